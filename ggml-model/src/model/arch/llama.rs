//! Llama: pre-norm blocks, RoPE on adjacent pairs, SwiGLU.

use ggml_core::RopeMode;

use super::{Features, FfnAct};
use crate::error::Result;
use crate::gguf_file::GgufFile;
use crate::model::HParams;

/// Llama's blocks.
pub(super) const FEATURES: Features = Features {
    rope_mode: RopeMode::Normal,
    scale_embeddings: false,
    qk_norm: false,
    scale_queries: false,
    post_norms: false,
    ffn_act: FfnAct::Silu,
};

/// Llama has nothing beyond the common keys: every layer is global, attention is scaled
/// by `1/sqrt(head_dim)`.
pub(super) fn read(_f: &GgufFile, hp: &mut HParams) -> Result<()> {
    hp.attn_scale = 1.0 / (hp.head_dim as f32).sqrt();
    Ok(())
}
