//! Hyperparameters of a llama-architecture model, read from GGUF metadata.

use crate::error::{HarnessError, Result};
use crate::gguf_file::GgufFile;

/// The numbers that define a llama model's shapes and numerics.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaHParams {
    /// Transformer blocks (`llama.block_count`).
    pub n_layer: usize,
    /// Embedding width (`llama.embedding_length`).
    pub n_embd: usize,
    /// Feed-forward width (`llama.feed_forward_length`).
    pub n_ff: usize,
    /// Query heads (`llama.attention.head_count`).
    pub n_head: usize,
    /// Key/value heads (`llama.attention.head_count_kv`, default `n_head`).
    pub n_head_kv: usize,
    /// Width of one head (`n_embd / n_head`).
    pub head_dim: usize,
    /// Vocabulary size (rows of `token_embd.weight`).
    pub n_vocab: usize,
    /// Training context length (`llama.context_length`).
    pub n_ctx_train: usize,
    /// RoPE frequency base (`llama.rope.freq_base`, default 10000).
    pub rope_freq_base: f32,
    /// RMS norm epsilon (`llama.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
}

impl LlamaHParams {
    /// Reads and checks the hyperparameters; errors name the missing or bad key.
    pub fn from_gguf(f: &GgufFile) -> Result<LlamaHParams> {
        let arch = f.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(HarnessError::Model(format!(
                "unsupported architecture '{arch}' (general.architecture); only 'llama' is supported"
            )));
        }
        let n_layer = f.get_usize("llama.block_count")?;
        let n_embd = f.get_usize("llama.embedding_length")?;
        let n_ff = f.get_usize("llama.feed_forward_length")?;
        let n_head = f.get_usize("llama.attention.head_count")?;
        let n_head_kv = match f.get_usize("llama.attention.head_count_kv") {
            Ok(v) => v,
            Err(HarnessError::MissingKey(_)) => n_head,
            Err(e) => return Err(e),
        };
        let n_ctx_train = f.get_usize("llama.context_length")?;
        let rope_freq_base = match f.get_f32("llama.rope.freq_base") {
            Ok(v) => v,
            Err(HarnessError::MissingKey(_)) => 10_000.0,
            Err(e) => return Err(e),
        };
        let rms_eps = f.get_f32("llama.attention.layer_norm_rms_epsilon")?;
        let bad = |key: &str, why: &str| HarnessError::Model(format!("{key}: {why}"));
        if n_layer == 0 || n_embd == 0 || n_ff == 0 || n_ctx_train == 0 {
            return Err(bad(
                "llama.*",
                "block_count, embedding_length, feed_forward_length and context_length must be > 0",
            ));
        }
        if n_head == 0 || n_embd % n_head != 0 {
            return Err(bad(
                "llama.attention.head_count",
                "must divide embedding_length",
            ));
        }
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(bad(
                "llama.attention.head_count_kv",
                "must divide head_count",
            ));
        }
        if !(rope_freq_base > 0.0 && rope_freq_base.is_finite()) {
            return Err(bad("llama.rope.freq_base", "must be finite and > 0"));
        }
        if !(rms_eps >= 0.0 && rms_eps.is_finite()) {
            return Err(bad(
                "llama.attention.layer_norm_rms_epsilon",
                "must be finite and >= 0",
            ));
        }
        let head_dim = n_embd / n_head;
        if head_dim % 2 != 0 {
            return Err(bad(
                "llama.attention.head_count",
                "head width must be even for RoPE",
            ));
        }
        let n_vocab = f
            .tensor_info("token_embd.weight")
            .map(|t| t.ne[1])
            .ok_or_else(|| HarnessError::MissingTensor("token_embd.weight".into()))?;
        Ok(LlamaHParams {
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab,
            n_ctx_train,
            rope_freq_base,
            rms_eps,
        })
    }

    /// Width of the keys (and values) of all KV heads: `n_head_kv * head_dim`.
    pub fn n_embd_kv(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}
