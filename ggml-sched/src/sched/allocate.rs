//! Partitioning, planning and allocating a graph once per shape.

use std::collections::BTreeSet;

use ggml_core::{Backend, DataRef, Graph, Tensor, TensorId};

use super::{GraphState, Scheduler, STUCK_GRACE};
use crate::alloc::layout;
use crate::error::Result;
use crate::partition::{partition, PartitionConfig};
use crate::plan::{build_plan, EventKey, Plan, PlanSettings};

impl Scheduler {
    /// Partitions, plans and allocates `graph` over `tensors` (the caller's context
    /// table). Waits for every queue first (as ggml's reserve). Tensors with data
    /// (weights) stay where they are; the scheduler places every other tensor.
    #[doc(alias = "reserve")]
    pub fn alloc(&mut self, tensors: &[Tensor], graph: &Graph<'_>) -> Result<()> {
        let leafs: Vec<TensorId> = graph.leafs().collect();
        self.alloc_nodes(tensors, graph.nodes(), &leafs)
    }

    /// [`alloc`](Scheduler::alloc) for a graph given as node and leaf lists.
    pub fn alloc_nodes(
        &mut self,
        tensors: &[Tensor],
        nodes: &[TensorId],
        leafs: &[TensorId],
    ) -> Result<()> {
        self.drain(STUCK_GRACE);
        self.free_tables();
        self.graph = None;
        let n_copies = self.opts.n_copies;
        let cfg = PartitionConfig {
            n_copies,
            input_backend: self.opts.input_backend.unwrap_or(self.n_devices - 1),
            op_offload: self.opts.op_offload,
            pins: self.pins.clone(),
            ring: self.opts.ring,
        };
        let refs: Vec<&dyn Backend> = self.backends[..self.n_devices]
            .iter()
            .map(|b| &**b)
            .collect();
        let part = partition(tensors, nodes, leafs, &refs, &cfg)?;
        let alignments: Vec<usize> = self
            .backends
            .iter()
            .map(|b| b.alignment().max(1).next_power_of_two())
            .collect();
        // Runs a backend computes with one fused kernel keep their tensors' bytes to
        // themselves until the run's last node.
        let mut fused = Vec::new();
        for sp in &part.splits {
            refs[sp.backend].fused_runs(tensors, &sp.nodes, &mut |s, e| {
                if s < e && e <= sp.nodes.len() {
                    fused.push(sp.nodes[s..e].to_vec());
                }
            });
        }
        let lay = layout(tensors, &part, &alignments, n_copies, &fused)?;

        // Buffers: keep those big enough, replace the others.
        for (b, &size) in lay.sizes.iter().enumerate() {
            let fits = self.buffers[b].is_some_and(|i| i.size >= size);
            if size == 0 || fits {
                continue;
            }
            if let Some(old) = self.buffers[b].take() {
                self.backends[b].free_buffer(old.id)?;
            }
            self.buffers[b] = Some(self.backends[b].alloc_buffer(size)?);
        }

        // Tables.
        let n = part.n_tensors;
        let mut tables = Vec::with_capacity(n_copies);
        let mut per_slot = vec![false; n + part.slot_tensors.len()];
        for c in 0..n_copies {
            let mut t: Vec<Tensor> = tensors.to_vec();
            t.extend_from_slice(&part.slot_tensors);
            for (id, p) in lay.place[c].iter().enumerate() {
                if let Some((b, off)) = *p {
                    let buf = self.buffers[b].expect("allocated above");
                    t[id].data = Some(DataRef {
                        buffer: buf.id,
                        addr: buf.base + off as u64,
                    });
                    if lay.place[0][id] != Some((b, off)) {
                        per_slot[id] = true;
                    }
                }
            }
            // Views (and in-place writers) see their root's bytes.
            for &id in part.nodes.iter().chain(&part.leafs) {
                let Some(r) = t[id.index()].view_src else {
                    continue;
                };
                if lay.place[c][r.index()].is_some() || t[id.index()].data.is_none() {
                    if let Some(d) = t[r.index()].data {
                        t[id.index()].data = Some(DataRef {
                            buffer: d.buffer,
                            addr: d.addr + t[id.index()].view_offs as u64,
                        });
                        per_slot[id.index()] = per_slot[r.index()];
                    }
                }
            }
            for &(node, j, ci) in &part.remap {
                t[node.index()].src[j] = Some(part.copies[ci].slots[c]);
            }
            tables.push(t);
        }

        // Plans and the events they use; a backend that declared events but has none
        // is planned again without.
        let plans = loop {
            let plans: Vec<Plan> = (0..n_copies)
                .map(|c| {
                    build_plan(
                        &part,
                        &self.props,
                        &PlanSettings {
                            n_copies,
                            slot: c,
                            style: self.opts.style,
                            weaken: self.opts.weaken.clone(),
                            engines: self.engines.clone(),
                        },
                    )
                })
                .collect();
            let mut replan = false;
            let keys: BTreeSet<EventKey> = plans.iter().flat_map(|p| p.events()).collect();
            for k in keys {
                if self.events.contains_key(&k) {
                    continue;
                }
                match self.backends[k.backend].event_new()? {
                    Some(id) => {
                        self.events.insert(k, id);
                    }
                    None => {
                        self.props[k.backend].events = false;
                        replan = true;
                        break;
                    }
                }
            }
            if !replan {
                break plans;
            }
        };
        // Devices that run splits keep each slot's table once, instead of a copy per split.
        let mut registered = vec![vec![None; self.n_devices]; n_copies];
        for (t, reg) in tables.iter().zip(&mut registered) {
            for (b, r) in reg.iter_mut().enumerate() {
                if part.splits.iter().any(|s| s.backend == b) {
                    *r = self.backends[b].table_register(t)?;
                }
            }
        }
        self.graph = Some(GraphState {
            part,
            tables,
            registered,
            plans,
            per_slot,
            last_run: None,
        });
        Ok(())
    }
}
