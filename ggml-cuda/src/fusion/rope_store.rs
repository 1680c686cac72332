//! The RoPE + KV-cache store fusion (`rope_store` in `kernels/rope.ptx`), for decode steps
//! and prompts alike (one block per token).
//!
//! A model graph in llama.cpp's order computes, per layer, the Q, K and V products, then
//! RoPE of Q and of K, then stores the roped K and the V rows into the KV cache
//! (`set_rows`), views in between. One launch does the ropes and the stores: it writes
//! the roped Q and K (other nodes read them) and both cache rows with the rope and
//! set_rows kernels' arithmetic, so every bit is what the four launches give.
//!
//! What qualifies: a run that starts at a rope and whose other nodes (views aside) are
//! ropes and `set_rows`, with exactly one store of a roped K (its source a contiguous
//! reshape of a contiguous rope output), at most one other rope (Q: same parameters and
//! positions) and at most one other store (V: the same row indices, an f32 source not
//! computed in the run); f32 ropes of any number of tokens; every tensor
//! allocated, and no written bytes overlapping any other tensor of the run. The longest
//! qualifying prefix of the run is fused (K rope and its store at least), else nothing:
//! a Gemma 3 graph, whose Q/K norms may sit between the ropes, fuses what is adjacent.

use ggml_core::{DType, Op, Tensor, TensorId};

use super::Fusion;
use crate::launch;
use crate::CudaTuning;

/// Where the nodes of a fused run sit, as offsets from its first node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RopeStore {
    /// The Q rope, if fused.
    pub q_rope: Option<u8>,
    /// The K rope.
    pub k_rope: u8,
    /// The store of the roped K.
    pub k_store: u8,
    /// The store of V, if fused.
    pub v_store: Option<u8>,
}

/// Most nodes a run spans, views included.
const MAX_RUN: usize = 16;

/// The fusion starting at `nodes[i]`, if one qualifies.
pub(super) fn matcher(
    tensors: &[Tensor],
    nodes: &[TensorId],
    i: usize,
    tuning: &CudaTuning,
) -> Option<(Fusion, usize)> {
    if !tuning.fuse_rope_store || !matches!(tensors.get(nodes[i].index())?.op, Op::Rope(_)) {
        return None;
    }
    // Offsets of the non-view nodes from i on while they are ropes or stores.
    let mut offs = [0usize; 4];
    let mut n = 0;
    for (o, id) in nodes[i..].iter().enumerate().take(MAX_RUN) {
        let t = tensors.get(id.index())?;
        if t.op.is_view() {
            continue;
        }
        if n == offs.len() || !matches!(t.op, Op::Rope(_) | Op::SetRows) {
            break;
        }
        offs[n] = o;
        n += 1;
    }
    (2..=n).rev().find_map(|len| {
        let rs = classify(tensors, nodes, i, &offs[..len])?;
        Some((Fusion::RopeStore(rs), offs[len - 1] + 1))
    })
}

/// The roles of the non-view nodes at `offs` from `i`, if they form a fusion.
fn classify(tensors: &[Tensor], nodes: &[TensorId], i: usize, offs: &[usize]) -> Option<RopeStore> {
    let t = |o: usize| -> Option<&Tensor> { tensors.get(nodes[i + o].index()) };
    let (mut ropes, mut stores) = (Vec::with_capacity(2), Vec::with_capacity(2));
    for &o in offs {
        match t(o)?.op {
            Op::Rope(_) => ropes.push(o),
            _ => stores.push(o),
        }
    }
    if ropes.len() > 2 || stores.is_empty() || stores.len() > 2 {
        return None;
    }
    // The rope a store reads, through a view.
    let consumed = |s: usize| -> Option<usize> {
        let src = t(s)?.src[0]?;
        let root = tensors.get(src.index())?.view_src.unwrap_or(src);
        ropes.iter().copied().find(|&r| nodes[i + r] == root)
    };
    let k_store = stores.iter().copied().find(|&s| consumed(s).is_some())?;
    let k_rope = consumed(k_store)?;
    let v_store = stores.iter().copied().find(|&s| s != k_store);
    let q_rope = ropes.iter().copied().find(|&r| r != k_rope);
    if v_store.is_some_and(|v| consumed(v).is_some()) {
        return None;
    }
    let roles = RopeStore {
        q_rope: q_rope.map(|o| o as u8),
        k_rope: k_rope as u8,
        k_store: k_store as u8,
        v_store: v_store.map(|o| o as u8),
    };
    valid(&Parts::of(tensors, nodes, i, roles)?, roles).then_some(roles)
}

/// The tensors of a fused run.
pub(crate) struct Parts {
    /// The Q rope and its source.
    pub q: Option<(Tensor, Tensor)>,
    /// The K rope and its source.
    pub k: (Tensor, Tensor),
    /// The K store (a view of the cache), the reshaped roped K it reads.
    pub k_store: (Tensor, Tensor),
    /// The V store and its source.
    pub v_store: Option<(Tensor, Tensor)>,
    /// Positions of the ropes.
    pub pos: Tensor,
    /// Row indices of the stores.
    pub idx: Tensor,
}

impl Parts {
    /// The tensors of the run at `i` with `roles`.
    pub(crate) fn of(
        tensors: &[Tensor],
        nodes: &[TensorId],
        i: usize,
        roles: RopeStore,
    ) -> Option<Parts> {
        let node = |o: u8| tensors.get(nodes.get(i + o as usize)?.index()).copied();
        let src = |t: &Tensor, k: usize| tensors.get(t.src[k]?.index()).copied();
        let with_src = |o: u8| -> Option<(Tensor, Tensor)> {
            let t = node(o)?;
            Some((t, src(&t, 0)?))
        };
        let k = with_src(roles.k_rope)?;
        let k_store = with_src(roles.k_store)?;
        Some(Parts {
            q: roles
                .q_rope
                .map(with_src)
                .map_or(Some(None), |q| q.map(Some))?,
            pos: src(&k.0, 1)?,
            idx: src(&k_store.0, 1)?,
            k,
            k_store,
            v_store: roles
                .v_store
                .map(with_src)
                .map_or(Some(None), |v| v.map(Some))?,
        })
    }
}

/// Whether the run's tensors have the shapes, types and disjoint bytes the kernel needs.
fn valid(p: &Parts, roles: RopeStore) -> bool {
    let (k, xk) = &p.k;
    let Op::Rope(params) = k.op else { return false };
    let [d, hk, n, ne3] = k.ne;
    let f32_rows = |t: &Tensor| t.dtype == DType::F32 && t.rows_contiguous();
    let rope_ok = |(r, x): &(Tensor, Tensor)| {
        f32_rows(r)
            && f32_rows(x)
            && r.ne == x.ne
            && r.ne[0] == d
            && r.ne[2] == n
            && r.ne[3] == 1
            && r.src[1] == k.src[1]
            && r.op == Op::Rope(params)
            && launch::rope(r.ne).is_some()
    };
    let nv = p.v_store.as_ref().map_or(0, |(_, v)| v.ne[0]);
    let hq = p.q.as_ref().map_or(0, |(q, _)| q.ne[1]);
    let store_ok = |(s, x): &(Tensor, Tensor)| {
        matches!(s.dtype, DType::F32 | DType::F16 | DType::BF16)
            && s.rows_contiguous()
            && s.ne[2] == 1
            && s.ne[3] == 1
            && s.src[1] == p.k_store.0.src[1]
            && f32_rows(x)
            && x.ne[0] == s.ne[0]
            && x.ne[1] == n
            && x.ne[2] == 1
            && x.ne[3] == 1
    };
    let (ks, kflat) = &p.k_store;
    let shapes = ne3 == 1
        && rope_ok(&p.k)
        && p.q.as_ref().is_none_or(rope_ok)
        && store_ok(&p.k_store)
        && p.v_store.as_ref().is_none_or(store_ok)
        // The store reads the roped K as [d * hk, n] rows: both contiguous, no offset.
        && k.is_contiguous()
        && kflat.is_contiguous()
        && kflat.view_offs == 0
        && kflat.ne == [d * hk, n, 1, 1]
        && p.pos.dtype == DType::I32
        && p.idx.dtype == DType::I32
        && p.idx.ne[0] == n
        && launch::rope_store(d, hq, hk, nv, n).is_some();
    if !shapes {
        return false;
    }
    // Written bytes overlap no other written bytes, nor bytes the run reads, except
    // that with one token (one block, all reads before any write) a node may write over
    // what an earlier node of the run (or itself) read: the allocator gives the roped K
    // the bytes of Q's source, dead once Q is roped. The K store's read of the roped K
    // is no read here: the kernel keeps the values.
    let span = |t: &Tensor| t.data.map(|d| (d.addr, d.addr + t.nbytes() as u64));
    let r = roles;
    let first_rope = r.q_rope.map_or(r.k_rope, |q| q.min(r.k_rope));
    let first_store = r.v_store.map_or(r.k_store, |v| v.min(r.k_store));
    let mut writes = vec![(span(k), r.k_rope), (span(ks), r.k_store)];
    let mut reads = vec![
        (span(xk), r.k_rope),
        (span(&p.pos), first_rope),
        (span(&p.idx), first_store),
    ];
    if let (Some((q, xq)), Some(o)) = (&p.q, r.q_rope) {
        writes.push((span(q), o));
        reads.push((span(xq), o));
    }
    if let (Some((vs, v)), Some(o)) = (&p.v_store, r.v_store) {
        writes.push((span(vs), o));
        reads.push((span(v), o));
    }
    let all = |v: Vec<(Option<(u64, u64)>, u8)>| -> Option<Vec<((u64, u64), u8)>> {
        v.into_iter().map(|(s, o)| Some((s?, o))).collect()
    };
    let (Some(writes), Some(reads)) = (all(writes), all(reads)) else {
        return false;
    };
    let apart = |a: (u64, u64), b: (u64, u64)| a.1 <= b.0 || b.1 <= a.0;
    writes.iter().enumerate().all(|(x, &(w, ow))| {
        writes[x + 1..].iter().all(|&(o, _)| apart(w, o))
            && reads
                .iter()
                .all(|&(rd, or)| apart(w, rd) || (n == 1 && or <= ow))
    })
}

#[cfg(test)]
mod tests {
    use super::super::{plan, Step};
    use super::*;
    use ggml_core::{Context, DataRef, RopeParams};

    /// A decode layer's attention inputs in llama.cpp's order: Q/K/V products stand in as
    /// plain tensors, then reshape Q, reshape K, rope Q, rope K, reshape, store K, store
    /// V. `norm_between` puts a norm of K between the ropes (an order that fuses only the
    /// K part). Every tensor gets its own bytes.
    fn layer(n: usize, norm_between: bool) -> (Vec<Tensor>, Vec<TensorId>) {
        let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 40];
        let mut ctx = Context::new(&mut s);
        let (d, hq, hk) = (64, 9, 3);
        let qc = ctx.new_tensor(DType::F32, [d * hq, n, 1, 1]).unwrap();
        let kc = ctx.new_tensor(DType::F32, [d * hk, n, 1, 1]).unwrap();
        let vc = ctx.new_tensor(DType::F32, [d * hk, n, 1, 1]).unwrap();
        let pos = ctx.new_tensor(DType::I32, [n, 1, 1, 1]).unwrap();
        let idx = ctx.new_tensor(DType::I32, [n, 1, 1, 1]).unwrap();
        let kcache = ctx.new_tensor(DType::F16, [d * hk, 256, 1, 1]).unwrap();
        let vcache = ctx.new_tensor(DType::F16, [d * hk, 256, 1, 1]).unwrap();
        let mut nodes = Vec::new();
        let q = ctx.reshape(qc, [d, hq, n, 1]).unwrap();
        nodes.push(q);
        let mut k = ctx.reshape(kc, [d, hk, n, 1]).unwrap();
        nodes.push(k);
        let p = RopeParams::llama(d as u32, 10000.0);
        let qr = ctx.rope(q, pos, p).unwrap();
        nodes.push(qr);
        if norm_between {
            k = ctx.rms_norm(k, 1e-6).unwrap();
            nodes.push(k);
        }
        let kr = ctx.rope(k, pos, p).unwrap();
        nodes.push(kr);
        let kf = ctx.reshape(kr, [d * hk, n, 1, 1]).unwrap();
        nodes.push(kf);
        nodes.push(ctx.set_rows(kcache, kf, idx).unwrap());
        nodes.push(ctx.set_rows(vcache, vc, idx).unwrap());
        let mut ts = ctx.tensors().to_vec();
        let mut addr = 1u64 << 20;
        for t in ts.iter_mut() {
            if t.view_src.is_none() {
                let buffer = ggml_core::BufferId {
                    domain: ggml_core::MemoryDomain(1),
                    index: 0,
                };
                t.data = Some(DataRef { buffer, addr });
                addr += (t.nbytes() as u64).div_ceil(256) * 256;
            }
        }
        for j in 0..ts.len() {
            if let Some(r) = ts[j].view_src {
                let base = ts[r.index()].data.unwrap();
                ts[j].data = Some(DataRef {
                    buffer: base.buffer,
                    addr: base.addr + ts[j].view_offs as u64,
                });
            }
        }
        (ts, nodes)
    }

    fn fused(steps: &[Step]) -> Vec<(RopeStore, usize, usize)> {
        steps
            .iter()
            .filter_map(|s| match s {
                Step::Fused {
                    fusion: Fusion::RopeStore(r),
                    start,
                    end,
                } => Some((*r, *start, *end)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn fuses_both_ropes_and_both_stores_of_a_decode_step() {
        let (ts, nodes) = layer(1, false);
        let steps = plan(&ts, &nodes, &CudaTuning::default());
        let want = RopeStore {
            q_rope: Some(0),
            k_rope: 1,
            k_store: 3,
            v_store: Some(4),
        };
        assert_eq!(fused(&steps), [(want, 2, 7)]);
        assert_eq!(steps.len(), 3, "two views, then the fused run: {steps:?}");
    }

    #[test]
    fn fuses_what_is_adjacent_and_stays_off_with_its_switch() {
        // K's norm between the ropes: Q's rope alone, then K's rope with both stores.
        let (ts, nodes) = layer(1, true);
        let f = fused(&plan(&ts, &nodes, &CudaTuning::default()));
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].0.q_rope, f[0].0.v_store), (None, Some(3)));
        let off = CudaTuning {
            fuse_rope_store: false,
            ..CudaTuning::default()
        };
        assert!(fused(&plan(&ts, &nodes, &off)).is_empty());
        // Prompt-sized batches fuse too (one block per token), and not with the switch off.
        let (ts, nodes) = layer(40, false);
        assert_eq!(fused(&plan(&ts, &nodes, &CudaTuning::default())).len(), 1);
        assert!(fused(&plan(&ts, &nodes, &off)).is_empty());
    }

    #[test]
    fn overlapping_bytes_or_other_indices_fuse_less() {
        // The V cache shares the K cache's bytes: only Q, K and K's store fuse.
        let (mut ts, nodes) = layer(1, false);
        let kstore = ts[nodes[5].index()];
        let vstore = nodes[6].index();
        ts[vstore].data = kstore.data;
        let f = fused(&plan(&ts, &nodes, &CudaTuning::default()));
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].0.v_store, f[0].2), (None, 6));
        // V stored at other rows than K: not the same store.
        let (mut ts, nodes) = layer(1, false);
        ts[nodes[6].index()].src[1] = ts[nodes[5].index()].src[0];
        let f = fused(&plan(&ts, &nodes, &CudaTuning::default()));
        assert_eq!(f[0].0.v_store, None);
        // The roped K in the bytes of Q's source (as the allocator places it): fine for
        // one token, whose block reads everything first; not across tokens.
        for (n, fuses_q) in [(1, true), (2, false)] {
            let (mut ts, nodes) = layer(n, false);
            let xq = ts[nodes[0].index()].data;
            let kr = nodes[3].index();
            ts[kr].data = xq;
            let kf = nodes[4].index();
            ts[kf].data = xq;
            let f = fused(&plan(&ts, &nodes, &CudaTuning::default()));
            assert_eq!(f[0].0.q_rope.is_some(), fuses_q, "{n} tokens");
        }
        // Two outputs in the same bytes: never.
        let (mut ts, nodes) = layer(1, false);
        ts[nodes[2].index()].data = ts[nodes[3].index()].data;
        let f = fused(&plan(&ts, &nodes, &CudaTuning::default()));
        assert_eq!(f[0].0.q_rope, None);
        // Unallocated tensors: nothing.
        let (mut ts, nodes) = layer(1, false);
        ts[nodes[3].index()].data = None;
        assert!(fused(&plan(&ts, &nodes, &CudaTuning::default())).is_empty());
    }
}
