//! The Q, K and V products with the RoPE + KV-cache store that follows them, in one `qmm`
//! launch (`fuse_qkv_rope`): the products run ([`ProductRun`], its norm prologue
//! included) and right after it (views aside) the [`RopeStore`] run whose ropes and
//! stores read those products. The epilogue of each product ropes its outputs (Q, K)
//! or stores them (V) with the `rope_store` kernel's instructions, so every node of both
//! runs gets the bits of the two launches it replaces.
//!
//! What qualifies, beyond what each run needs on its own: three products (Q, K, V);
//! normal RoPE (pairs (2t, 2t+1),
//! adjacent rows of one product) without the YaRN ramp (ext_factor 0); every rope and
//! store source a whole, offset-free view of one of the run's products, each product
//! read by at most one of them; contiguous roped outputs. Anything else stays two runs.

use ggml_core::{Op, RopeMode, Tensor, TensorId};

use super::{products, rope_store, Fusion, ProductRun, RopeStore, Tail};
use crate::qmm::RopeRole;
use crate::CudaTuning;

/// A matched run: the products, then the ropes and stores at `rope_at`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProductsRope {
    /// The products part (offsets from the run's first node).
    pub products: ProductRun,
    /// The rope + store part (offsets from `rope_at`).
    pub rope: RopeStore,
    /// Where the rope + store part starts in the run.
    pub rope_at: u8,
}

/// The fusion starting at `nodes[i]`, if one qualifies.
pub(super) fn matcher(
    tensors: &[Tensor],
    nodes: &[TensorId],
    i: usize,
    tuning: &CudaTuning,
) -> Option<(Fusion, usize)> {
    if !tuning.fuse_qkv_rope {
        return None;
    }
    let (Fusion::Products(p), n) = products::matcher(tensors, nodes, i, tuning)? else {
        return None;
    };
    if p.tail != Tail::None || p.n != 3 {
        return None;
    }
    let mut j = i + n;
    while j < nodes.len() && tensors.get(nodes[j].index())?.op.is_view() {
        j += 1;
    }
    if j >= nodes.len() {
        return None;
    }
    let (Fusion::RopeStore(r), m) = rope_store::matcher(tensors, nodes, j, tuning)? else {
        return None;
    };
    let run = ProductsRope {
        products: p,
        rope: r,
        rope_at: u8::try_from(j - i).ok()?,
    };
    roles(tensors, &nodes[i..j + m], run)?;
    Some((Fusion::ProductsRope(run), j + m - i))
}

/// The role of each product of `run` (whose nodes are `nodes`), if the run qualifies.
pub(crate) fn roles(
    tensors: &[Tensor],
    nodes: &[TensorId],
    run: ProductsRope,
) -> Option<[Option<RopeRole>; 3]> {
    let at = run.rope_at as usize;
    let parts = rope_store::Parts::of(tensors, nodes, at, run.rope)?;
    let Op::Rope(params) = parts.k.0.op else {
        return None;
    };
    if params.mode != RopeMode::Normal || params.ext_factor != 0.0 {
        return None;
    }
    let products: Vec<TensorId> = run.products.products[..run.products.n as usize]
        .iter()
        .map(|&o| nodes[o as usize])
        .collect();
    // The product that the source of node `o` (an offset from `at`) is a whole view of,
    // or is, with the product's rows as its first `dims` dimensions and its columns (the
    // tokens) as the next: element (row r, column c) of the product is the source's.
    let product_of = |o: u8, dims: usize| -> Option<usize> {
        let node = tensors.get(nodes.get(at + o as usize)?.index())?;
        let id = node.src[0]?;
        let src = tensors.get(id.index())?;
        let root = src.view_src.unwrap_or(id);
        let p = products.iter().position(|&p| p == root)?;
        let prod = tensors.get(root.index())?;
        let rows: usize = src.ne[..dims].iter().product();
        let whole = src.view_offs == 0
            && src.is_contiguous()
            && prod.is_contiguous()
            && rows == prod.ne[0]
            && src.ne[dims] == prod.ne[1]
            && src.nelements() == prod.nelements();
        whole.then_some(p)
    };
    let mut roles = [None; 3];
    let mut claim = |o: u8, role: RopeRole| -> Option<()> {
        // A rope reads [head dim, heads, tokens], the V store [row, tokens].
        let dims = if role == RopeRole::V { 1 } else { 2 };
        let k = product_of(o, dims)?;
        if roles[k].is_some() {
            return None;
        }
        roles[k] = Some(role);
        Some(())
    };
    let rope_out_ok = |t: &Tensor| t.is_contiguous() && t.ne[0] % 2 == 0;
    if !rope_out_ok(&parts.k.0) || params.n_dims as usize > parts.k.0.ne[0] {
        return None;
    }
    claim(run.rope.k_rope, RopeRole::K)?;
    if let (Some((q, _)), Some(o)) = (&parts.q, run.rope.q_rope) {
        if !rope_out_ok(q) {
            return None;
        }
        claim(o, RopeRole::Q)?;
    }
    if let Some(o) = run.rope.v_store {
        claim(o, RopeRole::V)?;
    }
    Some(roles)
}
