//! Seeded chaos delays: with a seed set, each stream's worker sleeps a random 0..=200 µs
//! before half of its operations, drawn from its own generator (the seed mixed with the
//! stream's id), so that the interleaving of streams changes with the seed. Correctly
//! ordered code gives the same results under every seed; code that relies on timing
//! does not.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::lock;

/// The longest chaos delay, in microseconds.
pub const MAX_DELAY_US: u64 = 200;

/// SplitMix64: a small, good-enough 64-bit generator.
#[derive(Clone, Debug)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// The driver-wide chaos setting, changeable at run time.
pub(crate) struct ChaosControl {
    seed: Mutex<Option<u64>>,
    /// Bumped on every change, so workers notice without taking the lock.
    generation: AtomicU64,
}

impl ChaosControl {
    pub(crate) fn new(seed: Option<u64>) -> ChaosControl {
        ChaosControl {
            seed: Mutex::new(seed),
            generation: AtomicU64::new(0),
        }
    }

    pub(crate) fn set(&self, seed: Option<u64>) {
        *lock(&self.seed) = seed;
        self.generation.fetch_add(1, Ordering::Release);
    }

    pub(crate) fn seed(&self) -> Option<u64> {
        *lock(&self.seed)
    }
}

/// One stream's view of the chaos setting: its own generator.
pub(crate) struct StreamChaos {
    stream_id: u64,
    generation: u64,
    rng: Option<SplitMix64>,
}

impl StreamChaos {
    pub(crate) fn new(stream_id: u64) -> StreamChaos {
        StreamChaos {
            stream_id,
            generation: u64::MAX,
            rng: None,
        }
    }

    /// The delay before the next operation (zero without chaos or on a coin flip).
    pub(crate) fn next_delay(&mut self, ctl: &ChaosControl) -> Duration {
        let g = ctl.generation.load(Ordering::Acquire);
        if g != self.generation {
            self.generation = g;
            self.rng = ctl.seed().map(|s| {
                let mut mix = SplitMix64::new(self.stream_id.wrapping_mul(0xd605_bbb5_8c8a_bd5b));
                SplitMix64::new(s ^ mix.next_u64())
            });
        }
        match &mut self.rng {
            Some(r) => {
                let x = r.next_u64();
                if x & 1 == 0 {
                    Duration::ZERO
                } else {
                    Duration::from_micros((x >> 1) % (MAX_DELAY_US + 1))
                }
            }
            None => Duration::ZERO,
        }
    }

    /// Sleeps the next delay, if any.
    pub(crate) fn pause(&mut self, ctl: &ChaosControl) {
        let d = self.next_delay(ctl);
        if !d.is_zero() {
            std::thread::sleep(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_follow_the_seed_and_stream() {
        let ctl = ChaosControl::new(Some(7));
        let draw = |id: u64| {
            let mut c = StreamChaos::new(id);
            (0..64).map(|_| c.next_delay(&ctl)).collect::<Vec<_>>()
        };
        let a = draw(1);
        assert_eq!(a, draw(1), "same seed and stream, same delays");
        assert_ne!(a, draw(2), "another stream draws differently");
        assert!(a.iter().all(|d| d.as_micros() <= MAX_DELAY_US as u128));
        let zeros = a.iter().filter(|d| d.is_zero()).count();
        assert!(
            (16..=48).contains(&zeros),
            "about half the operations wait: {zeros}"
        );
        ctl.set(None);
        let mut c = StreamChaos::new(1);
        assert!((0..16).all(|_| c.next_delay(&ctl).is_zero()));
    }
}
