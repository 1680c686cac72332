//! `--split-mode tensor-reduce`: partial sums all-reduced (F32, and BF16 on the wire),
//! within the PPL tolerances of split mode none, race-free.

use std::path::PathBuf;

use ggml_core::DType;
use harness::perplexity::{perplexity, PplSettings};
use harness::session::{RunConfig, Session, SplitMode};

fn model(dtype: DType) -> PathBuf {
    harness::synthetic::cached_model(dtype).unwrap()
}

fn ppl(dtype: DType, devices: &str, split: SplitMode, bf16_min: Option<usize>) -> f64 {
    let mut config = RunConfig::simple(devices.parse().unwrap(), split, 1, 2);
    config.check_races = true;
    config.reduce_bf16_min = bf16_min;
    let session = Session::open(&model(dtype), config).unwrap();
    let tokens = session.tokenizer.encode(&harness::default_corpus()[..3000]);
    let s = PplSettings {
        n_ctx: 128,
        n_batch: 128,
        max_chunks: Some(3),
    };
    let mut kv = session.kv_cache(s.n_ctx).unwrap();
    let mut exec = session.executor().unwrap();
    let r = perplexity(
        &session.model,
        exec.as_mut(),
        &mut kv,
        &tokens,
        session.tokenizer.bos(),
        s,
        |_, _, _| {},
    )
    .unwrap();
    let log = session.race_log.as_ref().unwrap();
    assert!(log.is_clean(), "{}", log.summary(5));
    r.ppl
}

#[test]
fn tensor_reduce_is_within_tolerance_in_f32_and_bf16() {
    let none = ppl(DType::Q4_1, "cpu", SplitMode::None, None);
    for devices in ["cpu:2", "cpu:4"] {
        let f32 = ppl(DType::Q4_1, devices, SplitMode::TensorReduce, None);
        let bf16 = ppl(DType::Q4_1, devices, SplitMode::TensorReduce, Some(0));
        let rel = |x: f64| ((x - none) / none).abs();
        assert!(rel(f32) < 1e-3, "{devices} F32: {f32} vs {none}");
        assert!(rel(bf16) < 5e-3, "{devices} BF16: {bf16} vs {none}");
        // The wire really was BF16: the numbers moved.
        assert_ne!(bf16.to_bits(), f32.to_bits(), "{devices}");
        // Above the threshold only: a threshold beyond every partial sum is F32 again.
        let big = ppl(DType::Q4_1, devices, SplitMode::TensorReduce, Some(1 << 30));
        assert_eq!(big.to_bits(), f32.to_bits(), "{devices}");
    }
}

#[test]
fn columns_off_the_quant_blocks_are_refused() {
    // 512 feed-forward rows over 3 devices: 171 columns do not fall on 32-element blocks.
    let mut config = RunConfig::simple("cpu:3".parse().unwrap(), SplitMode::TensorReduce, 1, 3);
    config.check_races = true;
    let e = Session::open(&model(DType::Q4_1), config)
        .unwrap_err()
        .to_string();
    assert!(e.contains("do not fall on 32-element blocks"), "{e}");
    let mut config = RunConfig::simple("cpu:2".parse().unwrap(), SplitMode::Tensor, 1, 2);
    config.reduce_bf16_min = Some(0);
    let e = Session::open(&model(DType::Q4_1), config)
        .unwrap_err()
        .to_string();
    assert!(e.contains("tensor-reduce only"), "{e}");
}
