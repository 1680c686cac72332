//! `ggml-harness`: perplexity, generation and tokenization on GGUF models (llama, gemma3).
//!
//! This file only defines the command line and dispatches; each command (its flags and
//! its work) is a module under `cli/`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    FetchModel(cli::fetch_model::FetchModelArgs),
    /// Writes a synthetic model the tests use (llama: 4 layers, 256 wide, GQA, byte
    /// vocabulary; gemma3: 6 layers with sliding windows, SentencePiece vocabulary;
    /// seeded weights) as a GGUF file, e.g. for runs on cuda-sim in CI.
    SynthModel(cli::synth_model::SynthModelArgs),
    /// Upcycles a dense llama model (e.g. SmolLM2) into a mixture of experts in Mixtral's
    /// layout, which llama.cpp loads as is, and prints a one-line summary.
    MakeMoe(cli::make_moe::MakeMoeArgs),
    /// Summarises a `--trace` file: busy and idle time per queue, overlap of the queues,
    /// the sync pattern of each split and the host syncs by rule.
    TraceSummary(cli::trace_summary::TraceSummaryArgs),
}

fn main() -> ExitCode {
    let r = match Cli::parse().command {
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
        Command::FetchModel(a) => cli::fetch_model::run(a),
        Command::SynthModel(a) => cli::synth_model::run(a),
        Command::MakeMoe(a) => cli::make_moe::run(a),
        Command::TraceSummary(a) => cli::trace_summary::run(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ggml-harness: error: {e}");
            ExitCode::FAILURE
        }
    }
}
