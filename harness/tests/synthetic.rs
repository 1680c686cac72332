//! Perplexity runs on synthetic models: every weight dtype loads and runs, and results
//! do not depend on threads or batch size (invariant 2).

use ggml_core::DType::{BF16, F16, F32, Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0};
use std::path::PathBuf;

use ggml_core::DType;
use harness::devices::DeviceList;
use harness::perplexity::{perplexity, PplResult, PplSettings};
use harness::session::{RunConfig, Session, SplitMode};
use rstest::rstest;

fn write_model(dtype: DType) -> PathBuf {
    harness::synthetic::cached_model(dtype).unwrap()
}

fn run(dtype: DType, threads: usize, ctx: usize, batch: usize) -> PplResult {
    let config = RunConfig::simple(
        "cpu".parse::<DeviceList>().unwrap(),
        SplitMode::None,
        1,
        threads,
    );
    let s = Session::open(&write_model(dtype), config).unwrap();
    let tokens = s.tokenizer.encode(&harness::default_corpus()[..3000]);
    let n_seq = (batch / ctx).max(1);
    let mut kv = s.kv_cache(ctx * n_seq).unwrap();
    let mut exec = s.executor().unwrap();
    let settings = PplSettings {
        n_ctx: ctx,
        n_batch: batch,
        max_chunks: Some(4),
    };
    perplexity(
        &s.model,
        exec.as_mut(),
        &mut kv,
        &tokens,
        None,
        settings,
        |_, _, _| {},
    )
    .unwrap()
}

#[rstest]
fn every_weight_dtype_runs(
    #[values(F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K)] dtype: DType,
) {
    let r = run(dtype, 2, 64, 64);
    assert!(r.ppl.is_finite() && r.ppl > 1.0, "{dtype}: ppl {}", r.ppl);
    // A random model over 258 tokens is close to uniform, never far beyond it.
    assert!(r.ppl < 258.0 * 4.0, "{dtype}: ppl {}", r.ppl);
    assert_eq!(r.n_scored, 4 * 31);
}

#[test]
fn threads_do_not_change_bits() {
    let a = run(DType::Q4_1, 1, 64, 64);
    for t in [2, 3] {
        let b = run(DType::Q4_1, t, 64, 64);
        assert_eq!(a.logits_sha256, b.logits_sha256, "threads {t}");
        assert_eq!(a.ppl.to_bits(), b.ppl.to_bits());
    }
}

#[test]
fn batch_size_and_parallel_sequences_do_not_change_bits() {
    let whole = run(DType::Q8_0, 2, 64, 64);
    let split = run(DType::Q8_0, 2, 64, 16);
    let multi = run(DType::Q8_0, 2, 64, 256);
    assert_eq!(whole.logits_sha256, split.logits_sha256);
    assert_eq!(whole.logits_sha256, multi.logits_sha256);
    assert_eq!(whole.chunks, multi.chunks);
}
