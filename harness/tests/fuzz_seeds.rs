//! Every committed seed of the harness's fuzz targets (`fuzz/seeds/TARGET/`) through the
//! targets' own bodies (`fuzz/src/lib.rs`, included by path), so CI replays them
//! without libFuzzer. A typed target's seed is decoded as libFuzzer would (`arbitrary`).
//! Then a short fuzz run per target: thousands of seeded mutations of its seeds
//! (`ggml_test_kit::fuzz_short`; `cargo xtask fuzz` runs libFuzzer with coverage).

#[path = "../fuzz/src/lib.rs"]
mod bodies;

use std::path::Path;

use arbitrary::{Arbitrary, Unstructured};
use ggml_test_kit::fuzz_short;

/// The seeds of `target`, sorted, with their bytes.
fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target);
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no seeds for {target}");
    v
}

/// Mutated inputs per target in the short fuzz run (a few seconds each).
const MUTATIONS: u32 = 10_000;

fn replay(target: &str, body: impl Fn(&[u8]) + std::panic::RefUnwindSafe) {
    let seeds = seeds(target);
    for (name, bytes) in &seeds {
        let ok = std::panic::catch_unwind(|| body(bytes));
        assert!(ok.is_ok(), "{target} panicked on seed {name}");
    }
    let seeds: Vec<Vec<u8>> = seeds.into_iter().map(|(_, b)| b).collect();
    fuzz_short(target, &seeds, MUTATIONS, 0x5eed, body);
}

#[test]
fn matrix_parse_seeds_and_mutations() {
    replay("matrix_parse", bodies::matrix_parse);
}

#[test]
fn devices_parse_seeds_and_mutations() {
    replay("devices_parse", bodies::devices_parse);
}

#[test]
fn tokenizer_text_seeds_and_mutations() {
    replay("tokenizer_text", bodies::tokenizer_text);
}

#[test]
fn kl_base_seeds_and_mutations() {
    replay("kl_base", bodies::kl_base);
}

#[test]
fn gguf_roundtrip_seeds_and_mutations() {
    replay("gguf_roundtrip", |bytes| {
        // As libFuzzer's typed targets: bytes that do not decode are skipped.
        if let Ok(input) = bodies::RoundtripInput::arbitrary_take_rest(Unstructured::new(bytes)) {
            bodies::gguf_roundtrip(input);
        }
    });
}
