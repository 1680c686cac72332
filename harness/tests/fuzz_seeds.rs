//! Every committed seed of the harness's fuzz targets (`fuzz/seeds/TARGET/`) through the
//! targets' own bodies (`fuzz/src/lib.rs`, included by path), so CI replays them
//! without libFuzzer. A typed target's seed is decoded as libFuzzer would (`arbitrary`).

#[path = "../fuzz/src/lib.rs"]
mod bodies;

use std::path::Path;

use arbitrary::{Arbitrary, Unstructured};

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

fn replay(target: &str, body: impl Fn(&[u8]) + std::panic::RefUnwindSafe) {
    for (name, bytes) in seeds(target) {
        let ok = std::panic::catch_unwind(|| body(&bytes));
        assert!(ok.is_ok(), "{target} panicked on seed {name}");
    }
}

#[test]
fn matrix_parse_seeds() {
    replay("matrix_parse", bodies::matrix_parse);
}

#[test]
fn devices_parse_seeds() {
    replay("devices_parse", bodies::devices_parse);
}

#[test]
fn tokenizer_text_seeds() {
    replay("tokenizer_text", bodies::tokenizer_text);
}

#[test]
fn kl_base_seeds() {
    replay("kl_base", bodies::kl_base);
}

#[test]
fn gguf_roundtrip_seeds() {
    replay("gguf_roundtrip", |bytes| {
        let input = bodies::RoundtripInput::arbitrary_take_rest(Unstructured::new(bytes))
            .expect("any bytes decode");
        bodies::gguf_roundtrip(input);
    });
}
