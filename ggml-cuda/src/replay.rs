//! Each kernel alone at the model's shapes: the launches of one pass are recorded
//! ([`CudaBackend::record_launches`]) and then relaunched one at a time between timed
//! events ([`CudaBackend::time_launches`]), with L2 flushed before each ("cold": weights
//! and activations come from DRAM) and without ("warm": the same launch again right
//! after itself). These are the kernels' own durations, free of host gaps, for comparing
//! with the cost model launch by launch.
//!
//! A replay reruns kernels on whatever the buffers hold by then: outputs may be
//! overwritten with different values (a node whose output shares memory with an input,
//! for example). Record and time after the runs whose results matter.

use ggml_core::{Backend, BackendResult, Name, Op, OpKey, Tensor};

use crate::backend::{CudaBackend, State};
use crate::driver::{Event, Func};
use crate::kernels::KernelId;
use crate::launch::{Args, LaunchDims};

/// One launch as the backend made it.
#[derive(Clone)]
pub struct RecordedLaunch {
    /// The kernel.
    pub kernel: KernelId,
    /// The op (and weight type) of the node it computes, as op timing keys it; a fused
    /// launch is keyed by its first node.
    pub op: OpKey,
    /// The node's name.
    pub node: Name,
    /// Grid, block and dynamic shared memory.
    pub dims: LaunchDims,
    /// The multiply-adds of a matrix product or attention that this launch computes
    /// (0 for every other kernel, and for the activation quantisation of a product):
    /// what the share of tensor-core multiply-adds is measured against.
    pub macs: u64,
    args: Args,
    /// The function launched: the kernel's entry, or a variant of it.
    function: Func,
}

impl std::fmt::Debug for RecordedLaunch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordedLaunch")
            .field("kernel", &self.kernel)
            .field("op", &self.op)
            .field("node", &self.node)
            .field("dims", &self.dims)
            .finish_non_exhaustive()
    }
}

/// The measured duration of one recorded launch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LaunchTime {
    /// The kernel.
    pub kernel: KernelId,
    /// The op (and weight type) it computes.
    pub op: OpKey,
    /// The node's name.
    pub node: Name,
    /// Grid, block and dynamic shared memory.
    pub dims: LaunchDims,
    /// Median microseconds with L2 flushed before each launch.
    pub cold_us: f64,
    /// Median microseconds of the launch repeated right after itself.
    pub warm_us: f64,
}

impl State {
    /// Notes a launch while recording is on: `launched` is the kernel and the function
    /// that ran it (its entry, or a variant of it).
    pub(crate) fn record(
        &mut self,
        launched: (KernelId, Func),
        op: OpKey,
        node: Name,
        dims: LaunchDims,
        macs: u64,
        args: &Args,
    ) {
        let (kernel, function) = launched;
        if let Some(r) = self.recorded.as_mut() {
            r.push(RecordedLaunch {
                kernel,
                op,
                node,
                dims,
                macs,
                args: args.clone(),
                function,
            });
        }
    }
}

/// The multiply-adds kernel `kernel` computes for `node` (see [`RecordedLaunch::macs`]).
pub(crate) fn node_macs(tensors: &[Tensor], node: &Tensor, kernel: KernelId) -> u64 {
    let src = |i: usize| node.src[i].and_then(|s| tensors.get(s.index()));
    let out = node.nelements() as u64;
    match (node.op, kernel) {
        (Op::MulMat | Op::MulMatId, KernelId::QuantizeQ8_1) => 0,
        // Every output is a dot product over the weights' rows.
        (Op::MulMat | Op::MulMatId, _) => src(0).map_or(0, |w| out * w.ne[0] as u64),
        // Q·K over D and P·V over Dv for every query row, KV position and head.
        (Op::FlashAttnExt { .. }, _) => match (src(0), src(1), src(2)) {
            (Some(q), Some(k), Some(v)) => {
                let rows = (q.ne[1] * q.ne[2] * q.ne[3]) as u64;
                rows * k.ne[1] as u64 * (q.ne[0] + v.ne[0]) as u64
            }
            _ => 0,
        },
        _ => 0,
    }
}

impl CudaBackend {
    /// Starts (`true`) or stops recording every launch this backend makes; stopping
    /// drops what was recorded. While recording, every kernel is launched from the host
    /// (no graph replays), so each launch is seen.
    pub fn record_launches(&self, on: bool) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.recorded = on.then(Vec::new);
    }

    /// The raw driver handle of this backend's stream (a `CUstream`, or cuda-sim's stream
    /// id), to match cuda-sim's profiler records (`LaunchRecord::stream`) with backends.
    pub fn stream_handle(&self) -> u64 {
        self.stream.0
    }

    /// Whether launches are being recorded.
    pub fn is_recording_launches(&self) -> bool {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.recorded.is_some()
    }

    /// The launches recorded since recording started or the last call, in order. On
    /// cuda-sim each was launched with its index in this list as its profiler tag
    /// (`cuda_sim::driver::Driver::set_launch_tag`); the tag is cleared here.
    pub fn take_recorded_launches(&self) -> Vec<RecordedLaunch> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.dev.api.set_launch_tag(self.stream, None);
        st.recorded.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Relaunches each of `launches` alone, `reps` times warm and `reps` times after
    /// writing `flush_bytes` of scratch memory (0: no cold runs, `cold_us` is NaN), and
    /// returns the median time of each. The buffers the launches read and write must
    /// still be alive. Kernel errors the replays raise are discarded: the values replayed
    /// kernels see are not the pass's.
    pub fn time_launches(
        &self,
        launches: &[RecordedLaunch],
        reps: usize,
        flush_bytes: usize,
    ) -> BackendResult<Vec<LaunchTime>> {
        self.bind()?;
        let api = self.dev.api;
        let ctx = self.dev.ctx;
        let fail = |e| self.cu(e).at("time_launches", Name::new("replay"));
        self.synchronize()?;
        let reps = reps.max(1);
        let flush = match flush_bytes {
            0 => None,
            n => Some(api.mem_alloc(ctx, n).map_err(fail)?),
        };
        let mut events: Vec<Event> = Vec::with_capacity(2 * reps);
        let result = (|| {
            for _ in 0..2 * reps {
                events.push(api.event_create_timed(ctx).map_err(fail)?);
            }
            let mut out = Vec::with_capacity(launches.len());
            for l in launches {
                let f = l.function;
                let time = |flush: Option<u64>| -> BackendResult<f64> {
                    let mut args = l.args.clone();
                    // Warm-up: the first launch of a kernel may load its code.
                    api.launch(f, &l.dims, self.stream, &mut args)
                        .map_err(fail)?;
                    for r in 0..reps {
                        if let Some(p) = flush {
                            api.memset_d8_async(p, r as u8, flush_bytes, self.stream)
                                .map_err(fail)?;
                        }
                        api.event_record(events[2 * r], self.stream).map_err(fail)?;
                        let mut args = l.args.clone();
                        api.launch(f, &l.dims, self.stream, &mut args)
                            .map_err(fail)?;
                        api.event_record(events[2 * r + 1], self.stream)
                            .map_err(fail)?;
                    }
                    api.event_synchronize(events[2 * reps - 1]).map_err(fail)?;
                    let mut us = Vec::with_capacity(reps);
                    for r in 0..reps {
                        let ms = api
                            .event_elapsed_ms(events[2 * r], events[2 * r + 1])
                            .map_err(fail)?;
                        us.push(ms as f64 * 1e3);
                    }
                    Ok(crate::calibrate::median(&us))
                };
                let warm_us = time(None)?;
                let cold_us = match flush {
                    Some(p) => time(Some(p))?,
                    None => f64::NAN,
                };
                out.push(LaunchTime {
                    kernel: l.kernel,
                    op: l.op,
                    node: l.node,
                    dims: l.dims,
                    cold_us,
                    warm_us,
                });
            }
            Ok(out)
        })();
        let drained = api.stream_synchronize(self.stream).map_err(fail);
        for e in events {
            api.event_destroy(e);
        }
        if let Some(p) = flush {
            let _ = api.mem_free(ctx, p);
        }
        self.discard_kernel_errors().and(drained).and(result)
    }
}
