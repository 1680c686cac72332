//! `ggml-harness bench`: prompt-processing and generation speed, like llama-bench.

use std::path::PathBuf;

use clap::Args;
use harness::error::Result;
use harness::session::Session;

use super::common::write_trace;
use super::run_args::RunArgs;

/// The flags of `ggml-harness bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// GGUF model (default: the cached SmolLM2, downloaded if missing).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Prompt tokens of the pp test (0 skips it).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    n_prompt: usize,
    /// Generated tokens of the tg test (0 skips it).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n_gen: usize,
    /// Repetitions of each test (after one warm-up).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    reps: usize,
    /// No warm-up run before the timed ones (as llama-bench's `--no-warmup`).
    #[arg(long)]
    no_warmup: bool,
    #[command(flatten)]
    run: RunArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Write a Chrome trace-event timeline of every queue and host action to FILE (see
    /// `trace-summary`).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// After the benchmark, one more pp and tg run with every node timed: prints the time
    /// per kind of op and device (MUL_MAT by weight type; on GPUs from timed events).
    #[arg(long)]
    op_times: bool,
}

/// Runs `ggml-harness bench`.
pub fn run(a: BenchArgs) -> Result<()> {
    let config = a.run.config()?;
    let path = harness::model_path(a.model.as_deref())?;
    let session = Session::open(&path, config.clone())?;
    let mut kv = session.kv_cache(a.n_prompt.max(a.n_gen).max(1))?;
    let on_gpu = !session.cuda_backends().is_empty();
    let mut exec = session.executor()?;
    if a.trace.is_some() {
        exec.enable_trace();
    }
    let runs = harness::bench::Runs {
        reps: a.reps,
        warmup: !a.no_warmup,
    };
    let mut results = Vec::new();
    if a.n_prompt > 0 {
        results.push(harness::bench::bench_pp(
            &session.model,
            exec.as_mut(),
            &mut kv,
            a.n_prompt,
            runs,
            &session.cuda_backends(),
        )?);
    }
    if a.n_gen > 0 {
        let launches = || -> (u64, u64) {
            let cuda = session.cuda_backends();
            let k = cuda
                .iter()
                .map(|b| b.kernel_stats().launches.iter().sum::<u64>())
                .sum();
            let sim = cuda
                .iter()
                .any(|b| b.driver_kind() == ggml_cuda::DriverKind::Sim);
            let w = if sim {
                ggml_cuda::sim_driver().map_or(0, |d| d.warp_instructions())
            } else {
                0
            };
            (k, w)
        };
        let before = launches();
        results.push(harness::bench::bench_tg(
            &session.model,
            exec.as_mut(),
            &mut kv,
            a.n_gen,
            runs,
            &session.cuda_backends(),
        )?);
        let after = launches();
        // Every generated token of the test, the warm-up run's included.
        let tokens = ((a.reps + usize::from(runs.warmup)) * a.n_gen) as f64;
        if on_gpu {
            eprint!(
                "tg{}: {:.1} CUDA kernel launches per token",
                a.n_gen,
                (after.0 - before.0) as f64 / tokens
            );
            if after.1 > before.1 {
                eprint!(
                    ", {:.0} warp instructions per token (cuda-sim)",
                    (after.1 - before.1) as f64 / tokens
                );
            }
            eprintln!(" (tuning: {})", config.cuda_tuning);
        }
    }
    write_trace(exec.as_mut(), a.trace.as_deref())?;
    harness::faults::require_fired(&session)?;
    let profiles = if a.op_times {
        harness::bench::op_profile(
            &session.model,
            exec.as_mut(),
            &mut kv,
            &session.timed_backends(),
            a.n_prompt,
            a.n_gen,
        )?
    } else {
        Vec::new()
    };
    drop(exec);
    drop(kv);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    // After the runs, so that it does not evict the weights from the caches first; only
    // where the weights are in host memory (the CPU devices).
    let probe = (a.n_gen > 0 && !on_gpu).then(|| harness::bench::read_bandwidth(config.threads));
    if a.json {
        let v = serde_json::json!({
            "model": name,
            "threads": config.threads,
            "devices": config.devices.to_string(),
            "split_mode": config.split_mode.name(),
            "n_copies": config.n_copies,
            "cuda_tuning": config.cuda_tuning.to_string(),
            "results": results,
            "read_probe_bytes_per_s": probe,
            "op_times": profiles.iter().map(|p| serde_json::json!({
                "test": p.test,
                "device": p.device,
                "wall_ms": p.wall_ms,
                "ops": p.ops.iter().map(|o| serde_json::json!({
                    "op": o.to_string(), "calls": o.calls, "ms": o.ms,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        });
        println!("{v}");
    } else {
        print!(
            "{}",
            harness::bench::table(&name, config.threads, &config.devices.to_string(), &results)
        );
        print!(
            "{}",
            harness::bench::bandwidth_lines(&results, probe, config.threads)
        );
        print!("{}", harness::bench::host_counter_lines(&results));
        print!("{}", harness::bench::op_profile_table(&profiles));
    }
    Ok(())
}
