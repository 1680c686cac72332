//! The backend contract: memory, an in-order execution queue, copies and events.
//!
//! This mirrors ggml's `ggml-backend-impl.h` as object-safe traits without allocation:
//! buffers and events are handles owned by the backend that created them.
//!
//! # Ordering contract
//!
//! Every backend owns one in-order queue (its "stream"). Methods named `*_async`,
//! [`Backend::graph_compute`] and [`Backend::event_record`]/[`Backend::event_wait`]
//! *enqueue* work and may return before it ran; queued items run in the order they were
//! enqueued. [`Backend::synchronize`] blocks the host until everything enqueued so far has
//! finished and reports the first error any of it hit. The blocking `buffer_*` methods are
//! **not** ordered against the queue: the caller must make sure the queue no longer
//! touches those bytes (HB rules in DESIGN.md). A backend whose `caps().async_compute` is
//! false finishes every call before returning.

use core::any::Any;
use core::fmt;

use crate::name::Name;
use crate::tensor::{BufferId, MemoryDomain, Tensor, TensorId};

/// The family of a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// Host CPU.
    Cpu,
    /// NVIDIA GPU through CUDA.
    Cuda,
    /// Anything else (test doubles, wrappers that hide the inner kind).
    Other,
}

/// The queue on which [`Backend::cpy_tensor_async`] executes the copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CopyQueue {
    /// The source backend's queue (CUDA style): the copy is ordered after the producer by
    /// queue order; the destination queue waits on a copy-done event.
    Source,
    /// The destination backend's queue: the copy is ordered before the consumer by queue
    /// order; the destination queue must first wait for the producer's event.
    Destination,
}

/// What a backend can do, declared up front so that a scheduler can plan without trying.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BackendCaps {
    /// `graph_compute` and `*_async` calls may return before the work ran.
    pub async_compute: bool,
    /// `event_new` returns events.
    pub events: bool,
    /// Where `cpy_tensor_async` runs its copy.
    pub copy_queue: CopyQueue,
}

/// Handle of an event created by [`Backend::event_new`] and owned by that backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventId(pub u32);

/// Handle of a tensor table kept by a backend ([`Backend::table_register`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TableId(pub u32);

/// An event together with the backend that owns it, for waits across backends.
#[derive(Clone, Copy)]
pub struct EventRef<'a> {
    /// The backend that created (and records) the event.
    pub owner: &'a dyn Backend,
    /// The event.
    pub id: EventId,
}

/// A buffer returned by [`Backend::alloc_buffer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferInfo {
    /// Handle of the buffer.
    pub id: BufferId,
    /// Address of the first byte in the backend's address space.
    pub base: u64,
    /// Size in bytes.
    pub size: usize,
}

/// Kinds of backend failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendErrorKind {
    /// The backend cannot run this op or dtype (invariant 4: never a silent fallback).
    UnsupportedOp,
    /// A tensor, buffer or event handle is not this backend's, or a range is out of bounds.
    InvalidArgument,
    /// Allocation failed.
    OutOfMemory,
    /// The event belongs to a backend this one cannot wait on in its queue; wait on the
    /// host instead.
    ForeignEvent,
    /// The device or driver reported an error (see `code`).
    Device,
    /// The backend is unusable after an earlier failure or was shut down.
    Unavailable,
    /// A kernel met invalid data at run time (e.g. a row index out of range).
    BadData,
}

/// An error of a backend operation, naming the backend, the op and tensor where known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendError {
    /// What failed.
    pub kind: BackendErrorKind,
    /// Name of the backend.
    pub backend: Name,
    /// The op being run, if any.
    pub op: Option<&'static str>,
    /// The tensor concerned, if any.
    pub tensor: Name,
    /// A fixed explanation.
    pub detail: &'static str,
    /// A driver error code (0 when none).
    pub code: i64,
}

impl BackendError {
    /// An error of `kind` in `backend` with `detail`.
    pub fn new(kind: BackendErrorKind, backend: Name, detail: &'static str) -> BackendError {
        BackendError {
            kind,
            backend,
            op: None,
            tensor: Name::EMPTY,
            detail,
            code: 0,
        }
    }

    /// The same error, naming the op and tensor.
    pub fn at(mut self, op: &'static str, tensor: Name) -> BackendError {
        self.op = Some(op);
        self.tensor = tensor;
        self
    }

    /// The same error with a driver code.
    pub fn with_code(mut self, code: i64) -> BackendError {
        self.code = code;
        self
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "backend {}: ", self.backend)?;
        if let Some(op) = self.op {
            write!(f, "op {op} ")?;
        }
        if !self.tensor.is_empty() {
            write!(f, "on '{}' ", self.tensor)?;
        }
        write!(f, "failed ({:?}): {}", self.kind, self.detail)?;
        if self.code != 0 {
            write!(f, " (code {})", self.code)?;
        }
        Ok(())
    }
}

impl core::error::Error for BackendError {}

/// Result of a backend operation.
pub type BackendResult<T> = core::result::Result<T, BackendError>;

/// A compute device with one in-order queue. Object safe: schedulers hold `&dyn Backend`.
pub trait Backend: Send + Sync {
    /// A name for messages and traces (`"cpu#1"`, `"cuda:0#0"`).
    fn name(&self) -> Name;

    /// The backend family.
    fn kind(&self) -> BackendKind;

    /// Declared capabilities.
    fn caps(&self) -> BackendCaps;

    /// `self` as `Any`, so a backend can recognise peers of its own type (for events and
    /// copies) by downcasting.
    fn as_any(&self) -> &dyn Any;

    // ---- memory -------------------------------------------------------------------

    /// The memory domain [`Backend::alloc_buffer`] allocates from.
    fn domain(&self) -> MemoryDomain;

    /// Alignment of buffer bases and of tensor offsets inside them, in bytes.
    fn alignment(&self) -> usize;

    /// Whether kernels of this backend can read and write tensors in `domain` directly
    /// (ggml's `supports_buft`). Tensors elsewhere are copied in by the scheduler.
    fn supports_domain(&self, domain: MemoryDomain) -> bool;

    /// Allocates `size` bytes in this backend's domain.
    fn alloc_buffer(&self, size: usize) -> BackendResult<BufferInfo>;

    /// Wraps `size` bytes of existing host memory at address `ptr` as a buffer of this
    /// backend's domain without copying (ggml's `buffer_from_host_ptr`, used to run
    /// memory-mapped weights in place). `Ok(None)` if this backend cannot read host
    /// memory directly. The caller keeps the memory valid and unchanged until the buffer
    /// is freed; freeing it does not free the memory.
    fn buffer_from_host_ptr(&self, _ptr: u64, _size: usize) -> BackendResult<Option<BufferInfo>> {
        Ok(None)
    }

    /// Frees a buffer. The caller ensures no queued work still uses it.
    fn free_buffer(&self, buffer: BufferId) -> BackendResult<()>;

    /// Blocking write of `data` at byte `offset` of `buffer`: complete when it returns,
    /// so work enqueued afterwards sees it. Work queued before it need not be ordered
    /// before it (the caller synchronises first). A GPU backend must not leave the write
    /// in flight on a queue its own queue does not wait for (CUDA's legacy NULL stream).
    fn buffer_set(&self, buffer: BufferId, offset: usize, data: &[u8]) -> BackendResult<()>;

    /// Blocking read into `out` from byte `offset` of `buffer`, complete when it returns
    /// (not ordered after work already queued: the caller synchronises first).
    fn buffer_get(&self, buffer: BufferId, offset: usize, out: &mut [u8]) -> BackendResult<()>;

    /// Enqueues a copy of the `len` bytes at byte `offset` of `buffer` into host memory
    /// the backend keeps (pinned memory on a GPU), after everything already enqueued, so
    /// that the result comes back with a single wait: the next [`Backend::buffer_get`] of
    /// exactly that range, made after the host waited for an event recorded here after
    /// this call (or for the whole queue), returns those bytes without another wait or
    /// copy. The caller does not write the range until that read. `Ok(false)` (the
    /// default): the backend keeps no such copy (too large, no host memory of its own),
    /// and `buffer_get` reads as usual.
    fn buffer_prefetch(
        &self,
        _buffer: BufferId,
        _offset: usize,
        _len: usize,
    ) -> BackendResult<bool> {
        Ok(false)
    }

    /// Blocking fill of the whole `buffer` with `value`, complete when it returns (as
    /// [`Backend::buffer_set`]).
    fn buffer_clear(&self, buffer: BufferId, value: u8) -> BackendResult<()>;

    // ---- ops ----------------------------------------------------------------------

    /// Whether this backend can compute `node` (an index into `tensors`, with its sources
    /// described there). Views always count as supported.
    fn supports_op(&self, tensors: &[Tensor], node: TensorId) -> bool;

    /// Whether the scheduler should move `node` here even though its weights live in
    /// host memory (ggml's `offload_op`, e.g. large batches on a GPU).
    fn offload_op(&self, _tensors: &[Tensor], _node: TensorId) -> bool {
        false
    }

    // ---- queue --------------------------------------------------------------------

    /// Enqueues a write of `data` to the bytes of `tensor` from byte `offset` on. The data
    /// is copied out of `data` before this returns (so the caller may reuse it at once);
    /// the write to the tensor happens in queue order.
    fn set_tensor_async(&self, tensor: &Tensor, offset: usize, data: &[u8]) -> BackendResult<()>;

    /// Waits for everything enqueued so far, then reads the bytes of `tensor` from byte
    /// `offset` on into `out`.
    fn get_tensor(&self, tensor: &Tensor, offset: usize, out: &mut [u8]) -> BackendResult<()>;

    /// Copies `src` (a tensor of `src_backend`) into `dst` (a tensor in a domain this
    /// backend supports), asynchronously: the copy runs after everything already enqueued
    /// on the queue it runs on (see [`BackendCaps::copy_queue`]), and everything enqueued
    /// on `self` afterwards runs after the copy. Returns `Ok(false)` when this backend
    /// cannot do this copy (the caller then copies through the host, blocking).
    fn cpy_tensor_async(
        &self,
        src_backend: &dyn Backend,
        src: &Tensor,
        dst: &Tensor,
    ) -> BackendResult<bool>;

    /// Copies `src` (a tensor of `src_backend`) into `dst` (a tensor of `dst_backend`) on
    /// *this* backend's queue, which then acts as a copy engine beside the two devices'
    /// own queues (a second CUDA stream, a copy thread): the copy runs after everything
    /// already enqueued here and before everything enqueued here afterwards, and is not
    /// ordered against either device's queue (the caller orders it with events).
    /// Returns `Ok(false)` (the default) when this backend cannot reach both memories.
    fn engine_cpy_tensor_async(
        &self,
        _src_backend: &dyn Backend,
        _src: &Tensor,
        _dst_backend: &dyn Backend,
        _dst: &Tensor,
    ) -> BackendResult<bool> {
        Ok(false)
    }

    /// Enqueues the computation of `nodes` (ids into `tensors`, in order). Descriptors are
    /// copied before this returns; the tensors' bytes are read and written when the queue
    /// runs it. Errors found later are reported by the next `synchronize`.
    fn graph_compute(&self, tensors: &[Tensor], nodes: &[TensorId]) -> BackendResult<()>;

    /// Reports, through `found(start, end)`, the runs `nodes[start..end]` that
    /// [`Backend::graph_compute`] would compute with one fused kernel (the default: none).
    /// Such a kernel reads and writes the run's tensors in any order, so an allocator must
    /// keep every tensor a run reads or writes in its own bytes until the run's last node:
    /// no output of the run placed over bytes another node of the run still uses. The
    /// answer depends only on the nodes' ops, shapes and dtypes (and the backend's
    /// settings), not on where the tensors are.
    fn fused_runs(
        &self,
        _tensors: &[Tensor],
        _nodes: &[TensorId],
        _found: &mut dyn FnMut(usize, usize),
    ) {
    }

    /// Keeps a copy of the tensor table `tensors` for [`Backend::graph_compute_table`],
    /// so that a caller running many graph parts over one table (a scheduler's splits)
    /// does not have `graph_compute` copy it for every part. `None` (the default): the
    /// backend has no use for it (it reads the descriptors before `graph_compute`
    /// returns), call `graph_compute`.
    fn table_register(&self, _tensors: &[Tensor]) -> BackendResult<Option<TableId>> {
        Ok(None)
    }

    /// Forgets a table from [`Backend::table_register`]; work already enqueued with it
    /// still runs.
    fn table_free(&self, _table: TableId) -> BackendResult<()> {
        Ok(())
    }

    /// [`Backend::graph_compute`] over the registered table `table`.
    fn graph_compute_table(&self, _table: TableId, _nodes: &[TensorId]) -> BackendResult<()> {
        Err(BackendError::new(
            BackendErrorKind::InvalidArgument,
            self.name(),
            "this backend keeps no tensor tables",
        ))
    }

    /// Blocks until every enqueued item finished; returns the first error any of them
    /// hit since the last `synchronize` (the queue then continues to accept work).
    fn synchronize(&self) -> BackendResult<()>;

    /// Reports, without waiting, an error that work already run on the queue hit (it
    /// stays for `synchronize` to report too). The default reports none: backends whose
    /// errors only `synchronize` finds.
    fn pending_error(&self) -> BackendResult<()> {
        Ok(())
    }

    /// [`Backend::synchronize`] that gives up after `timeout`: `Ok(false)` when work is
    /// still running then (a hung queue), the queue untouched. The default waits without
    /// a limit.
    fn synchronize_timeout(&self, _timeout: core::time::Duration) -> BackendResult<bool> {
        self.synchronize().map(|()| true)
    }

    // ---- events -------------------------------------------------------------------

    /// A new event, or `None` if this backend has no events.
    fn event_new(&self) -> BackendResult<Option<EventId>>;

    /// Frees an event. The caller ensures no queue still waits on it.
    fn event_free(&self, event: EventId) -> BackendResult<()>;

    /// Enqueues a record of `event`: it completes when everything enqueued before it on
    /// this queue has finished. Re-recording replaces the previous point.
    fn event_record(&self, event: EventId) -> BackendResult<()>;

    /// Makes this backend's queue wait (without blocking the host) until the point last
    /// recorded for `event` has completed; `event` may belong to another backend. Returns
    /// [`BackendErrorKind::ForeignEvent`] if this backend cannot wait on that owner's
    /// events in its queue (see [`Backend::can_wait_on`]).
    fn event_wait(&self, event: EventRef<'_>) -> BackendResult<()>;

    /// Whether [`Backend::event_wait`] accepts events owned by `owner`.
    fn can_wait_on(&self, owner: &dyn Backend) -> bool;

    /// Blocks the host until the point last recorded for `event` has completed (at once
    /// if it was never recorded).
    fn event_synchronize(&self, event: EventId) -> BackendResult<()>;

    /// [`Backend::event_synchronize`] that gives up after `timeout`: `Ok(false)` when the
    /// point has not completed by then. The default waits without a limit.
    fn event_synchronize_timeout(
        &self,
        event: EventId,
        _timeout: core::time::Duration,
    ) -> BackendResult<bool> {
        self.event_synchronize(event).map(|()| true)
    }

    /// When the point last recorded for `event` completed, in nanoseconds since the Unix
    /// epoch on the host's clock: `None` while it has not completed (or if it was never
    /// recorded), and always `None` from backends that do not time their events (the
    /// default). Traces use it to put queue work and host work on one time line.
    fn event_time_ns(&self, _event: EventId) -> BackendResult<Option<u64>> {
        Ok(None)
    }
}
