//! `ggml-harness tokenize`: the token ids of a text.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use harness::default_corpus;
use harness::error::{HarnessError, Result};

/// The flags of `ggml-harness tokenize`.
#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// GGUF model (default: the cached SmolLM2, downloaded if missing).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Text file (default: the embedded GPL-3 corpus).
    #[arg(long)]
    file: Option<PathBuf>,
}

/// Runs `ggml-harness tokenize`.
pub fn run(a: TokenizeArgs) -> Result<()> {
    let TokenizeArgs { model, file } = a;
    let path = harness::model_path(model.as_deref())?;
    let f = harness::gguf_file::GgufFile::open(&path)?;
    let tok = harness::tokenizer::Tokenizer::from_gguf(&f.gguf()?)
        .map_err(|e| harness::error::ModelError::Tokenizer(e.to_string()))?;
    // llama-tokenize keeps the text as is (the reference ids include the final newline).
    let text = match &file {
        Some(p) => std::fs::read_to_string(p).map_err(|source| HarnessError::Io {
            path: p.display().to_string(),
            source,
        })?,
        None => default_corpus().to_string(),
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for id in tok.encode(&text) {
        writeln!(out, "{id}").map_err(|source| HarnessError::Io {
            path: "<stdout>".into(),
            source,
        })?;
    }
    Ok(())
}
