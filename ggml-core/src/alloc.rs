//! Graph memory planning: offsets for every tensor a graph computes, in one buffer, with
//! reuse of bytes once their last reader ran (like ggml-alloc's `gallocr`).
//!
//! The plan is an interval assignment over the node order: each tensor lives from the node
//! that writes it to the last node that reads it (directly or through views); a tensor is
//! placed in the best-fitting free block, and its bytes are freed after its last reader.
//! Tensors flagged [`TensorFlags::OUTPUT`] or [`TensorFlags::INPUT`] are never freed, so
//! they survive the whole compute (inputs are written before it starts, outputs read
//! after it ends). The plan assumes the nodes execute in order; a scheduler that runs
//! parts of a graph concurrently on several queues must order reuse itself (HB6).

use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::tensor::{Tensor, TensorFlags, TensorId};

/// Per-tensor result and scratch of [`plan`]; the caller provides one per tensor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    /// Byte offset assigned in the buffer (valid when `allocated`).
    pub offset: usize,
    /// Aligned bytes reserved.
    pub size: usize,
    /// Whether the tensor was given bytes by this plan.
    pub allocated: bool,
    /// Index of the last node reading the tensor (scratch).
    last_use: usize,
    /// Whether the tensor must stay allocated to the end (scratch).
    keep: bool,
    /// Whether its bytes were returned already (scratch).
    freed: bool,
}

/// A free range of the buffer (scratch of [`plan`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FreeBlock {
    offset: usize,
    size: usize,
}

/// Assigns offsets to every tensor of `graph` that needs bytes: leaves without data
/// (inputs) and non-view nodes without data, all aligned to `alignment` (a power of two).
/// Returns the buffer size needed; `slots[id]` holds each tensor's offset.
///
/// `slots` needs one entry per tensor of the context, `free` one per tensor the graph
/// may hold free at once (one per graph tensor is always enough).
pub fn plan(
    tensors: &[Tensor],
    graph: &Graph<'_>,
    alignment: usize,
    slots: &mut [Slot],
    free: &mut [FreeBlock],
) -> Result<usize> {
    plan_nodes(
        tensors,
        graph.nodes(),
        graph.leafs(),
        alignment,
        slots,
        free,
    )
}

/// [`plan`] over an explicit node order and leaf set (for callers that keep graphs as
/// plain id lists).
pub fn plan_nodes(
    tensors: &[Tensor],
    nodes: &[TensorId],
    leafs: impl IntoIterator<Item = TensorId>,
    alignment: usize,
    slots: &mut [Slot],
    free: &mut [FreeBlock],
) -> Result<usize> {
    if alignment == 0 || !alignment.is_power_of_two() {
        return Err(Error::Param {
            op: "alloc::plan",
            what: "alignment must be a power of two",
        });
    }
    if slots.len() < tensors.len() {
        return Err(Error::CapacityExceeded {
            what: "alloc slots (one per context tensor)",
            capacity: slots.len(),
        });
    }
    slots.fill(Slot::default());
    let root = |id: TensorId| -> usize {
        let t = &tensors[id.index()];
        t.view_src.unwrap_or(id).index()
    };
    let needs_bytes = |t: &Tensor| t.data.is_none() && t.view_src.is_none();
    let check = |id: TensorId| -> Result<()> {
        if id.index() < tensors.len() {
            Ok(())
        } else {
            Err(Error::UnknownTensor {
                id: id.0,
                len: tensors.len(),
            })
        }
    };

    // Lifetimes: last reader of every root tensor.
    for (i, &n) in nodes.iter().enumerate() {
        check(n)?;
        let t = &tensors[n.index()];
        for s in t.src.iter().flatten() {
            check(*s)?;
            slots[root(*s)].last_use = i;
        }
        if let Some(v) = t.view_src {
            check(v)?;
            slots[v.index()].last_use = i;
        }
        let r = root(n);
        if slots[r].last_use < i {
            slots[r].last_use = i;
        }
        if t.flags.contains(TensorFlags::OUTPUT) || t.flags.contains(TensorFlags::INPUT) {
            slots[r].keep = true;
        }
    }

    let mut arena = Arena {
        free,
        n_free: 0,
        top: 0,
    };
    // Leaves that need bytes (inputs) live for the whole graph.
    for l in leafs {
        check(l)?;
        let t = &tensors[l.index()];
        if needs_bytes(t) {
            let size = aligned(t.nbytes(), alignment)?;
            let s = &mut slots[l.index()];
            s.offset = arena.take(size)?;
            s.size = size;
            s.allocated = true;
            s.keep = true;
        }
    }
    for (i, &n) in nodes.iter().enumerate() {
        let t = &tensors[n.index()];
        if needs_bytes(t) {
            let size = aligned(t.nbytes(), alignment)?;
            let offset = arena.take(size)?;
            let s = &mut slots[n.index()];
            s.offset = offset;
            s.size = size;
            s.allocated = true;
        }
        // Free every root whose last reader is this node (allocation above came first, so
        // a result never overlaps its own operands).
        let t = &tensors[n.index()];
        let reads = t
            .src
            .iter()
            .flatten()
            .chain(t.view_src.iter())
            .map(|s| root(*s));
        for r in reads.chain(core::iter::once(n.index())) {
            let slot = &mut slots[r];
            if slot.allocated && !slot.keep && !slot.freed && slot.last_use == i {
                slot.freed = true;
                let (offset, size) = (slot.offset, slot.size);
                arena.give_back(offset, size)?;
            }
        }
    }
    Ok(arena.top)
}

fn aligned(n: usize, alignment: usize) -> Result<usize> {
    n.checked_add(alignment - 1)
        .map(|v| v & !(alignment - 1))
        .ok_or(Error::Overflow {
            what: "aligned tensor size",
        })
}

struct Arena<'a> {
    free: &'a mut [FreeBlock],
    n_free: usize,
    top: usize,
}

impl Arena<'_> {
    /// Best fit among free blocks, else grows the buffer.
    fn take(&mut self, size: usize) -> Result<usize> {
        let mut best: Option<usize> = None;
        for i in 0..self.n_free {
            let b = self.free[i];
            if b.size >= size && best.is_none_or(|j| self.free[j].size > b.size) {
                best = Some(i);
            }
        }
        if let Some(i) = best {
            let off = self.free[i].offset;
            self.free[i].offset += size;
            self.free[i].size -= size;
            if self.free[i].size == 0 {
                self.free.copy_within(i + 1..self.n_free, i);
                self.n_free -= 1;
            }
            return Ok(off);
        }
        // Grow, absorbing a free block that ends at the top.
        if let Some(i) =
            (0..self.n_free).find(|&i| self.free[i].offset + self.free[i].size == self.top)
        {
            let off = self.free[i].offset;
            self.top = off.checked_add(size).ok_or(Error::Overflow {
                what: "buffer size",
            })?;
            self.free.copy_within(i + 1..self.n_free, i);
            self.n_free -= 1;
            return Ok(off);
        }
        let off = self.top;
        self.top = off.checked_add(size).ok_or(Error::Overflow {
            what: "buffer size",
        })?;
        Ok(off)
    }

    /// Returns a range to the free list (kept sorted by offset, neighbours merged).
    fn give_back(&mut self, offset: usize, size: usize) -> Result<()> {
        let pos = (0..self.n_free)
            .find(|&i| self.free[i].offset > offset)
            .unwrap_or(self.n_free);
        let merges_prev = pos > 0 && self.free[pos - 1].offset + self.free[pos - 1].size == offset;
        let merges_next = pos < self.n_free && offset + size == self.free[pos].offset;
        match (merges_prev, merges_next) {
            (true, true) => {
                self.free[pos - 1].size += size + self.free[pos].size;
                self.free.copy_within(pos + 1..self.n_free, pos);
                self.n_free -= 1;
            }
            (true, false) => self.free[pos - 1].size += size,
            (false, true) => {
                self.free[pos].offset = offset;
                self.free[pos].size += size;
            }
            (false, false) => {
                if self.n_free == self.free.len() {
                    return Err(Error::CapacityExceeded {
                        what: "alloc free blocks",
                        capacity: self.free.len(),
                    });
                }
                self.free.copy_within(pos..self.n_free, pos + 1);
                self.free[pos] = FreeBlock { offset, size };
                self.n_free += 1;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Context, DType};

    #[test]
    fn reuses_dead_bytes_and_keeps_outputs() {
        let mut s = [Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 16];
        let mut ctx = Context::new(&mut s);
        let x = ctx.new_tensor(DType::F32, [64, 1, 1, 1]).unwrap(); // input: 256 B
        ctx.set_flags(x, TensorFlags::INPUT).unwrap();
        let a = ctx.scale(x, 2.0).unwrap(); // 256
        let b = ctx.scale(a, 2.0).unwrap(); // a dies after b
        let c = ctx.scale(b, 2.0).unwrap(); // can reuse a's bytes
        let d = ctx.scale(c, 2.0).unwrap();
        ctx.set_flags(d, TensorFlags::OUTPUT).unwrap();
        let mut ids = [TensorId(0); 16];
        let mut marks = [0u64; Graph::marks_len(16)];
        let mut g = Graph::new(&mut ids, &mut marks);
        g.build_forward_expand(&ctx, d).unwrap();
        let mut slots = [Slot::default(); 16];
        let mut free = [FreeBlock::default(); 16];
        let size = plan(ctx.tensors(), &g, 64, &mut slots, &mut free).unwrap();
        let off = |id: TensorId| slots[id.index()].offset;
        assert_eq!(size, 3 * 256, "the input and two ping-pong buffers");
        assert_eq!(off(c), off(a));
        assert_eq!(off(d), off(b), "b is dead once c ran");
        assert_ne!(off(b), off(a));
        assert!(off(x) != off(a) && off(x) != off(b));
        // Every live pair is disjoint: check all nodes' operands against results.
        for &n in g.nodes() {
            let t = ctx.get(n).unwrap();
            for src in t.src.iter().flatten() {
                assert_ne!(off(*src), off(n));
            }
        }
    }

    #[test]
    fn views_extend_the_life_of_their_root() {
        let mut s = [Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 16];
        let mut ctx = Context::new(&mut s);
        let x = ctx.new_tensor(DType::F32, [64, 2, 1, 1]).unwrap();
        ctx.set_flags(x, TensorFlags::INPUT).unwrap();
        let a = ctx.scale(x, 2.0).unwrap();
        let v = ctx.view_2d(a, 64, 1, 256, 256).unwrap();
        let b = ctx.scale(x, 3.0).unwrap(); // must not land on a: v still reads it
        let c = ctx.add(b, v).unwrap();
        ctx.set_flags(c, TensorFlags::OUTPUT).unwrap();
        let mut ids = [TensorId(0); 16];
        let mut marks = [0u64; Graph::marks_len(16)];
        let mut g = Graph::new(&mut ids, &mut marks);
        g.build_forward_expand(&ctx, c).unwrap();
        let mut slots = [Slot::default(); 16];
        let mut free = [FreeBlock::default(); 16];
        plan(ctx.tensors(), &g, 32, &mut slots, &mut free).unwrap();
        let (sa, sb) = (slots[a.index()], slots[b.index()]);
        assert!(sa.offset + sa.size <= sb.offset || sb.offset + sb.size <= sa.offset);
        assert!(!slots[v.index()].allocated);
    }

    #[test]
    fn bad_alignment_is_an_error() {
        let mut s = [Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 2];
        let ctx = Context::new(&mut s);
        let mut ids = [TensorId(0); 2];
        let mut marks = [0u64; 2];
        let g = Graph::new(&mut ids, &mut marks);
        let mut slots = [Slot::default(); 2];
        let mut free = [FreeBlock::default(); 2];
        assert!(plan(ctx.tensors(), &g, 3, &mut slots, &mut free).is_err());
    }
}
