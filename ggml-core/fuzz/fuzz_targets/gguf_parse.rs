//! Parses arbitrary bytes as GGUF and touches every accessor of whatever parses.
//! Any panic is a finding: the parser must refuse bad input with an error value, and
//! the accessors of a parsed file must not fail.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ggml_core_fuzz::gguf_parse(data));
