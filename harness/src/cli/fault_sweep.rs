//! `ggml-harness fault-sweep`: a fault injected at every op, every run checked.

use std::path::PathBuf;

use clap::Args;
use harness::error::{HarnessError, Result};
use harness::session::AllGather;

use super::run_args::SplitModeArg;

/// The flags of `ggml-harness fault-sweep`.
#[derive(Args, Debug)]
pub struct FaultSweepArgs {
    /// GGUF model (default: the synthetic llama the tests use, Q4_1).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Devices, as --devices.
    #[arg(long, default_value = "cpu:2")]
    devices: String,
    /// Split mode.
    #[arg(long, value_enum, default_value_t = SplitModeArg::Layer)]
    split_mode: SplitModeArg,
    /// Pipeline slots (2: another pass is in flight when the fault hits).
    #[arg(long, default_value_t = 2)]
    n_copies: usize,
    /// Tokens per micro-batch.
    #[arg(long, default_value_t = 16)]
    ubatch: usize,
    /// Threads in total.
    #[arg(short = 't', long, default_value_t = 2)]
    threads: usize,
    /// Inject at every N-th op only.
    #[arg(long, default_value_t = 1)]
    every: usize,
    /// Seconds the host waits for a hung device.
    #[arg(long, default_value_t = 0.5)]
    wait_timeout: f64,
    /// Only these kinds, comma-separated (default: alloc, kernel and hang, and on
    /// cuda-sim devices illegal-address, launch, peer-copy and event too).
    #[arg(long, value_delimiter = ',', value_name = "KIND,...", value_parser = parse_inject_kind)]
    kinds: Vec<harness::faults::InjectKind>,
    /// Print every faulty run.
    #[arg(long)]
    verbose: bool,
}

/// Parses a `--kinds` name.
fn parse_inject_kind(s: &str) -> std::result::Result<harness::faults::InjectKind, String> {
    harness::faults::InjectKind::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = harness::faults::InjectKind::ALL
            .iter()
            .map(|k| k.name())
            .collect();
        format!("unknown fault kind (one of {})", names.join(", "))
    })
}

/// Runs `ggml-harness fault-sweep`.
pub fn run(a: FaultSweepArgs) -> Result<()> {
    if !(a.wait_timeout.is_finite() && a.wait_timeout > 0.0) {
        return Err(HarnessError::Usage(format!(
            "--wait-timeout {}: must be positive",
            a.wait_timeout
        )));
    }
    let model = match &a.model {
        Some(p) => harness::model_path(Some(p))?,
        None => harness::synthetic::cached_model(ggml_core::DType::Q4_1)?,
    };
    let cell = harness::regress::Cell {
        devices: a.devices.parse()?,
        split: a.split_mode.into(),
        n_copies: a.n_copies,
        threads: a.threads,
        n_ubatch: a.ubatch,
        reduce_bf16_min: None,
        all_gather: AllGather::Concat,
    };
    let settings = harness::regress::RegressSettings {
        ppl: harness::perplexity::PplSettings {
            n_ctx: 48,
            n_batch: 96,
            max_chunks: Some(2),
        },
        check_races: false,
        chaos: None,
        weaken: Vec::new(),
    };
    let text = &harness::default_corpus()[..1500];
    let timeout = std::time::Duration::from_secs_f64(a.wait_timeout);
    let limit = 20.0 * a.wait_timeout + 30.0;
    let mut by_kind: Vec<(harness::faults::InjectKind, harness::faults::SweepSummary)> = Vec::new();
    let summary = harness::faults::sweep(
        &model,
        text,
        &cell,
        &settings,
        harness::faults::SweepOptions {
            every: a.every,
            timeout,
            limit,
            kinds: a.kinds.clone(),
        },
        |r, later| {
            match by_kind.iter_mut().find(|(k, _)| *k == r.spec.kind) {
                Some((_, s)) => s.add(r, later, limit),
                None => {
                    let mut s = harness::faults::SweepSummary::default();
                    s.add(r, later, limit);
                    by_kind.push((r.spec.kind, s));
                }
            }
            if a.verbose || (r.fired && !(r.named && later == Some(true))) {
                eprintln!(
                    "{} fired={} {:.2}s leaked={} later={later:?}: {}",
                    r.spec,
                    r.fired,
                    r.seconds,
                    r.leaked_bytes,
                    r.error.as_deref().unwrap_or("no error")
                );
            }
        },
    )?;
    println!("{}", harness::faults::SweepSummary::HEADER);
    for (kind, s) in &by_kind {
        println!("{}", s.row(&a.devices, kind.name()));
    }
    println!("{}", summary.row(&a.devices, "all"));
    if summary.clean() {
        Ok(())
    } else {
        Err(HarnessError::Usage(
            "the fault sweep found problems (see above)".into(),
        ))
    }
}
