//! `ggml-harness perplexity`: perplexity (and KL divergence) over a text.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use harness::error::{HarnessError, Result};
use harness::perplexity::{perplexity, PplSettings};
use harness::session::Session;

use super::common::{report_races, write_trace};
use super::run_args::RunArgs;

/// The flags of `ggml-harness perplexity`.
#[derive(Args, Debug)]
pub struct PplArgs {
    /// GGUF model (default: the cached SmolLM2, downloaded if missing).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Text file (default: the embedded GPL-3 corpus).
    #[arg(long)]
    file: Option<PathBuf>,
    /// Tokens per chunk.
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Tokens per decode call.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    #[command(flatten)]
    run: RunArgs,
    /// Process at most this many chunks.
    #[arg(long)]
    chunks: Option<usize>,
    /// Print one JSON object instead of llama-perplexity's text.
    #[arg(long)]
    json: bool,
    /// Write a Chrome trace-event timeline of every queue and host action to FILE (see
    /// `trace-summary`).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Also compare our logits with the base model's log-probabilities in FILE, written by
    /// `llama-perplexity --kl-divergence-base FILE` over the same text and --ctx, and print
    /// llama-perplexity --kl-divergence's table and statistics (KL divergence, Δp, same
    /// top token).
    #[arg(long, value_name = "FILE")]
    kl_divergence_base: Option<PathBuf>,
}

/// Runs `ggml-harness perplexity`.
pub fn run(a: PplArgs) -> Result<()> {
    let t0 = Instant::now();
    let settings = PplSettings {
        n_ctx: a.ctx,
        n_batch: a.batch,
        max_chunks: a.chunks,
    };
    // Before the model loads: a bad flag fails at once.
    settings.check()?;
    let config = a.run.config()?;
    let session = Session::open(&harness::model_path(a.model.as_deref())?, config.clone())?;
    let text = harness::corpus_text(a.file.as_deref())?;
    // As common_tokenize(add_special = true): BOS first when the vocabulary adds it.
    let tokens = session.tokenizer.encode(&text);
    let bos = session
        .tokenizer
        .add_bos()
        .then(|| session.tokenizer.bos())
        .flatten();
    let n_seq = (a.batch / a.ctx).max(1);
    let mut kv = session.kv_cache(a.ctx * n_seq)?;
    let mut exec = session.executor()?;
    if a.trace.is_some() {
        exec.enable_trace();
    }
    let show_bar = !a.json && std::io::stderr().is_terminal();
    let bar = show_bar.then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} chunks, {elapsed} elapsed, eta {eta}",
            )
            .expect("valid template"),
        );
        b
    });
    if !a.json {
        let n_chunk = (tokens.len() / a.ctx).min(a.chunks.unwrap_or(usize::MAX));
        eprintln!(
            "perplexity: calculating perplexity over {n_chunk} chunks, n_ctx={}, batch_size={}, n_seq={n_seq}",
            a.ctx,
            a.batch.min(a.ctx * n_seq)
        );
    }
    let mut kl = match &a.kl_divergence_base {
        Some(p) => Some(harness::kl::KlRun::new(harness::kl::KlBase::open(p)?)),
        None => None,
    };
    // Progress after each chunk: llama-perplexity's `[i]ppl,` or, with a base file, a row
    // of its --kl-divergence table.
    let progress = |i: usize, n: usize, p: f64, st: Option<&harness::kl::KlStats>| {
        if let Some(b) = &bar {
            b.set_length(n as u64);
            b.set_position(i as u64 + 1);
        }
        if !a.json {
            let s = match st {
                None => format!("[{}]{p:.4},", i + 1),
                Some(st) if i == 0 => {
                    format!(
                        "{}\n{}",
                        harness::kl::KlStats::TABLE_HEADER,
                        st.chunk_line(i)
                    )
                }
                Some(st) => st.chunk_line(i),
            };
            if let Some(b) = &bar {
                b.println(&s);
            } else if st.is_some() {
                println!("{s}");
            } else {
                print!("{s}");
                let _ = std::io::stdout().flush();
            }
        }
    };
    let r = match kl.as_mut() {
        None => perplexity(
            &session.model,
            exec.as_mut(),
            &mut kv,
            &tokens,
            bos,
            settings,
            |i, n, p| progress(i, n, p, None),
        )?,
        Some(kl) => harness::perplexity::perplexity_kl(
            &session.model,
            exec.as_mut(),
            &mut kv,
            &tokens,
            bos,
            settings,
            kl,
            |i, n, p, st| progress(i, n, p, Some(st)),
        )?,
    };
    let kl_report = kl.as_ref().and_then(|k| k.stats.report());
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    harness::faults::require_fired(&session)?;
    let seconds = t0.elapsed().as_secs_f64();
    write_trace(exec.as_mut(), a.trace.as_deref())?;
    let races = report_races(&session)?;
    if a.json {
        let mut v = serde_json::json!({
            "ppl": r.ppl,
            "ppl_f64_bits": format!("{:016x}", r.ppl.to_bits()),
            "ppl_stderr": r.ppl_stderr,
            "nll_sum": r.nll_sum,
            "n_scored": r.n_scored,
            "chunks": r.chunks,
            "logits_sha256": r.logits_sha256,
            "devices": config.devices.to_string(),
            "split_mode": config.split_mode.name(),
            "n_copies": config.n_copies,
            "seconds": seconds,
            "races": races,
        });
        if let Some(k) = &kl_report {
            v["kl_divergence"] = serde_json::to_value(k).expect("serialisable");
        }
        println!("{v}");
    } else {
        println!();
        println!("Final estimate: PPL = {:.4} +/- {:.5}", r.ppl, r.ppl_stderr);
        if let Some(k) = &kl_report {
            if k.count < 100 {
                // llama-perplexity prints no statistics over so few values.
                eprintln!(
                    "kl-divergence: only {} tokens scored; llama-perplexity prints no statistics under 100",
                    k.count
                );
            } else {
                println!();
                print!("{k}");
            }
        }
        eprintln!("({} tokens scored in {seconds:.1} s)", r.n_scored);
    }
    if races > 0 {
        return Err(HarnessError::Usage(format!(
            "the happens-before checker found {races} races"
        )));
    }
    Ok(())
}
