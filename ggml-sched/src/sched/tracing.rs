//! Recording a [`Trace`] of runs: markers around each queue action, the host's reads.

use ggml_core::{Tensor, TensorId};

use super::{GraphState, RunStats, Scheduler};
use crate::error::Result;
use crate::plan::{Action, CopyOn, HbRule};
use crate::trace::{now_ns, SliceKind, Trace, TraceTrack, Tracer};

impl Scheduler {
    /// Starts recording a [`Trace`] of every following run (see [`crate::trace`]).
    /// Tracing adds two event records per queue action; it changes no result.
    pub fn enable_trace(&mut self) {
        self.tracer.get_or_insert_with(Tracer::default);
    }

    /// Tags the slices of following runs with a batch and micro-batch index (for traces
    /// of callers that cut batches); `None` clears the tag.
    pub fn set_trace_tag(&self, tag: Option<(u64, usize)>) {
        if let Some(tr) = &self.tracer {
            tr.set_tag(tag);
        }
    }

    /// Waits for the queues to pass every trace marker and returns what was recorded
    /// since tracing was enabled or last taken; `None` when tracing is off.
    pub fn take_trace(&mut self) -> Result<Option<Trace>> {
        match &self.tracer {
            Some(tr) => Ok(Some(tr.take(&self.backends)?)),
            None => Ok(None),
        }
    }

    /// [`exec`](Scheduler::exec), bracketed by trace markers when tracing.
    pub(super) fn exec_traced(
        &self,
        gs: &GraphState,
        c: usize,
        run: u64,
        split: Option<usize>,
        a: &Action,
        st: &mut RunStats,
    ) -> Result<()> {
        let Some(tr) = &self.tracer else {
            return self.exec(gs, c, a, st);
        };
        let name = |id: TensorId| gs.tables[c][id.index()].name.as_str().to_string();
        let (track, kind, label, rule) = match *a {
            Action::Wait { queue, event, why } => (
                TraceTrack::Queue(queue),
                SliceKind::Wait,
                format!("wait {}", self.props[event.backend].name),
                Some(why),
            ),
            Action::HostWait { event, why } => (
                TraceTrack::Host,
                SliceKind::HostSync,
                format!("host wait {}", self.props[event.backend].name),
                Some(why),
            ),
            Action::HostSync { backend, why } => (
                TraceTrack::Host,
                SliceKind::HostSync,
                format!("host sync {}", self.props[backend].name),
                Some(why),
            ),
            Action::Record { event } => (
                TraceTrack::Queue(event.backend),
                SliceKind::Record,
                format!("record {:?}", event.kind),
                None,
            ),
            Action::Compute { split } => {
                let sp = &gs.part.splits[split];
                let first = sp.nodes.first().map(|&n| name(n)).unwrap_or_default();
                let last = sp.nodes.last().map(|&n| name(n)).unwrap_or_default();
                (
                    TraceTrack::Queue(sp.backend),
                    SliceKind::Compute,
                    format!("split {split}: {first} .. {last}"),
                    None,
                )
            }
            Action::Copy {
                tensor,
                from,
                to,
                on,
                ..
            } => {
                let (track, kind) = match on {
                    CopyOn::Engine(e) => (TraceTrack::Queue(e), SliceKind::Copy),
                    CopyOn::Src => (TraceTrack::Queue(from), SliceKind::Copy),
                    CopyOn::Dst => (TraceTrack::Queue(to), SliceKind::Copy),
                    CopyOn::Host => (TraceTrack::Host, SliceKind::HostCopy),
                };
                (track, kind, name(tensor), None)
            }
        };
        let mut sl = tr.slice(track, kind, label);
        (sl.run, sl.slot, sl.split, sl.rule) = (Some(run), Some(c), split, rule);
        if let Action::Copy { to, .. } = *a {
            sl.dst = Some(to);
        }
        match track {
            TraceTrack::Host => {
                sl.start_ns = now_ns();
                self.exec(gs, c, a, st)?;
                sl.end_ns = now_ns();
                tr.host(sl);
            }
            TraceTrack::Queue(q) => {
                let open = tr.open(&self.backends, q)?;
                self.exec(gs, c, a, st)?;
                tr.close(&self.backends, open, sl)?;
            }
        }
        Ok(())
    }

    /// Traces the host's wait for an output of `run` (HB7).
    pub(super) fn trace_read(&self, run: u64, slot: usize, t: &Tensor, t0: u64) {
        if let Some(tr) = &self.tracer {
            let label = format!("read {}", t.name.as_str());
            let mut sl = tr.slice(TraceTrack::Host, SliceKind::HostSync, label);
            (sl.run, sl.slot, sl.rule) = (Some(run), Some(slot), Some(HbRule::Hb7));
            (sl.start_ns, sl.end_ns) = (t0, now_ns());
            tr.host(sl);
        }
    }
}
