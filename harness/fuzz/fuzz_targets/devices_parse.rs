//! Any text as a `--devices` list: a list that prints back to itself, or a one-line
//! error. A panic is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| harness_fuzz::devices_parse(data));
