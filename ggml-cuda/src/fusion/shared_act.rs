//! Prompt-class quantised products that read one activation (Q, K and V; gate and up):
//! the activation is quantised to Q8_1 once for all of them instead of once per product.
//!
//! Each product still runs its own `qgemm` (or, with `no-qgemm`, `qmm`) launch on the
//! same Q8_1 blocks the unfused path would have made for it: the quantisation of one
//! activation gives the same bytes every time, so the results are bit for bit those of
//! the unfused nodes. A run is matched on shapes alone; whether the bytes allow it (no
//! product writes over the activation) is decided when it is launched, with the
//! addresses.

use ggml_core::{DType, Op, Tensor, TensorId};

use super::Fusion;
use crate::launch::MMQ_MIN_N;
use crate::reference::is_kernel_quant;
use crate::CudaTuning;

/// A matched run: offsets (within the run) of its 2 or 3 products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SharedAct {
    /// The products (the first `n` entries).
    pub products: [u8; 3],
    /// Number of products (2 or 3).
    pub n: u8,
}

/// The name op timing gives a run: `MUL_MAT*2` or `MUL_MAT*3`.
pub(crate) fn op_name(r: &SharedAct) -> &'static str {
    match r.n {
        2 => "MUL_MAT*2",
        _ => "MUL_MAT*3",
    }
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

/// The run of 2 or 3 consecutive (views aside) tiled products reading one activation that
/// starts at `nodes[i]`, if `tuning` allows it.
pub(crate) fn matcher(
    tensors: &[Tensor],
    nodes: &[TensorId],
    i: usize,
    tuning: &CudaTuning,
) -> Option<(Fusion, usize)> {
    if tuning.legacy_products || !tuning.fuse_qkv {
        return None;
    }
    let (act, k) = tiled_product(tensors, nodes[i])?;
    let mut products = [0u8; 3];
    let mut n = 1;
    let mut at = i + 1;
    while n < 3 {
        let mut j = at;
        while j < nodes.len() && tensors.get(nodes[j].index())?.op.is_view() {
            j += 1;
        }
        match nodes.get(j).and_then(|&id| tiled_product(tensors, id)) {
            Some(p) if p == (act, k) => {
                products[n] = u8::try_from(j - i).ok()?;
                n += 1;
                at = j + 1;
            }
            _ => break,
        }
    }
    if n < 2 {
        return None;
    }
    let run = SharedAct {
        products,
        n: n as u8,
    };
    Some((Fusion::SharedAct(run), products[n - 1] as usize + 1))
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

    fn runs(steps: &[Step]) -> Vec<(usize, usize, u8)> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::Fused {
                    fusion: Fusion::SharedAct(r),
                    start,
                    end,
                } => Some((*start, *end, r.n)),
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
        // Q, (view), K, V; gate, up. O and down read activations of their own.
        assert_eq!(
            runs(&plan(ctx.tensors(), &nodes, &t)),
            [(0, 4, 3), (6, 8, 2)]
        );
        // The switch, the legacy kernels, and decode-sized batches (the decode fusions'
        // matter, not this one) leave no such run.
        let off = CudaTuning {
            fuse_qkv: false,
            ..t
        };
        assert!(runs(&plan(ctx.tensors(), &nodes, &off)).is_empty());
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
}
