//! Backend assignment, splits and cross-backend input copies: ggml's
//! `ggml_backend_sched_split_graph` passes 1 to 5, without touching the caller's graph.
//!
//! The result, a [`Partition`], is a pure description: which backend runs each node,
//! the splits (runs of consecutive nodes on one backend), the cross-backend copies with
//! one destination tensor per pipeline slot, and an explicit remap of node sources to
//! those slot tensors. The scheduler builds its own tensor table from it (a copy of the
//! caller's descriptors plus the slot copies, one table per slot).

use std::collections::HashMap;

use ggml_core::{Backend, DataRef, Name, Op, Tensor, TensorFlags, TensorId};

use crate::error::{Result, SchedError};

/// Settings of [`partition`].
#[derive(Clone, Debug)]
pub struct PartitionConfig {
    /// Pipeline slots: each cross-backend copy gets this many destination tensors.
    pub n_copies: usize,
    /// Backend that holds tensors flagged [`TensorFlags::INPUT`] (ggml: the last, the CPU).
    pub input_backend: usize,
    /// Move ops on host-memory weights to the first backend whose `offload_op` accepts
    /// them (ggml's `op_offload`).
    pub op_offload: bool,
    /// User pins `(tensor, backend)`, applied before every other pass.
    pub pins: Vec<(TensorId, usize)>,
    /// Route copies of computed tensors round the ring of backends `0 → 1 → … → n-1 →
    /// 0`: backend `b` receives a tensor of backend `a` from `b - 1`'s copy of it (see
    /// [`CopyInput::via`]) unless `a` is `b - 1`, so every copy crosses one link
    /// between neighbours.
    pub ring: bool,
}

/// Where the bytes a copy reads come from, which decides the waits it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SourceKind {
    /// Written by graph nodes on the source backend's queue (activations, or caller
    /// memory such as a KV cache that the graph writes).
    Computed,
    /// A leaf without data: written by the caller ([`crate::Scheduler::set_input`]) on
    /// the source backend's queue before the run.
    UserInput,
    /// Caller memory the graph never writes (weights): needs no ordering.
    Static,
}

/// One cross-backend input: tensor `tensor` owned by backend `from`, read by nodes on
/// backend `to`, copied once per run into `slots[run % n_copies]`.
#[derive(Clone, Debug)]
pub struct CopyInput {
    /// The source tensor (an id of the caller's table).
    pub tensor: TensorId,
    /// Its name, for listings and reports.
    pub name: String,
    /// Backend owning the source bytes.
    pub from: usize,
    /// Backend whose nodes read the copy.
    pub to: usize,
    /// Where the source bytes come from.
    pub kind: SourceKind,
    /// The split whose input phase performs the copy: the first split on `to` reading it,
    /// or the first split needing a forward round the ring that reads it.
    pub split: usize,
    /// Destination tensors, one per pipeline slot (ids of the scheduler's table).
    pub slots: Vec<TensorId>,
    /// Bytes copied.
    pub nbytes: usize,
    /// For [`SourceKind::Computed`]: the split that last wrote the source's bytes before
    /// the copy (on `from`), if any in this graph. The copy must wait for it, and for
    /// nothing later on `from`.
    pub producer: Option<usize>,
    /// A forward round the ring ([`PartitionConfig::ring`]): the copy reads the slot of
    /// copy `via` (the same tensor received by `from`, the previous backend of the ring)
    /// instead of the tensor itself, and must wait for that copy.
    pub via: Option<usize>,
}

/// A run of consecutive graph nodes on one backend.
#[derive(Clone, Debug)]
pub struct Split {
    /// Backend running the split.
    pub backend: usize,
    /// Nodes passed to `graph_compute`, in order (view ops are left out: they run no
    /// kernel).
    pub nodes: Vec<TensorId>,
    /// Index (in the graph's node order) of the first node of the split.
    pub first_node: usize,
    /// One past the index of the last node of the split.
    pub end_node: usize,
    /// Copies performed in this split's input phase (indices into [`Partition::copies`]).
    pub inputs: Vec<usize>,
}

/// The result of [`partition`].
#[derive(Clone, Debug)]
pub struct Partition {
    /// Number of tensors of the caller's table; slot copies get ids from here on.
    pub n_tensors: usize,
    /// Backend of each caller tensor that the graph uses (views: their root's backend).
    pub backend_of: Vec<Option<usize>>,
    /// The splits in execution order.
    pub splits: Vec<Split>,
    /// Cross-backend copies.
    pub copies: Vec<CopyInput>,
    /// Descriptors of the slot copies (ids `n_tensors..`), without data.
    pub slot_tensors: Vec<Tensor>,
    /// Source rewrites `(node, src index, copy)`: in the table of slot `c`,
    /// `node.src[index]` becomes `copies[copy].slots[c]`.
    pub remap: Vec<(TensorId, usize, usize)>,
    /// Leaves without data that the caller writes (inputs).
    pub user_inputs: Vec<TensorId>,
    /// Backend holding [`TensorFlags::INPUT`] tensors.
    pub input_backend: usize,
    /// The graph's nodes in order.
    pub nodes: Vec<TensorId>,
    /// The graph's leaves.
    pub leafs: Vec<TensorId>,
}

impl Partition {
    /// The split containing node index `i` of the graph's node order, if any.
    pub fn split_of_node(&self, i: usize) -> Option<usize> {
        self.splits
            .iter()
            .position(|s| s.first_node <= i && i < s.end_node)
    }
}

fn tname(tensors: &[Tensor], id: TensorId) -> String {
    let n = tensors[id.index()].name;
    if n.is_empty() {
        format!("#{}", id.0)
    } else {
        n.as_str().to_string()
    }
}

/// Creates the cross-backend copies of one split's sources.
struct NewCopies<'a, 'b> {
    tensors: &'a [Tensor],
    backends: &'a [&'b dyn Backend],
    n: usize,
    n_copies: usize,
    ring: bool,
    copies: &'a mut Vec<CopyInput>,
    slot_tensors: &'a mut Vec<Tensor>,
    copy_of: &'a mut HashMap<(TensorId, usize), usize>,
    inputs: &'a mut Vec<usize>,
}

impl NewCopies<'_, '_> {
    /// The copy of `s` (owned by `owner`) into backend `to`, made in split `k`'s input
    /// phase if it does not exist yet; round the ring, through the copy into `to - 1`
    /// (made first, recursively).
    fn route(
        &mut self,
        s: TensorId,
        to: usize,
        owner: usize,
        kind: SourceKind,
        producer: Option<usize>,
        k: usize,
    ) -> usize {
        if let Some(&ci) = self.copy_of.get(&(s, to)) {
            return ci;
        }
        let nb = self.backends.len();
        let prev = (to + nb - 1) % nb;
        let via =
            (self.ring && prev != owner).then(|| self.route(s, prev, owner, kind, producer, k));
        let st = &self.tensors[s.index()];
        let mut slots = Vec::with_capacity(self.n_copies);
        for c in 0..self.n_copies {
            let id = TensorId((self.n + self.slot_tensors.len()) as u32);
            let name = Name::new(&format!(
                "{}#{}#{}",
                self.backends[to].name(),
                tname(self.tensors, s),
                c
            ));
            self.slot_tensors.push(Tensor {
                dtype: st.dtype,
                ne: st.ne,
                nb: st.nb,
                op: Op::None,
                src: [None; ggml_core::MAX_SRC],
                view_src: None,
                view_offs: 0,
                flags: TensorFlags::default(),
                name,
                data: None,
            });
            slots.push(id);
        }
        self.copies.push(CopyInput {
            tensor: s,
            name: tname(self.tensors, s),
            from: if via.is_some() { prev } else { owner },
            to,
            kind,
            split: k,
            slots,
            nbytes: st.nbytes(),
            producer: if via.is_some() { None } else { producer },
            via,
        });
        let ci = self.copies.len() - 1;
        self.copy_of.insert((s, to), ci);
        self.inputs.push(ci);
        ci
    }
}

/// Assigns every node of the graph (`nodes` in execution order, `leafs`) to one of
/// `backends` (index = priority, 0 highest), cuts the node list into splits and creates
/// the cross-backend copies, in the order ggml uses:
///
/// 1. user pins ([`PartitionConfig::pins`]);
/// 2. tensors with data (or views of them): the first backend that supports their memory
///    domain (and, for nodes, the op); [`TensorFlags::INPUT`] leaves: the input backend;
///    nodes reading a [`TensorFlags::WEIGHT`] tensor with data: the weight's backend;
/// 3. expansion to unassigned neighbours by priority: forward and backward without the
///    last backend (the CPU of ggml), then forward and backward with it, each only where
///    the backend supports the op;
/// 4. remaining nodes: the backend supporting the op with the most sources on it;
/// 5. views and nodes writing into another tensor's bytes (`view_src`) go where their
///    root is; unassigned leaves go to their consumer; a node no backend supports is an
///    error naming the op.
///
/// A source is copied into the consumer's backend when its owner differs, except caller
/// memory that the graph never writes and the consumer can read in place (weights).
/// Computed tensors are always copied across backends, even between backends sharing a
/// memory domain: a copy is what the happens-before plan orders; direct reads across
/// queues would need the same waits on every consumer.
pub fn partition(
    tensors: &[Tensor],
    nodes: &[TensorId],
    leafs: &[TensorId],
    backends: &[&dyn Backend],
    cfg: &PartitionConfig,
) -> Result<Partition> {
    let nb = backends.len();
    if nb == 0 {
        return Err(SchedError::Invalid("no backends".into()));
    }
    if cfg.input_backend >= nb {
        return Err(SchedError::Invalid(format!(
            "input backend {} out of range (have {nb})",
            cfg.input_backend
        )));
    }
    if !(1..=crate::MAX_COPIES).contains(&cfg.n_copies) {
        return Err(SchedError::Invalid(format!(
            "n_copies must be 1..={}, got {}",
            crate::MAX_COPIES,
            cfg.n_copies
        )));
    }
    let n = tensors.len();
    let bad =
        |id: TensorId| SchedError::Graph(ggml_core::Error::UnknownTensor { id: id.0, len: n });
    for &id in nodes.iter().chain(leafs) {
        if id.index() >= n {
            return Err(bad(id));
        }
        let t = &tensors[id.index()];
        for s in t.src.iter().flatten().chain(t.view_src.iter()) {
            if s.index() >= id.index() {
                return Err(bad(*s));
            }
        }
    }

    let root = |id: TensorId| tensors[id.index()].view_src.unwrap_or(id);
    let data_of = |id: TensorId| -> Option<DataRef> {
        tensors[id.index()].data.or(tensors[root(id).index()].data)
    };
    let supports = |b: usize, id: TensorId| backends[b].supports_op(tensors, id);
    let is_compute = |id: TensorId| {
        let op = tensors[id.index()].op;
        op != Op::None && !op.is_view()
    };
    let mut written = vec![false; n];
    for &id in nodes {
        if is_compute(id) {
            written[root(id).index()] = true;
        }
    }

    let mut assign: Vec<Option<usize>> = vec![None; n];
    let mut pinned = vec![false; n];
    for &(id, b) in &cfg.pins {
        if id.index() >= n {
            return Err(bad(id));
        }
        if b >= nb {
            return Err(SchedError::Invalid(format!(
                "pin of '{}' to backend {b}: only {nb} backends",
                tname(tensors, id)
            )));
        }
        assign[id.index()] = Some(b);
        pinned[id.index()] = true;
    }

    // Pass 1: tensors with data, inputs, consumers of weights.
    for &id in leafs.iter().chain(nodes) {
        if assign[id.index()].is_some() {
            continue;
        }
        let t = &tensors[id.index()];
        let is_node = t.op != Op::None;
        if let Some(d) = data_of(id) {
            let need_op = is_compute(id);
            let found = (0..nb).find(|&b| {
                backends[b].supports_domain(d.buffer.domain) && (!need_op || supports(b, id))
            });
            assign[id.index()] = match found {
                Some(b) => Some(b),
                None if need_op => {
                    return Err(SchedError::Unsupported {
                        op: t.op.name(),
                        tensor: tname(tensors, id),
                        detail: " on any backend that can use the memory it writes".into(),
                    })
                }
                None => {
                    return Err(SchedError::NoBackendForMemory {
                        tensor: tname(tensors, id),
                        domain: d.buffer.domain.0,
                    })
                }
            };
            continue;
        }
        if !is_node {
            if t.flags.contains(TensorFlags::INPUT) {
                assign[id.index()] = Some(cfg.input_backend);
            }
            continue;
        }
        if !is_compute(id) || matches!(t.op, Op::Rope(_) | Op::FlashAttnExt { .. }) {
            continue;
        }
        for s in t.src.iter().flatten() {
            let rs = root(*s);
            let Some(d) = data_of(*s) else { continue };
            if !tensors[rs.index()].flags.contains(TensorFlags::WEIGHT) {
                continue;
            }
            if cfg.op_offload && d.buffer.domain == ggml_core::MemoryDomain::HOST {
                if let Some(b) =
                    (0..nb).find(|&b| supports(b, id) && backends[b].offload_op(tensors, id))
                {
                    assign[id.index()] = Some(b);
                    break;
                }
            }
            if let Some(b) =
                (0..nb).find(|&b| backends[b].supports_domain(d.buffer.domain) && supports(b, id))
            {
                assign[id.index()] = Some(b);
                break;
            }
        }
    }

    // Pass 2: expand by priority, first without the last backend, then with it.
    let compute_nodes: Vec<TensorId> = nodes.iter().copied().filter(|&id| is_compute(id)).collect();
    let last = nb - 1;
    let mut sweep = |order: &mut dyn Iterator<Item = TensorId>, with_last: bool| {
        let mut cur: Option<usize> = None;
        for id in order {
            match assign[id.index()] {
                Some(b) => {
                    cur = if !with_last && b == last {
                        None
                    } else {
                        Some(b)
                    }
                }
                None => {
                    if let Some(b) = cur {
                        if supports(b, id) {
                            assign[id.index()] = Some(b);
                        }
                    }
                }
            }
        }
    };
    sweep(&mut compute_nodes.iter().copied(), false);
    sweep(&mut compute_nodes.iter().rev().copied(), false);
    sweep(&mut compute_nodes.iter().copied(), true);
    sweep(&mut compute_nodes.iter().rev().copied(), true);

    // Pass 3: remaining nodes go where most of their sources are.
    for &id in &compute_nodes {
        if assign[id.index()].is_some() {
            continue;
        }
        let t = &tensors[id.index()];
        let mut best: Option<(usize, usize)> = None;
        for (b, backend) in backends.iter().enumerate() {
            if !supports(b, id) {
                continue;
            }
            let score = t
                .src
                .iter()
                .flatten()
                .filter(|s| {
                    assign[s.index()] == Some(b)
                        || data_of(**s).is_some_and(|d| backend.supports_domain(d.buffer.domain))
                })
                .count();
            if best.is_none_or(|(sc, _)| score > sc) {
                best = Some((score, b));
            }
        }
        if let Some((_, b)) = best {
            assign[id.index()] = Some(b);
        }
    }

    // Pass 4: views and in-place writers follow their root; leaves follow consumers.
    for &id in nodes {
        let t = &tensors[id.index()];
        if let Some(r) = t.view_src {
            if let Some(b) = assign[r.index()] {
                if pinned[id.index()] && assign[id.index()] != Some(b) {
                    return Err(SchedError::Invalid(format!(
                        "'{}' is pinned to backend {:?} but writes into '{}' on backend {b}",
                        tname(tensors, id),
                        assign[id.index()],
                        tname(tensors, r)
                    )));
                }
                assign[id.index()] = Some(b);
            }
        } else if assign[id.index()].is_none() && is_compute(id) {
            match (0..nb).find(|&b| supports(b, id)) {
                Some(b) => assign[id.index()] = Some(b),
                None => {
                    return Err(SchedError::Unsupported {
                        op: t.op.name(),
                        tensor: tname(tensors, id),
                        detail: String::new(),
                    })
                }
            }
        }
        let Some(b) = assign[id.index()] else {
            continue;
        };
        for s in t.src.iter().flatten() {
            if assign[s.index()].is_some() {
                continue;
            }
            let rs = root(*s);
            if assign[rs.index()].is_none() {
                assign[rs.index()] = Some(b);
            }
            assign[s.index()] = assign[rs.index()];
        }
    }
    // Views whose root got its backend only now, and unconsumed input leaves.
    for &id in nodes {
        if let Some(r) = tensors[id.index()].view_src {
            if assign[id.index()].is_none() {
                assign[id.index()] = assign[r.index()];
            }
        }
    }
    for &id in leafs {
        if assign[id.index()].is_none() {
            assign[id.index()] = Some(cfg.input_backend);
        }
    }
    for &id in &compute_nodes {
        let b = assign[id.index()].ok_or_else(|| SchedError::Unsupported {
            op: tensors[id.index()].op.name(),
            tensor: tname(tensors, id),
            detail: String::new(),
        })?;
        if !supports(b, id) {
            return Err(SchedError::Unsupported {
                op: tensors[id.index()].op.name(),
                tensor: tname(tensors, id),
                detail: format!(
                    " on backend {} it is pinned or bound to",
                    backends[b].name()
                ),
            });
        }
    }

    // Pass 5: splits and copies.
    let mut splits: Vec<Split> = Vec::new();
    let mut copies: Vec<CopyInput> = Vec::new();
    let mut slot_tensors: Vec<Tensor> = Vec::new();
    let mut remap = Vec::new();
    let mut copy_of: HashMap<(TensorId, usize), usize> = HashMap::new();
    // The latest split writing each root tensor's bytes.
    let mut last_writer: HashMap<TensorId, usize> = HashMap::new();
    for (i, &id) in nodes.iter().enumerate() {
        if !is_compute(id) {
            continue;
        }
        let b = assign[id.index()].expect("assigned above");
        if splits.last().is_none_or(|s| s.backend != b) {
            splits.push(Split {
                backend: b,
                nodes: Vec::new(),
                first_node: i,
                end_node: i + 1,
                inputs: Vec::new(),
            });
        }
        let k = splits.len() - 1;
        splits[k].nodes.push(id);
        splits[k].end_node = i + 1;
        let t = &tensors[id.index()];
        for (j, s) in t.src.iter().enumerate() {
            let Some(s) = *s else { continue };
            let rs = root(s);
            let owner = assign[s.index()]
                .or(assign[rs.index()])
                .expect("sources are assigned in pass 4");
            if owner == b {
                continue;
            }
            let data = data_of(s);
            let kind = match data {
                None if tensors[rs.index()].op == Op::None => SourceKind::UserInput,
                Some(_) if !written[rs.index()] => SourceKind::Static,
                _ => SourceKind::Computed,
            };
            if kind == SourceKind::Static
                && data.is_some_and(|d| backends[b].supports_domain(d.buffer.domain))
            {
                continue;
            }
            let producer = match kind {
                SourceKind::Computed => last_writer.get(&rs).copied(),
                _ => None,
            };
            let mut made = NewCopies {
                tensors,
                backends,
                n,
                n_copies: cfg.n_copies,
                ring: cfg.ring && kind == SourceKind::Computed,
                copies: &mut copies,
                slot_tensors: &mut slot_tensors,
                copy_of: &mut copy_of,
                inputs: &mut splits[k].inputs,
            };
            let ci = made.route(s, b, owner, kind, producer, k);
            remap.push((id, j, ci));
        }
        last_writer.insert(root(id), k);
    }
    if n + slot_tensors.len() > u32::MAX as usize {
        return Err(SchedError::Invalid("too many tensors".into()));
    }

    let user_inputs = leafs
        .iter()
        .copied()
        .filter(|&id| tensors[id.index()].data.is_none())
        .collect();
    Ok(Partition {
        n_tensors: n,
        backend_of: assign,
        splits,
        copies,
        slot_tensors,
        remap,
        user_inputs,
        input_backend: cfg.input_backend,
        nodes: nodes.to_vec(),
        leafs: leafs.to_vec(),
    })
}
