//! Running forward passes: on one backend directly ([`DirectExecutor`]).

use std::sync::Arc;

use ggml_core::{alloc, Backend, Tensor, TensorId};

use crate::batch::{prepare, Batch, GraphInputs};
use crate::error::{HarnessError, Result};
use crate::model::{build_forward, ForwardGraph, Model};
use crate::placement::{KvCache, OwnedBuffer};

/// Something that runs forward passes of a model over batches.
pub trait Executor {
    /// Decodes `batch` (writing its keys and values into `kv`) and returns the logits of
    /// the tokens whose output was requested, `n_vocab` floats per token, in batch order.
    fn forward(&mut self, model: &Model, kv: &mut KvCache, batch: &Batch) -> Result<Vec<f32>> {
        let ticket = self.submit(model, kv, batch)?;
        self.collect(ticket)
    }

    /// Enqueues the forward pass of `batch` without waiting for it and returns a ticket
    /// for [`collect`](Executor::collect). Passes run in submission order; up to
    /// [`max_in_flight`](Executor::max_in_flight) may overlap (a pipeline keeps every
    /// device busy with a different pass).
    fn submit(&mut self, model: &Model, kv: &mut KvCache, batch: &Batch) -> Result<u64>;

    /// The logits of a submitted pass (as [`forward`](Executor::forward) returns them).
    /// Each ticket is collected once.
    fn collect(&mut self, ticket: u64) -> Result<Vec<f32>>;

    /// How many submitted passes may be uncollected at once without stalling.
    fn max_in_flight(&self) -> usize {
        1
    }

    /// Host syncs per forward pass so far, where the executor counts them.
    fn host_syncs_per_forward(&self) -> Option<f64> {
        None
    }
}

/// Runs every pass on a single backend, with a compute buffer that grows as needed.
pub struct DirectExecutor {
    backend: Arc<dyn Backend>,
    compute: Option<OwnedBuffer>,
    done: std::collections::BTreeMap<u64, Vec<f32>>,
    next: u64,
}

impl std::fmt::Debug for DirectExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DirectExecutor({})", self.backend.name())
    }
}

impl DirectExecutor {
    /// An executor on `backend`.
    pub fn new(backend: Arc<dyn Backend>) -> DirectExecutor {
        DirectExecutor {
            backend,
            compute: None,
            done: Default::default(),
            next: 0,
        }
    }

    /// Gives every tensor of `g` that needs bytes a place in the compute buffer.
    fn allocate(&mut self, g: &mut ForwardGraph) -> Result<()> {
        let align = self.backend.alignment().max(1);
        let mut slots = vec![alloc::Slot::default(); g.tensors.len()];
        let mut free = vec![alloc::FreeBlock::default(); g.tensors.len()];
        let size = alloc::plan_nodes(
            &g.tensors,
            &g.nodes,
            g.leafs.iter().copied(),
            align,
            &mut slots,
            &mut free,
        )?;
        if self.compute.as_ref().is_none_or(|b| b.info().size < size) {
            self.compute = None;
            self.compute = Some(OwnedBuffer::alloc(&self.backend, size)?);
        }
        let buf = self.compute.as_ref().expect("allocated above");
        for (i, s) in slots.iter().enumerate() {
            if s.allocated {
                g.tensors[i].data = Some(buf.at(s.offset));
            }
        }
        resolve_views(&mut g.tensors);
        Ok(())
    }
}

/// Sets the data location of every view from its root tensor's.
pub fn resolve_views(tensors: &mut [Tensor]) {
    for i in 0..tensors.len() {
        if let Some(root) = tensors[i].view_src {
            if let Some(d) = tensors[root.index()].data {
                tensors[i].data = Some(ggml_core::DataRef {
                    buffer: d.buffer,
                    addr: d.addr + tensors[i].view_offs as u64,
                });
            }
        }
    }
}

/// Writes the batch inputs into their tensors through `backend`'s queue.
pub fn set_inputs(backend: &dyn Backend, g: &ForwardGraph, inputs: &GraphInputs) -> Result<()> {
    let t = |id: TensorId| &g.tensors[id.index()];
    backend.set_tensor_async(t(g.inp_tokens), 0, &inputs.tokens)?;
    backend.set_tensor_async(t(g.inp_pos), 0, &inputs.pos)?;
    backend.set_tensor_async(t(g.kq_mask), 0, &inputs.mask)?;
    backend.set_tensor_async(t(g.inp_out_ids), 0, &inputs.out_ids)?;
    Ok(())
}

/// Reads an F32 tensor's elements.
pub fn read_f32(backend: &dyn Backend, t: &Tensor) -> Result<Vec<f32>> {
    if t.dtype != ggml_core::DType::F32 || !t.is_contiguous() {
        return Err(HarnessError::Usage(format!(
            "'{}' is not a contiguous f32 tensor",
            t.name
        )));
    }
    let mut bytes = vec![0u8; t.nbytes()];
    backend.get_tensor(t, 0, &mut bytes)?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// The error for a ticket that was never issued or already collected.
fn unknown_ticket(ticket: u64) -> HarnessError {
    HarnessError::Usage(format!(
        "forward pass {ticket} was not submitted or was already collected"
    ))
}

impl Executor for DirectExecutor {
    /// Runs the pass to completion (one backend has nothing to overlap with).
    fn submit(&mut self, model: &Model, kv: &mut KvCache, batch: &Batch) -> Result<u64> {
        let inputs = prepare(kv, batch)?;
        let mut g = build_forward(model, &kv.layers, inputs.shape)?;
        self.allocate(&mut g)?;
        set_inputs(self.backend.as_ref(), &g, &inputs)?;
        self.backend.graph_compute(&g.tensors, &g.nodes)?;
        self.backend.synchronize()?;
        let logits = read_f32(self.backend.as_ref(), &g.tensors[g.logits.index()])?;
        let ticket = self.next;
        self.next += 1;
        self.done.insert(ticket, logits);
        Ok(ticket)
    }

    fn collect(&mut self, ticket: u64) -> Result<Vec<f32>> {
        self.done
            .remove(&ticket)
            .ok_or_else(|| unknown_ticket(ticket))
    }
}

/// Runs every pass through [`ggml_sched::Scheduler`] over one or more backends. The
/// graph and its allocation are reused while the batch geometry stays the same.
pub struct SchedExecutor {
    sched: ggml_sched::Scheduler,
    layers: crate::placement::LayerMap,
    current: Option<ForwardGraph>,
    /// Runs submitted and not yet read, oldest first (their logits live in the slots).
    in_flight: std::collections::VecDeque<u64>,
    /// Logits read early (before a slot or the graph was reused), by run.
    done: std::collections::BTreeMap<u64, Vec<f32>>,
}

impl std::fmt::Debug for SchedExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SchedExecutor({:?})", self.sched)
    }
}

impl SchedExecutor {
    /// An executor scheduling over `backends`, layers placed as `layers` says.
    pub fn new(
        backends: Vec<Arc<dyn Backend>>,
        layers: crate::placement::LayerMap,
        opts: ggml_sched::SchedOptions,
    ) -> Result<SchedExecutor> {
        Ok(SchedExecutor {
            sched: ggml_sched::Scheduler::new(backends, opts)?,
            layers,
            current: None,
            in_flight: Default::default(),
            done: Default::default(),
        })
    }

    /// The scheduler (plans, statistics).
    pub fn scheduler(&self) -> &ggml_sched::Scheduler {
        &self.sched
    }

    /// Builds, splits, plans and allocates the forward graph of `batch` without running
    /// it (so that [`ggml_sched::Scheduler::plan`] can be inspected).
    pub fn prepare(&mut self, model: &Model, kv: &mut KvCache, batch: &Batch) -> Result<()> {
        let inputs = prepare(kv, batch)?;
        self.ensure_graph(model, kv, &inputs)
    }

    fn ensure_graph(&mut self, model: &Model, kv: &KvCache, inputs: &GraphInputs) -> Result<()> {
        if self
            .current
            .as_ref()
            .is_some_and(|g| g.shape == inputs.shape)
        {
            return Ok(());
        }
        self.current = None;
        let g = build_forward(model, &kv.layers, inputs.shape)?;
        self.sched.clear_pins();
        // The first node of each layer goes where the layer lives (as llama.cpp pins the
        // norm); everything else follows the weights.
        for (l, &first) in g.layer_first.iter().enumerate() {
            self.sched
                .set_tensor_backend(first, self.layers.layer_device[l])?;
        }
        self.sched.alloc_nodes(&g.tensors, &g.nodes, &g.leafs)?;
        self.current = Some(g);
        Ok(())
    }
}

impl SchedExecutor {
    /// Reads the logits of run `run` (one of the last `n_copies`) from its slot.
    fn read_logits(&self, run: u64) -> Result<Vec<f32>> {
        let g = self.current.as_ref().ok_or_else(|| unknown_ticket(run))?;
        let t = &g.tensors[g.logits.index()];
        let mut bytes = vec![0u8; t.nbytes()];
        self.sched.get_tensor_run(run, g.logits, &mut bytes)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Reads the oldest run in flight into `done`.
    fn retire_oldest(&mut self) -> Result<()> {
        if let Some(run) = self.in_flight.front().copied() {
            let logits = self.read_logits(run)?;
            self.in_flight.pop_front();
            self.done.insert(run, logits);
        }
        Ok(())
    }
}

impl Executor for SchedExecutor {
    fn submit(&mut self, model: &Model, kv: &mut KvCache, batch: &Batch) -> Result<u64> {
        let inputs = prepare(kv, batch)?;
        let reshape = self
            .current
            .as_ref()
            .is_none_or(|g| g.shape != inputs.shape);
        // A new graph reallocates every slot, and a new run reuses the slot of the run
        // n_copies back: read what those still hold first.
        while !self.in_flight.is_empty()
            && (reshape || self.in_flight.len() >= self.sched.options().n_copies)
        {
            self.retire_oldest()?;
        }
        self.ensure_graph(model, kv, &inputs)?;
        let g = self.current.as_ref().expect("built above");
        let run = self.sched.next_run();
        self.sched.compute_with(&[
            (g.inp_tokens, &inputs.tokens),
            (g.inp_pos, &inputs.pos),
            (g.kq_mask, &inputs.mask),
            (g.inp_out_ids, &inputs.out_ids),
        ])?;
        self.in_flight.push_back(run);
        Ok(run)
    }

    fn collect(&mut self, ticket: u64) -> Result<Vec<f32>> {
        if let Some(l) = self.done.remove(&ticket) {
            return Ok(l);
        }
        let pos = self
            .in_flight
            .iter()
            .position(|&r| r == ticket)
            .ok_or_else(|| unknown_ticket(ticket))?;
        let logits = self.read_logits(ticket)?;
        self.in_flight.remove(pos);
        Ok(logits)
    }

    fn max_in_flight(&self) -> usize {
        self.sched.options().n_copies
    }

    fn host_syncs_per_forward(&self) -> Option<f64> {
        Some(self.sched.stats().host_syncs_per_compute())
    }
}
