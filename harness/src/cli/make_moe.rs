//! `ggml-harness make-moe`: a dense llama upcycled into a mixture of experts.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use harness::error::Result;

/// The flags of `ggml-harness make-moe`.
#[derive(Args, Debug)]
pub struct MakeMoeArgs {
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

/// Runs `ggml-harness make-moe`.
pub fn run(a: MakeMoeArgs) -> Result<()> {
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
