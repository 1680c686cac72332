//! `ggml-harness plan`: the scheduler's plan of one forward pass.

use std::path::PathBuf;

use clap::Args;
use harness::error::{HarnessError, Result};
use harness::session::{Session, SplitMode};

use super::common::check_tflops;
use super::run_args::RunArgs;

/// The flags of `ggml-harness plan`.
#[derive(Args, Debug)]
pub struct PlanArgs {
    /// GGUF model (default: the cached SmolLM2, downloaded if missing).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Tokens in the batch the plan is made for.
    #[arg(long, default_value_t = 512)]
    tokens: usize,
    /// Pipeline slot whose plan is printed (every slot has its own copies).
    #[arg(long, default_value_t = 0)]
    slot: usize,
    /// Print ggml's plan (a host sync before every split) instead of ours.
    #[arg(long)]
    naive: bool,
    /// With --split-mode tensor: product speed per device for the all-gather cost model
    /// printed after the plan.
    #[arg(long, default_value_t = 400.0, value_name = "TFLOPS")]
    tflops: f64,
    #[command(flatten)]
    run: RunArgs,
}

/// Runs `ggml-harness plan`.
pub fn run(a: PlanArgs) -> Result<()> {
    let config = a.run.config()?;
    if a.slot >= config.n_copies {
        return Err(HarnessError::Usage(format!(
            "--slot {}: there are {} pipeline slots (--n-copies)",
            a.slot, config.n_copies
        )));
    }
    if a.tokens == 0 {
        return Err(HarnessError::Usage("--tokens must be at least 1".into()));
    }
    let session = Session::open(&harness::model_path(a.model.as_deref())?, config)?;
    let mut kv = session.kv_cache(a.tokens)?;
    let style = if a.naive {
        ggml_sched::PlanStyle::Naive
    } else {
        ggml_sched::PlanStyle::Minimal
    };
    let mut exec = session.sched_executor(style)?;
    let mut batch = harness::batch::Batch::default();
    for i in 0..a.tokens {
        batch.push(0, i as i32, 0, i + 1 == a.tokens);
    }
    exec.prepare(&session.model, &mut kv, &batch)?;
    let plan = exec
        .scheduler()
        .plan(a.slot)
        .ok_or_else(|| HarnessError::Usage("the scheduler made no plan".into()))?;
    print!("{plan}");
    if session.config.split_mode == SplitMode::TensorReduce {
        let points = harness::model::tp::reduce_points(&session.model)?;
        print!("{}", harness::model::tp::reduce_table(&points, a.tokens));
    }
    if session.config.split_mode == SplitMode::Tensor {
        let hp = &session.model.hp;
        let gathers =
            harness::cost::layer_gathers(hp.n_embd, hp.n_head * hp.head_dim, hp.n_ff, a.tokens);
        let mut devices = vec![session.backends.len(), 2, 4, 8];
        devices.sort_unstable();
        devices.dedup();
        check_tflops(a.tflops)?;
        println!();
        print!(
            "{}",
            harness::cost::table(&gathers, &devices, &harness::cost::LINKS, a.tflops * 1e12)
        );
    }
    Ok(())
}
