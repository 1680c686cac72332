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

/// Which experts each token of a mixture-of-experts FFN uses, and their weights.
pub(super) struct Routing {
    /// I32 `[n_expert_used, n_tokens]`: the chosen experts, best first.
    pub ids: TensorId,
    /// F32 `[1, n_expert_used, n_tokens]`: their normalised (and scaled) weights.
    pub weights: TensorId,
}

/// The router of a mixture of experts as llama.cpp builds it for llama (Mixtral):
/// softmax of `gate_inp · cur` over the experts, the `n_expert_used` most probable
/// chosen (ties to the lower index), their probabilities gathered and normalised to sum
/// to one (the sum clamped below at f16's smallest normal, as llama.cpp), then scaled by
/// `expert_weights_scale` when that is neither 0 nor 1.
pub(super) fn moe_route<'a>(
    b: &mut impl Nodes<'a>,
    hp: &HParams,
    cur: TensorId,
    gate_inp: TensorId,
) -> Result<Routing> {
    let n = b.ctx().get(cur)?.ne[1];
    let (ne, nu) = (hp.n_expert, hp.n_expert_used);
    let logits = b.ctx().mul_mat(gate_inp, cur)?;
    let logits = b.node(logits, "ffn_moe_logits")?;
    let probs = b.ctx().soft_max(logits, None, 1.0, 0.0)?;
    let probs = b.node(probs, "ffn_moe_probs")?;
    let ids = b.ctx().argsort_top_k(probs, nu)?;
    let ids = b.node(ids, "ffn_moe_topk")?;
    let per_expert = b.ctx().reshape(probs, [1, ne, n, 1])?;
    let w = b.ctx().get_rows(per_expert, ids)?;
    let w = b.node(w, "ffn_moe_weights")?;
    let w = b.ctx().reshape(w, [nu, n, 1, 1])?;
    let sum = b.ctx().sum_rows(w)?;
    let sum = b.node(sum, "ffn_moe_weights_sum")?;
    let sum = b
        .ctx()
        .clamp(sum, half::f16::MIN_POSITIVE.to_f32(), f32::INFINITY)?;
    let sum = b.node(sum, "ffn_moe_weights_sum_clamped")?;
    let w = b.ctx().div(w, sum)?;
    let w = b.node(w, "ffn_moe_weights_norm")?;
    let mut weights = b.ctx().reshape(w, [1, nu, n, 1])?;
    let s = hp.expert_weights_scale;
    if s != 0.0 && s != 1.0 {
        let scaled = b.ctx().scale(weights, s)?;
        weights = b.node(scaled, "ffn_moe_weights_scaled")?;
    }
    Ok(Routing { ids, weights })
}

/// The gated activation of the chosen experts: `act(gate_exps · cur) * (up_exps · cur)`
/// for each (expert, token) of `r`, `[n_ff, n_expert_used, n_tokens]` (or this device's
/// rows of `n_ff`).
pub(super) fn moe_gate_up<'a>(
    b: &mut impl Nodes<'a>,
    act: FfnAct,
    cur: TensorId,
    (gate_exps, up_exps): (TensorId, TensorId),
    r: &Routing,
) -> Result<TensorId> {
    let t = *b.ctx().get(cur)?;
    let cur = b.ctx().reshape(cur, [t.ne[0], 1, t.ne[1], 1])?;
    let u = b.ctx().mul_mat_id(up_exps, cur, r.ids)?;
    let u = b.node(u, "ffn_moe_up")?;
    let g = b.ctx().mul_mat_id(gate_exps, cur, r.ids)?;
    let g = b.node(g, "ffn_moe_gate")?;
    ffn_act(b, act, g, u)
}

/// The experts' outputs `[n, n_expert_used, n_tokens]` weighted by the router and summed
/// over the chosen experts, in llama.cpp's order (`((e0 + e1) + e2) + ...`): `[n,
/// n_tokens]`. Linear in `experts`, so a partial sum stays one until the result.
pub(super) fn moe_combine<'a>(
    b: &mut impl Nodes<'a>,
    experts: TensorId,
    r: &Routing,
) -> Result<TensorId> {
    let e = b.ctx().mul(experts, r.weights)?;
    let e = b.node(e, "ffn_moe_weighted")?;
    let t = *b.ctx().get(e)?;
    let (n, nu, nt) = (t.ne[0], t.ne[1], t.ne[2]);
    let expert = |b: &mut _, i: usize| -> Result<TensorId> {
        Ok(Nodes::ctx(b).view_2d(e, n, nt, t.nb[2], i * t.nb[1])?)
    };
    let mut acc = expert(b, 0)?;
    if nu == 1 {
        acc = b.ctx().cont(acc)?;
        return b.node(acc, "ffn_moe_out");
    }
    for i in 1..nu {
        let v = expert(b, i)?;
        let s = b.ctx().add(acc, v)?;
        acc = b.node(
            s,
            if i + 1 == nu {
                "ffn_moe_out"
            } else {
                "ffn_moe_sum"
            },
        )?;
    }
    Ok(acc)
}
