//! Any text through the synthetic model's byte-level BPE tokenizer: it encodes, with and
//! without special tokens, and decoding gives the text back. A panic is a finding.
#![no_main]

use std::sync::OnceLock;

use ggml_core::gguf::Gguf;
use ggml_core::DType;
use harness::synthetic::{synthetic_gguf, SyntheticSpec};
use harness::tokenizer::Tokenizer;
use libfuzzer_sys::fuzz_target;

fn tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let bytes = synthetic_gguf(&SyntheticSpec::tiny(DType::Q4_0));
        Tokenizer::from_gguf(&Gguf::parse(&bytes).expect("synthetic GGUF parses"))
            .expect("synthetic vocabulary loads")
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let tok = tokenizer();
    let ids = tok.encode_with(&text, false);
    assert_eq!(tok.decode(&ids), text);
    let _ = tok.encode(&text);
});
