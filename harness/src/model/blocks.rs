//! The building blocks both graph builders share (norms, the query/key preparation of
//! attention, the gated feed-forward activation), following the architecture's
//! [`Features`](super::Features). A builder supplies [`Nodes`]: how a new node is named
//! (and, tensor-parallel, pinned to its device).

use ggml_core::{AttnParams, Context, TensorId};

use super::{FfnAct, HParams};
use crate::error::Result;

/// Where a builder's nodes go: its context, and what it does with each new node.
pub(super) trait Nodes<'a> {
    /// The graph context.
    fn ctx(&mut self) -> &mut Context<'a>;
    /// Names (and records) a node made in [`ctx`](Nodes::ctx); returns it.
    fn node(&mut self, id: TensorId, name: &str) -> Result<TensorId>;
}

/// `rms_norm(x) * w`; the norm is named `rms_name`, the product `name`. Returns
/// `(norm, product)`.
pub(super) fn norm<'a>(
    b: &mut impl Nodes<'a>,
    x: TensorId,
    w: TensorId,
    eps: f32,
    rms_name: &str,
    name: &str,
) -> Result<(TensorId, TensorId)> {
    let r = b.ctx().rms_norm(x, eps)?;
    let r = b.node(r, rms_name)?;
    let m = b.ctx().mul(r, w)?;
    Ok((r, b.node(m, name)?))
}

/// Query and key heads of layer `il` made ready for attention: `q` `[head_dim, nh, n]`
/// and `k` `[head_dim, nkv, n]` RMS-normed per head (with `q_norm`/`k_norm`), rotated,
/// and the queries scaled when the architecture scales them. Returns `(q, k)` and the
/// attention parameters to use with them.
pub(super) fn prepare_qk<'a>(
    b: &mut impl Nodes<'a>,
    hp: &HParams,
    il: usize,
    (q, k): (TensorId, TensorId),
    (q_norm, k_norm): (Option<TensorId>, Option<TensorId>),
    pos: TensorId,
) -> Result<(TensorId, TensorId, AttnParams)> {
    let (mut q, mut k) = (q, k);
    if let (Some(qn), Some(kn)) = (q_norm, k_norm) {
        q = norm(b, q, qn, hp.rms_eps, "Qrms", "Qcur_normed")?.1;
        k = norm(b, k, kn, hp.rms_eps, "Krms", "Kcur_normed")?.1;
    }
    let rope = hp.rope(il);
    let q = b.ctx().rope(q, pos, rope)?;
    let mut q = b.node(q, "Qrope")?;
    let k = b.ctx().rope(k, pos, rope)?;
    let k = b.node(k, "Krope")?;
    let attn = if hp.features.scale_queries {
        let s = b.ctx().scale(q, hp.attn_scale)?;
        q = b.node(s, "Qscaled")?;
        AttnParams::scaled(1.0)
    } else {
        AttnParams::scaled(hp.attn_scale)
    };
    Ok((q, k, attn))
}

/// The gated activation `act(g) * u`.
pub(super) fn ffn_act<'a>(
    b: &mut impl Nodes<'a>,
    act: FfnAct,
    g: TensorId,
    u: TensorId,
) -> Result<TensorId> {
    let (h, name) = match act {
        FfnAct::Silu => (b.ctx().swiglu(g, u)?, "ffn_swiglu"),
        FfnAct::Gelu => (b.ctx().geglu(g, u)?, "ffn_geglu"),
    };
    b.node(h, name)
}

/// `x` after the architecture's post-norm (`w`, if any), named `name`.
pub(super) fn post_norm<'a>(
    b: &mut impl Nodes<'a>,
    x: TensorId,
    w: Option<TensorId>,
    eps: f32,
    name: &str,
) -> Result<TensorId> {
    match w {
        Some(w) => Ok(norm(b, x, w, eps, &format!("{name}_rms"), name)?.1),
        None => Ok(x),
    }
}

/// The token embeddings of `tokens`, scaled by `sqrt(n_embd)` where the architecture
/// does that.
pub(super) fn embeddings<'a>(
    b: &mut impl Nodes<'a>,
    hp: &HParams,
    tok_embd: TensorId,
    tokens: TensorId,
) -> Result<TensorId> {
    let x = b.ctx().get_rows(tok_embd, tokens)?;
    let x = b.node(x, "inp_embd")?;
    if !hp.features.scale_embeddings {
        return Ok(x);
    }
    let s = b.ctx().scale(x, (hp.n_embd as f32).sqrt())?;
    b.node(s, "inp_scaled")
}
