//! Parses the real SmolLM2-135M-Instruct Q4_1 model when it is in the cache
//! (`$GGML_RS_CACHE`, default `~/.cache/ggml-rs`); skipped with a message otherwise.

mod common;

use std::path::PathBuf;

use ggml_core::gguf::{Gguf, ValueType};
use ggml_core::DType;

const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("GGML_RS_CACHE") {
        return Some(PathBuf::from(dir));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("ggml-rs"))
}

#[test]
fn smollm2_q4_1() {
    let Some(path) = cache_dir().map(|d| d.join(FILE)) else {
        eprintln!("skipped: no GGML_RS_CACHE and no HOME to find {FILE}");
        return;
    };
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!(
                "skipped: {} not readable ({e}); ggml-core/README.md says how to fetch it",
                path.display()
            );
            return;
        }
    };
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
