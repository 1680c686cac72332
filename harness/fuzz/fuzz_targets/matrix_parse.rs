//! Any bytes as a matrix file: a matrix, or a one-line error `m.toml:LINE: reason` with
//! LINE inside the text (or the line after its last newline, for an error at the end).
//! A panic is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = harness::matrix::file::parse("m.toml", None, text) {
        let e = e.to_string();
        assert!(!e.contains('\n'), "{e:?}");
        let line: usize = e
            .strip_prefix("m.toml:")
            .and_then(|r| r.split(':').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no line in {e:?}"));
        assert!(line >= 1 && line <= text.lines().count() + 1, "{e:?}");
    }
});
