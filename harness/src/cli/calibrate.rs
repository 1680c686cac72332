//! `ggml-harness calibrate`: a CUDA device's microbenchmarks and kernel times.

use std::path::PathBuf;

use clap::Args;
use harness::error::{HarnessError, Result};
use harness::session::Session;

use super::run_args::RunArgs;

/// The flags of `ggml-harness calibrate`.
#[derive(Args, Debug)]
pub struct CalibrateArgs {
    /// GGUF model whose kernels are timed (default: the cached SmolLM2).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Folder the files are written to (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Prompt tokens of the timed prompt pass.
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    n_prompt: usize,
    /// Timed repetitions of each kernel, cold and warm.
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    reps: usize,
    /// The smallest probe sizes and a 64 KiB flush: a dry run of every step (cuda-sim).
    #[arg(long)]
    tiny: bool,
    /// Only the microbenchmarks, no model.
    #[arg(long)]
    probes_only: bool,
    /// The commit the binary was built from, written into the files.
    #[arg(long, default_value = "unknown")]
    commit: String,
    #[command(flatten)]
    run: RunArgs,
}

/// Runs `ggml-harness calibrate`.
pub fn run(a: CalibrateArgs) -> Result<()> {
    use harness::calibrate;
    let config = a.run.config()?;
    let io = |source| HarnessError::Io {
        path: a.out.display().to_string(),
        source,
    };
    std::fs::create_dir_all(&a.out).map_err(io)?;
    let (size, flush) = match a.tiny {
        true => (ggml_cuda::ProbeSize::Tiny, 64 << 10),
        false => (ggml_cuda::ProbeSize::Full, calibrate::FLUSH_BYTES),
    };
    let backends = harness::session::create_backends(&config)?;
    let cuda: Vec<&ggml_cuda::CudaBackend> = backends
        .iter()
        .filter_map(|b| b.as_any().downcast_ref::<ggml_cuda::CudaBackend>())
        .collect();
    let [gpu] = cuda.as_slice() else {
        return Err(HarnessError::Usage(format!(
            "calibrate measures one CUDA device; --devices {} has {}",
            config.devices,
            cuda.len()
        )));
    };
    eprintln!(
        "calibrate: probes on {} ({})",
        ggml_core::Backend::name(*gpu),
        gpu.device_name()
    );
    let c = gpu.calibrate(size)?;
    for p in &c.probes {
        eprintln!(
            "  {:<18} {:>12.4e} {}/s  ({:.3} ms; {})",
            p.name,
            p.rate(),
            p.unit,
            p.seconds * 1e3,
            p.detail
        );
    }
    calibrate::write_json(
        &a.out,
        "probes.json",
        &calibrate::probes_json(&c, &a.commit),
    )?;
    drop(backends);
    if a.probes_only {
        return Ok(());
    }
    let path = harness::model_path(a.model.as_deref())?;
    let session = Session::open(&path, config)?;
    let mut kv = session.kv_cache(a.n_prompt.max(1))?;
    let mut exec = session.executor()?;
    eprintln!(
        "calibrate: every kernel of pp{} and one generated token, alone",
        a.n_prompt
    );
    let rows = calibrate::time_model_kernels(
        &session.model,
        exec.as_mut(),
        &mut kv,
        &session.cuda_backends(),
        a.n_prompt,
        a.reps,
        flush,
    )?;
    print!("{}", calibrate::summary_table(&rows));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    calibrate::write_json(
        &a.out,
        "kernels.json",
        &serde_json::json!({
            "model": name,
            "commit": a.commit,
            "n_prompt": a.n_prompt,
            "repetitions": a.reps,
            "flush_bytes": flush,
            "tuning": session.cuda_backends().first().map(|b| b.tuning().to_string()),
            "launches": rows,
        }),
    )
}
