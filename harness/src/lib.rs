//! The ggml-rs harness: runs SmolLM2 GGUF models on the ggml-rs crates.
//!
//! - [`tokenizer`]: GPT-2 byte-level BPE with the smollm pre-tokenizer, matching
//!   llama.cpp's token ids exactly.
#![warn(missing_docs)]

pub mod tokenizer;
