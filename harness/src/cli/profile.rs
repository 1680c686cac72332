//! `ggml-harness profile`: a model's passes on cuda-sim, priced by the cost model.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use harness::error::{HarnessError, Result};
use harness::session::Session;

use super::run_args::RunArgs;

/// The flags of `ggml-harness profile`.
#[derive(Args, Debug)]
pub struct ProfileArgs {
    /// GGUF model (default: the cached SmolLM2).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The GPU the cost model prices: h100-sxm (or h100) or h200.
    #[arg(long, default_value = "h200")]
    gpu: String,
    /// Prompt tokens of the prompt pass (0 skips it).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    n_prompt: usize,
    /// Generated tokens the generation figure is named after (0 skips the generated
    /// token); each token is modelled as one decode at --gen-position.
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n_gen: usize,
    /// The decoded token's position: the cache first holds that many tokens (computed,
    /// not profiled), which its attention reads. 0: a generation's first token; 64: the
    /// mean over a 128-token generation.
    #[arg(long, value_name = "P", default_value_t = 0)]
    gen_position: usize,
    /// Interpret at most N evenly spaced blocks of each launch and scale the counts
    /// (0: every block; minutes per pass on the real model).
    #[arg(long, value_name = "N", default_value_t = 16)]
    sample_blocks: u64,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    json: bool,
    /// After the tables, where the critical path of each op's longest launch spent its
    /// cycles (through a barrier, along the warp that reached it last): its label regions
    /// and its N costliest PTX lines (0: off).
    #[arg(long, value_name = "N", default_value_t = 0)]
    stalls: usize,
    /// A `ggml-harness bench --json` output measured on the priced GPU (same commit):
    /// its tokens per second are printed beside the modelled ones. It must have run with
    /// this run's `--cuda-tuning`.
    #[arg(long, value_name = "BENCH_JSON")]
    against: Option<PathBuf>,
    #[command(flatten)]
    run: RunArgs,
}

/// Makes cuda-sim's devices the architecture `gpu` is (sm_90 for the Hopper GPUs), so
/// that the kernels run as they would there (the sm_90 text of the PTX, launched with
/// programmatic stream serialisation where they wait for the grid before), unless
/// `CUDA_SIM_ARCH` says otherwise.
pub(crate) fn emulate_the_priced_architecture(
    gpu: &ggml_cuda::cuda_sim::cost::GpuSpec,
) -> Result<()> {
    use ggml_cuda::cuda_sim::driver::{Driver, SimConfig};
    let mut cfg = SimConfig::from_env().map_err(HarnessError::Usage)?;
    if std::env::var_os("CUDA_SIM_ARCH").is_none() {
        let cc = gpu.arch.compute_capability;
        cfg.compute_capability = if cc >= 90 { (9, 0) } else { (8, 0) };
    }
    Driver::configure_global(cfg).map_err(|e| HarnessError::Model(e.detail))
}

/// The figures of the bench output at `path`, refused unless it ran with `tuning` (an
/// output from before bench recorded its tuning is taken as the default's).
fn measured_with(
    path: &std::path::Path,
    tuning: &ggml_cuda::CudaTuning,
) -> Result<Vec<harness::fit::BenchFigure>> {
    let (recorded, figures) = harness::fit::read_bench(path)?;
    let ran: ggml_cuda::CudaTuning = match recorded.as_deref() {
        Some(t) => t.parse().map_err(|e| {
            HarnessError::Usage(format!(
                "--against {}: its cuda_tuning: {e}",
                path.display()
            ))
        })?,
        None => ggml_cuda::CudaTuning::default(),
    };
    if ran != *tuning {
        return Err(HarnessError::Usage(format!(
            "--against {}: measured with --cuda-tuning {ran}, this profile runs {tuning}: \
             pass --cuda-tuning {ran}",
            path.display()
        )));
    }
    Ok(figures)
}

/// Runs `ggml-harness profile`.
pub fn run(a: ProfileArgs) -> Result<()> {
    use harness::profile;
    let gpu = ggml_cuda::cuda_sim::cost::GpuSpec::named(&a.gpu).ok_or_else(|| {
        HarnessError::Usage(format!(
            "--gpu {}: expected one of {}",
            a.gpu,
            ggml_cuda::cuda_sim::cost::GpuSpec::NAMES.join(", ")
        ))
    })?;
    let config = a.run.config()?;
    let against = match &a.against {
        Some(p) => Some(measured_with(p, &config.cuda_tuning)?),
        None => None,
    };
    let settings = profile::ProfileSettings {
        gpu,
        sample_blocks: (a.sample_blocks > 0).then_some(a.sample_blocks),
        n_prompt: a.n_prompt,
        n_gen: a.n_gen,
        gen_position: a.gen_position,
        launch: if config.cuda_tuning.graphs {
            ggml_cuda::cuda_sim::cost::LaunchKind::GraphNode
        } else {
            ggml_cuda::cuda_sim::cost::LaunchKind::Stream
        },
        stall_lines: a.stalls > 0,
    };
    emulate_the_priced_architecture(&settings.gpu)?;
    let path = harness::model_path(a.model.as_deref())?;
    let session = Session::open(&path, config.clone())?;
    let mut kv = session.kv_cache(a.n_prompt.max(a.gen_position + 1))?;
    let mut exec = session.executor()?;
    let t0 = Instant::now();
    let launches = profile::profile_model(
        &session.model,
        exec.as_mut(),
        &mut kv,
        &session.cuda_backends(),
        &settings,
    )?;
    // The bench's figures beside the same tests priced from these launches.
    let against = against.map(|figures| harness::fit::end_to_end(&launches, &launches, &figures));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    if a.json {
        let run = serde_json::json!({
            "model": name,
            "devices": config.devices.to_string(),
            "tuning": config.cuda_tuning.to_string(),
            "seconds": t0.elapsed().as_secs_f64(),
        });
        let mut v = profile::json(&launches, &settings, run);
        if let Some(rows) = &against {
            v["against"] = harness::fit::measured_against_modelled_json(rows);
        }
        println!("{v}");
        return Ok(());
    }
    println!(
        "{name} on {} priced for {} (MODELLED, not measured; {}; {}; {})",
        config.devices,
        settings.gpu.name,
        match settings.sample_blocks {
            Some(n) => format!("at most {n} blocks of each launch interpreted, counts scaled"),
            None => "every block interpreted".into(),
        },
        match settings.launch {
            ggml_cuda::cuda_sim::cost::LaunchKind::GraphNode => "kernels as graph nodes",
            ggml_cuda::cuda_sim::cost::LaunchKind::Stream => "kernels launched on a stream",
        },
        if launches.iter().any(|l| l.programmatic) {
            "programmatic dependent launch"
        } else {
            "no programmatic dependent launch"
        }
    );
    let pp = format!("pp{}", a.n_prompt);
    for pass in [pp.as_str(), "tg"] {
        if launches.iter().any(|l| l.pass == pass) {
            println!();
            print!("{}", profile::table(&launches, pass));
            if a.stalls > 0 {
                println!();
                print!("{}", profile::stall_report(&launches, pass, a.stalls));
            }
        }
    }
    let pp_s = profile::pass_seconds(&launches, &pp);
    let tg_s = profile::pass_seconds(&launches, "tg");
    println!();
    if pp_s > 0.0 {
        println!(
            "modelled pp{}: {:.0} t/s (tensor-core share of multiply-adds {:.2} %)",
            a.n_prompt,
            a.n_prompt as f64 / pp_s,
            100.0 * profile::tensor_core_fraction(&launches, &pp)
        );
    }
    if tg_s > 0.0 {
        println!(
            "modelled tg{}: {:.0} t/s (tensor-core share {:.2} %)",
            a.n_gen,
            1.0 / tg_s,
            100.0 * profile::tensor_core_fraction(&launches, "tg")
        );
    }
    if let Some(rows) = &against {
        println!();
        print!("{}", harness::fit::measured_against_modelled_table(rows));
    }
    match settings.gpu.calibration() {
        Some(c) => {
            let families: Vec<&str> = c.families.iter().map(|f| f.family.as_str()).collect();
            println!(
                "constants fitted on {} at {} ({}); calibrated families: {}; \
                 the others' modelled times are uncalibrated",
                c.gpu,
                c.commit,
                c.file,
                families.join(", ")
            );
        }
        None => println!(
            "no calibration on {}: every modelled time above is uncalibrated",
            settings.gpu.name
        ),
    }
    eprintln!("profile: {:.1} s on cuda-sim", t0.elapsed().as_secs_f64());
    Ok(())
}
