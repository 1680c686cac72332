//! The two seeded generators the tests use. Neither may change: tests pin digests of
//! results computed from their values.

/// A xorshift64 generator (the CPU backend's tests). [`Xorshift::new`] spreads a small
/// seed over the state; the tuple constructor takes a state as it is (must not be 0).
#[derive(Clone, Debug)]
pub struct Xorshift(pub u64);

impl Xorshift {
    /// The generator for `seed`, any value (0 included).
    pub fn new(seed: u64) -> Xorshift {
        Xorshift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1), on a grid of 2^-23.
    pub fn f(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// `n` values of [`f`](Xorshift::f), each times `scale`.
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
}

/// A 64-bit LCG (Knuth's MMIX constants) giving 31 bits a step (the CUDA backend's
/// tests): the same inputs on every run and host.
#[derive(Clone, Debug)]
pub struct Lcg(pub u64);

impl Lcg {
    /// The next 31 random bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    /// Uniform in [-1, 1).
    pub fn f(&mut self) -> f32 {
        self.next() as f32 / (1u64 << 31) as f32 * 2.0 - 1.0
    }

    /// `n` values of [`f`](Lcg::f).
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f()).collect()
    }

    /// `n` bytes, the low 8 bits of [`next`](Lcg::next) each.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Values of the generators as the test files had them: a change here changes every
    // seeded input in the workspace.
    #[test]
    fn xorshift_sequence_is_pinned() {
        let mut r = Xorshift::new(0);
        assert_eq!(r.0, 1);
        assert_eq!(r.next(), 0x0000_0000_4082_2041);
        let mut r = Xorshift::new(7);
        let v: Vec<u64> = (0..3).map(|_| r.next()).collect();
        let mut s = 7u64.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for want in v {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            assert_eq!(want, s);
        }
    }

    #[test]
    fn lcg_sequence_is_pinned() {
        let mut r = Lcg(1);
        let first = 1u64
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        assert_eq!(r.next(), (first >> 33) as u32);
        assert_eq!(Lcg(0).next(), (1442695040888963407u64 >> 33) as u32);
    }

    #[test]
    fn floats_stay_in_range() {
        let (mut x, mut l) = (Xorshift::new(3), Lcg(3));
        for _ in 0..10_000 {
            let (a, b) = (x.f(), l.f());
            assert!((-1.0..1.0).contains(&a), "{a}");
            assert!((-1.0..1.0).contains(&b), "{b}");
        }
        assert_eq!(Xorshift::new(5).vec(4, 2.0).len(), 4);
        assert!(Lcg(5).bytes(9).iter().any(|&b| b != 0));
    }
}
