//! Hyperparameters of a model, read from GGUF metadata (`{arch}.*` keys).

use ggml_core::RopeParams;

use super::arch::{optional, Arch, Features};
use crate::error::{ModelError, Result};
use crate::gguf_file::GgufFile;

/// The numbers that define a model's shapes and numerics, and its architecture's
/// structural [`Features`].
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    /// The architecture (`general.architecture`).
    pub arch: Arch,
    /// Its structural choices.
    pub features: Features,
    /// Transformer blocks (`{arch}.block_count`).
    pub n_layer: usize,
    /// Embedding width (`{arch}.embedding_length`).
    pub n_embd: usize,
    /// Feed-forward width (`{arch}.feed_forward_length`).
    pub n_ff: usize,
    /// Query heads (`{arch}.attention.head_count`).
    pub n_head: usize,
    /// Key/value heads (`{arch}.attention.head_count_kv`, default `n_head`).
    pub n_head_kv: usize,
    /// Width of one head (`{arch}.attention.key_length`, default `n_embd / n_head`).
    pub head_dim: usize,
    /// Vocabulary size (rows of `token_embd.weight`).
    pub n_vocab: usize,
    /// Training context length (`{arch}.context_length`).
    pub n_ctx_train: usize,
    /// RoPE frequency base of the global layers (`{arch}.rope.freq_base`, default 10000).
    pub rope_freq_base: f32,
    /// RoPE position scale of the global layers (1: none).
    pub rope_freq_scale: f32,
    /// RoPE frequency base of the sliding-window layers.
    pub rope_freq_base_swa: f32,
    /// RMS norm epsilon (`{arch}.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
    /// Factor of `q·k` in attention.
    pub attn_scale: f32,
    /// Sliding window of the local layers: a token sees the `n_swa` latest positions
    /// (its own included); 0 when no layer is local.
    pub n_swa: usize,
    /// Per layer: whether it attends through the sliding window.
    pub swa_layers: Vec<bool>,
    /// Experts of each feed-forward block (`{arch}.expert_count`); 0: a dense FFN.
    pub n_expert: usize,
    /// Experts each token uses (`{arch}.expert_used_count`); 0 without experts.
    pub n_expert_used: usize,
    /// Factor of the normalised expert weights (`{arch}.expert_weights_scale`; 0 or 1:
    /// none, as llama.cpp).
    pub expert_weights_scale: f32,
}

/// The former name of [`HParams`], from when llama was the only architecture.
pub type LlamaHParams = HParams;

impl HParams {
    /// Reads and checks the hyperparameters; errors name the missing or bad key.
    pub fn from_gguf(f: &GgufFile) -> Result<HParams> {
        let arch = Arch::from_name(&f.get_str("general.architecture")?)?;
        let a = arch.name();
        let key = |k: &str| format!("{a}.{k}");
        let n_layer = f.get_usize(&key("block_count"))?;
        let n_embd = f.get_usize(&key("embedding_length"))?;
        let n_ff = f.get_usize(&key("feed_forward_length"))?;
        let n_head = f.get_usize(&key("attention.head_count"))?;
        let n_head_kv = optional(f.get_usize(&key("attention.head_count_kv")))?.unwrap_or(n_head);
        let n_ctx_train = f.get_usize(&key("context_length"))?;
        let rope_freq_base = optional(f.get_f32(&key("rope.freq_base")))?.unwrap_or(10_000.0);
        let rms_eps = f.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
        let bad = |k: &str, why: &str| ModelError::Model(format!("{a}.{k}: {why}"));
        if n_layer == 0 || n_embd == 0 || n_ff == 0 || n_ctx_train == 0 {
            return Err(bad(
                "*",
                "block_count, embedding_length, feed_forward_length and context_length must be > 0",
            ));
        }
        if n_head == 0 {
            return Err(bad("attention.head_count", "must be > 0"));
        }
        let head_dim = match optional(f.get_usize(&key("attention.key_length")))? {
            Some(k) => k,
            None if n_embd % n_head == 0 => n_embd / n_head,
            None => return Err(bad("attention.head_count", "must divide embedding_length")),
        };
        if let Some(v) = optional(f.get_usize(&key("attention.value_length")))? {
            if v != head_dim {
                return Err(bad(
                    "attention.value_length",
                    "must equal the key length (heads of one width)",
                ));
            }
        }
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(bad("attention.head_count_kv", "must divide head_count"));
        }
        if !(rope_freq_base > 0.0 && rope_freq_base.is_finite()) {
            return Err(bad("rope.freq_base", "must be finite and > 0"));
        }
        if !(rms_eps >= 0.0 && rms_eps.is_finite()) {
            return Err(bad(
                "attention.layer_norm_rms_epsilon",
                "must be finite and >= 0",
            ));
        }
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(bad(
                "attention.key_length",
                "head width must be even for RoPE",
            ));
        }
        let n_vocab = f
            .tensor_info("token_embd.weight")
            .map(|t| t.ne[1])
            .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
        let n_expert = optional(f.get_usize(&key("expert_count")))?.unwrap_or(0);
        let n_expert_used = optional(f.get_usize(&key("expert_used_count")))?.unwrap_or(0);
        if n_expert > 0 && !(1..=n_expert).contains(&n_expert_used) {
            return Err(bad(
                "expert_used_count",
                "must be in 1..=expert_count when the model has experts",
            ));
        }
        if n_expert == 0 && n_expert_used != 0 {
            return Err(bad("expert_used_count", "set without expert_count"));
        }
        let expert_weights_scale =
            optional(f.get_f32(&key("expert_weights_scale")))?.unwrap_or(0.0);
        if !expert_weights_scale.is_finite() {
            return Err(bad("expert_weights_scale", "must be finite"));
        }
        let mut hp = HParams {
            arch,
            features: arch.features(),
            n_layer,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab,
            n_ctx_train,
            rope_freq_base,
            rope_freq_scale: 1.0,
            rope_freq_base_swa: rope_freq_base,
            rms_eps,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            n_swa: 0,
            swa_layers: vec![false; n_layer],
            n_expert,
            n_expert_used,
            expert_weights_scale,
        };
        arch.read_specific(f, &mut hp)?;
        Ok(hp)
    }

    /// Width of the keys (and values) of all KV heads: `n_head_kv * head_dim`.
    pub fn n_embd_kv(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Width of the queries of all heads: `n_head * head_dim` (not always `n_embd`).
    pub fn n_embd_q(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Whether the feed-forward blocks are mixtures of experts.
    pub fn is_moe(&self) -> bool {
        self.n_expert > 0
    }

    /// Whether layer `il` attends through the sliding window.
    pub fn is_swa(&self, il: usize) -> bool {
        self.n_swa > 0 && self.swa_layers.get(il).copied().unwrap_or(false)
    }

    /// The RoPE of layer `il`: the architecture's layout, the local or global base and
    /// scale.
    pub fn rope(&self, il: usize) -> RopeParams {
        let (base, scale) = if self.is_swa(il) {
            (self.rope_freq_base_swa, 1.0)
        } else {
            (self.rope_freq_base, self.rope_freq_scale)
        };
        let mut r = RopeParams::llama(self.head_dim as u32, base);
        r.mode = self.features.rope_mode;
        r.freq_scale = scale;
        r
    }
}
