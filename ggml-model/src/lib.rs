//! Run GGUF language models (llama, gemma3, their mixtures of experts) on the ggml-rs
//! backends: load a file, place its weights on one device or many, tokenize, decode
//! batches, sample. What an engine vendors to run a model; no CLI, serialisation or
//! progress crates (the `ggml-harness` binary in the `harness` crate is built on it).
//!
//! ```
//! use ggml_core::DType;
//! use ggml_model::batch::Batch;
//! use ggml_model::executor::Executor;
//! use ggml_model::generate::{argmax, generate, Sampler, SamplerConfig};
//! use ggml_model::session::{RunConfig, Session, SplitMode};
//! use ggml_model::synthetic::{write_synthetic, SyntheticSpec};
//!
//! // A tiny seeded llama (4 layers, 256 wide, Q4_1 matrices) written as GGUF, so this
//! // runs without a download; a real llama or gemma3 GGUF opens the same way.
//! let path = std::env::temp_dir().join(format!("ggml-model-doc-{}.gguf", std::process::id()));
//! write_synthetic(&SyntheticSpec::tiny(DType::Q4_1), &path)?;
//!
//! // One CPU device, 2 threads. "cpu:2" with SplitMode::Layer is a pipeline over two
//! // virtual CPU devices; "cuda:0", or "cuda-sim:0,cuda-sim:1" (emulated GPUs), also work.
//! let config = RunConfig::simple("cpu".parse()?, SplitMode::None, 1, 2);
//! let session = Session::open(&path, config)?;
//! let mut kv = session.kv_cache(64)?;
//! let mut exec = session.executor()?;
//!
//! // A prompt in one batch; the logits of its last token.
//! let prompt = session.tokenizer.encode("The GNU General Public License");
//! let mut batch = Batch::default();
//! for (i, &t) in prompt.iter().enumerate() {
//!     batch.push(t, i as i32, 0, i + 1 == prompt.len());
//! }
//! let logits = exec.forward(&session.model, &mut kv, &batch)?;
//! assert_eq!(logits.len(), session.model.hp.n_vocab);
//! let next = argmax(&logits);
//!
//! // A greedy continuation of the same prompt: its first token is that argmax.
//! let mut greedy = Sampler::new(SamplerConfig::default())?;
//! let text = "The GNU General Public License";
//! let g = generate(&session, exec.as_mut(), &mut kv, text, 8, &mut greedy, |_, _| Ok(()))?;
//! assert!(g.tokens.first().is_none_or(|&t| t == next));
//! println!("{text}{}", session.tokenizer.decode(&g.tokens));
//! # drop((exec, kv, session));
//! # std::fs::remove_file(&path).ok();
//! # Ok::<(), ggml_model::error::ModelError>(())
//! ```
//!
//! - [`gguf_file`]: a memory-mapped, validated GGUF file; [`gguf_writer`] writes one;
//! - [`model`]: architectures, hyperparameters, weights and the forward graphs (one
//!   device or a layer split, and tensor parallel);
//! - [`tokenizer`]: GPT-2 byte-level BPE with the smollm pre-tokenizer, and SentencePiece,
//!   token for token as llama.cpp;
//! - [`devices`]: device lists (`cpu:2`, `cuda:0,cuda:1`, `cuda-sim:0x2`);
//! - [`session`]: a model opened on devices in a split mode, with its backends;
//! - [`placement`]: weights and the KV cache in backend memory;
//! - [`batch`], [`executor`]: batches of tokens and the forward passes that run them
//!   through the scheduler;
//! - [`generate`]: greedy and sampled continuation of a prompt;
//! - [`synthetic`]: tiny seeded models written as GGUF, for tests without a download;
//! - [`error`]: the error every fallible function returns.
//!
//! Layering: `ggml-core` <- `ggml-cpu`, `ggml-cuda`, `ggml-sched` <- `ggml-model` <-
//! `harness`. Fault injection stays in the harness: a session takes it as a
//! [`session::FaultInjector`].
#![warn(missing_docs)]

pub mod batch;
pub mod devices;
pub mod error;
pub mod executor;
pub mod generate;
pub mod gguf_file;
pub mod gguf_writer;
pub mod model;
pub mod placement;
pub mod session;
pub mod synthetic;
pub mod tokenizer;

/// Compiles the README's Rust examples as doctests, so the README cannot go stale.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
