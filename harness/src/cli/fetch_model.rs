//! `ggml-harness fetch-model`: a known model downloaded into the cache.

use clap::Args;
use harness::error::Result;

/// The flags of `ggml-harness fetch-model`.
#[derive(Args, Debug)]
pub struct FetchModelArgs {
    /// Which model: smollm2-135m or gemma3-270m.
    #[arg(long, default_value = "smollm2-135m")]
    model: String,
}

/// Runs `ggml-harness fetch-model`.
pub fn run(a: FetchModelArgs) -> Result<()> {
    harness::model_path(Some(std::path::Path::new(&a.model))).map(|p| println!("{}", p.display()))
}
