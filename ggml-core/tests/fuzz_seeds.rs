//! Every committed seed of ggml-core's fuzz targets (`fuzz/seeds/`) and every finding
//! (`tests/data/fuzz/`) through the targets' own bodies (`fuzz/src/lib.rs`, included by
//! path), so CI replays them without libFuzzer; then a short fuzz run of seeded mutations
//! of the seeds (`ggml_test_kit::fuzz_short`; `cargo xtask fuzz` runs libFuzzer).

#[path = "../fuzz/src/lib.rs"]
mod bodies;

use std::path::Path;

/// The files of `dir`, sorted, with their bytes.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
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
    v
}

#[test]
fn gguf_parse_seeds_findings_and_mutations() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let seeds = files(&root.join("fuzz/seeds/gguf_parse"));
    assert!(seeds.len() >= 7, "{} seeds", seeds.len());
    let findings = files(&root.join("tests/data/fuzz"));
    assert!(!findings.is_empty());
    for (name, bytes) in seeds.iter().chain(&findings) {
        // A panic names the input: the body asserts, this says which file.
        let ok = std::panic::catch_unwind(|| bodies::gguf_parse(bytes));
        assert!(ok.is_ok(), "gguf_parse panicked on {name}");
    }
    let inputs: Vec<Vec<u8>> = seeds.into_iter().chain(findings).map(|(_, b)| b).collect();
    ggml_test_kit::fuzz_short("gguf_parse", &inputs, 20_000, 0x5eed, bodies::gguf_parse);
}
