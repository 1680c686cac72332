//! Any bytes as a llama-perplexity KL-divergence base file: opened, checked against a
//! run, and read chunk by chunk, or a one-line error naming the file. A panic is a
//! finding.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| harness_fuzz::kl_base(data));
