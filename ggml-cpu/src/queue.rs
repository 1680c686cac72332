//! The in-order execution queue of a backend instance (its "stream") and its events.
//!
//! One worker thread per backend pops items in order and runs them; graph computes fan
//! out over the backend's [`Pool`](crate::pool::Pool), whose thread 0 is this worker.
//! The first error of queued work is kept until the next `synchronize`; the queue keeps
//! running the following items. A panic inside a kernel is caught and reported as an
//! error, so nothing can hang the queue.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use ggml_core::{BackendError, BackendErrorKind, Name, Tensor, TensorId};

use crate::exec::Executor;
use crate::memory::{resolve, Registry};
use crate::ops::copy::copy_same_dtype;
use crate::pool::Pool;

/// State of an event: the latest recorded point and the latest completed point.
pub(crate) struct EventState {
    /// Generation of the latest `event_record` enqueued (0: never recorded).
    pub(crate) recorded: AtomicU64,
    /// (latest completed generation, owner gone, when it completed in ns since the Unix
    /// epoch).
    done: Mutex<(u64, bool, u64)>,
    cv: Condvar,
}

impl EventState {
    pub(crate) fn new() -> Arc<EventState> {
        Arc::new(EventState {
            recorded: AtomicU64::new(0),
            done: Mutex::new((0, false, 0)),
            cv: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, (u64, bool, u64)> {
        self.done.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks generation `generation` complete.
    pub(crate) fn complete(&self, generation: u64) {
        let mut d = self.lock();
        if generation > d.0 {
            d.0 = generation;
            d.2 = now_ns();
        }
        self.cv.notify_all();
    }

    /// When `generation` completed (ns since the Unix epoch), if it has.
    pub(crate) fn completed_at(&self, generation: u64) -> Option<u64> {
        let d = self.lock();
        (generation > 0 && d.0 >= generation).then_some(d.2)
    }

    /// Marks the event's owner as gone: every wait on it returns.
    pub(crate) fn kill(&self) {
        self.lock().1 = true;
        self.cv.notify_all();
    }

    /// Blocks until `generation` completed or the owner is gone, at most until
    /// `deadline`; returns whether it completed (or the owner is gone) in time.
    pub(crate) fn wait_until(&self, generation: u64, deadline: std::time::Instant) -> bool {
        let mut d = self.lock();
        loop {
            if d.0 >= generation || d.1 {
                return true;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            d = self
                .cv
                .wait_timeout(d, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Blocks until `generation` completed, the owner is gone, or `stop` is set.
    /// Returns whether the point really completed.
    pub(crate) fn wait(&self, generation: u64, stop: Option<&AtomicBool>) -> bool {
        let mut d = self.lock();
        loop {
            if d.0 >= generation {
                return true;
            }
            if d.1 || stop.is_some_and(|s| s.load(Ordering::Acquire)) {
                return false;
            }
            d = match stop {
                Some(_) => {
                    self.cv
                        .wait_timeout(d, Duration::from_millis(5))
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.cv.wait(d).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }
}

/// The host clock in nanoseconds since the Unix epoch (the time base of
/// [`ggml_core::Backend::event_time_ns`]).
pub(crate) fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// One unit of queued work. (Items are moved once into the queue; their size is irrelevant.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum Item {
    /// Compute `nodes` of `tensors` in order.
    Compute {
        tensors: Arc<[Tensor]>,
        nodes: Vec<TensorId>,
    },
    /// Write `data` into `tensor`'s bytes from byte `offset` on.
    Set {
        tensor: Tensor,
        offset: usize,
        data: Vec<u8>,
    },
    /// Copy `src` (in `src_reg` or host memory) into `dst` (in `dst_reg` or host memory).
    Copy {
        src_reg: Arc<Registry>,
        src: Tensor,
        dst_reg: Arc<Registry>,
        dst: Tensor,
    },
    /// Complete `generation` of the event.
    Record(Arc<EventState>, u64),
    /// Wait until `generation` of the event completed.
    Wait(Arc<EventState>, u64),
    /// Run a host function in queue order.
    HostFn(Box<dyn FnOnce() + Send>),
}

struct State {
    items: VecDeque<Item>,
    enqueued: u64,
    completed: u64,
    error: Option<BackendError>,
}

/// The part of a backend shared with its worker thread.
pub(crate) struct Queue {
    pub(crate) name: Name,
    pub(crate) registry: Arc<Registry>,
    state: Mutex<State>,
    work: Condvar,
    done: Condvar,
    pub(crate) shutdown: AtomicBool,
}

impl Queue {
    pub(crate) fn new(name: Name, registry: Arc<Registry>) -> Queue {
        Queue {
            name,
            registry,
            state: Mutex::new(State {
                items: VecDeque::new(),
                enqueued: 0,
                completed: 0,
                error: None,
            }),
            work: Condvar::new(),
            done: Condvar::new(),
            shutdown: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn err(&self, kind: BackendErrorKind, detail: &'static str) -> BackendError {
        BackendError::new(kind, self.name, detail)
    }

    /// Appends an item.
    pub(crate) fn push(&self, item: Item) -> Result<(), BackendError> {
        let mut s = self.lock();
        if self.shutdown.load(Ordering::Acquire) {
            return Err(self.err(BackendErrorKind::Unavailable, "backend is shutting down"));
        }
        s.items.push_back(item);
        s.enqueued += 1;
        self.work.notify_one();
        Ok(())
    }

    /// Blocks until everything enqueued so far completed; with `take_error`, returns and
    /// clears the first error.
    pub(crate) fn wait_idle(&self, take_error: bool) -> Result<(), BackendError> {
        let mut s = self.lock();
        let target = s.enqueued;
        while s.completed < target {
            s = self.done.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        match (take_error, s.error.take()) {
            (true, Some(e)) => Err(e),
            (false, e) => {
                s.error = e;
                Ok(())
            }
            (true, None) => Ok(()),
        }
    }

    /// [`Queue::wait_idle`] that gives up at `deadline` (returns `Ok(false)`).
    pub(crate) fn wait_idle_until(
        &self,
        deadline: std::time::Instant,
    ) -> Result<bool, BackendError> {
        let mut s = self.lock();
        let target = s.enqueued;
        while s.completed < target {
            let now = std::time::Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            s = self
                .done
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        s.error.take().map_or(Ok(true), Err)
    }

    /// The first error of queued work not yet reported by `synchronize` (kept for it).
    pub(crate) fn pending_error(&self) -> Option<BackendError> {
        self.lock().error
    }

    /// Asks the worker to stop after the item it is running; queued items are dropped.
    pub(crate) fn stop(&self) {
        let _s = self.lock();
        self.shutdown.store(true, Ordering::Release);
        self.work.notify_all();
    }

    fn pop(&self) -> Option<Item> {
        let mut s = self.lock();
        loop {
            if self.shutdown.load(Ordering::Acquire) {
                return None;
            }
            if let Some(it) = s.items.pop_front() {
                return Some(it);
            }
            s = self.work.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn finish(&self, result: Result<(), BackendError>) {
        let mut s = self.lock();
        s.completed += 1;
        if let Err(e) = result {
            if s.error.is_none() {
                s.error = Some(e);
            }
        }
        self.done.notify_all();
    }

    /// Releases everything still queued after a stop: records complete as "owner gone".
    fn drain(&self) {
        let items: Vec<Item> = {
            let mut s = self.lock();
            let n = s.items.len() as u64;
            s.completed += n;
            self.done.notify_all();
            s.items.drain(..).collect()
        };
        for it in items {
            if let Item::Record(ev, _) = it {
                ev.kill();
            }
        }
    }
}

/// A small deterministic generator for chaos delays (splitmix64).
struct Chaos(u64);

impl Chaos {
    fn sleep(&mut self) {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        let us = z % 201;
        if us > 0 {
            std::thread::sleep(Duration::from_micros(us));
        }
    }
}

/// The worker thread's loop.
pub(crate) fn worker_main(q: Arc<Queue>, pool: Pool, mut exec: Executor, chaos: Option<u64>) {
    let mut chaos = chaos.map(Chaos);
    pool.pin_caller();
    while let Some(item) = q.pop() {
        if let Some(c) = chaos.as_mut() {
            c.sleep();
        }
        let res = catch_unwind(AssertUnwindSafe(|| run_item(&q, &pool, &mut exec, item)))
            .unwrap_or_else(|_| {
                Err(q.err(
                    BackendErrorKind::Device,
                    "a kernel panicked (bug in ggml-cpu)",
                ))
            });
        if let Some(c) = chaos.as_mut() {
            c.sleep();
        }
        q.finish(res);
    }
    q.drain();
}

fn run_item(q: &Queue, pool: &Pool, exec: &mut Executor, item: Item) -> Result<(), BackendError> {
    match item {
        Item::Compute { tensors, nodes } => exec.compute(pool, &q.registry, &tensors, &nodes),
        Item::Set {
            tensor,
            offset,
            data,
        } => {
            let bad = |d| {
                q.err(BackendErrorKind::InvalidArgument, d)
                    .at("SET", tensor.name)
            };
            let dref = tensor.data.ok_or_else(|| bad("tensor has no data"))?;
            if offset
                .checked_add(data.len())
                .is_none_or(|e| e > tensor.nbytes())
            {
                return Err(bad("write past the end of the tensor"));
            }
            let (region, ptr) = resolve(
                &q.registry,
                ggml_core::DataRef {
                    buffer: dref.buffer,
                    addr: dref.addr + offset as u64,
                },
                data.len(),
            )
            .map_err(bad)?;
            if !region.writable() {
                return Err(bad("tensor is in a read-only buffer"));
            }
            // SAFETY: `resolve` checked that ptr..ptr+len lies in the live region, which
            // `region` keeps alive; `data` is a separate allocation.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, data.len()) };
            Ok(())
        }
        Item::Copy {
            src_reg,
            src,
            dst_reg,
            dst,
        } => copy_same_dtype(q, &src_reg, &src, &dst_reg, &dst),
        Item::Record(ev, generation) => {
            ev.complete(generation);
            Ok(())
        }
        Item::Wait(ev, generation) => {
            ev.wait(generation, Some(&q.shutdown));
            Ok(())
        }
        Item::HostFn(f) => {
            f();
            Ok(())
        }
    }
}
