//! `ggml-harness`: perplexity, generation and tokenization on GGUF models (llama, gemma3).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use harness::error::{HarnessError, Result};

mod cli;

/// Perplexity, generation and tokenization on GGUF models (llama, gemma3), on CPU and CUDA
/// backends.
#[derive(Parser, Debug)]
#[command(name = "ggml-harness", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Perplexity of a model over a text, as llama-perplexity computes it.
    Perplexity(cli::perplexity::PplArgs),
    /// Prints the token ids of a text, one per line.
    Tokenize(cli::tokenize::TokenizeArgs),
    /// Runs a regression matrix (a TOML file of cells and rules; default: the CPU matrix)
    /// and fails if any rule breaks or any cell moves from its golden.
    Regress(cli::regress::RegressArgs),
    /// Prompt-processing and generation speed, like llama-bench.
    Bench(cli::bench::BenchArgs),
    /// Measures a CUDA device for the cost model: microbenchmarks (probes.json) and every
    /// kernel of a prompt pass and a generated token timed alone (kernels.json).
    Calibrate(cli::calibrate::CalibrateArgs),
    /// Counts every kernel launch of a prompt pass and a generated token on cuda-sim and
    /// prices it with the cost model of a named GPU: modelled (not measured) time per op,
    /// the counters beside it, and modelled pp/tg tokens per second.
    Profile(cli::profile::ProfileArgs),
    /// Fits the cost model's constants to what a GPU measured (a `calibrate` folder or a
    /// per-op table), profiling the same passes on cuda-sim, and prints every row's error.
    FitCostModel(cli::fit_cost_model::FitArgs),
    /// Prints the scheduler's plan of one forward pass: per split, its waits, copies,
    /// compute and records, and the host syncs they cost.
    Plan(cli::plan::PlanArgs),
    /// Injects a fault at every op of a forward pass (every kind, every device) and
    /// checks each run fails with an error naming device, op and cause, in time, without
    /// leaks, and that a clean run afterwards gives the same bits; prints the summary.
    FaultSweep(cli::fault_sweep::FaultSweepArgs),
    /// Predicts the copy time that the all-gathers of the exact tensor split expose,
    /// whole (concat) or pipelined with their products (ring), for layer shapes, device
    /// counts and links (PCIe 4, PCIe 5, NVLink 4).
    CostModel(cli::cost_model::CostModelArgs),
    /// Continues a prompt: greedy by default (as llama-simple), or sampled with
    /// --temp/--top-k/--top-p/--seed; streams the text, then prints tokens per second.
    Generate(cli::generate::GenerateArgs),
    /// Downloads a known model (default: SmolLM2) into the cache and prints its path.
    FetchModel {
        /// Which model: smollm2-135m or gemma3-270m.
        #[arg(long, default_value = "smollm2-135m")]
        model: String,
    },
    /// Writes a synthetic model the tests use (llama: 4 layers, 256 wide, GQA, byte
    /// vocabulary; gemma3: 6 layers with sliding windows, SentencePiece vocabulary;
    /// seeded weights) as a GGUF file, e.g. for runs on cuda-sim in CI.
    SynthModel {
        /// Architecture: llama or gemma3.
        #[arg(long, default_value = "llama")]
        arch: String,
        /// Output GGUF file.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// dtype of every matrix but the token embedding (f32, f16, bf16, q4_0, q4_1,
        /// q5_0, q5_1, q8_0, q4_k, q6_k, ...).
        #[arg(long, default_value = "q4_1", value_name = "T")]
        dtype: String,
        /// Seed of the weights.
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// Upcycles a dense llama model (e.g. SmolLM2) into a mixture of experts in Mixtral's
    /// layout, which llama.cpp loads as is, and prints a one-line summary.
    MakeMoe(MakeMoeArgs),
    /// Summarises a `--trace` file: busy and idle time per queue, overlap of the queues,
    /// the sync pattern of each split and the host syncs by rule.
    TraceSummary {
        /// Trace file written by `perplexity --trace` or `bench --trace`.
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Debug)]
struct MakeMoeArgs {
    /// Dense llama GGUF model or a known model's name (default: the cached SmolLM2).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Experts per feed-forward block (2..=1024).
    #[arg(long, default_value_t = 4)]
    experts: usize,
    /// Experts each token uses (1..=experts).
    #[arg(long, default_value_t = 2)]
    used: usize,
    /// Seed of the experts' noise and of the routers.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Noise of each expert weight, relative to the RMS of its row (one standard
    /// deviation; requantisation adds its own).
    #[arg(long, default_value_t = harness::make_moe::DEFAULT_NOISE)]
    noise: f32,
    /// Standard deviation of the routers' logits for a typical hidden state.
    #[arg(long, default_value_t = harness::make_moe::DEFAULT_ROUTER_SCALE)]
    router_scale: f32,
    /// Output GGUF file.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Perplexity(a) => cli::perplexity::run(a),
        Command::Tokenize(a) => cli::tokenize::run(a),
        Command::Bench(a) => cli::bench::run(a),
        Command::Calibrate(a) => cli::calibrate::run(a),
        Command::Profile(a) => cli::profile::run(a),
        Command::FitCostModel(a) => cli::fit_cost_model::run(a),
        Command::Regress(a) => cli::regress::run(a),
        Command::Plan(a) => cli::plan::run(a),
        Command::CostModel(a) => cli::cost_model::run(a),
        Command::FaultSweep(a) => cli::fault_sweep::run(a),
        Command::Generate(a) => cli::generate::run(a),
        Command::FetchModel { model } => harness::model_path(Some(std::path::Path::new(&model)))
            .map(|p| println!("{}", p.display())),
        Command::SynthModel {
            arch,
            out,
            dtype,
            seed,
        } => synth_model(&arch, &out, &dtype, seed),
        Command::MakeMoe(a) => run_make_moe(a),
        Command::TraceSummary { file, json } => harness::trace::summarize(&file).map(|s| {
            if json {
                println!("{}", serde_json::to_string(&s).expect("serialisable"));
            } else {
                print!("{}", s.text());
            }
        }),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ggml-harness: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_make_moe(a: MakeMoeArgs) -> Result<()> {
    let src = harness::model_path(a.model.as_deref())?;
    let opts = harness::make_moe::MoeOptions {
        experts: a.experts,
        used: a.used,
        seed: a.seed,
        noise: a.noise,
        router_scale: a.router_scale,
    };
    let t0 = Instant::now();
    let s = harness::make_moe::make_moe(&src, &opts, &a.out)?;
    println!(
        "wrote {} from {} in {:.1} s: {s}",
        a.out.display(),
        src.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

fn synth_model(arch: &str, out: &std::path::Path, dtype: &str, seed: u64) -> Result<()> {
    let dt = harness::synthetic::weight_dtype(dtype)
        .map_err(|e| HarnessError::Usage(format!("--dtype: {e}")))?;
    let arch = harness::model::Arch::from_name(arch)?;
    let spec = harness::synthetic::SyntheticSpec {
        seed,
        ..harness::synthetic::SyntheticSpec::tiny_of(arch, dt)
    };
    let bytes = harness::synthetic::synthetic_gguf(&spec);
    std::fs::write(out, &bytes).map_err(|source| HarnessError::Io {
        path: out.display().to_string(),
        source,
    })?;
    eprintln!(
        "wrote {} ({} bytes): synthetic {arch}, {} layers, n_embd {}, matrices {}",
        out.display(),
        bytes.len(),
        spec.n_layer,
        spec.n_embd,
        dt.name()
    );
    Ok(())
}
