//! Any bytes as a matrix file: a matrix, or a one-line error `m.toml:LINE: reason` with
//! LINE inside the text (or the line after its last newline, for an error at the end).
//! A panic is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| harness_fuzz::matrix_parse(data));
