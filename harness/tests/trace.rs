//! A traced cpu:3 layer-split run with micro-batches: the timeline shows the queues
//! working at the same time and no host sync inside a batch except HB5 and HB7, and
//! tracing (or cutting batches) changes no bit of the result.

use std::path::PathBuf;

use ggml_core::DType;
use harness::executor::Executor;
use harness::perplexity::{perplexity, PplResult, PplSettings};
use harness::session::{RunConfig, Session, SplitMode};

fn model() -> PathBuf {
    harness::synthetic::cached_model(DType::Q4_1).unwrap()
}

const SETTINGS: PplSettings = PplSettings {
    n_ctx: 128,
    n_batch: 128,
    max_chunks: Some(4),
};

/// Perplexity of the synthetic model on cpu:3 (layer split, two slots), with micro-batches
/// of `n_ubatch` tokens, traced into `trace` if given; and the letters of each split of
/// the scheduler's plan.
fn run(n_ubatch: usize, trace: Option<&std::path::Path>) -> (PplResult, Vec<String>) {
    let mut config = RunConfig::simple("cpu:3".parse().unwrap(), SplitMode::Layer, 2, 3);
    config.n_ubatch = n_ubatch;
    config.check_races = true;
    let session = Session::open(&model(), config).unwrap();
    let text = &harness::default_corpus()[..4000];
    let tokens = session.tokenizer.encode(text);
    let mut kv = session.kv_cache(SETTINGS.n_ctx).unwrap();
    let mut exec = session
        .sched_executor(ggml_sched::PlanStyle::Minimal)
        .unwrap();
    if trace.is_some() {
        exec.enable_trace();
    }
    let bos = session.tokenizer.bos();
    let r = perplexity(
        &session.model,
        &mut exec,
        &mut kv,
        &tokens,
        bos,
        SETTINGS,
        |_, _, _| {},
    )
    .unwrap();
    if let Some(path) = trace {
        let t = exec.take_trace().unwrap().expect("the scheduler traces");
        harness::trace::write_chrome(&t, path).unwrap();
    }
    let log = session.race_log.as_ref().unwrap();
    assert!(log.is_clean(), "{}", log.summary(5));
    let plan = exec.scheduler().plan(0).unwrap();
    let letters = plan
        .splits
        .iter()
        .map(|s| {
            s.actions
                .iter()
                .filter_map(ggml_sched::Action::letter)
                .collect()
        })
        .collect();
    (r, letters)
}

#[test]
fn traced_cpu3_layer_split_overlaps_without_stray_host_syncs() {
    let path = model().with_file_name("cpu3-layer-c2-u32.trace.json");
    let (traced, plan) = run(32, Some(&path));
    let (plain, _) = run(0, None);
    assert_eq!(traced.ppl.to_bits(), plain.ppl.to_bits());
    assert_eq!(traced.logits_sha256, plain.logits_sha256);

    let s = harness::trace::summarize(&path).unwrap();
    eprintln!("{}", s.text());
    assert_eq!((s.batches, s.runs), (4, 16), "4 batches of 4 micro-batches");
    assert_eq!(s.tracks.len(), 4, "the host and three queues");
    assert!(s.tracks.iter().skip(1).all(|t| t.busy_ms > 0.0));
    assert!(s.overlap > 0.0, "queues never worked at the same time");
    assert_eq!(s.stray_host_syncs, 0, "{:?}", s.host_syncs);
    assert!(
        s.host_syncs.keys().all(|r| r == "HB5" || r == "HB7"),
        "{:?}",
        s.host_syncs
    );
    // The queues did what the plan says, in every run: per split its queue waits, its
    // copies, then its graph (no host sync inside a split).
    assert_eq!(s.splits.len(), plan.len());
    for (p, want) in s.splits.iter().zip(&plan) {
        assert_eq!((&p.pattern, p.runs, p.of), (want, 16, 16), "{p:?}");
        assert!(p.pattern.ends_with('g') && !p.pattern.contains(['s', 'c']));
    }
}
