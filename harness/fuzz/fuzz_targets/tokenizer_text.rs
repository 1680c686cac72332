//! Any text through the synthetic model's byte-level BPE tokenizer: it encodes, with and
//! without special tokens, and decoding gives the text back. A panic is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| harness_fuzz::tokenizer_text(data));
