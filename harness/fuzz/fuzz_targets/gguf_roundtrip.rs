//! GGUF files the harness writes (from fuzzed metadata and tensor shapes), read back by
//! ggml-core's parser: every key, value, shape and byte comes back as written.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: harness_fuzz::RoundtripInput| harness_fuzz::gguf_roundtrip(input));
