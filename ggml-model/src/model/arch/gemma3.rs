//! Gemma 3 as llama.cpp builds it (`src/models/gemma3.cpp`): embeddings scaled by
//! `sqrt(n_embd)`; RMS norms before and after attention and feed-forward; query and key
//! heads RMS-normed before NeoX RoPE; queries scaled by `1/sqrt(head_dim)`; GeGLU;
//! layers in groups of six, five sliding-window (local, their own RoPE base) and one
//! global.

use ggml_core::RopeMode;

use super::{optional, Features, FfnAct};
use crate::error::{ModelError, Result};
use crate::gguf_file::GgufFile;
use crate::model::HParams;

/// Gemma 3's blocks.
pub(super) const FEATURES: Features = Features {
    rope_mode: RopeMode::Neox,
    scale_embeddings: true,
    qk_norm: true,
    scale_queries: true,
    post_norms: true,
    ffn_act: FfnAct::Gelu,
};

/// llama.cpp's default pattern: of every six layers the last is global.
const SWA_PATTERN: usize = 6;
/// RoPE base of the local layers when the file does not say (llama.cpp's default).
const ROPE_FREQ_BASE_SWA: f32 = 10_000.0;
/// Layer count of the 27B model, whose attention scale uses `n_embd / n_head`.
const N_LAYER_27B: usize = 62;

/// Sliding window, layer pattern, local RoPE base, global RoPE scaling, attention
/// scale; refuses a final logit soft-cap (Gemma 2's, not built here).
pub(super) fn read(f: &GgufFile, hp: &mut HParams) -> Result<()> {
    let n_swa = optional(f.get_usize("gemma3.attention.sliding_window"))?.unwrap_or(0);
    if n_swa > 0 {
        let pattern = optional(f.get_usize("gemma3.attention.sliding_window_pattern"))?
            .unwrap_or(SWA_PATTERN);
        hp.n_swa = n_swa;
        hp.swa_layers = (0..hp.n_layer)
            .map(|il| pattern == 0 || il % pattern < pattern - 1)
            .collect();
        hp.rope_freq_base_swa =
            optional(f.get_f32("gemma3.rope.freq_base_swa"))?.unwrap_or(ROPE_FREQ_BASE_SWA);
        if !(hp.rope_freq_base_swa > 0.0 && hp.rope_freq_base_swa.is_finite()) {
            return Err(ModelError::Model(
                "gemma3.rope.freq_base_swa: must be finite and > 0".into(),
            ));
        }
    }
    // Like llama.cpp: a scaling factor scales the global layers' positions linearly.
    let kind = optional(f.get_str("gemma3.rope.scaling.type"))?;
    if let Some(other) = kind.as_deref().filter(|k| !matches!(*k, "none" | "linear")) {
        return Err(ModelError::Model(format!(
            "gemma3.rope.scaling.type '{other}' is not supported (only linear)"
        )));
    }
    if let Some(factor) = optional(f.get_f32("gemma3.rope.scaling.factor"))? {
        if !(factor >= 0.0 && factor.is_finite()) {
            return Err(ModelError::Model(
                "gemma3.rope.scaling.factor: must be finite and >= 0".into(),
            ));
        }
        if factor > 0.0 && kind.as_deref() != Some("none") {
            hp.rope_freq_scale = 1.0 / factor;
        }
    }
    if let Some(cap) = optional(f.get_f32("gemma3.final_logit_softcapping"))? {
        if cap != 0.0 {
            return Err(ModelError::Model(format!(
                "gemma3.final_logit_softcapping {cap}: a final logit soft-cap is not supported"
            )));
        }
    }
    hp.attn_scale = if hp.n_layer == N_LAYER_27B {
        1.0 / ((hp.n_embd / hp.n_head) as f32).sqrt()
    } else {
        1.0 / (hp.head_dim as f32).sqrt()
    };
    Ok(())
}
