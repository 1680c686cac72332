//! Fusion: patterns over consecutive nodes of a split that run as one launch, as
//! llama.cpp's `ggml_cuda_try_fuse` does.
//!
//! [`plan`] walks the nodes of a `graph_compute` call in order and cuts them into
//! [`Step`]s: a single node, or a run of consecutive nodes (views in between included)
//! that one fused kernel computes. A fused launch computes every node it replaces, with
//! the same arithmetic as the unfused kernels of the same generation, so results are bit
//! for bit those of the unfused path and every node's output stays readable by whatever
//! else reads it (another split, the host). Each fusion has a switch in
//! [`CudaTuning`](crate::CudaTuning).

use ggml_core::{Tensor, TensorId};

use crate::CudaTuning;

mod products;
mod products_rope;
mod rope_store;
mod shared_act;
pub(crate) use products::{ProductRun, Tail};
pub(crate) use products_rope::{roles as products_rope_roles, ProductsRope};
pub(crate) use rope_store::{Parts as RopeStoreParts, RopeStore};
pub(crate) use shared_act::SharedAct;

/// A run of nodes that one fused kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fusion {
    /// RoPE of K (and of Q) with the KV-cache stores of K (and of V): `rope_store`.
    RopeStore(RopeStore),
    /// Decode-class quantised products with their norm prologue, shared activation or
    /// epilogue (one `qmm` launch).
    Products(ProductRun),
    /// Q, K and V products with the RoPE + KV-cache store that reads them (one `qmm`
    /// launch with the RoPE epilogue).
    ProductsRope(ProductsRope),
    /// Prompt-class products that read one activation, on one Q8_1 quantisation of it
    /// (by `quantize_q8_1`, with the RMS norm and weight that make it by `rms_norm_q8_1`,
    /// or with the SwiGLU that makes it by `swiglu_q8_1`), then the products' launches.
    SharedAct(SharedAct),
}

impl Fusion {
    /// What op timing counts the run as: a name per shape of run (`RMS_NORM+MUL_MAT*3`:
    /// the norm and three products) and, for products, the type of the first product's
    /// weights.
    pub(crate) fn key(&self, tensors: &[Tensor], nodes: &[TensorId]) -> ggml_core::OpKey {
        match self {
            Fusion::RopeStore(r) => {
                let name = match (r.q_rope.is_some(), r.v_store.is_some()) {
                    (true, true) => "ROPE*2+SET_ROWS*2",
                    (true, false) => "ROPE*2+SET_ROWS",
                    (false, true) => "ROPE+SET_ROWS*2",
                    (false, false) => "ROPE+SET_ROWS",
                };
                (name, None)
            }
            Fusion::Products(r) => (
                products::op_name(r),
                weight_name(tensors, nodes, r.products[0]),
            ),
            Fusion::SharedAct(r) => (
                shared_act::op_name(r),
                weight_name(tensors, nodes, r.products[0]),
            ),
            Fusion::ProductsRope(r) => {
                let (_, w) = Fusion::Products(r.products).key(tensors, nodes);
                let norm = r.products.norm.is_some();
                let name = match (norm, r.rope.q_rope.is_some(), r.rope.v_store.is_some()) {
                    (true, true, true) => "RMS_NORM+MUL_MAT*3+ROPE*2+SET_ROWS*2",
                    (true, true, false) => "RMS_NORM+MUL_MAT*3+ROPE*2+SET_ROWS",
                    (true, false, true) => "RMS_NORM+MUL_MAT*3+ROPE+SET_ROWS*2",
                    (true, false, false) => "RMS_NORM+MUL_MAT*3+ROPE+SET_ROWS",
                    (false, true, true) => "MUL_MAT*3+ROPE*2+SET_ROWS*2",
                    (false, true, false) => "MUL_MAT*3+ROPE*2+SET_ROWS",
                    (false, false, true) => "MUL_MAT*3+ROPE+SET_ROWS*2",
                    (false, false, false) => "MUL_MAT*3+ROPE+SET_ROWS",
                };
                (name, w)
            }
        }
    }
}

/// The index of the first node at or after `i` that is not a view (`nodes.len()` if
/// none).
pub(crate) fn skip_views(tensors: &[Tensor], nodes: &[TensorId], mut i: usize) -> usize {
    while i < nodes.len() && tensors[nodes[i].index()].op.is_view() {
        i += 1;
    }
    i
}

/// The operand of binary node `t` other than `id`, when exactly one of its two operands
/// is `id` (a norm's weight beside the norm, a residual beside a product).
pub(crate) fn other_operand(t: &Tensor, id: TensorId) -> Option<TensorId> {
    match (t.src[0], t.src[1]) {
        (Some(a), Some(b)) if a == id && b != id => Some(b),
        (Some(a), Some(b)) if b == id && a != id => Some(a),
        _ => None,
    }
}

/// The dtype name of the weights of the product at offset `at` of a run.
fn weight_name(tensors: &[Tensor], nodes: &[TensorId], at: u8) -> Option<&'static str> {
    let p = tensors.get(nodes.get(at as usize)?.index())?;
    Some(tensors.get(p.src[0]?.index())?.dtype.name())
}

/// One step of a split's execution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// `nodes[i]` on its own.
    Node(usize),
    /// `nodes[start..end]` as one fused launch (views among them included).
    Fused {
        /// What the run computes.
        fusion: Fusion,
        /// First node of the run.
        start: usize,
        /// One past the last node of the run.
        end: usize,
    },
}

/// A matcher: the fusion that starts at `nodes[i]` and how many nodes it takes, if one
/// does.
type Matcher = fn(&[Tensor], &[TensorId], usize, &CudaTuning) -> Option<(Fusion, usize)>;

/// Every fusion's matcher, tried in order at each node.
const MATCHERS: &[Matcher] = &[
    products_rope::matcher,
    rope_store::matcher,
    products::matcher,
    shared_act::matcher,
];

/// The steps that compute `nodes` with the fusions `tuning` allows.
pub(crate) fn plan(tensors: &[Tensor], nodes: &[TensorId], tuning: &CudaTuning) -> Vec<Step> {
    let mut steps = Vec::with_capacity(nodes.len());
    let mut i = 0;
    while i < nodes.len() {
        match MATCHERS.iter().find_map(|m| m(tensors, nodes, i, tuning)) {
            Some((fusion, n)) if n > 0 => {
                steps.push(Step::Fused {
                    fusion,
                    start: i,
                    end: i + n,
                });
                i += n;
            }
            _ => {
                steps.push(Step::Node(i));
                i += 1;
            }
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_core::{Context, DType};

    #[test]
    fn without_matches_every_node_is_a_step() {
        let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 8];
        let mut ctx = Context::new(&mut s);
        let a = ctx.new_tensor(DType::F32, [4, 1, 1, 1]).unwrap();
        let b = ctx.add(a, a).unwrap();
        let c = ctx.mul(b, a).unwrap();
        let steps = plan(ctx.tensors(), &[b, c], &CudaTuning::legacy());
        assert_eq!(steps, [Step::Node(0), Step::Node(1)]);
    }
}
