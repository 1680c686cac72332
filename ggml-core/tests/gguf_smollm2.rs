//! Parses the real SmolLM2-135M-Instruct Q4_1 model from the cache (`$GGML_RS_CACHE`,
//! default `~/.cache/ggml-rs`), downloading it there first when it is missing (with the
//! same code as `cargo xtask fetch-model`); a failed download fails the test.

mod common;

use ggml_core::gguf::{Gguf, ValueType};
use ggml_core::DType;

#[path = "../../xtask/src/fetch.rs"]
#[allow(dead_code)]
mod fetch;

#[test]
fn smollm2_q4_1() {
    let path = fetch::fetch_model().unwrap_or_else(|e| panic!("SmolLM2 could not be fetched: {e}"));
    let bytes = std::fs::read(&path).expect("reading the model");
    assert_eq!(
        bytes.len(),
        98_362_432,
        "unexpected size of {}",
        path.display()
    );

    let g = Gguf::parse(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(g.version(), 3);
    assert_eq!(g.tensor_count(), 272);
    assert_eq!(g.metadata_count(), 33);
    assert_eq!(g.get_str("general.architecture"), Some("llama"));
    assert_eq!(g.get_u32("llama.block_count"), Some(30));
    assert_eq!(g.get_as_usize("llama.block_count"), Some(30));

    let tokens = g.get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.elem_type(), ValueType::String);
    assert_eq!(tokens.len(), 49152);
    assert_eq!(tokens.strings().unwrap().count(), 49152);

    let t = g.tensor("token_embd.weight").unwrap();
    assert_eq!(t.dtype(), DType::Q8_0);
    assert_eq!(t.dims(), [576, 49152]);
    assert_eq!(t.n_bytes(), 576 / 32 * 34 * 49152);
    assert_eq!(t.data(&bytes).len(), t.n_bytes());

    // Every tensor fits in the file, and the layout is llama.cpp's packed one.
    g.check_packed_layout().unwrap();
    let end = g.tensors().map(|t| t.byte_range().end).max().unwrap();
    assert!(end <= bytes.len());
    common::touch_all(&g, &bytes);
    eprintln!(
        "parsed {}: {} tensors, {} keys, data at {}",
        path.display(),
        g.tensor_count(),
        g.metadata_count(),
        g.data_offset()
    );
}
