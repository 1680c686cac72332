//! Fault injection: [`FaultyBackend`] wraps any backend and makes it fail at a chosen
//! point of the work it is given, the way devices fail in the middle of a pipelined
//! pass: an allocation that fails, an op that reports an error (asynchronously, as a
//! kernel does: the error comes back from the next wait on the queue), or a queue that
//! never completes (every later wait on it blocks, and the scheduler's
//! [`timeout`](crate::SchedOptions::timeout) must give up and say where).
//!
//! The wrapper also counts the bytes its backend holds, so tests can check that a failed
//! run leaves memory where it found it.

use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use ggml_core::{
    Backend, BackendCaps, BackendError, BackendErrorKind, BackendKind, BackendResult, BufferId,
    BufferInfo, EventId, EventRef, MemoryDomain, Name, Tensor, TensorId,
};

/// What goes wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// The `op`-th buffer allocation fails (out of memory).
    Alloc,
    /// The `op`-th node the backend computes reports an error.
    Kernel,
    /// The backend's queue stops at the `op`-th node and never completes.
    Hang,
    /// The [`Trigger`] given to [`FaultyBackend::with_trigger`] runs just before the
    /// `op`-th node is submitted: it arms a fault in the layer below (an emulated
    /// driver's), whose error comes back through the wrapped backend as that layer
    /// reports it. Not in [`FaultKind::ALL`]: it needs a trigger.
    Trigger,
}

/// What a [`FaultKind::Trigger`] plan runs: given the node about to be submitted and its
/// index among the backend's nodes.
pub type Trigger = Box<dyn Fn(&Tensor, usize) + Send + Sync>;

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 3] = [FaultKind::Alloc, FaultKind::Kernel, FaultKind::Hang];

    /// The command-line name: `alloc`, `kernel`, `hang`.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Alloc => "alloc",
            FaultKind::Kernel => "kernel",
            FaultKind::Hang => "hang",
            FaultKind::Trigger => "trigger",
        }
    }

    /// The kind named `name`.
    pub fn from_name(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// Where and how a backend fails: at its `op`-th node (counted from 0 over everything
/// it computes, so in the first pass for an index below the pass's node count) or, for
/// [`FaultKind::Alloc`], its `op`-th allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FaultPlan {
    /// Node (or allocation) index.
    pub op: usize,
    /// What happens there.
    pub kind: FaultKind,
}

struct HangState {
    hung: bool,
    released: bool,
}

/// A backend that fails as its [`FaultPlan`] says and otherwise forwards everything.
pub struct FaultyBackend {
    inner: Arc<dyn Backend>,
    plan: FaultPlan,
    nodes: AtomicUsize,
    allocs: AtomicUsize,
    /// The injected error, reported by every later wait (sticky, as a GPU's).
    error: Mutex<Option<BackendError>>,
    hang: Mutex<HangState>,
    wake: Condvar,
    fired: AtomicBool,
    bytes: Mutex<Vec<(BufferId, usize)>>,
    trigger: Option<Trigger>,
}

impl fmt::Debug for FaultyBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyBackend")
            .field("inner", &self.inner.name())
            .field("plan", &self.plan)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `b` without a [`FaultyBackend`] around it.
fn unwrap(b: &dyn Backend) -> &dyn Backend {
    match b.as_any().downcast_ref::<FaultyBackend>() {
        Some(f) => &*f.inner,
        None => b,
    }
}

impl FaultyBackend {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Backend>, plan: FaultPlan) -> Arc<FaultyBackend> {
        Arc::new(FaultyBackend::build(inner, plan, None))
    }

    /// Wraps `inner` with a [`FaultKind::Trigger`] plan: `trigger` runs before its
    /// `op`-th node.
    pub fn with_trigger(
        inner: Arc<dyn Backend>,
        op: usize,
        trigger: Trigger,
    ) -> Arc<FaultyBackend> {
        let plan = FaultPlan {
            op,
            kind: FaultKind::Trigger,
        };
        Arc::new(FaultyBackend::build(inner, plan, Some(trigger)))
    }

    fn build(inner: Arc<dyn Backend>, plan: FaultPlan, trigger: Option<Trigger>) -> FaultyBackend {
        FaultyBackend {
            inner,
            plan,
            nodes: AtomicUsize::new(0),
            allocs: AtomicUsize::new(0),
            error: Mutex::new(None),
            hang: Mutex::new(HangState {
                hung: false,
                released: false,
            }),
            wake: Condvar::new(),
            fired: AtomicBool::new(false),
            bytes: Mutex::new(Vec::new()),
            trigger,
        }
    }

    /// Whether the fault happened (for [`FaultKind::Trigger`]: whether the trigger ran).
    pub fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }

    /// Nodes submitted through the wrapper so far (what a node plan counts).
    pub fn nodes_seen(&self) -> usize {
        self.nodes.load(Ordering::Acquire)
    }

    /// Buffer allocations asked of the wrapper so far (what an alloc plan counts).
    pub fn allocations_seen(&self) -> usize {
        self.allocs.load(Ordering::Acquire)
    }

    /// Bytes of the buffers allocated through the wrapper and not freed.
    pub fn live_bytes(&self) -> usize {
        lock(&self.bytes).iter().map(|(_, n)| n).sum()
    }

    /// Ends a hang: blocked waits return (with the hang's error), so that no thread stays
    /// blocked after the caller gave up on the device.
    pub fn release(&self) {
        lock(&self.hang).released = true;
        self.wake.notify_all();
    }

    fn hung(&self) -> bool {
        lock(&self.hang).hung
    }

    fn sticky(&self) -> BackendResult<()> {
        lock(&self.error).map_or(Ok(()), Err)
    }

    /// Blocks while hung (until released or `timeout`); `false` on timeout. It reports no
    /// error: the caller waits for the inner queue first (a queue that failed may still
    /// be running, and nobody may free what it uses before it stopped).
    fn wait_hang(&self, timeout: Option<Duration>) -> bool {
        let mut h = lock(&self.hang);
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        while h.hung && !h.released {
            h = match deadline {
                None => self.wake.wait(h).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = std::time::Instant::now();
                    if now >= d {
                        return false;
                    }
                    self.wake
                        .wait_timeout(h, d - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
        true
    }

    fn fault_error(
        &self,
        detail: &'static str,
        tensors: &[Tensor],
        node: TensorId,
    ) -> BackendError {
        let t = &tensors[node.index()];
        let name = match t.name.is_empty() {
            true => Name::new(&format!("#{}", node.0)),
            false => t.name,
        };
        BackendError::new(BackendErrorKind::Device, self.inner.name(), detail).at(t.op.name(), name)
    }
}

impl Drop for FaultyBackend {
    fn drop(&mut self) {
        self.release();
    }
}

impl Backend for FaultyBackend {
    fn name(&self) -> Name {
        self.inner.name()
    }
    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }
    fn caps(&self) -> BackendCaps {
        self.inner.caps()
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn domain(&self) -> MemoryDomain {
        self.inner.domain()
    }
    fn alignment(&self) -> usize {
        self.inner.alignment()
    }
    fn supports_domain(&self, domain: MemoryDomain) -> bool {
        self.inner.supports_domain(domain)
    }
    fn alloc_buffer(&self, size: usize) -> BackendResult<BufferInfo> {
        let i = self.allocs.fetch_add(1, Ordering::AcqRel);
        if self.plan.kind == FaultKind::Alloc && i == self.plan.op {
            self.fired.store(true, Ordering::Release);
            return Err(BackendError::new(
                BackendErrorKind::OutOfMemory,
                self.inner.name(),
                "injected allocation failure",
            ));
        }
        let info = self.inner.alloc_buffer(size)?;
        lock(&self.bytes).push((info.id, info.size));
        Ok(info)
    }
    fn buffer_from_host_ptr(&self, ptr: u64, size: usize) -> BackendResult<Option<BufferInfo>> {
        self.inner.buffer_from_host_ptr(ptr, size)
    }
    fn free_buffer(&self, buffer: BufferId) -> BackendResult<()> {
        self.inner.free_buffer(buffer)?;
        lock(&self.bytes).retain(|(b, _)| *b != buffer);
        Ok(())
    }
    fn buffer_set(&self, buffer: BufferId, offset: usize, data: &[u8]) -> BackendResult<()> {
        self.inner.buffer_set(buffer, offset, data)
    }
    fn buffer_get(&self, buffer: BufferId, offset: usize, out: &mut [u8]) -> BackendResult<()> {
        self.inner.buffer_get(buffer, offset, out)
    }
    fn buffer_prefetch(&self, buffer: BufferId, offset: usize, len: usize) -> BackendResult<bool> {
        self.inner.buffer_prefetch(buffer, offset, len)
    }
    fn buffer_clear(&self, buffer: BufferId, value: u8) -> BackendResult<()> {
        self.inner.buffer_clear(buffer, value)
    }
    fn supports_op(&self, tensors: &[Tensor], node: TensorId) -> bool {
        self.inner.supports_op(tensors, node)
    }
    fn offload_op(&self, tensors: &[Tensor], node: TensorId) -> bool {
        self.inner.offload_op(tensors, node)
    }
    fn set_tensor_async(&self, tensor: &Tensor, offset: usize, data: &[u8]) -> BackendResult<()> {
        if self.hung() {
            return Ok(());
        }
        self.inner.set_tensor_async(tensor, offset, data)
    }
    fn get_tensor(&self, tensor: &Tensor, offset: usize, out: &mut [u8]) -> BackendResult<()> {
        self.wait_hang(None);
        self.inner.get_tensor(tensor, offset, out)?;
        self.sticky()
    }
    fn cpy_tensor_async(
        &self,
        src_backend: &dyn Backend,
        src: &Tensor,
        dst: &Tensor,
    ) -> BackendResult<bool> {
        if self.hung() {
            return Ok(true);
        }
        self.inner.cpy_tensor_async(unwrap(src_backend), src, dst)
    }
    fn engine_cpy_tensor_async(
        &self,
        src_backend: &dyn Backend,
        src: &Tensor,
        dst_backend: &dyn Backend,
        dst: &Tensor,
    ) -> BackendResult<bool> {
        if self.hung() {
            return Ok(true);
        }
        self.inner
            .engine_cpy_tensor_async(unwrap(src_backend), src, unwrap(dst_backend), dst)
    }
    fn fused_runs(
        &self,
        tensors: &[Tensor],
        nodes: &[TensorId],
        found: &mut dyn FnMut(usize, usize),
    ) {
        self.inner.fused_runs(tensors, nodes, found)
    }

    fn graph_compute(&self, tensors: &[Tensor], nodes: &[TensorId]) -> BackendResult<()> {
        if self.hung() {
            return Ok(());
        }
        let first = self.nodes.fetch_add(nodes.len(), Ordering::AcqRel);
        let hit = self.plan.op.checked_sub(first).filter(|&i| i < nodes.len());
        let Some(i) = hit.filter(|_| self.plan.kind != FaultKind::Alloc) else {
            return self.inner.graph_compute(tensors, nodes);
        };
        if i > 0 {
            self.inner.graph_compute(tensors, &nodes[..i])?;
        }
        self.fired.store(true, Ordering::Release);
        match self.plan.kind {
            FaultKind::Kernel => {
                // Reported by the next wait, as an asynchronous kernel error.
                let e = self.fault_error("injected kernel fault", tensors, nodes[i]);
                lock(&self.error).get_or_insert(e);
            }
            FaultKind::Hang => {
                let e = self.fault_error(
                    "injected hang (the queue never completed)",
                    tensors,
                    nodes[i],
                );
                lock(&self.error).get_or_insert(e);
                lock(&self.hang).hung = true;
            }
            FaultKind::Trigger => {
                if let Some(t) = &self.trigger {
                    t(&tensors[nodes[i].index()], self.plan.op);
                }
                return self.inner.graph_compute(tensors, &nodes[i..]);
            }
            FaultKind::Alloc => unreachable!("filtered above"),
        }
        Ok(())
    }
    fn pending_error(&self) -> BackendResult<()> {
        // A hung queue reports nothing: it just never completes.
        if self.plan.kind != FaultKind::Hang {
            self.sticky()?;
        }
        self.inner.pending_error()
    }
    fn synchronize(&self) -> BackendResult<()> {
        self.wait_hang(None);
        self.inner.synchronize()?;
        self.sticky()
    }
    fn synchronize_timeout(&self, timeout: Duration) -> BackendResult<bool> {
        if !self.wait_hang(Some(timeout)) || !self.inner.synchronize_timeout(timeout)? {
            return Ok(false);
        }
        self.sticky().map(|()| true)
    }
    fn event_new(&self) -> BackendResult<Option<EventId>> {
        self.inner.event_new()
    }
    fn event_free(&self, event: EventId) -> BackendResult<()> {
        self.inner.event_free(event)
    }
    fn event_record(&self, event: EventId) -> BackendResult<()> {
        if self.hung() {
            return Ok(());
        }
        self.inner.event_record(event)
    }
    fn event_wait(&self, event: EventRef<'_>) -> BackendResult<()> {
        if self.hung() {
            return Ok(());
        }
        // Waiting on a hung queue's event: this queue stops behind it, for ever.
        if let Some(f) = event.owner.as_any().downcast_ref::<FaultyBackend>() {
            if f.hung() {
                lock(&self.hang).hung = true;
                return Ok(());
            }
        }
        let owner = unwrap(event.owner);
        self.inner.event_wait(EventRef {
            owner,
            id: event.id,
        })
    }
    fn can_wait_on(&self, owner: &dyn Backend) -> bool {
        self.inner.can_wait_on(unwrap(owner))
    }
    fn event_synchronize(&self, event: EventId) -> BackendResult<()> {
        self.wait_hang(None);
        self.inner.event_synchronize(event)?;
        self.sticky()
    }
    fn event_synchronize_timeout(&self, event: EventId, timeout: Duration) -> BackendResult<bool> {
        if !self.wait_hang(Some(timeout))
            || !self.inner.event_synchronize_timeout(event, timeout)?
        {
            return Ok(false);
        }
        self.sticky().map(|()| true)
    }
    fn event_time_ns(&self, event: EventId) -> BackendResult<Option<u64>> {
        self.inner.event_time_ns(event)
    }
}
