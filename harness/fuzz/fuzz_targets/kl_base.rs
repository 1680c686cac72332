//! Any bytes as a llama-perplexity KL-divergence base file: opened, checked against a
//! run, and read chunk by chunk, or a one-line error naming the file. A panic is a
//! finding.
#![no_main]

use harness::kl::{ChunkLogProbs, KlBase};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let src = Box::new(std::io::Cursor::new(data.to_vec()));
    let mut base = match KlBase::from_source("base.kld", src) {
        Ok(b) => b,
        Err(e) => {
            let e = e.to_string();
            assert!(!e.contains('\n') && e.starts_with("base.kld: "), "{e:?}");
            return;
        }
    };
    // A run that may or may not match the header.
    let tokens: Vec<u32> = data.iter().take(64).map(|&b| u32::from(b)).collect();
    if let Err(e) = base.check_run(16, 256, &tokens) {
        assert!(!e.to_string().contains('\n'), "{e}");
    }
    let mut out = ChunkLogProbs::default();
    for c in 0..4 {
        if let Err(e) = base.read_chunk(c, &mut out) {
            assert!(!e.to_string().contains('\n'), "{e}");
            break;
        }
    }
});
