//! `ggml-harness fetch-model`: a known model downloaded into the cache.

use clap::Args;
use harness::error::Result;

/// The flags of `ggml-harness fetch-model`.
#[derive(Args, Debug)]
pub struct FetchModelArgs {
    /// Which model: smollm2-135m, gemma3-270m, or smollm2-moe (built from the cached
    /// SmolLM2 by make-moe on first use). Prints its path.
    #[arg(long, default_value = "smollm2-135m")]
    model: String,
}

/// Runs `ggml-harness fetch-model`.
pub fn run(a: FetchModelArgs) -> Result<()> {
    harness::model_path(Some(std::path::Path::new(&a.model))).map(|p| println!("{}", p.display()))
}
