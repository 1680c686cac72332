//! `ggml-harness trace-summary`: a `--trace` file summarised.

use std::path::PathBuf;

use clap::Args;
use harness::error::Result;

/// The flags of `ggml-harness trace-summary`.
#[derive(Args, Debug)]
pub struct TraceSummaryArgs {
    /// Trace file written by `perplexity --trace` or `bench --trace`.
    file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `ggml-harness trace-summary`.
pub fn run(a: TraceSummaryArgs) -> Result<()> {
    harness::trace::summarize(&a.file).map(|s| {
        if a.json {
            println!("{}", serde_json::to_string(&s).expect("serialisable"));
        } else {
            print!("{}", s.text());
        }
    })
}
