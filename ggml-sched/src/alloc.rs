//! Compute-buffer layout, one buffer per backend.
//!
//! Each backend's buffer holds, first, the tensors that live across runs: user inputs,
//! the slot copies of cross-backend inputs (one per pipeline slot) and outputs (one per
//! slot, so run r's outputs stay readable while run r + 1 executes). Then an interval
//! plan over the graph's node order places the backend's other nodes, reusing the bytes
//! of a tensor after its last reader: a node on the same backend, or the input phase of
//! the split that copies it to another backend. Only the owner's queue reuses bytes;
//! copies that read them from another queue are ordered by the plan (see
//! [`crate::plan`], HB4/HB6).

use ggml_core::{Op, Tensor, TensorFlags, TensorId};

use crate::error::{Result, SchedError};
use crate::partition::Partition;

/// Where every tensor that needs bytes goes, per pipeline slot.
#[derive(Clone, Debug)]
pub(crate) struct Layout {
    /// Bytes needed per backend.
    pub sizes: Vec<usize>,
    /// `place[slot][id] = (backend, offset)` for tensors placed by the scheduler.
    pub place: Vec<Vec<Option<(usize, usize)>>>,
}

fn aligned(n: usize, a: usize) -> Result<usize> {
    n.checked_add(a - 1)
        .map(|v| v & !(a - 1))
        .ok_or_else(|| SchedError::Invalid("tensor size overflows".into()))
}

#[derive(Default)]
struct FreeList {
    blocks: Vec<(usize, usize)>,
    top: usize,
}

impl FreeList {
    fn take(&mut self, size: usize) -> usize {
        let best = self
            .blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| b.1 >= size)
            .min_by_key(|(_, b)| b.1)
            .map(|(i, _)| i);
        if let Some(i) = best {
            let off = self.blocks[i].0;
            self.blocks[i].0 += size;
            self.blocks[i].1 -= size;
            if self.blocks[i].1 == 0 {
                self.blocks.remove(i);
            }
            return off;
        }
        if let Some(i) = self.blocks.iter().position(|b| b.0 + b.1 == self.top) {
            let off = self.blocks[i].0;
            self.blocks.remove(i);
            self.top = off + size;
            return off;
        }
        let off = self.top;
        self.top += size;
        off
    }

    fn give(&mut self, off: usize, size: usize) {
        if size == 0 {
            return;
        }
        let pos = self.blocks.partition_point(|b| b.0 < off);
        self.blocks.insert(pos, (off, size));
        if pos + 1 < self.blocks.len()
            && self.blocks[pos].0 + self.blocks[pos].1 == self.blocks[pos + 1].0
        {
            self.blocks[pos].1 += self.blocks[pos + 1].1;
            self.blocks.remove(pos + 1);
        }
        if pos > 0 && self.blocks[pos - 1].0 + self.blocks[pos - 1].1 == self.blocks[pos].0 {
            self.blocks[pos - 1].1 += self.blocks[pos].1;
            self.blocks.remove(pos);
        }
    }
}

/// Lays out every backend's compute buffer for `part` (tensors of the caller's table
/// `tensors`, alignments per backend, `n_copies` slots). Each of `fused` is a run of
/// nodes a backend computes with one kernel ([`ggml_core::Backend::fused_runs`]): every
/// tensor one of its nodes reads or writes keeps its bytes until the run's last node.
pub(crate) fn layout(
    tensors: &[Tensor],
    part: &Partition,
    alignments: &[usize],
    n_copies: usize,
    fused: &[Vec<TensorId>],
) -> Result<Layout> {
    let nb = alignments.len();
    let n = part.n_tensors;
    let total = n + part.slot_tensors.len();
    let mut place = vec![vec![None; total]; n_copies];
    let mut top = vec![0usize; nb];
    let root = |id: TensorId| tensors[id.index()].view_src.unwrap_or(id);
    let backend = |id: TensorId| -> Result<usize> {
        part.backend_of[id.index()].ok_or_else(|| SchedError::Tensor {
            id: id.0,
            name: tensors[id.index()].name.as_str().to_string(),
            what: "has no backend".into(),
        })
    };
    let mut bump = |b: usize, size: usize| -> Result<usize> {
        let off = top[b];
        top[b] = off
            .checked_add(aligned(size, alignments[b])?)
            .ok_or_else(|| SchedError::Invalid("buffer size overflows".into()))?;
        Ok(off)
    };

    for &id in &part.user_inputs {
        let b = backend(id)?;
        let off = bump(b, tensors[id.index()].nbytes())?;
        for p in &mut place {
            p[id.index()] = Some((b, off));
        }
    }
    for cp in &part.copies {
        for &sid in &cp.slots {
            let off = bump(cp.to, part.slot_tensors[sid.index() - n].nbytes())?;
            for p in &mut place {
                p[sid.index()] = Some((cp.to, off));
            }
        }
    }
    let needs = |id: TensorId| {
        let t = &tensors[id.index()];
        t.op != Op::None && !t.op.is_view() && t.data.is_none() && t.view_src.is_none()
    };
    let persistent = |id: TensorId| {
        let f = tensors[id.index()].flags;
        f.contains(TensorFlags::OUTPUT) || f.contains(TensorFlags::INPUT)
    };
    for &id in &part.nodes {
        if !needs(id) || !persistent(id) {
            continue;
        }
        let b = backend(id)?;
        let size = tensors[id.index()].nbytes();
        if tensors[id.index()].flags.contains(TensorFlags::OUTPUT) {
            for p in &mut place {
                p[id.index()] = Some((b, bump(b, size)?));
            }
        } else {
            let off = bump(b, size)?;
            for p in &mut place {
                p[id.index()] = Some((b, off));
            }
        }
    }

    // Interval plan over the node order for everything else.
    let mut last_use = vec![0usize; n];
    for (i, &id) in part.nodes.iter().enumerate() {
        let t = &tensors[id.index()];
        for s in t.src.iter().flatten().chain(std::iter::once(&id)) {
            let r = root(*s).index();
            last_use[r] = last_use[r].max(i);
        }
    }
    for cp in &part.copies {
        let at = part.splits[cp.split].first_node;
        let r = root(cp.tensor).index();
        last_use[r] = last_use[r].max(at);
    }
    if !fused.is_empty() {
        let mut pos = vec![usize::MAX; n];
        for (i, &id) in part.nodes.iter().enumerate() {
            if id.index() < n {
                pos[id.index()] = i;
            }
        }
        for run in fused {
            let at = |id: &TensorId| pos.get(id.index()).copied().filter(|&p| p != usize::MAX);
            let Some(end) = run.iter().filter_map(at).max() else {
                continue;
            };
            for id in run {
                let t = &tensors[id.index()];
                for s in t.src.iter().flatten().chain(std::iter::once(id)) {
                    let r = root(*s).index();
                    last_use[r] = last_use[r].max(end);
                }
            }
        }
    }
    let mut arenas: Vec<FreeList> = top
        .iter()
        .map(|&t| FreeList {
            blocks: Vec::new(),
            top: t,
        })
        .collect();
    let mut deaths: Vec<Vec<(usize, usize, usize)>> = vec![Vec::new(); part.nodes.len()];
    for (i, &id) in part.nodes.iter().enumerate() {
        if needs(id) && !persistent(id) {
            let b = backend(id)?;
            let size = aligned(tensors[id.index()].nbytes(), alignments[b])?;
            let off = arenas[b].take(size);
            for p in &mut place {
                p[id.index()] = Some((b, off));
            }
            deaths[last_use[id.index()].max(i)].push((b, off, size));
        }
        for (b, off, size) in std::mem::take(&mut deaths[i]) {
            arenas[b].give(off, size);
        }
    }
    Ok(Layout {
        sizes: arenas.iter().map(|a| a.top).collect(),
        place,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::partition::{partition, PartitionConfig};
    use crate::testing::{SimBackend, SimOptions};
    use ggml_core::{Backend, Context, DType, Graph};

    /// x -> a = x + x -> b = a * a -> c = b + b -> d = c * c: without fused runs c takes
    /// a's bytes (a is dead after b); with b, c one fused run a lives until c.
    #[test]
    fn fused_runs_keep_their_tensors_apart() {
        let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 16];
        let mut ctx = Context::new(&mut s);
        let x = ctx.new_tensor(DType::F32, [64, 1, 1, 1]).unwrap();
        ctx.set_flags(x, TensorFlags::INPUT).unwrap();
        let a = ctx.add(x, x).unwrap();
        let b = ctx.mul(a, a).unwrap();
        let c = ctx.add(b, b).unwrap();
        let d = ctx.mul(c, c).unwrap();
        ctx.set_flags(d, TensorFlags::OUTPUT).unwrap();
        let mut ids = [TensorId(0); 16];
        let mut marks = [0u64; Graph::marks_len(16)];
        let mut g = Graph::new(&mut ids, &mut marks);
        g.build_forward_expand(&ctx, d).unwrap();
        let sim = SimBackend::new(SimOptions::new("dev0"));
        let refs: [&dyn Backend; 1] = [&*sim];
        let cfg = PartitionConfig {
            n_copies: 1,
            input_backend: 0,
            op_offload: false,
            pins: vec![],
            ring: false,
        };
        let leafs: Vec<TensorId> = g.leafs().collect();
        let part = partition(ctx.tensors(), g.nodes(), &leafs, &refs, &cfg).unwrap();
        let at = |l: &Layout, id: TensorId| l.place[0][id.index()].unwrap();
        let plain = layout(ctx.tensors(), &part, &[256], 1, &[]).unwrap();
        assert_eq!(at(&plain, c), at(&plain, a), "c reuses a's bytes");
        let fused = layout(ctx.tensors(), &part, &[256], 1, &[vec![b, c]]).unwrap();
        let placed = [a, b, c].map(|t| at(&fused, t));
        assert!(
            placed[0] != placed[1] && placed[1] != placed[2] && placed[0] != placed[2],
            "{placed:?}"
        );
    }

    #[test]
    fn free_list_reuses_and_merges() {
        let mut f = FreeList::default();
        let a = f.take(32);
        let b = f.take(32);
        let c = f.take(64);
        assert_eq!((a, b, c), (0, 32, 64));
        f.give(a, 32);
        f.give(b, 32);
        assert_eq!(f.blocks, vec![(0, 64)]);
        assert_eq!(f.take(48), 0);
        f.give(c, 64);
        // Block at the top grows the buffer in place.
        assert_eq!(f.take(128), 48);
        assert_eq!(f.top, 176);
    }
}
