//! Any text as a `--devices` list: a list that prints back to itself, or a one-line
//! error. A panic is a finding.
#![no_main]

use harness::devices::DeviceList;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match text.parse::<DeviceList>() {
        Ok(list) => {
            let again: DeviceList = list.to_string().parse().expect("printed lists parse");
            assert_eq!(again.to_string(), list.to_string());
        }
        Err(e) => assert!(!e.to_string().contains('\n'), "{e}"),
    }
});
