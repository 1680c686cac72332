//! The architectures this crate builds, each a small module that says how its GGUF
//! names things and which of the shared building blocks its layers use.
//!
//! Adding an architecture is local: a module here with its [`Features`] and its own
//! hyperparameter keys, a variant in [`Arch`], and tensor names in
//! [`Model::from_gguf`](super::Model::from_gguf) if it has weights the others lack.
//! Both graph builders (single device and tensor parallel) follow [`Features`].

mod gemma3;
mod llama;

use ggml_core::RopeMode;

use crate::error::{ModelError, Result};
use crate::gguf_file::GgufFile;

/// A supported model architecture (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Llama (SmolLM2 and the synthetic test models).
    Llama,
    /// Gemma 3.
    Gemma3,
}

/// The activation of the gated feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnAct {
    /// `silu(gate) * up` (SwiGLU).
    Silu,
    /// `gelu(gate) * up` (GeGLU, tanh GELU).
    Gelu,
}

/// The structural choices of an architecture that the graph builders follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// Pair layout of RoPE.
    pub rope_mode: RopeMode,
    /// Embeddings multiplied by `sqrt(n_embd)` after the lookup.
    pub scale_embeddings: bool,
    /// RMS norm of every query and key head (`attn_q_norm`, `attn_k_norm`) before RoPE.
    pub qk_norm: bool,
    /// The attention scale multiplies the queries after RoPE (a scale op, as llama.cpp
    /// builds Gemma); otherwise the attention kernel applies it.
    pub scale_queries: bool,
    /// RMS norms of the attention and feed-forward outputs before their residual adds
    /// (`post_attention_norm`, `post_ffw_norm`).
    pub post_norms: bool,
    /// Feed-forward activation.
    pub ffn_act: FfnAct,
}

impl Arch {
    /// Every supported architecture.
    pub const ALL: [Arch; 2] = [Arch::Llama, Arch::Gemma3];

    /// The name in `general.architecture`, also the prefix of its metadata keys.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Gemma3 => "gemma3",
        }
    }

    /// The architecture called `name`; the error lists the supported ones.
    pub fn from_name(name: &str) -> Result<Arch> {
        Arch::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
                ModelError::Model(format!(
                    "unsupported architecture '{name}' (general.architecture); supported: {}",
                    names.join(", ")
                ))
            })
    }

    /// Its structural choices.
    pub fn features(self) -> Features {
        match self {
            Arch::Llama => llama::FEATURES,
            Arch::Gemma3 => gemma3::FEATURES,
        }
    }

    /// Reads what only this architecture has into `hp` (whose common fields are set).
    pub(super) fn read_specific(self, f: &GgufFile, hp: &mut super::HParams) -> Result<()> {
        match self {
            Arch::Llama => llama::read(f, hp),
            Arch::Gemma3 => gemma3::read(f, hp),
        }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `key`'s value, or `None` when the key is absent (other errors pass through).
pub(super) fn optional<T>(r: Result<T>) -> Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(ModelError::MissingKey(_)) => Ok(None),
        Err(e) => Err(e),
    }
}
