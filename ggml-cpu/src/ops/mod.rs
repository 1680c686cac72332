//! Op kernels: each runs on every thread of the pool with its share of the work.

pub(crate) mod attn;
pub(crate) mod copy;
pub(crate) mod elementwise;
pub(crate) mod get_rows;
pub(crate) mod moe;
pub(crate) mod mul_mat;
pub(crate) mod norm;
pub(crate) mod rope;

use ggml_core::{Op, Tensor};

use crate::exec::{KResult, NodeCtx};
use crate::pool::ThreadCtx;

/// Number of phases (separated by barriers) of the node's kernel.
pub(crate) fn phases(t: &Tensor) -> usize {
    match t.op {
        Op::MulMat | Op::MulMatId => 2,
        _ => 1,
    }
}

/// Scratch bytes `(shared, per thread)` the node needs.
pub(crate) fn scratch_size(t: &Tensor, tensors: &[Tensor], nth: usize) -> (usize, usize) {
    let ne0 = t
        .src
        .iter()
        .flatten()
        .map(|s| tensors[s.index()].ne[0])
        .chain(std::iter::once(t.ne[0]))
        .max()
        .unwrap_or(0);
    match t.op {
        Op::MulMat => mul_mat::scratch(t, tensors, nth),
        Op::MulMatId => moe::mul_mat_id_scratch(t, tensors),
        Op::FlashAttnExt { .. } => (0, attn::scratch(t, tensors)),
        _ => (0, 4 * 4 * (ne0 + 16)),
    }
}

/// Runs phase `phase` of the node's kernel on this thread.
pub(crate) fn run(c: &NodeCtx<'_>, th: &ThreadCtx<'_>, phase: usize) -> KResult {
    match c.node.op {
        Op::GetRows => get_rows::run(c, th),
        Op::Add
        | Op::Mul
        | Op::Div
        | Op::Scale { .. }
        | Op::Clamp { .. }
        | Op::Silu
        | Op::Swiglu
        | Op::Gelu
        | Op::Geglu => elementwise::run(c, th),
        Op::RmsNorm { eps } => norm::rms_norm(c, th, eps),
        Op::SoftMax { scale, max_bias } => norm::soft_max(c, th, scale, max_bias),
        Op::Rope(p) => rope::run(c, th, &p),
        Op::MulMat => mul_mat::run(c, th, phase),
        Op::MulMatId => moe::mul_mat_id(c, th, phase),
        Op::ArgsortTopK { k } => moe::argsort_top_k(c, th, k as usize),
        Op::SumRows => moe::sum_rows(c, th),
        Op::Argmax => moe::argmax(c, th),
        Op::Cpy | Op::Cont => copy::cpy(c, th),
        Op::SetRows => copy::set_rows(c, th),
        Op::Concat { dim } => copy::concat(c, th, dim as usize),
        Op::FlashAttnExt {
            scale,
            max_bias,
            softcap,
        } => attn::run(c, th, scale, max_bias, softcap),
        Op::None | Op::View | Op::Reshape | Op::Permute { .. } | Op::Transpose => Ok(()),
    }
}
