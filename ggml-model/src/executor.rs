//! Running forward passes through the scheduler ([`SchedExecutor`]).

use std::sync::Arc;

use ggml_core::Backend;

use crate::batch::{prepare, Batch, GraphInputs};
use crate::error::{ModelError, Result};
use crate::model::{build_forward, build_forward_tp, ForwardGraph, Model};
use crate::placement::KvCache;

/// Something that runs forward passes of a model over batches.
pub trait Executor {
    /// Decodes `batch` (writing its keys and values into `kv`) and returns the logits of
    /// the tokens whose output was requested, `n_vocab` floats per token, in batch order.
    /// The batch may run as several micro-batches; the result is the same.
    fn forward(&mut self, model: &Model, kv: &mut KvCache, batch: &Batch) -> Result<Vec<f32>> {
        let ticket = self.submit(model, kv, batch)?;
        self.collect(ticket)
    }

    /// Decodes `batch` as [`forward`](Executor::forward) does and returns, for each token
    /// whose output was requested, greedy sampling's token: the index of its highest
    /// logit, the first on ties ([`crate::generate::argmax`] exactly). An executor that
    /// can compute it where the logits are reads back 4 bytes per token, not a row of
    /// logits; the default computes it from the logits on the host.
    fn forward_greedy(
        &mut self,
        model: &Model,
        kv: &mut KvCache,
        batch: &Batch,
    ) -> Result<Vec<u32>> {
        let logits = self.forward(model, kv, batch)?;
        Ok(logits
            .chunks(model.hp.n_vocab)
            .map(crate::generate::argmax)
            .collect())
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

    /// The scheduler's cumulative statistics (copies, bytes moved, host syncs), where the
    /// executor has a scheduler.
    fn sched_stats(&self) -> Option<ggml_sched::Stats> {
        None
    }

    /// Starts recording a timeline of every following pass, where the executor can.
    fn enable_trace(&mut self) {}

    /// The timeline recorded since [`enable_trace`](Executor::enable_trace) (waiting for
    /// queued work to pass its markers); `None` if the executor does not trace.
    fn take_trace(&mut self) -> Result<Option<ggml_sched::Trace>> {
        Ok(None)
    }
}

/// The error for a ticket that was never issued or already collected.
fn unknown_ticket(ticket: u64) -> ModelError {
    ModelError::Usage(format!(
        "forward pass {ticket} was not submitted or was already collected"
    ))
}

/// Runs every pass through [`ggml_sched::Scheduler`] over one or more backends. A batch
/// is cut into micro-batches of `n_ubatch` tokens, each one scheduler run in the next
/// pipeline slot, submitted back to back. The logits of each run are staged aside on the
/// producing queue ([`ggml_sched::Scheduler::stage_output`]), so no slot reuse waits for
/// the host to read them. The graph and its allocation are reused while the micro-batch
/// geometry stays the same.
pub struct SchedExecutor {
    sched: ggml_sched::Scheduler,
    layers: crate::placement::LayerMap,
    n_ubatch: usize,
    current: Option<ForwardGraph>,
    /// The staged logits (and the bytes of them requested) of each run with requested
    /// outputs of each submitted batch, by ticket.
    tickets: std::collections::BTreeMap<u64, Vec<(ggml_sched::StagedOutput, usize)>>,
    next_ticket: u64,
    /// Room for a staged output whose trailing rows nobody asked for.
    spare: Vec<u8>,
    /// The passes being submitted compute greedy tokens (ARGMAX on the logits) and
    /// stage those instead of the logits.
    greedy: bool,
}

impl std::fmt::Debug for SchedExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SchedExecutor({:?})", self.sched)
    }
}

impl SchedExecutor {
    /// An executor scheduling over `backends` (with `engines`, one per backend, running
    /// the copies between them; none: copies on the backends' queues), layers placed as
    /// `layers` says, cutting
    /// batches into micro-batches of `n_ubatch` tokens (0: never).
    pub fn new(
        backends: Vec<Arc<dyn Backend>>,
        engines: Vec<Arc<dyn Backend>>,
        layers: crate::placement::LayerMap,
        opts: ggml_sched::SchedOptions,
        n_ubatch: usize,
    ) -> Result<SchedExecutor> {
        let sched = if engines.is_empty() {
            ggml_sched::Scheduler::new(backends, opts)?
        } else {
            ggml_sched::Scheduler::with_copy_engines(backends, engines, opts)?
        };
        Ok(SchedExecutor {
            sched,
            layers,
            n_ubatch,
            current: None,
            tickets: Default::default(),
            next_ticket: 0,
            spare: Vec::new(),
            greedy: false,
        })
    }

    /// The scheduler (plans, statistics).
    pub fn scheduler(&self) -> &ggml_sched::Scheduler {
        &self.sched
    }

    /// Builds, splits, plans and allocates the forward graph of `batch` without running
    /// it (so that [`ggml_sched::Scheduler::plan`] can be inspected).
    pub fn prepare(&mut self, model: &Model, kv: &mut KvCache, batch: &Batch) -> Result<()> {
        let inputs = prepare(kv, batch, self.n_ubatch)?;
        self.ensure_graph(model, kv, &inputs[0])
    }

    fn ensure_graph(&mut self, model: &Model, kv: &KvCache, inputs: &GraphInputs) -> Result<()> {
        let greedy = self.greedy;
        if self
            .current
            .as_ref()
            .is_some_and(|g| g.shape == inputs.shape && g.argmax.is_some() == greedy)
        {
            return Ok(());
        }
        self.current = None;
        self.sched.clear_pins();
        let g = match &self.layers.tp {
            Some(tp) => {
                let g = build_forward_tp(model, tp, &kv.tp_layers, inputs.shape)?;
                for &(id, d) in &g.pins {
                    self.sched.set_tensor_backend(id, d)?;
                }
                g
            }
            None => {
                let g = build_forward(model, &kv.layers, inputs.shape)?;
                // The first node of each layer goes where the layer lives (as llama.cpp
                // pins the norm); everything else follows the weights.
                for (l, &first) in g.layer_first.iter().enumerate() {
                    self.sched
                        .set_tensor_backend(first, self.layers.layer_device[l])?;
                }
                g
            }
        };
        let g = if greedy { g.with_argmax()? } else { g };
        self.sched.alloc_nodes(&g.tensors, &g.nodes, &g.leafs)?;
        self.current = Some(g);
        Ok(())
    }
}

impl SchedExecutor {
    /// Submits one micro-batch as the next scheduler run; returns its staged logits and
    /// how many of their bytes (leading rows) were requested, if any were.
    fn submit_run(
        &mut self,
        model: &Model,
        kv: &KvCache,
        inputs: &GraphInputs,
    ) -> Result<Option<(ggml_sched::StagedOutput, usize)>> {
        self.ensure_graph(model, kv, inputs)?;
        let g = self.current.as_ref().expect("built above");
        let mut feeds: Vec<(ggml_core::TensorId, &[u8])> = vec![
            (g.inp_tokens, &inputs.tokens),
            (g.inp_pos, &inputs.pos),
            (g.inp_kv_idxs, &inputs.kv_idxs),
            (g.kq_mask, &inputs.mask),
            (g.inp_out_ids, &inputs.out_ids),
        ];
        if let Some(m) = g.kq_mask_swa {
            feeds.push((m, &inputs.mask_swa));
        }
        self.sched.compute_with(&feeds)?;
        if inputs.wanted_rows > 0 {
            let out = match g.argmax {
                Some(best) if self.greedy => best,
                _ => g.logits,
            };
            let staged = self.sched.stage_output(out)?;
            let keep = staged.nbytes() / inputs.shape.n_outputs * inputs.wanted_rows;
            Ok(Some((staged, keep)))
        } else {
            Ok(None)
        }
    }
}

impl Executor for SchedExecutor {
    fn forward_greedy(
        &mut self,
        model: &Model,
        kv: &mut KvCache,
        batch: &Batch,
    ) -> Result<Vec<u32>> {
        self.greedy = true;
        let ticket = self.submit(model, kv, batch);
        self.greedy = false;
        // The staged rows are I32 token ids, read into f32 storage bit for bit.
        let ids = self.collect(ticket?)?;
        Ok(ids.iter().map(|x| x.to_bits()).collect())
    }

    fn submit(&mut self, model: &Model, kv: &mut KvCache, batch: &Batch) -> Result<u64> {
        let inputs = prepare(kv, batch, self.n_ubatch)?;
        let ticket = self.next_ticket;
        let mut staged = Vec::with_capacity(inputs.len());
        for (u, inp) in inputs.iter().enumerate() {
            self.sched.set_trace_tag(Some((ticket, u)));
            let r = self.submit_run(model, kv, inp);
            self.sched.set_trace_tag(None);
            staged.extend(r?);
        }
        self.next_ticket += 1;
        self.tickets.insert(ticket, staged);
        Ok(ticket)
    }

    fn collect(&mut self, ticket: u64) -> Result<Vec<f32>> {
        let staged = self
            .tickets
            .remove(&ticket)
            .ok_or_else(|| unknown_ticket(ticket))?;
        let total: usize = staged.iter().map(|(_, keep)| keep).sum();
        // Read straight into the result (rows are whole f32s); only a run with unwanted
        // trailing rows goes through the spare buffer. Generation reads a megabyte of
        // logits per token: no extra copies, and no buffer allocated per pass.
        let mut logits = vec![0f32; total / 4];
        let out: &mut [u8] = bytemuck::cast_slice_mut(&mut logits);
        let mut off = 0;
        for (s, keep) in staged {
            if keep == s.nbytes() {
                self.sched.read_staged(s, &mut out[off..off + keep])?;
            } else {
                self.spare.resize(s.nbytes(), 0);
                self.sched.read_staged(s, &mut self.spare)?;
                out[off..off + keep].copy_from_slice(&self.spare[..keep]);
            }
            off += keep;
        }
        Ok(logits)
    }

    fn max_in_flight(&self) -> usize {
        self.sched.options().n_copies
    }

    fn host_syncs_per_forward(&self) -> Option<f64> {
        Some(self.sched.stats().host_syncs_per_compute())
    }

    fn sched_stats(&self) -> Option<ggml_sched::Stats> {
        Some(*self.sched.stats())
    }

    fn enable_trace(&mut self) {
        self.sched.enable_trace();
    }

    fn take_trace(&mut self) -> Result<Option<ggml_sched::Trace>> {
        Ok(self.sched.take_trace()?)
    }
}
