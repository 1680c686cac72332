//! A short fuzz run for CI without libFuzzer: seeded byte mutations of a fuzz target's
//! committed seeds, each fed to the target's body. No coverage feedback (that is what
//! `cargo xtask fuzz` with libFuzzer adds), but no sanitizer build either, so every target
//! runs a few thousand mutated inputs inside the ordinary test build. The run is the same
//! on every machine: a finding reproduces from the iteration number alone, and its input
//! is written to a file named in the failure.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use crate::Xorshift;

/// Bytes that parsers treat specially: zero, sign and length boundaries.
const INTERESTING: [u8; 8] = [0x00, 0x01, 0x7f, 0x80, 0xfe, 0xff, 0x20, 0x0a];

/// One mutated input: a seed with one to four edits (bit flip, special byte, random
/// byte, insertion, deletion, a repeated run, a 32-bit boundary value, or a splice with
/// another seed). `seeds` must not be empty.
pub fn mutate(rng: &mut Xorshift, seeds: &[Vec<u8>]) -> Vec<u8> {
    let pick = |rng: &mut Xorshift, n: usize| (rng.next() % n as u64) as usize;
    let mut v = seeds[pick(rng, seeds.len())].clone();
    for _ in 0..1 + pick(rng, 4) {
        let len = v.len();
        match pick(rng, 8) {
            0 if len > 0 => {
                let i = pick(rng, len);
                v[i] ^= 1 << pick(rng, 8);
            }
            1 if len > 0 => {
                let i = pick(rng, len);
                v[i] = INTERESTING[pick(rng, INTERESTING.len())];
            }
            2 if len > 0 => {
                let i = pick(rng, len);
                v[i] = rng.next() as u8;
            }
            3 => {
                let i = pick(rng, len + 1);
                v.insert(i, rng.next() as u8);
            }
            4 if len > 0 => {
                let i = pick(rng, len);
                let n = 1 + pick(rng, (len - i).min(64));
                v.drain(i..i + n);
            }
            5 if len > 0 => {
                let i = pick(rng, len);
                let n = 1 + pick(rng, (len - i).min(64));
                let run = v[i..i + n].to_vec();
                v.splice(i..i, run);
            }
            6 if len >= 4 => {
                let i = pick(rng, len - 3);
                let word: u32 =
                    [0, 1, u32::MAX, i32::MAX as u32, 0x8000_0000, 1 << 16][pick(rng, 6)];
                v[i..i + 4].copy_from_slice(&word.to_le_bytes());
            }
            7 => {
                let other = &seeds[pick(rng, seeds.len())];
                let cut = pick(rng, len + 1);
                let from = pick(rng, other.len() + 1);
                v.truncate(cut);
                v.extend_from_slice(&other[from..]);
            }
            _ => {}
        }
    }
    v
}

/// Feeds `iterations` mutated inputs of `seeds` (generator seeded with `seed`) to `body`.
/// A panic in `body` is a finding: the input is written to
/// `$TMPDIR/ggml-rs-fuzz/TARGET-ITERATION.bin` and this panics naming it.
pub fn fuzz_short(
    target: &str,
    seeds: &[Vec<u8>],
    iterations: u32,
    seed: u64,
    body: impl Fn(&[u8]),
) {
    assert!(!seeds.is_empty(), "{target}: no seeds to mutate");
    let mut rng = Xorshift::new(seed);
    for i in 0..iterations {
        let input = mutate(&mut rng, seeds);
        if catch_unwind(AssertUnwindSafe(|| body(&input))).is_err() {
            let dir = std::env::temp_dir().join("ggml-rs-fuzz");
            let path: PathBuf = dir.join(format!("{target}-{i}.bin"));
            let saved = std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(&path, &input))
                .map(|()| path.display().to_string())
                .unwrap_or_else(|e| format!("(not saved: {e})"));
            panic!("{target}: mutated input {i} of seed {seed} panicked; input: {saved}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_are_seeded_and_change_the_input() {
        let seeds = vec![b"GGUF\x03\0\0\0 some text".to_vec(), vec![1, 2, 3]];
        let a: Vec<Vec<u8>> = {
            let mut r = Xorshift::new(5);
            (0..200).map(|_| mutate(&mut r, &seeds)).collect()
        };
        let mut r = Xorshift::new(5);
        let b: Vec<Vec<u8>> = (0..200).map(|_| mutate(&mut r, &seeds)).collect();
        assert_eq!(a, b, "the same seed gives the same inputs");
        let changed = a.iter().filter(|m| !seeds.contains(m)).count();
        assert!(
            changed > 150,
            "only {changed} of 200 inputs differ from a seed"
        );
        assert!(a.iter().any(|m| m.is_empty() || m.len() > 20));
    }

    #[test]
    #[should_panic(expected = "mutated input")]
    fn a_panicking_body_is_a_finding() {
        fuzz_short("t", &[vec![0u8; 8]], 1000, 1, |b| {
            assert!(!b.contains(&0xff))
        });
    }
}
