//! The regression matrix on a synthetic model (CI runs it; `cargo xtask regress` runs
//! the same matrix on the real model): every cell bit-identical and race-free under
//! chaos, and every weakened scheduler rule caught by the checker on real CPU queues.

mod common;

use std::path::PathBuf;

use ggml_core::DType;
use harness::golden::GoldenSet;
use harness::matrix::run::{run, RunOptions};
use harness::matrix::{Matrix, Source};
use harness::perplexity::perplexity;
use harness::regress::RegressSettings;
use harness::session::{RunConfig, Session, SplitMode};
use rstest::rstest;

fn model() -> PathBuf {
    harness::synthetic::cached_model(DType::Q4_1).unwrap()
}

fn text() -> &'static str {
    &harness::default_corpus()[..2500]
}

/// Two passes of 4 sequences of 64 tokens: exercises multi-sequence batches, KV reuse
/// across passes and pipeline slots.
fn settings(chaos: Option<u64>, weaken: Vec<ggml_sched::WeakenKnob>) -> RegressSettings {
    common::regress_settings(64, 256, 8, chaos, weaken)
}

#[rstest]
#[case::no_chaos(None)]
#[case::chaos_1(Some(1))]
#[case::chaos_2(Some(2))]
fn cpu_matrix_is_bit_identical_and_race_free(#[case] chaos: Option<u64>) {
    let mut m = Matrix::cpu();
    assert_eq!(m.cells.len(), 80);
    let corpus = model().with_file_name(format!("corpus-{chaos:?}.txt"));
    std::fs::write(&corpus, text()).unwrap();
    m.settings.model = Source::Path(model());
    m.settings.corpus = Source::Path(corpus);
    m.settings.ppl = settings(chaos, Vec::new()).ppl;
    let opts = RunOptions {
        check_races: true,
        chaos_seeds: vec![chaos],
        weaken: Vec::new(),
        goldens: GoldenSet::default(),
        bless: false,
        require_golden: false,
    };
    // The matrix's `identical ["*"]` rule and the race check make any differing or racy
    // cell a violation.
    let report = run(&m, &opts, |_| {}).unwrap();
    assert!(report.passed(), "{:?}", report.violations);
    // One host sync per forward pass with a pipeline (HB5: the logits reach the host),
    // none more.
    for r in report.rows.iter().map(|r| &r.result) {
        if r.devices != "cpu" && r.split_mode == SplitMode::Layer {
            assert!(r.host_syncs_per_forward <= 1.0 + 1e-9, "{r:?}");
        }
    }
}

#[rstest]
#[case::own_event(ggml_sched::WeakenKnob::OwnEvent, ggml_core::CopyQueue::Destination)]
#[case::no_slot_wait(ggml_sched::WeakenKnob::NoSlotWait, ggml_core::CopyQueue::Source)]
#[case::async_user_input(
    ggml_sched::WeakenKnob::AsyncUserInput,
    ggml_core::CopyQueue::Destination
)]
#[case::no_alloc_wait(ggml_sched::WeakenKnob::NoAllocWait, ggml_core::CopyQueue::Destination)]
fn weakened_rules_are_caught_on_cpu_queues(
    #[case] knob: ggml_sched::WeakenKnob,
    #[case] copy_queue: ggml_core::CopyQueue,
) {
    // Micro-batches keep several runs in flight inside each batch, with their logits
    // staged, so that nothing but the plan orders one run's work against the next.
    let mut config = RunConfig::simple("cpu:3".parse().unwrap(), SplitMode::Layer, 2, 3);
    config.n_ubatch = 64;
    config.check_races = true;
    config.chaos = Some(7);
    config.weaken = vec![knob];
    config.cpu_copy_queue = copy_queue;
    let session = Session::open(&model(), config).unwrap();
    let tokens = session.tokenizer.encode(text());
    let mut kv = session.kv_cache(256).unwrap();
    let mut exec = session.executor().unwrap();
    let s = settings(None, Vec::new()).ppl;
    perplexity(
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
    assert!(log.race_count() > 0, "{knob:?} not caught");
    assert!(
        log.rules().contains(&knob.rule()),
        "{knob:?}: {:?}",
        log.rules()
    );
}
