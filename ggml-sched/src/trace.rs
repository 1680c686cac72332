//! Timelines of scheduler runs: every queue action and host sync as a timed slice.
//!
//! Queue work is timed without touching kernels: the scheduler records a marker event on
//! the queue before and after each action it enqueues, and reads when each marker
//! completed ([`Backend::event_time_ns`], on the host clock). Host work (submitting a run,
//! host waits, reads of outputs) is timed on the host directly. A backend that does not
//! time its events contributes host slices only.

use std::sync::{Arc, Mutex, MutexGuard};

use ggml_core::{Backend, EventId};

use crate::error::Result;
use crate::plan::HbRule;

/// The time line a slice belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TraceTrack {
    /// The host thread that drives the scheduler.
    Host,
    /// The queue of backend `i` (scheduler order).
    Queue(usize),
}

/// What a slice is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SliceKind {
    /// A split's graph on its queue.
    Compute,
    /// An asynchronous copy into a pipeline slot, on the queue that runs it.
    Copy,
    /// A queue waiting on another queue's event.
    Wait,
    /// An event record.
    Record,
    /// The write of a user input on the input backend's queue.
    SetInput,
    /// The host blocked on a queue (host wait, sync, or a read of an output).
    HostSync,
    /// A copy through the host (the fallback when a backend declines an async copy).
    HostCopy,
    /// The host inside [`Scheduler::compute`](crate::Scheduler::compute): planning and
    /// enqueueing one run.
    Submit,
}

impl SliceKind {
    /// Short name (`compute`, `copy`, `wait`, ...).
    pub fn name(self) -> &'static str {
        match self {
            SliceKind::Compute => "compute",
            SliceKind::Copy => "copy",
            SliceKind::Wait => "wait",
            SliceKind::Record => "record",
            SliceKind::SetInput => "set_input",
            SliceKind::HostSync => "host_sync",
            SliceKind::HostCopy => "host_copy",
            SliceKind::Submit => "submit",
        }
    }

    /// The kind named `name`.
    pub fn from_name(name: &str) -> Option<SliceKind> {
        [
            SliceKind::Compute,
            SliceKind::Copy,
            SliceKind::Wait,
            SliceKind::Record,
            SliceKind::SetInput,
            SliceKind::HostSync,
            SliceKind::HostCopy,
            SliceKind::Submit,
        ]
        .into_iter()
        .find(|k| k.name() == name)
    }

    /// Letter in a split's sync pattern, as [`Action::letter`](crate::Action::letter):
    /// `w` queue wait, `s` host sync, `a` async copy, `c` copy through the host, `g`
    /// graph; records, input writes and submits have none.
    pub fn letter(self) -> Option<char> {
        match self {
            SliceKind::Compute => Some('g'),
            SliceKind::Copy => Some('a'),
            SliceKind::Wait => Some('w'),
            SliceKind::HostSync => Some('s'),
            SliceKind::HostCopy => Some('c'),
            SliceKind::Record | SliceKind::SetInput | SliceKind::Submit => None,
        }
    }
}

/// One timed piece of work.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceSlice {
    /// Where it ran.
    pub track: TraceTrack,
    /// What it was.
    pub kind: SliceKind,
    /// A tensor name, split or event, for people.
    pub label: String,
    /// Run (one micro-batch) it belongs to.
    pub run: Option<u64>,
    /// Pipeline slot of the run.
    pub slot: Option<usize>,
    /// Split index.
    pub split: Option<usize>,
    /// Batch and micro-batch within it, as the caller tagged them
    /// ([`Scheduler::set_trace_tag`](crate::Scheduler::set_trace_tag)).
    pub batch: Option<(u64, usize)>,
    /// The happens-before rule a wait or host sync discharges.
    pub rule: Option<HbRule>,
    /// For copies: the backend whose memory the copy writes (the one waiting for it).
    pub dst: Option<usize>,
    /// Order in which the host issued it (counts every traced action).
    pub seq: u64,
    /// Start, ns since the Unix epoch.
    pub start_ns: u64,
    /// End, ns since the Unix epoch (equal to the start for instants such as records).
    pub end_ns: u64,
}

/// What a traced scheduler recorded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// Name of each backend's queue, in scheduler order.
    pub queues: Vec<String>,
    /// Every slice, ordered by start time.
    pub slices: Vec<TraceSlice>,
}

/// The host clock in ns since the Unix epoch (the time base of
/// [`Backend::event_time_ns`]).
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A queue slice whose marker events have not completed yet.
struct Pending {
    slice: TraceSlice,
    queue: usize,
    start: EventId,
    end: EventId,
}

#[derive(Default)]
struct State {
    seq: u64,
    tag: Option<(u64, usize)>,
    pending: Vec<Pending>,
    done: Vec<TraceSlice>,
}

/// The recorder a traced [`Scheduler`](crate::Scheduler) owns.
#[derive(Default)]
pub(crate) struct Tracer {
    state: Mutex<State>,
}

/// A queue action being traced: the marker recorded before it.
pub(crate) struct Open {
    queue: usize,
    start: EventId,
}

impl Tracer {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_tag(&self, tag: Option<(u64, usize)>) {
        self.lock().tag = tag;
    }

    /// The slice skeleton with the current tag.
    pub(crate) fn slice(&self, track: TraceTrack, kind: SliceKind, label: String) -> TraceSlice {
        let mut st = self.lock();
        st.seq += 1;
        TraceSlice {
            track,
            kind,
            label,
            run: None,
            slot: None,
            split: None,
            batch: st.tag,
            rule: None,
            dst: None,
            seq: st.seq,
            start_ns: 0,
            end_ns: 0,
        }
    }

    /// Records a start marker on `queue` (`None` if its backend has no events).
    pub(crate) fn open(&self, backends: &[Arc<dyn Backend>], queue: usize) -> Result<Option<Open>> {
        let b = &backends[queue];
        let Some(start) = b.event_new()? else {
            return Ok(None);
        };
        b.event_record(start)?;
        Ok(Some(Open { queue, start }))
    }

    /// Records the end marker of `open` and keeps `slice` until both markers are timed.
    pub(crate) fn close(
        &self,
        backends: &[Arc<dyn Backend>],
        open: Option<Open>,
        slice: TraceSlice,
    ) -> Result<()> {
        let Some(o) = open else { return Ok(()) };
        let b = &backends[o.queue];
        let end = match b.event_new()? {
            Some(e) => e,
            None => return Ok(()),
        };
        b.event_record(end)?;
        self.lock().pending.push(Pending {
            slice,
            queue: o.queue,
            start: o.start,
            end,
        });
        Ok(())
    }

    /// Keeps a host slice.
    pub(crate) fn host(&self, slice: TraceSlice) {
        self.lock().done.push(slice);
    }

    /// Times every pending slice whose markers completed (all of them with `block`, which
    /// waits for the markers) and frees their events.
    pub(crate) fn resolve(&self, backends: &[Arc<dyn Backend>], block: bool) -> Result<()> {
        let mut st = self.lock();
        let pending = std::mem::take(&mut st.pending);
        for p in pending {
            let b = &backends[p.queue];
            if block {
                b.event_synchronize(p.end)?;
            }
            match (b.event_time_ns(p.start)?, b.event_time_ns(p.end)?) {
                (Some(t0), Some(t1)) => {
                    b.event_free(p.start)?;
                    b.event_free(p.end)?;
                    let mut s = p.slice;
                    s.start_ns = t0;
                    s.end_ns = t1.max(t0);
                    st.done.push(s);
                }
                _ if block => {
                    // The backend completed the marker but does not time events.
                    b.event_free(p.start)?;
                    b.event_free(p.end)?;
                }
                _ => st.pending.push(p),
            }
        }
        Ok(())
    }

    /// Everything recorded so far (waiting for pending markers), ordered by start.
    pub(crate) fn take(&self, backends: &[Arc<dyn Backend>]) -> Result<Trace> {
        self.resolve(backends, true)?;
        let mut slices = std::mem::take(&mut self.lock().done);
        slices.sort_by_key(|s| (s.start_ns, s.end_ns));
        Ok(Trace {
            queues: backends
                .iter()
                .map(|b| b.name().as_str().to_string())
                .collect(),
            slices,
        })
    }
}
