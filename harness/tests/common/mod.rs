//! Setup the harness integration tests share: regression cells and settings, a split
//! checked against one device, two cells' perplexities compared, a real model's whole
//! corpus against llama.cpp's running perplexities, a builtin matrix against its goldens,
//! and a greedy generation's logits. Each test file uses part of it.
#![allow(dead_code)]

use std::path::Path;

use harness::batch::Batch;
use harness::golden::GoldenSet;
use harness::matrix::run::{run, RunOptions};
use harness::matrix::Matrix;
use harness::perplexity::{perplexity, PplResult, PplSettings};
use harness::regress::{run_cell, Cell, CellResult, RegressSettings};
use harness::session::{RunConfig, Session, SplitMode};

/// A regression cell on `devices` with two threads and no tensor-reduce or all-gather
/// options.
pub fn cell(devices: &str, split: SplitMode, n_copies: usize, n_ubatch: usize) -> Cell {
    Cell {
        devices: devices.parse().unwrap(),
        split,
        n_copies,
        threads: 2,
        n_ubatch,
        reduce_bf16_min: None,
        all_gather: Default::default(),
    }
}

/// Race-checked regression settings: `max_chunks` chunks of `n_ctx` tokens in batches of
/// `n_batch`.
pub fn regress_settings(
    n_ctx: usize,
    n_batch: usize,
    max_chunks: usize,
    chaos: Option<u64>,
    weaken: Vec<ggml_sched::WeakenKnob>,
) -> RegressSettings {
    RegressSettings {
        ppl: PplSettings {
            n_ctx,
            n_batch,
            max_chunks: Some(max_chunks),
        },
        check_races: true,
        chaos,
        weaken,
    }
}

/// The synthetic Gemma 3 and MoE tests' settings: two chunks of 48 tokens (positions
/// beyond Gemma 3's window of 8, in micro-batches too) under chaos seed 3.
pub fn two_chunks_of_48() -> RegressSettings {
    regress_settings(48, 96, 2, Some(3), Vec::new())
}

/// Runs `model` on `base` (unsplit) and on `split`, asserts that the split gives the
/// base's logits bit for bit and no races, and returns both results.
pub fn assert_split_gives_the_bits_of(
    base: &str,
    model: &Path,
    text: &str,
    split: &Cell,
    s: &RegressSettings,
) -> (CellResult, CellResult) {
    let one = run_cell(model, text, &cell(base, SplitMode::None, 1, 0), s).unwrap();
    let other = run_cell(model, text, split, s).unwrap();
    assert_eq!(
        other.logits_sha256, one.logits_sha256,
        "{} {:?}",
        split.devices, split.split
    );
    assert_eq!(other.races, 0);
    (one, other)
}

/// Runs `model` on one CPU and on `other` and asserts that `other` has no races and
/// a perplexity within `tolerance` (relative) of the CPU's.
pub fn assert_close_to_one_cpu(
    model: &Path,
    text: &str,
    other: &Cell,
    s: &RegressSettings,
    tolerance: f64,
) {
    let cpu = run_cell(model, text, &cell("cpu", SplitMode::None, 1, 0), s).unwrap();
    let got = run_cell(model, text, other, s).unwrap();
    assert_eq!(got.races, 0);
    let rel = (got.ppl - cpu.ppl).abs() / cpu.ppl;
    let what = format!("{} {:?}", other.devices, other.split);
    eprintln!("{what} vs cpu: {rel:.3e}");
    assert!(
        rel < tolerance,
        "{what}: {} vs cpu {} ({rel:.2e})",
        got.ppl,
        cpu.ppl
    );
}

/// The whole default corpus through the model at `path` on one CPU as llama-perplexity
/// runs it (`-c 512 -b 512 -t 2`, one final newline dropped, BOS first only where the
/// vocabulary adds it): the session, the text and the result.
pub fn whole_corpus_on_one_cpu(path: &Path) -> (Session, String, PplResult) {
    let config = RunConfig::simple("cpu".parse().unwrap(), SplitMode::None, 1, 2);
    let s = Session::open(path, config).unwrap();
    let mut text = harness::default_corpus().to_string();
    text.pop();
    let tokens = s.tokenizer.encode(&text);
    let mut kv = s.kv_cache(512).unwrap();
    let mut exec = s.executor().unwrap();
    let settings = PplSettings {
        n_ctx: 512,
        n_batch: 512,
        max_chunks: None,
    };
    let bos = s.tokenizer.add_bos().then(|| s.tokenizer.bos()).flatten();
    let r = perplexity(
        &s.model,
        exec.as_mut(),
        &mut kv,
        &tokens,
        bos,
        settings,
        |_, _, _| {},
    )
    .unwrap();
    drop(exec);
    (s, text, r)
}

/// Every running perplexity of `r` within `chunk_tolerance` of llama.cpp's `reference`,
/// and the final one within `final_tolerance`.
pub fn assert_tracks(r: &PplResult, reference: &[f64], chunk_tolerance: f64, final_tolerance: f64) {
    assert_eq!(r.chunks.len(), reference.len());
    for (i, (ours, theirs)) in r.chunks.iter().zip(reference).enumerate() {
        let rel = (ours - theirs).abs() / theirs;
        eprintln!(
            "[{}] ours {ours:.4} llama.cpp {theirs:.4} (rel diff {rel:.2e})",
            i + 1
        );
        assert!(rel < chunk_tolerance, "chunk {}: {ours} vs {theirs}", i + 1);
    }
    let last = reference[reference.len() - 1];
    let rel = (r.ppl - last).abs() / last;
    assert!(
        rel < final_tolerance,
        "final PPL {} vs {last} ({rel:.2e})",
        r.ppl
    );
}

/// Runs the builtin matrix `name` with the race checker against the embedded goldens:
/// it passes, no row races, and every row but the tensor-reduce ones equals its golden.
pub fn assert_builtin_matrix_is_golden(name: &str) {
    let m = Matrix::builtin(name).unwrap();
    let opts = RunOptions {
        check_races: true,
        chaos_seeds: vec![None],
        weaken: Vec::new(),
        goldens: GoldenSet::parse(harness::golden::EMBEDDED).unwrap(),
        bless: false,
        require_golden: true,
    };
    let report = run(&m, &opts, |_| {}).unwrap();
    assert!(report.passed(), "{:?}", report.violations);
    for r in &report.rows {
        assert_eq!(r.result.races, 0, "{}", r.name);
        if !r.name.contains("reduce") {
            assert_eq!(
                r.golden,
                harness::matrix::report::GoldenStatus::Equal,
                "{}: no golden or a different one",
                r.name
            );
        }
    }
}

/// The logits, as bits, of `prompt`'s last token and of `n_gen` tokens generated after it
/// greedily (the first index of the largest logit), in a fresh KV cache of `n_ctx` cells.
pub fn greedy_logit_bits(
    session: &Session,
    n_ctx: usize,
    prompt: &[u32],
    n_gen: usize,
) -> Vec<Vec<u32>> {
    let mut kv = session.kv_cache(n_ctx).unwrap();
    let mut exec = session.executor().unwrap();
    let mut batch = Batch::default();
    for (i, &t) in prompt.iter().enumerate() {
        batch.push(t, i as i32, 0, i + 1 == prompt.len());
    }
    let mut logits = vec![exec.forward(&session.model, &mut kv, &batch).unwrap()];
    for i in 0..n_gen {
        let last = logits.last().unwrap();
        let tok = (0..last.len())
            .max_by(|&a, &b| last[a].total_cmp(&last[b]).then(b.cmp(&a)))
            .unwrap() as u32;
        let mut b = Batch::default();
        b.push(tok, (prompt.len() + i) as i32, 0, true);
        logits.push(exec.forward(&session.model, &mut kv, &b).unwrap());
    }
    logits
        .into_iter()
        .map(|l| l.iter().map(|x| x.to_bits()).collect())
        .collect()
}
