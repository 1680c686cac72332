//! Inputs the fuzzer (`ggml-core/fuzz`, target `gguf_parse`) found, kept in
//! `tests/data/fuzz/`: each must parse or fail cleanly, as recorded here.

mod common;

use ggml_core::gguf::Gguf;

/// (file name, expected error kind and field, or None if it must parse).
const CASES: &[(&str, Option<(&str, &str)>)] = &[
    // An empty tensor in a file whose data section starts past its end: parse
    // accepted it with a byte range outside the file.
    (
        "crash-d8e837086708976e1848270316f0a095f77a254f",
        Some(("OffsetOutOfBounds", "tensor_info[0].offset")),
    ),
];

#[test]
fn fuzz_findings() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz");
    for (name, expected) in CASES {
        let bytes = std::fs::read(dir.join(name)).unwrap();
        match (Gguf::parse(&bytes), expected) {
            (Ok(g), None) => {
                common::touch_all(&g, &bytes);
            }
            (Err(e), Some((kind, field))) => {
                assert_eq!(e.kind().name(), *kind, "{name}: {e}");
                assert_eq!(e.field().to_string(), *field, "{name}: {e}");
            }
            (r, _) => panic!("{name}: unexpected result {r:?}"),
        }
    }
    // Every file in the directory is listed.
    let listed = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(listed, CASES.len(), "unlisted files in {}", dir.display());
}
