//! Runs of decode-class quantised products that one `qmm` launch computes:
//!
//! - `fuse_norm`: RMS_NORM -> MUL by a norm weight -> the product(s) reading the MUL's
//!   output: the prologue computes the norm (rms_norm's reduction order) times the
//!   weight, writes both nodes, and quantises the result for the products;
//! - `fuse_qkv`: up to three products that read the same activation (Q, K and V);
//! - `fuse_glu`: two products (gate and up) and the SWIGLU/GEGLU of their outputs;
//! - `fuse_add`: one product and the ADD of its output and a residual.
//!
//! Only shapes the fused kernel computes exactly as the unfused ones qualify (2-D f32
//! activations of fewer than [`MMQ_MIN_N`] columns, quantised weights, unit element
//! strides); anything else is left to the single-node kernels. View nodes between the
//! matched ones are part of the run (they launch nothing). Whether the tensors' bytes
//! allow a fused launch (no output over bytes the launch reads or writes elsewhere, all
//! in this device's memory) is decided when the run is launched, with the addresses.

use ggml_core::{DType, Op, Tensor, TensorId};

use super::{skip_views, Fusion};
use crate::launch::MMQ_MIN_N;
use crate::reference::is_kernel_quant;
use crate::CudaTuning;

/// What follows the products in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tail {
    /// Nothing.
    None,
    /// The ADD at this offset of the run (one product).
    Add(u8),
    /// The SWIGLU or GEGLU at this offset (two products; `gate_first`: its first operand
    /// is the run's first product).
    Glu {
        /// Offset of the GLU node in the run.
        at: u8,
        /// Whether the gate (the GLU's first operand) is the first product.
        gate_first: bool,
    },
}

/// A matched run: offsets of its nodes within the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProductRun {
    /// RMS_NORM and MUL.
    pub norm: Option<(u8, u8)>,
    /// The products (the first `n` entries).
    pub products: [u8; 3],
    /// Number of products (1..=3).
    pub n: u8,
    /// The epilogue.
    pub tail: Tail,
}

/// The name op timing gives run `r`: its ops, products counted (the norm is RMS_NORM and
/// its MUL).
pub(crate) fn op_name(r: &ProductRun) -> &'static str {
    match (r.norm.is_some(), r.n, r.tail) {
        (true, 1, Tail::None) => "RMS_NORM+MUL_MAT",
        (true, 1, Tail::Add(_)) => "RMS_NORM+MUL_MAT+ADD",
        (true, 2, Tail::None) => "RMS_NORM+MUL_MAT*2",
        (true, 2, Tail::Glu { .. }) => "RMS_NORM+MUL_MAT*2+GLU",
        (true, _, _) => "RMS_NORM+MUL_MAT*3",
        (false, 1, _) => "MUL_MAT+ADD",
        (false, 2, Tail::Glu { .. }) => "MUL_MAT*2+GLU",
        (false, 2, _) => "MUL_MAT*2",
        (false, _, _) => "MUL_MAT*3",
    }
}

fn get(tensors: &[Tensor], id: Option<TensorId>) -> Option<&Tensor> {
    tensors.get(id?.index())
}

/// An f32 tensor of at most 2 dimensions with unit element stride.
fn f32_2d(t: &Tensor) -> bool {
    t.dtype == DType::F32 && t.ne[2] == 1 && t.ne[3] == 1 && (t.ne[0] <= 1 || t.nb[0] == 4)
}

/// Whether node `id` is a decode-class quantised product `qmm` runs on its own: its
/// activation and K.
fn product(tensors: &[Tensor], id: TensorId) -> Option<(TensorId, usize)> {
    let t = tensors.get(id.index())?;
    if t.op != Op::MulMat {
        return None;
    }
    let w = get(tensors, t.src[0])?;
    let a_id = t.src[1]?;
    let a = get(tensors, Some(a_id))?;
    let ok = is_kernel_quant(w.dtype)
        && w.ne[2] == 1
        && w.ne[3] == 1
        && w.nb[0] == w.dtype.type_size()
        && f32_2d(a)
        && a.ne[1] < MMQ_MIN_N
        && a.ne[0] == w.ne[0]
        && f32_2d(t)
        && t.ne[0] == w.ne[1]
        && t.ne[1] == a.ne[1];
    ok.then_some((a_id, w.ne[0]))
}

/// RMS_NORM at `i` and the MUL by a norm weight after it: their positions and the MUL's
/// output (the activation).
fn norm(tensors: &[Tensor], nodes: &[TensorId], i: usize) -> Option<(usize, usize, TensorId)> {
    let r_id = nodes[i];
    let r = &tensors[r_id.index()];
    if !matches!(r.op, Op::RmsNorm { .. }) || !f32_2d(r) || r.ne[1] >= MMQ_MIN_N {
        return None;
    }
    let x = get(tensors, r.src[0])?;
    if !f32_2d(x) || x.ne != r.ne {
        return None;
    }
    let j = skip_views(tensors, nodes, i + 1);
    let m_id = *nodes.get(j)?;
    let m = &tensors[m_id.index()];
    if m.op != Op::Mul || !f32_2d(m) || m.ne != r.ne || m.nb[1] != r.nb[1] {
        return None;
    }
    let w = match (m.src[0], m.src[1]) {
        (Some(a), Some(b)) if a == r_id => get(tensors, Some(b))?,
        (Some(a), Some(b)) if b == r_id => get(tensors, Some(a))?,
        _ => return None,
    };
    // The norm weight: one f32 row of K values, broadcast over the columns.
    let weight_ok = w.dtype == DType::F32 && w.ne == [r.ne[0], 1, 1, 1] && w.nb[0] == 4;
    weight_ok.then_some((i, j, m_id))
}

/// The run of products (and what comes with them) starting at `nodes[i]`, if the
/// switches in `tuning` allow one of at least two nodes.
pub(crate) fn matcher(
    tensors: &[Tensor],
    nodes: &[TensorId],
    i: usize,
    tuning: &CudaTuning,
) -> Option<(Fusion, usize)> {
    // A run starts at a node that computes something (views only ever sit inside one).
    if tuning.legacy_products || tensors.get(nodes[i].index())?.op.is_view() {
        return None;
    }
    let off = |k: usize| u8::try_from(k - i).ok();
    let (norm_at, act, mut at) = match tuning.fuse_norm.then(|| norm(tensors, nodes, i)) {
        Some(Some((r, m, act))) => (Some((off(r)?, off(m)?)), Some(act), m + 1),
        _ => (None, None, i),
    };
    // The products: consecutive (views aside), reading one activation.
    let most = if tuning.fuse_qkv || tuning.fuse_glu {
        3
    } else {
        1
    };
    let mut products = [0u8; 3];
    let mut n = 0;
    let mut act = act;
    let mut k_of = None;
    loop {
        let j = skip_views(tensors, nodes, at);
        let Some(&id) = nodes.get(j) else { break };
        let Some((a, k)) = product(tensors, id) else {
            break;
        };
        if act.is_some_and(|x| x != a) || k_of.is_some_and(|x| x != k) || n == most {
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
    let node = |o: u8| &tensors[nodes[i + o as usize].index()];
    let id_of = |o: u8| nodes[i + o as usize];
    let mut tail = Tail::None;
    // Gate and up products with their gated activation.
    if n >= 2 && tuning.fuse_glu {
        let second = skip_views(tensors, nodes, i + products[1] as usize + 1);
        if let Some(g) = nodes.get(second).map(|id| &tensors[id.index()]) {
            let (p0, p1) = (id_of(products[0]), id_of(products[1]));
            let same = node(products[0]).ne == node(products[1]).ne;
            let glu_ok = matches!(g.op, Op::Swiglu | Op::Geglu) && f32_2d(g) && same;
            let gate_first = match (g.src[0], g.src[1]) {
                (Some(a), Some(b)) if a == p0 && b == p1 => Some(true),
                (Some(a), Some(b)) if a == p1 && b == p0 => Some(false),
                _ => None,
            };
            if let (true, Some(gate_first)) = (glu_ok && g.ne == node(products[0]).ne, gate_first) {
                n = 2;
                tail = Tail::Glu {
                    at: off(second)?,
                    gate_first,
                };
            }
        }
    }
    if tail == Tail::None && !tuning.fuse_qkv {
        n = 1;
    }
    let end_products = i + products[n - 1] as usize + 1;
    if tail == Tail::None && n == 1 && tuning.fuse_add {
        let j = skip_views(tensors, nodes, end_products);
        if let Some(&id) = nodes.get(j) {
            let t = &tensors[id.index()];
            let p = id_of(products[0]);
            let other = match (t.src[0], t.src[1]) {
                (Some(a), Some(b)) if a == p && b != p => Some(b),
                (Some(a), Some(b)) if b == p && a != p => Some(a),
                _ => None,
            };
            let res_ok =
                get(tensors, other).is_some_and(|r| f32_2d(r) && r.ne == node(products[0]).ne);
            if t.op == Op::Add && f32_2d(t) && t.ne == node(products[0]).ne && res_ok {
                tail = Tail::Add(off(j)?);
            }
        }
    }
    let last = match tail {
        Tail::None => i + products[n - 1] as usize,
        Tail::Add(o) | Tail::Glu { at: o, .. } => i + o as usize,
    };
    // A single product alone is no fusion: it runs as one launch anyway.
    if norm_at.is_none() && n == 1 && tail == Tail::None {
        return None;
    }
    let run = ProductRun {
        norm: norm_at,
        products,
        n: n as u8,
        tail,
    };
    Some((Fusion::Products(run), last + 1 - i))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fusion::{plan, Step};
    use ggml_core::Context;

    fn storage() -> Vec<Tensor> {
        vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 64]
    }

    /// The nodes of a llama layer's products as the harness orders them (views left in,
    /// as a graph_compute caller may pass them): norm, Q, K, V; O and its residual add;
    /// norm, gate, up, SwiGLU; down and its add.
    fn layer(ctx: &mut Context<'_>, n: usize, wdt: DType) -> Vec<TensorId> {
        let x = ctx.new_tensor(DType::F32, [64, n, 1, 1]).unwrap();
        let g = ctx.new_tensor(DType::F32, [64, 1, 1, 1]).unwrap();
        let r = ctx.rms_norm(x, 1e-5).unwrap();
        let cur = ctx.mul(r, g).unwrap();
        let wq = ctx.new_tensor(wdt, [64, 64, 1, 1]).unwrap();
        let wk = ctx.new_tensor(wdt, [64, 32, 1, 1]).unwrap();
        let wv = ctx.new_tensor(wdt, [64, 32, 1, 1]).unwrap();
        let q = ctx.mul_mat(wq, cur).unwrap();
        let k = ctx.mul_mat(wk, cur).unwrap();
        let v = ctx.mul_mat(wv, cur).unwrap();
        let q3 = ctx.reshape(q, [16, 4, n, 1]).unwrap();
        let o = ctx.reshape(q3, [64, n, 1, 1]).unwrap();
        let wo = ctx.new_tensor(wdt, [64, 64, 1, 1]).unwrap();
        let o = ctx.mul_mat(wo, o).unwrap();
        let h = ctx.add(o, x).unwrap();
        let r2 = ctx.rms_norm(h, 1e-5).unwrap();
        let cur2 = ctx.mul(r2, g).unwrap();
        let wg = ctx.new_tensor(wdt, [64, 96, 1, 1]).unwrap();
        let wu = ctx.new_tensor(wdt, [64, 96, 1, 1]).unwrap();
        let gate = ctx.mul_mat(wg, cur2).unwrap();
        let up = ctx.mul_mat(wu, cur2).unwrap();
        let act = ctx.swiglu(gate, up).unwrap();
        let wd = ctx.new_tensor(wdt, [96, 64, 1, 1]).unwrap();
        let d = ctx.mul_mat(wd, act).unwrap();
        let out = ctx.add(d, h).unwrap();
        vec![r, cur, q, k, v, q3, o, h, r2, cur2, gate, up, act, d, out]
    }

    fn fused(steps: &[Step]) -> Vec<(usize, usize)> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::Fused { start, end, .. } => Some((*start, *end)),
                Step::Node(_) => None,
            })
            .collect()
    }

    #[test]
    fn a_llama_layer_is_four_runs() {
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let nodes = layer(&mut ctx, 1, DType::Q4_1);
        let steps = plan(ctx.tensors(), &nodes, &CudaTuning::default());
        // norm + QKV (views after V included only up to V), O + add, norm + gate + up +
        // GLU, down + add.
        assert_eq!(fused(&steps), [(0, 5), (6, 8), (8, 13), (13, 15)]);
        assert_eq!(steps.len(), 5, "{steps:?}");
        let Step::Fused {
            fusion: Fusion::Products(run),
            ..
        } = steps[0]
        else {
            panic!("{steps:?}")
        };
        assert_eq!((run.norm, run.n, run.tail), (Some((0, 1)), 3, Tail::None));
    }

    #[test]
    fn each_switch_turns_its_part_off() {
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let nodes = layer(&mut ctx, 3, DType::Q4_0);
        let ts = ctx.tensors();
        let t = CudaTuning::default();
        let no_qkv = CudaTuning {
            fuse_qkv: false,
            ..t
        };
        // norm + Q; K and V alone (nothing to fuse them with); the GLU run keeps both.
        assert_eq!(
            fused(&plan(ts, &nodes, &no_qkv)),
            [(0, 3), (6, 8), (8, 13), (13, 15)]
        );
        let no_norm = CudaTuning {
            fuse_norm: false,
            ..t
        };
        assert_eq!(
            fused(&plan(ts, &nodes, &no_norm)),
            [(2, 5), (6, 8), (10, 13), (13, 15)]
        );
        let no_glu = CudaTuning {
            fuse_glu: false,
            ..t
        };
        assert_eq!(
            fused(&plan(ts, &nodes, &no_glu)),
            [(0, 5), (6, 8), (8, 12), (13, 15)]
        );
        let no_add = CudaTuning {
            fuse_add: false,
            ..t
        };
        assert_eq!(fused(&plan(ts, &nodes, &no_add)), [(0, 5), (8, 13)]);
        let legacy = CudaTuning {
            legacy_products: true,
            ..t
        };
        assert!(fused(&plan(ts, &nodes, &legacy)).is_empty());
        assert!(fused(&plan(ts, &nodes, &t.without_fusions())).is_empty());
    }

    #[test]
    fn prompt_batches_and_float_weights_do_not_qualify() {
        for (n, wdt) in [(8, DType::Q4_1), (1, DType::F16), (2, DType::F32)] {
            let mut s = storage();
            let mut ctx = Context::new(&mut s);
            let nodes = layer(&mut ctx, n, wdt);
            let steps = plan(ctx.tensors(), &nodes, &CudaTuning::default());
            // Prompt batches' products share their quantised activation (a run of
            // another kind, `shared_act.rs`), nothing of this module's.
            let ours = steps.iter().any(|s| {
                matches!(
                    s,
                    Step::Fused {
                        fusion: Fusion::Products(_),
                        ..
                    }
                )
            });
            assert!(!ours, "N {n} {wdt}: {steps:?}");
        }
    }

    #[test]
    fn patterns_that_do_not_qualify() {
        let mut s = storage();
        let mut ctx = Context::new(&mut s);
        let x = ctx.new_tensor(DType::F32, [64, 2, 1, 1]).unwrap();
        let y = ctx.new_tensor(DType::F32, [64, 2, 1, 1]).unwrap();
        let g = ctx.new_tensor(DType::F32, [64, 2, 1, 1]).unwrap();
        let w = ctx.new_tensor(DType::Q8_0, [64, 16, 1, 1]).unwrap();
        // A MUL by a full matrix (not a norm weight row) before the product: no norm part.
        let r = ctx.rms_norm(x, 1e-5).unwrap();
        let m = ctx.mul(r, g).unwrap();
        let p = ctx.mul_mat(w, m).unwrap();
        // Products of different activations.
        let p1 = ctx.mul_mat(w, x).unwrap();
        let p2 = ctx.mul_mat(w, y).unwrap();
        // An add whose other operand broadcasts.
        let y2 = ctx.new_tensor(DType::F32, [64, 2, 1, 1]).unwrap();
        let b = ctx.new_tensor(DType::F32, [16, 1, 1, 1]).unwrap();
        let p3 = ctx.mul_mat(w, y2).unwrap();
        let a = ctx.add(p3, b).unwrap();
        // A GLU of a product and something else.
        let p4 = ctx.mul_mat(w, x).unwrap();
        let z = ctx.new_tensor(DType::F32, [16, 2, 1, 1]).unwrap();
        let sw = ctx.swiglu(p4, z).unwrap();
        let nodes = [r, m, p, p1, p2, p3, a, p4, sw];
        let steps = plan(ctx.tensors(), &nodes, &CudaTuning::default());
        assert!(fused(&steps).is_empty(), "{steps:?}");
    }
}
