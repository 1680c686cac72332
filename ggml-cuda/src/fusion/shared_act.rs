//! Prompt-class quantised products that read one activation (Q, K and V; gate and up):
//! the activation is quantised to Q8_1 once for all of them instead of once per product
//! (`fuse_qkv`), and when it is an RMS norm times a weight row, by the norm's own kernel
//! (`rms_norm_q8_1`, `fuse_norm`), which writes the norm and the MUL too; when it is a
//! SwiGLU, by the SwiGLU's (`swiglu_q8_1`, `fuse_glu`), which writes the SwiGLU too.
//!
//! The products then run on the same Q8_1 blocks the unfused path would have made for
//! each of them (the quantisation of one activation gives the same bytes every time): on
//! `qgemm` as one launch (each matrix's row blocks in turn), where a single product may
//! also add a residual in its epilogue (`fuse_add`), or with `no-qgemm` one `qmm` launch
//! each. Every output is bit for bit the unfused nodes'. A run is matched on shapes alone;
//! whether the bytes allow it (no output over bytes the run reads or writes elsewhere) is
//! decided when it is launched, with the addresses.

use ggml_core::{DType, Op, Tensor, TensorId};

use super::{other_operand, skip_views, Fusion};
use crate::launch::MMQ_MIN_N;
use crate::reference::is_kernel_quant;
use crate::CudaTuning;

/// A matched run: offsets (within the run) of its norm and of its products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SharedAct {
    /// RMS_NORM and the MUL by its weight, whose output the products read.
    pub norm: Option<(u8, u8)>,
    /// The SWIGLU whose output the products read (never with a norm).
    pub glu: Option<u8>,
    /// The products (the first `n` entries).
    pub products: [u8; 3],
    /// Number of products (1 to 3; 2 or 3 without a norm, a SwiGLU or an add).
    pub n: u8,
    /// The ADD of a single product's output and a residual, computed in `qgemm`'s
    /// epilogue (`fuse_add`).
    pub add: Option<u8>,
}

/// The name op timing gives a run.
pub(crate) fn op_name(r: &SharedAct) -> &'static str {
    if r.glu.is_some() {
        return match (r.add.is_some(), r.n) {
            (true, _) => "SWIGLU+MUL_MAT+ADD",
            (false, 1) => "SWIGLU+MUL_MAT",
            (false, 2) => "SWIGLU+MUL_MAT*2",
            (false, _) => "SWIGLU+MUL_MAT*3",
        };
    }
    match (r.norm.is_some(), r.n) {
        _ if r.add.is_some() => match r.norm {
            Some(_) => "RMS_NORM+MUL_MAT+ADD",
            None => "MUL_MAT+ADD",
        },
        (true, 1) => "RMS_NORM+MUL_MAT",
        (true, 2) => "RMS_NORM+MUL_MAT*2",
        (true, _) => "RMS_NORM+MUL_MAT*3",
        (false, 2) => "MUL_MAT*2",
        (false, _) => "MUL_MAT*3",
    }
}

/// An f32 matrix (at most 2-D) with unit element stride.
fn f32_2d(t: &Tensor) -> bool {
    t.dtype == DType::F32 && t.ne[2] == 1 && t.ne[3] == 1 && t.nb[0] == 4
}

/// RMS_NORM at `nodes[i]` of a prompt-sized matrix whose rows split into Q8_1 blocks, and
/// the MUL by a weight row after it (views aside): the MUL's position and output.
fn norm(tensors: &[Tensor], nodes: &[TensorId], i: usize) -> Option<(usize, TensorId)> {
    let r_id = nodes[i];
    let r = tensors.get(r_id.index())?;
    if !matches!(r.op, Op::RmsNorm { .. }) || !f32_2d(r) || r.ne[1] < MMQ_MIN_N || r.ne[0] % 32 != 0
    {
        return None;
    }
    let x = tensors.get(r.src[0]?.index())?;
    if !f32_2d(x) || x.ne != r.ne {
        return None;
    }
    let j = skip_views(tensors, nodes, i + 1);
    let m_id = *nodes.get(j)?;
    let m = tensors.get(m_id.index())?;
    if m.op != Op::Mul || !f32_2d(m) || m.ne != r.ne {
        return None;
    }
    let w = tensors.get(other_operand(m, r_id)?.index())?;
    let weight_ok = w.dtype == DType::F32 && w.ne == [r.ne[0], 1, 1, 1] && w.nb[0] == 4;
    weight_ok.then_some((j, m_id))
}

/// SWIGLU at `nodes[i]` of prompt-sized 2-D f32 operands whose rows split into Q8_1
/// blocks (what `swiglu_q8_1` computes).
fn swiglu(tensors: &[Tensor], nodes: &[TensorId], i: usize) -> bool {
    let Some(g) = tensors.get(nodes[i].index()) else {
        return false;
    };
    let operand = |s: Option<TensorId>| {
        s.and_then(|s| tensors.get(s.index()))
            .is_some_and(|x| f32_2d(x) && x.ne == g.ne)
    };
    g.op == Op::Swiglu
        && f32_2d(g)
        && g.ne[1] >= MMQ_MIN_N
        && g.ne[0] % 32 == 0
        && operand(g.src[0])
        && operand(g.src[1])
}

/// Whether node `id` is a plain 2-D product of the tiled class on quantised weights (the
/// shape `ops::matmul` sends to `qgemm` or `qmm` with activations quantised beforehand):
/// its activation and K.
fn tiled_product(tensors: &[Tensor], id: TensorId) -> Option<(TensorId, usize)> {
    let t = tensors.get(id.index())?;
    if t.op != Op::MulMat {
        return None;
    }
    let w = tensors.get(t.src[0]?.index())?;
    let a_id = t.src[1]?;
    let a = tensors.get(a_id.index())?;
    let plain_2d = |x: &Tensor| x.ne[2] == 1 && x.ne[3] == 1;
    let ok = is_kernel_quant(w.dtype)
        && plain_2d(w)
        && plain_2d(t)
        && plain_2d(a)
        && a.dtype == DType::F32
        && a.ne[1] >= MMQ_MIN_N
        && a.ne[0] == w.ne[0]
        && t.ne[1] == a.ne[1];
    ok.then_some((a_id, w.ne[0]))
}

/// The run that starts at `nodes[i]`, if `tuning` allows one: an optional norm (RMS_NORM
/// and its weight's MUL, `fuse_norm`) or SWIGLU (`fuse_glu`), then 1 to 3 consecutive
/// (views aside) tiled products reading one activation (the MUL's or the SWIGLU's output
/// after one; more than one needs `fuse_qkv`), at least two products without either.
pub(crate) fn matcher(
    tensors: &[Tensor],
    nodes: &[TensorId],
    i: usize,
    tuning: &CudaTuning,
) -> Option<(Fusion, usize)> {
    if tuning.legacy_products {
        return None;
    }
    let off = |j: usize| u8::try_from(j - i).ok();
    let (norm_at, mut act, mut at) = match tuning.fuse_norm.then(|| norm(tensors, nodes, i)) {
        Some(Some((m, act))) => (Some((0, off(m)?)), Some(act), m + 1),
        _ => (None, None, i),
    };
    let glu_at = (norm_at.is_none() && tuning.fuse_glu && swiglu(tensors, nodes, i)).then(|| {
        act = Some(nodes[i]);
        at = i + 1;
        0
    });
    let most = if tuning.fuse_qkv { 3 } else { 1 };
    let mut products = [0u8; 3];
    let mut n = 0;
    let mut k_of = None;
    while n < most {
        let j = skip_views(tensors, nodes, at);
        let Some((a, k)) = nodes.get(j).and_then(|&id| tiled_product(tensors, id)) else {
            break;
        };
        if act.is_some_and(|x| x != a) || k_of.is_some_and(|x| x != k) {
            break;
        }
        act = Some(a);
        k_of = Some(k);
        products[n] = off(j)?;
        n += 1;
        at = j + 1;
    }
    if n == 0 {
        return None;
    }
    let last = i + products[n - 1] as usize;
    let add = match n == 1 && tuning.fuse_add && tuning.qgemm {
        true => residual_add(tensors, nodes, last),
        false => None,
    };
    if norm_at.is_none() && glu_at.is_none() && n < 2 && add.is_none() {
        return None;
    }
    let run = SharedAct {
        norm: norm_at,
        glu: glu_at,
        products,
        n: n as u8,
        add: match add {
            Some(j) => Some(off(j)?),
            None => None,
        },
    };
    Some((Fusion::SharedAct(run), add.unwrap_or(last) + 1 - i))
}

/// The ADD right after product `nodes[p]` (views aside) of its output and an f32 residual
/// of the same shape: its position.
fn residual_add(tensors: &[Tensor], nodes: &[TensorId], p: usize) -> Option<usize> {
    let j = skip_views(tensors, nodes, p + 1);
    let add = tensors.get(nodes.get(j)?.index())?;
    let prod_id = nodes[p];
    let prod = tensors.get(prod_id.index())?;
    let res = tensors.get(other_operand(add, prod_id)?.index())?;
    let ok = add.op == Op::Add
        && f32_2d(add)
        && f32_2d(res)
        && f32_2d(prod)
        && add.ne == prod.ne
        && res.ne == prod.ne;
    ok.then_some(j)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fusion::{plan, Step};
    use ggml_core::Context;

    /// A prompt layer's products as the harness orders them: Q, K, V (a view between),
    /// O and its add, gate, up, SwiGLU, down.
    fn layer(ctx: &mut Context<'_>, n: usize) -> Vec<TensorId> {
        let x = ctx.new_tensor(DType::F32, [64, n, 1, 1]).unwrap();
        let w = |ctx: &mut Context<'_>, k: usize, m: usize| {
            ctx.new_tensor(DType::Q4_1, [k, m, 1, 1]).unwrap()
        };
        let (wq, wk, wv, wo) = (
            w(ctx, 64, 64),
            w(ctx, 64, 32),
            w(ctx, 64, 32),
            w(ctx, 64, 64),
        );
        let q = ctx.mul_mat(wq, x).unwrap();
        let q3 = ctx.reshape(q, [16, 4, n, 1]).unwrap();
        let k = ctx.mul_mat(wk, x).unwrap();
        let v = ctx.mul_mat(wv, x).unwrap();
        let o = ctx.reshape(q3, [64, n, 1, 1]).unwrap();
        let o = ctx.mul_mat(wo, o).unwrap();
        let h = ctx.add(o, x).unwrap();
        let (wg, wu, wd) = (w(ctx, 64, 96), w(ctx, 64, 96), w(ctx, 96, 64));
        let gate = ctx.mul_mat(wg, h).unwrap();
        let up = ctx.mul_mat(wu, h).unwrap();
        let act = ctx.swiglu(gate, up).unwrap();
        let d = ctx.mul_mat(wd, act).unwrap();
        vec![q, q3, k, v, o, h, gate, up, act, d]
    }

    /// Each run's first and end node, and its products (plus 10 with a norm, 20 with a
    /// SwiGLU, 100 with an add).
    fn runs(steps: &[Step]) -> Vec<(usize, usize, u8)> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::Fused {
                    fusion: Fusion::SharedAct(r),
                    start,
                    end,
                } => Some((
                    *start,
                    *end,
                    r.n + 10 * r.norm.is_some() as u8
                        + 20 * r.glu.is_some() as u8
                        + 100 * r.add.is_some() as u8,
                )),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_prompt_layer_quantises_each_shared_activation_once() {
        let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 48];
        let mut ctx = Context::new(&mut s);
        let nodes = layer(&mut ctx, 512);
        let t = CudaTuning::default();
        // Q, (view), K, V; O and its residual add; gate, up; the SwiGLU and down, which
        // reads it (no add after it here).
        assert_eq!(
            runs(&plan(ctx.tensors(), &nodes, &t)),
            [(0, 4, 3), (4, 6, 101), (6, 8, 2), (8, 10, 21)]
        );
        let no_glu = CudaTuning {
            fuse_glu: false,
            ..t
        };
        assert_eq!(
            runs(&plan(ctx.tensors(), &nodes, &no_glu)),
            [(0, 4, 3), (4, 6, 101), (6, 8, 2)]
        );
        // The add needs qgemm's epilogue and its switch.
        for no_add in [
            CudaTuning { qgemm: false, ..t },
            CudaTuning {
                fuse_add: false,
                ..t
            },
        ] {
            assert_eq!(
                runs(&plan(ctx.tensors(), &nodes, &no_add)),
                [(0, 4, 3), (6, 8, 2), (8, 10, 21)]
            );
        }
        // Without fuse_qkv only the add's and the SwiGLU's runs are left; the legacy
        // kernels and decode-sized batches (the decode fusions' matter, not this one) leave
        // none.
        let off = CudaTuning {
            fuse_qkv: false,
            ..t
        };
        assert_eq!(
            runs(&plan(ctx.tensors(), &nodes, &off)),
            [(4, 6, 101), (8, 10, 21)]
        );
        assert!(runs(&plan(ctx.tensors(), &nodes, &CudaTuning::legacy())).is_empty());
        let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 48];
        let mut ctx = Context::new(&mut s);
        let nodes = layer(&mut ctx, MMQ_MIN_N - 1);
        assert!(runs(&plan(ctx.tensors(), &nodes, &t)).is_empty());
    }

    #[test]
    fn products_of_other_activations_or_another_k_end_the_run() {
        let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 32];
        let mut ctx = Context::new(&mut s);
        let x = ctx.new_tensor(DType::F32, [64, 16, 1, 1]).unwrap();
        let y = ctx.new_tensor(DType::F32, [64, 16, 1, 1]).unwrap();
        let w = ctx.new_tensor(DType::Q8_0, [64, 32, 1, 1]).unwrap();
        let wf = ctx.new_tensor(DType::F16, [64, 32, 1, 1]).unwrap();
        let a = ctx.mul_mat(w, x).unwrap();
        let b = ctx.mul_mat(w, y).unwrap();
        let c = ctx.mul_mat(wf, y).unwrap();
        let d = ctx.mul_mat(w, y).unwrap();
        let e = ctx.mul_mat(w, y).unwrap();
        let f = ctx.mul_mat(w, y).unwrap();
        let g = ctx.mul_mat(w, y).unwrap();
        let t = CudaTuning::default();
        // x then y; y on float weights (no Q8_1); then four on y: at most three a run.
        let nodes = [a, b, c, d, e, f, g];
        assert_eq!(runs(&plan(ctx.tensors(), &nodes, &t)), [(3, 6, 3)]);
    }

    #[test]
    fn a_norm_and_its_weight_quantise_for_the_products_that_read_them() {
        let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 32];
        let mut ctx = Context::new(&mut s);
        let x = ctx.new_tensor(DType::F32, [64, 16, 1, 1]).unwrap();
        let g = ctx.new_tensor(DType::F32, [64, 1, 1, 1]).unwrap();
        let g2 = ctx.new_tensor(DType::F32, [64, 16, 1, 1]).unwrap();
        let w = ctx.new_tensor(DType::Q4_1, [64, 32, 1, 1]).unwrap();
        let rn = ctx.rms_norm(x, 1e-5).unwrap();
        let cur = ctx.mul(rn, g).unwrap();
        let q = ctx.mul_mat(w, cur).unwrap();
        let k = ctx.mul_mat(w, cur).unwrap();
        let v = ctx.mul_mat(w, cur).unwrap();
        let t = CudaTuning::default();
        let nodes = [rn, cur, q, k, v];
        assert_eq!(runs(&plan(ctx.tensors(), &nodes, &t)), [(0, 5, 13)]);
        let no_norm = CudaTuning {
            fuse_norm: false,
            ..t
        };
        assert_eq!(runs(&plan(ctx.tensors(), &nodes, &no_norm)), [(2, 5, 3)]);
        // Without fuse_qkv the norm takes its first product; K and V go alone.
        let no_qkv = CudaTuning {
            fuse_qkv: false,
            ..t
        };
        assert_eq!(runs(&plan(ctx.tensors(), &nodes, &no_qkv)), [(0, 3, 11)]);
        // A MUL by a full matrix is no norm weight; a row not of Q8_1 blocks is no
        // prompt norm either.
        let cur2 = ctx.mul(rn, g2).unwrap();
        let p = ctx.mul_mat(w, cur2).unwrap();
        assert!(runs(&plan(ctx.tensors(), &[rn, cur2, p], &t)).is_empty());
        let y = ctx.new_tensor(DType::F32, [48, 16, 1, 1]).unwrap();
        let gy = ctx.new_tensor(DType::F32, [48, 1, 1, 1]).unwrap();
        let ry = ctx.rms_norm(y, 1e-5).unwrap();
        let my = ctx.mul(ry, gy).unwrap();
        assert!(runs(&plan(ctx.tensors(), &[ry, my], &t)).is_empty());
    }

    #[test]
    fn a_swiglu_quantises_for_its_products_and_takes_their_add() {
        let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 32];
        let mut ctx = Context::new(&mut s);
        let g = ctx.new_tensor(DType::F32, [96, 16, 1, 1]).unwrap();
        let u = ctx.new_tensor(DType::F32, [96, 16, 1, 1]).unwrap();
        let res = ctx.new_tensor(DType::F32, [64, 16, 1, 1]).unwrap();
        let w = ctx.new_tensor(DType::Q4_1, [96, 64, 1, 1]).unwrap();
        let act = ctx.swiglu(g, u).unwrap();
        let d = ctx.mul_mat(w, act).unwrap();
        let e = ctx.add(d, res).unwrap();
        let t = CudaTuning::default();
        assert_eq!(runs(&plan(ctx.tensors(), &[act, d, e], &t)), [(0, 3, 121)]);
        // Two products of the SwiGLU share its blocks (no add then).
        let d2 = ctx.mul_mat(w, act).unwrap();
        assert_eq!(runs(&plan(ctx.tensors(), &[act, d, d2], &t)), [(0, 3, 22)]);
        // A SwiGLU alone, one of a decode-sized batch, and a GeGLU are no run.
        assert!(runs(&plan(ctx.tensors(), &[act], &t)).is_empty());
        let g4 = ctx
            .new_tensor(DType::F32, [96, MMQ_MIN_N - 1, 1, 1])
            .unwrap();
        let a4 = ctx.swiglu(g4, g4).unwrap();
        let p4 = ctx.mul_mat(w, a4).unwrap();
        assert!(runs(&plan(ctx.tensors(), &[a4, p4], &t)).is_empty());
        let ge = ctx.geglu(g, u).unwrap();
        let pe = ctx.mul_mat(w, ge).unwrap();
        assert!(runs(&plan(ctx.tensors(), &[ge, pe], &t)).is_empty());
    }
}
