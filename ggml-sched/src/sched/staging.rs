//! Outputs copied aside on their producer's queue, so that a pipeline slot can be reused
//! before the host reads what its run produced.
//!
//! Reading an output straight from its slot forces the caller to read run r before it
//! submits run r + n_copies (the slot's next user), which is a host sync on run r's
//! completion in the middle of a pipeline. Staging enqueues a copy of the output into
//! spare memory on the producing backend's queue right after the run (queue order puts
//! it after the producer and before the slot's next write), records an event, and lets
//! the host read it whenever it likes.

use std::sync::Arc;

use ggml_core::{Backend, BufferInfo, DataRef, EventId, Tensor, TensorId};

use super::Scheduler;
use crate::check::AccessContext;
use crate::error::{Result, SchedError};
use crate::plan::HbRule;
use crate::trace::{now_ns, SliceKind, TraceTrack};

/// Spare staging memory and its event, owned by one backend.
pub(super) struct Spare {
    backend: usize,
    buffer: BufferInfo,
    event: EventId,
}

impl Spare {
    pub(super) fn free(self, backends: &[Arc<dyn Backend>]) {
        let b = &backends[self.backend];
        let _ = b.event_free(self.event);
        let _ = b.free_buffer(self.buffer.id);
    }
}

/// An output of one run, copied aside by [`Scheduler::stage_output`]; read it with
/// [`Scheduler::read_staged`].
/// Its memory belongs to the scheduler (freed with it) and is reused after the read.
#[must_use = "a staged output's memory is reused only after read_staged"]
pub struct StagedOutput {
    run: u64,
    nbytes: usize,
    place: Place,
}

enum Place {
    /// Copy enqueued into the spare the scheduler keeps under this key.
    Queued(u64),
    /// Read at once (the backend has no events or declined the copy).
    Ready(Vec<u8>),
}

impl std::fmt::Debug for StagedOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagedOutput")
            .field("run", &self.run)
            .field("nbytes", &self.nbytes)
            .field("queued", &matches!(self.place, Place::Queued(_)))
            .finish()
    }
}

impl StagedOutput {
    /// The run that produced it.
    pub fn run(&self) -> u64 {
        self.run
    }

    /// Its size in bytes.
    pub fn nbytes(&self) -> usize {
        self.nbytes
    }
}

impl Scheduler {
    /// Copies output `id` (flagged [`ggml_core::TensorFlags::OUTPUT`]) of the latest run
    /// aside on the queue of the backend that produced it, without blocking the host.
    /// The run's pipeline slot may then be reused at once; the value stays readable with
    /// [`read_staged`](Scheduler::read_staged), which waits only for this copy (HB7).
    pub fn stage_output(&mut self, id: TensorId) -> Result<StagedOutput> {
        let gs = self.state()?;
        let run = gs
            .last_run
            .ok_or_else(|| self.tensor_err(id, "no completed compute to stage from"))?;
        let slot = (run % self.opts.n_copies as u64) as usize;
        let t = *gs.tables[slot]
            .get(id.index())
            .ok_or_else(|| self.tensor_err(id, "unknown tensor"))?;
        let per_slot = gs.per_slot.get(id.index()).copied().unwrap_or(false);
        if !(per_slot || t.flags.contains(ggml_core::TensorFlags::OUTPUT)) {
            return Err(self.tensor_err(id, "only outputs (TensorFlags::OUTPUT) can be staged"));
        }
        let owner = self.owner_of(gs, id, &t)?;
        let nbytes = t.nbytes();
        let b = self.backends[owner].clone();
        self.annotate(AccessContext {
            run: Some(run),
            slot: Some(slot),
            split: None,
            phase: "stage_output",
        });
        let spare = match self
            .staging
            .iter()
            .position(|s| s.backend == owner && s.buffer.size >= nbytes)
        {
            Some(i) => Some(self.staging.swap_remove(i)),
            None => match b.event_new()? {
                Some(event) => Some(Spare {
                    backend: owner,
                    buffer: b.alloc_buffer(nbytes.max(1))?,
                    event,
                }),
                None => None,
            },
        };
        let Some(spare) = spare else {
            // No events: read it now.
            return self.read_now(run, id, nbytes);
        };
        let mut dst = Tensor::contiguous(t.dtype, t.ne)
            .ok_or_else(|| self.tensor_err(id, "has a shape that cannot be staged"))?;
        dst.name = t.name;
        dst.data = Some(DataRef {
            buffer: spare.buffer.id,
            addr: spare.buffer.base,
        });
        let open = match &self.tracer {
            Some(tr) => tr.open(&self.backends, owner)?,
            None => None,
        };
        let copied = match b.cpy_tensor_async(&*b, &t, &dst) {
            Ok(c) => c,
            Err(e) => {
                self.staging.push(spare);
                return Err(e.into());
            }
        };
        if let Some(tr) = &self.tracer {
            let label = format!("stage {}", t.name.as_str());
            let mut sl = tr.slice(TraceTrack::Queue(owner), SliceKind::Copy, label);
            (sl.run, sl.slot) = (Some(run), Some(slot));
            tr.close(&self.backends, open, sl)?;
        }
        if !copied {
            self.staging.push(spare);
            return self.read_now(run, id, nbytes);
        }
        // Where the backend can, the bytes go on to its host memory right behind the copy
        // (pinned memory on a GPU): the host's one wait for the event below then covers
        // the read too, and `read_staged` makes no second wait.
        if let Err(e) = b.buffer_prefetch(spare.buffer.id, 0, nbytes) {
            self.staging.push(spare);
            return Err(e.into());
        }
        if let Err(e) = b.event_record(spare.event) {
            self.staging.push(spare);
            return Err(e.into());
        }
        self.annotate(AccessContext::default());
        let key = self.next_staged;
        self.next_staged += 1;
        self.staged.insert(key, spare);
        Ok(StagedOutput {
            run,
            nbytes,
            place: Place::Queued(key),
        })
    }

    /// The fallback where nothing can be staged: reads output `id` of `run` at once (a
    /// host sync, HB7).
    fn read_now(&self, run: u64, id: TensorId, nbytes: usize) -> Result<StagedOutput> {
        let mut bytes = vec![0u8; nbytes];
        self.get_tensor_run(run, id, &mut bytes)?;
        self.annotate(AccessContext::default());
        Ok(StagedOutput {
            run,
            nbytes,
            place: Place::Ready(bytes),
        })
    }

    /// Waits for a staged output's copy (a host sync, HB7) and reads it into `out`
    /// (exactly [`StagedOutput::nbytes`] long); its memory returns to the scheduler.
    pub fn read_staged(&mut self, staged: StagedOutput, out: &mut [u8]) -> Result<()> {
        if out.len() != staged.nbytes {
            return Err(SchedError::Invalid(format!(
                "staged output of run {} has {} bytes, the slice {}",
                staged.run,
                staged.nbytes,
                out.len()
            )));
        }
        let spare = match staged.place {
            Place::Ready(bytes) => {
                out.copy_from_slice(&bytes);
                return Ok(());
            }
            Place::Queued(key) => self.staged.remove(&key).ok_or_else(|| {
                SchedError::Invalid(format!("staged output of run {} read twice", staged.run))
            })?,
        };
        let b = self.backends[spare.backend].clone();
        self.annotate(AccessContext {
            run: Some(staged.run),
            slot: None,
            split: None,
            phase: "read_staged",
        });
        let t0 = now_ns();
        self.stats.host_reads += 1;
        let res = self
            .host_event_wait(spare.backend, spare.event, || {
                format!("the staged output of run {} (HB7)", staged.run)
            })
            .and_then(|()| Ok(b.buffer_get(spare.buffer.id, 0, out)?));
        self.annotate(AccessContext::default());
        if let Some(tr) = &self.tracer {
            let mut sl = tr.slice(TraceTrack::Host, SliceKind::HostSync, "read staged".into());
            (sl.run, sl.rule) = (Some(staged.run), Some(HbRule::Hb7));
            (sl.start_ns, sl.end_ns) = (t0, now_ns());
            tr.host(sl);
        }
        self.staging.push(spare);
        res.and_then(|()| self.check_devices())
    }
}
