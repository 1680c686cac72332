//! `ggml-harness fit-cost-model`: the cost model's constants fitted to measurements.

use std::path::PathBuf;

use clap::Args;
use harness::error::{HarnessError, Result};
use harness::session::Session;

use super::run_args::RunArgs;

/// The flags of `ggml-harness fit-cost-model`.
#[derive(Args, Debug)]
pub struct FitArgs {
    /// GGUF model the measurements were made with (default: the cached SmolLM2).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The GPU whose constants are fitted: h100-sxm (or h100) or h200.
    #[arg(long)]
    gpu: String,
    /// A `ggml-harness calibrate` folder (probes.json, kernels.json).
    #[arg(
        long,
        value_name = "DIR",
        conflicts_with = "op_table",
        required_unless_present = "op_table"
    )]
    dir: Option<PathBuf>,
    /// A per-op table: `pass<TAB>op<TAB>calls<TAB>ms` lines (e.g.
    /// harness/reference/cuda-h200-op-times.tsv).
    #[arg(long, value_name = "FILE")]
    op_table: Option<PathBuf>,
    /// Passes whose rows the fit uses (the others are reported): default, every prompt
    /// pass (a generated token's op times include waits for the host).
    #[arg(long, value_delimiter = ',')]
    fit_pass: Vec<String>,
    /// Constants to fit (default: l2-bytes-per-clk, alu-latency, shared-latency,
    /// global-latency, special-latency; probes set others directly).
    #[arg(long, value_delimiter = ',')]
    tunables: Vec<String>,
    /// Interpret at most N blocks of each launch (0: all).
    #[arg(long, value_name = "N", default_value_t = 16)]
    sample_blocks: u64,
    /// How the measured kernels were launched: on a stream (op times of a run without
    /// CUDA graphs) or as graph nodes (a calibration folder's replays, default).
    #[arg(long)]
    stream_launches: bool,
    /// A `ggml-harness bench --json` output of the same commit and GPU (the kit's
    /// `tuning-<list>.json`): its pp512 and tg128 beside the passes modelled before and
    /// after the fit, a check the per-kernel rows cannot give (what kernels cost together,
    /// in a replayed graph). Profile with the `--cuda-tuning` it ran with. Repeatable.
    #[arg(long, value_name = "FILE")]
    bench: Vec<PathBuf>,
    /// Write the JSON report to FILE too.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    #[command(flatten)]
    run: RunArgs,
}

/// The cost-model constant named `name` in kebab case (`l2-bytes-per-clk`).
fn tunable_named(name: &str) -> Result<ggml_cuda::cuda_sim::cost::Tunable> {
    use ggml_cuda::cuda_sim::cost::Tunable;
    Tunable::ALL
        .into_iter()
        .find(|t| {
            let kebab: String = format!("{t:?}")
                .chars()
                .enumerate()
                .flat_map(|(i, c)| {
                    let dash = (i > 0 && c.is_ascii_uppercase()).then_some('-');
                    dash.into_iter().chain(std::iter::once(c.to_ascii_lowercase()))
                })
                .collect();
            kebab == name
        })
        .ok_or_else(|| {
            HarnessError::Usage(format!(
                "--tunables {name}: expected dram-efficiency, l2-bytes-per-clk, alu-latency, special-latency, shared-latency, global-latency, launch-stream, launch-graph-node or programmatic-launch"
            ))
        })
}

/// Runs `ggml-harness fit-cost-model`.
pub fn run(a: FitArgs) -> Result<()> {
    use ggml_cuda::cuda_sim::cost::{self, GpuSpec, LaunchKind, Tunable};
    use harness::{fit, profile};
    let mut spec = GpuSpec::named(&a.gpu).ok_or_else(|| {
        HarnessError::Usage(format!(
            "--gpu {}: expected one of {}",
            a.gpu,
            GpuSpec::NAMES.join(", ")
        ))
    })?;
    let tunables = if a.tunables.is_empty() {
        vec![
            Tunable::L2BytesPerClk,
            Tunable::AluLatency,
            Tunable::SharedLatency,
            Tunable::GlobalLatency,
            Tunable::SpecialLatency,
        ]
    } else {
        a.tunables
            .iter()
            .map(|t| tunable_named(t))
            .collect::<Result<Vec<_>>>()?
    };
    let table = a.op_table.as_deref().map(fit::read_op_table).transpose()?;
    // The prompt length the measurements used: the first ppN pass.
    let n_prompt = match (&table, &a.dir) {
        (Some(t), _) => t
            .iter()
            .find_map(|r| r.pass.strip_prefix("pp")?.parse().ok()),
        (None, Some(d)) => {
            let p = d.join("kernels.json");
            let text = std::fs::read_to_string(&p).map_err(|source| HarnessError::Io {
                path: p.display().to_string(),
                source,
            })?;
            serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v["n_prompt"].as_u64())
                .map(|n| n as usize)
        }
        (None, None) => None,
    }
    .unwrap_or(512);
    let committed = spec.clone();
    let notes = match &a.dir {
        Some(d) => fit::apply_probes(&mut spec, &d.join("probes.json"))?,
        None => Vec::new(),
    };
    let launch = if a.stream_launches || a.dir.is_none() {
        LaunchKind::Stream
    } else {
        LaunchKind::GraphNode
    };
    // The same kernels as `profile` prices (on Hopper: the sm_90 text, with programmatic
    // dependent launch), so that a fit's constants mean the same to both.
    super::profile::emulate_the_priced_architecture(&spec)?;
    let config = a.run.config()?;
    let tuning = config.cuda_tuning.to_string();
    let mut bench = Vec::new();
    for file in &a.bench {
        let (ran, figures) = fit::read_bench(file)?;
        if let Some(ran) = ran.filter(|r| *r != tuning) {
            return Err(HarnessError::Usage(format!(
                "--bench {}: measured with --cuda-tuning {ran}, profiled with {tuning}: pass --cuda-tuning {ran}",
                file.display()
            )));
        }
        bench.extend(figures);
    }
    let settings = profile::ProfileSettings {
        gpu: spec.clone(),
        sample_blocks: (a.sample_blocks > 0).then_some(a.sample_blocks),
        n_prompt,
        n_gen: 1,
        gen_position: 0,
        launch,
        stall_lines: false,
    };
    let path = harness::model_path(a.model.as_deref())?;
    let session = Session::open(&path, config.clone())?;
    let mut kv = session.kv_cache(n_prompt)?;
    let mut exec = session.executor()?;
    eprintln!(
        "fit-cost-model: profiling pp{n_prompt} and a generated token on {}",
        config.devices
    );
    let launches = profile::profile_model(
        &session.model,
        exec.as_mut(),
        &mut kv,
        &session.cuda_backends(),
        &settings,
    )?;
    let measured = match (table, &a.dir) {
        (Some(t), _) => t,
        (None, Some(d)) => fit::rows_from_kernels(&d.join("kernels.json"), &launches)?,
        (None, None) => unreachable!("clap requires --dir or --op-table"),
    };
    let fit_passes: Vec<String> = if a.fit_pass.is_empty() {
        measured
            .iter()
            .filter(|r| r.pass.starts_with("pp"))
            .map(|r| r.pass.clone())
            .collect()
    } else {
        a.fit_pass.clone()
    };
    let rows = fit::fit_rows(&launches, &measured, &fit_passes, launch)?;
    let fitted =
        cost::fit(&spec, &rows, &tunables).map_err(|e| HarnessError::Model(e.to_string()))?;
    print!(
        "{}",
        fit::report(&committed, &spec, &rows, &fitted, &notes)?
    );
    let end_to_end = if bench.is_empty() {
        Vec::new()
    } else {
        let mut after = launches.clone();
        profile::reprice(&mut after, &fitted.spec, launch)?;
        let rows = fit::end_to_end(&launches, &after, &bench);
        print!("\n{}", fit::end_to_end_table(&rows));
        rows
    };
    if let Some(out) = &a.out {
        let run = serde_json::json!({
            "model": path.file_name().map(|n| n.to_string_lossy().to_string()),
            "devices": config.devices.to_string(),
            "tuning": config.cuda_tuning.to_string(),
            "measured": a.dir.as_ref().or(a.op_table.as_ref()).map(|p| p.display().to_string()),
            "sample_blocks": settings.sample_blocks,
        });
        let mut v = fit::report_json(&spec, &fitted, &notes, run);
        v["end_to_end"] = fit::end_to_end_json(&end_to_end);
        std::fs::write(out, serde_json::to_string_pretty(&v).expect("JSON") + "\n").map_err(
            |source| HarnessError::Io {
                path: out.display().to_string(),
                source,
            },
        )?;
    }
    Ok(())
}
