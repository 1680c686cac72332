//! Computation graphs with fixed capacity in caller-provided memory.

use crate::context::Context;
use crate::error::{Error, Result};
use crate::op::Op;
use crate::tensor::TensorId;

/// An ordered list of nodes (tensors computed by an op) and leaves (tensors with
/// [`Op::None`]), as ggml's `ggml_cgraph`.
///
/// The caller provides `ids` (capacity for nodes and leaves together) and `marks`, a
/// bitset scratch of at least [`Graph::marks_len`] words for the context's capacity.
/// Nodes appear in topological order (tensor id order).
#[derive(Debug)]
pub struct Graph<'a> {
    ids: &'a mut [TensorId],
    n_nodes: usize,
    n_leafs: usize,
    marks: &'a mut [u64],
}

impl<'a> Graph<'a> {
    /// Words of `marks` needed for a context of `tensor_capacity` tensors.
    pub const fn marks_len(tensor_capacity: usize) -> usize {
        2 * tensor_capacity.div_ceil(64)
    }

    /// An empty graph over caller-provided storage.
    pub fn new(ids: &'a mut [TensorId], marks: &'a mut [u64]) -> Graph<'a> {
        marks.fill(0);
        Graph {
            ids,
            n_nodes: 0,
            n_leafs: 0,
            marks,
        }
    }

    /// Removes all nodes and leaves.
    pub fn clear(&mut self) {
        self.n_nodes = 0;
        self.n_leafs = 0;
        self.marks.fill(0);
    }

    /// The nodes in execution order.
    pub fn nodes(&self) -> &[TensorId] {
        &self.ids[..self.n_nodes]
    }

    /// The leaves in the order they were reached.
    pub fn leafs(&self) -> impl Iterator<Item = TensorId> + '_ {
        let cap = self.ids.len();
        (0..self.n_leafs).map(move |i| self.ids[cap - 1 - i])
    }

    /// Number of nodes.
    pub fn n_nodes(&self) -> usize {
        self.n_nodes
    }

    /// Number of leaves.
    pub fn n_leafs(&self) -> usize {
        self.n_leafs
    }

    /// Whether `id` is a node or leaf of this graph.
    pub fn contains(&self, id: TensorId) -> bool {
        let i = id.index();
        self.marks
            .get(i / 64)
            .is_some_and(|w| w & (1u64 << (i % 64)) != 0)
    }

    /// Adds `out` and every tensor it depends on (sources and viewed tensors) that is
    /// not in the graph yet, in topological order, as `ggml_build_forward_expand`.
    /// Nothing is added if capacity runs out.
    pub fn build_forward_expand(&mut self, ctx: &Context<'_>, out: TensorId) -> Result<()> {
        let tensors = ctx.tensors();
        let last = out.index();
        if last >= tensors.len() {
            return Err(Error::UnknownTensor {
                id: out.0,
                len: tensors.len(),
            });
        }
        let words = ctx.capacity().div_ceil(64);
        if self.marks.len() < 2 * words {
            return Err(Error::CapacityExceeded {
                what: "graph marks (see Graph::marks_len)",
                capacity: self.marks.len(),
            });
        }
        let (member, want) = self.marks.split_at_mut(words);
        let want = &mut want[..words];
        want.fill(0);
        let get = |bits: &[u64], i: usize| bits[i / 64] & (1u64 << (i % 64)) != 0;
        let set = |bits: &mut [u64], i: usize| bits[i / 64] |= 1u64 << (i % 64);

        if get(member, last) {
            return Ok(());
        }
        set(want, last);
        let mut n_new_nodes = 0usize;
        let mut n_new_leafs = 0usize;
        // Sources have smaller ids, so one downward sweep marks every ancestor.
        for i in (0..=last).rev() {
            if !get(want, i) {
                continue;
            }
            let t = &tensors[i];
            if t.op == Op::None {
                n_new_leafs += 1;
            } else {
                n_new_nodes += 1;
            }
            for s in t.src.iter().chain(core::iter::once(&t.view_src)).flatten() {
                let j = s.index();
                if j >= i {
                    return Err(Error::UnknownTensor { id: s.0, len: i });
                }
                if !get(member, j) {
                    set(want, j);
                }
            }
        }
        let used = self.n_nodes + self.n_leafs;
        if used + n_new_nodes + n_new_leafs > self.ids.len() {
            return Err(Error::CapacityExceeded {
                what: "graph nodes and leafs",
                capacity: self.ids.len(),
            });
        }
        let cap = self.ids.len();
        for (i, t) in tensors[..=last].iter().enumerate() {
            if !get(want, i) {
                continue;
            }
            set(member, i);
            let id = TensorId(i as u32);
            if t.op == Op::None {
                self.ids[cap - 1 - self.n_leafs] = id;
                self.n_leafs += 1;
            } else {
                self.ids[self.n_nodes] = id;
                self.n_nodes += 1;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Tensor};

    #[test]
    fn builds_in_topological_order() {
        let mut s = [Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 16];
        let mut ctx = Context::new(&mut s);
        let w = ctx.new_tensor(DType::F32, [8, 8, 1, 1]).unwrap();
        let x = ctx.new_tensor(DType::F32, [8, 2, 1, 1]).unwrap();
        let unused = ctx.new_tensor(DType::F32, [8, 2, 1, 1]).unwrap();
        let y = ctx.mul_mat(w, x).unwrap();
        let z = ctx.add(y, x).unwrap();
        let z2 = ctx.scale(z, 2.0).unwrap();
        let mut ids = [TensorId(0); 8];
        let mut marks = [0u64; Graph::marks_len(16)];
        let mut g = Graph::new(&mut ids, &mut marks);
        g.build_forward_expand(&ctx, z).unwrap();
        g.build_forward_expand(&ctx, z2).unwrap();
        g.build_forward_expand(&ctx, z).unwrap();
        assert_eq!(g.nodes(), &[y, z, z2]);
        assert_eq!(g.leafs().collect::<std::vec::Vec<_>>(), [w, x]);
        assert!(!g.contains(unused));
    }

    #[test]
    fn capacity_error_adds_nothing() {
        let mut s = [Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 16];
        let mut ctx = Context::new(&mut s);
        let a = ctx.new_tensor(DType::F32, [8, 1, 1, 1]).unwrap();
        let b = ctx.scale(a, 2.0).unwrap();
        let c = ctx.scale(b, 2.0).unwrap();
        let mut ids = [TensorId(0); 2];
        let mut marks = [0u64; Graph::marks_len(16)];
        let mut g = Graph::new(&mut ids, &mut marks);
        assert!(matches!(
            g.build_forward_expand(&ctx, c),
            Err(Error::CapacityExceeded { .. })
        ));
        assert_eq!(g.n_nodes() + g.n_leafs(), 0);
        let mut small = [0u64; 1];
        let mut g2 = Graph::new(&mut ids, &mut small);
        assert!(g2.build_forward_expand(&ctx, a).is_err());
    }
}
