//! Streams: a queue of operations executed in order by the stream's own worker thread.
//!
//! Every operation has a sequence number (1, 2, ...) on its stream, and may depend on
//! positions of other streams ([`Dep`]: "stream S has completed its first n
//! operations"): an event wait, or the legacy NULL stream's implicit ordering. The
//! worker waits for those, sleeps its chaos delay, then runs the operation, unless the
//! device's context is poisoned, in which case it is skipped. Dependencies only ever
//! name operations enqueued before the dependent one, so waits cannot form a cycle.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::chaos::StreamChaos;
use super::graph::Capture;
use super::lock;
use super::ops::{self, Failure, Op};
use super::shared::Shared;
use crate::error::{CuError, ErrorCode};

/// How a stream orders against the legacy NULL stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamKind {
    /// The legacy NULL stream of a context.
    Legacy,
    /// A stream created without `CU_STREAM_NON_BLOCKING`: ordered with the NULL stream.
    Blocking,
    /// `CU_STREAM_NON_BLOCKING`: no implicit ordering.
    NonBlocking,
}

/// "`stream` has completed its first `seq` operations".
#[derive(Clone)]
pub(crate) struct Dep {
    pub(crate) stream: Arc<StreamShared>,
    pub(crate) seq: u64,
}

impl Dep {
    pub(crate) fn is_done(&self) -> bool {
        self.stream.queue().completed >= self.seq
    }

    pub(crate) fn wait(&self) {
        self.stream.wait_for(self.seq);
    }
}

pub(crate) struct Queued {
    deps: Vec<Dep>,
    op: Op,
}

struct Queue {
    ops: VecDeque<Queued>,
    enqueued: u64,
    completed: u64,
    shutdown: bool,
    /// An asynchronous launch error (non-sticky), returned by the next synchronize.
    deferred: Option<CuError>,
}

/// One stream.
pub(crate) struct StreamShared {
    pub(crate) id: u64,
    pub(crate) dev: usize,
    pub(crate) kind: StreamKind,
    state: Mutex<Queue>,
    /// Signalled on every push, completion and shutdown.
    cv: Condvar,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// The capture in progress on this stream, if any.
    pub(crate) capture: Mutex<Option<Arc<Capture>>>,
}

impl StreamShared {
    pub(crate) fn new(id: u64, dev: usize, kind: StreamKind) -> Arc<StreamShared> {
        Arc::new(StreamShared {
            id,
            dev,
            kind,
            state: Mutex::new(Queue {
                ops: VecDeque::new(),
                enqueued: 0,
                completed: 0,
                shutdown: false,
                deferred: None,
            }),
            cv: Condvar::new(),
            worker: Mutex::new(None),
            capture: Mutex::new(None),
        })
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        lock(&self.state)
    }

    /// The capture in progress on this stream.
    pub(crate) fn capturing(&self) -> Option<Arc<Capture>> {
        lock(&self.capture).clone()
    }

    /// Starts the worker thread.
    pub(crate) fn start(self: &Arc<Self>, shared: Arc<Shared>) -> Result<(), CuError> {
        let me = Arc::clone(self);
        let handle = std::thread::Builder::new()
            .name(format!("cuda-sim-stream-{}", self.id))
            .spawn(move || run_worker(me, shared))
            .map_err(|e| {
                CuError::new(
                    ErrorCode::OutOfMemory,
                    format!("cannot start a stream worker thread: {e}"),
                )
            })?;
        *lock(&self.worker) = Some(handle);
        Ok(())
    }

    /// Appends an operation; its sequence number. Fails once the stream is being
    /// destroyed.
    pub(crate) fn push(&self, deps: Vec<Dep>, op: Op) -> Result<u64, CuError> {
        let deps = deps.into_iter().filter(|d| !d.is_done()).collect();
        let mut q = self.queue();
        if q.shutdown {
            return Err(CuError::new(
                ErrorCode::InvalidHandle,
                format!("stream {} is being destroyed", self.id),
            ));
        }
        q.enqueued += 1;
        let seq = q.enqueued;
        q.ops.push_back(Queued { deps, op });
        drop(q);
        self.cv.notify_all();
        Ok(seq)
    }

    /// The position after everything enqueued so far, if some of it is pending.
    pub(crate) fn tail(self: &Arc<Self>) -> Option<Dep> {
        let q = self.queue();
        (q.completed < q.enqueued).then(|| Dep {
            stream: Arc::clone(self),
            seq: q.enqueued,
        })
    }

    /// Blocks until the first `seq` operations completed (or were skipped).
    pub(crate) fn wait_for(&self, seq: u64) {
        let mut q = self.queue();
        while q.completed < seq {
            q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Takes the pending asynchronous launch error, if any.
    pub(crate) fn take_deferred(&self) -> Option<CuError> {
        self.queue().deferred.take()
    }

    /// Asks the worker to stop once the queue is drained; pushes fail from now on.
    pub(crate) fn request_shutdown(&self) {
        self.queue().shutdown = true;
        self.cv.notify_all();
    }

    /// Waits for the worker to drain the queue and exit (after `request_shutdown`).
    pub(crate) fn join(&self) {
        let handle = lock(&self.worker).take();
        if let Some(h) = handle {
            // The worker catches panics of operations; a panic elsewhere in it has
            // already been printed, and the queue it leaves is drained below.
            let _ = h.join();
        }
        // Whatever is left (a worker that never started or died) counts as skipped,
        // so that no waiter blocks for ever.
        let mut q = self.queue();
        q.ops.clear();
        q.completed = q.enqueued;
        drop(q);
        self.cv.notify_all();
    }

    /// The next operation, waiting for one; `None` once shut down and drained.
    fn next(&self) -> Option<Queued> {
        let mut q = self.queue();
        loop {
            if let Some(op) = q.ops.pop_front() {
                return Some(op);
            }
            if q.shutdown {
                return None;
            }
            q = self.cv.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn complete_one(&self, deferred: Option<CuError>) {
        let mut q = self.queue();
        q.completed += 1;
        if deferred.is_some() && q.deferred.is_none() {
            q.deferred = deferred;
        }
        drop(q);
        self.cv.notify_all();
    }
}

/// The message of a caught panic.
pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic".to_string()
    }
}

fn run_worker(stream: Arc<StreamShared>, shared: Arc<Shared>) {
    let mut chaos = StreamChaos::new(stream.id);
    while let Some(Queued { deps, op }) = stream.next() {
        for d in &deps {
            d.wait();
        }
        drop(deps);
        chaos.pause(&shared.chaos);
        let mut deferred = None;
        if shared.sticky(stream.dev).is_none() {
            let what = op.describe();
            match catch_unwind(AssertUnwindSafe(|| ops::execute(&shared, stream.dev, op))) {
                Ok(Ok(())) => {}
                Ok(Err(Failure::Fault(f))) => shared.report_fault(stream.dev, *f),
                Ok(Err(Failure::Sticky(e))) => {
                    eprintln!("cuda-sim: device {}: {e}", stream.dev);
                    shared.poison(stream.dev, e);
                }
                Ok(Err(Failure::Deferred(e))) => {
                    eprintln!("cuda-sim: device {}: {what} failed: {e}", stream.dev);
                    deferred = Some(e);
                }
                Err(p) => {
                    let e = CuError::new(
                        ErrorCode::LaunchFailed,
                        format!("cuda-sim panicked running {what}: {}", panic_text(&*p)),
                    );
                    eprintln!("cuda-sim: device {}: {}", stream.dev, e.detail);
                    shared.poison(stream.dev, e);
                }
            }
        }
        stream.complete_one(deferred);
    }
}
