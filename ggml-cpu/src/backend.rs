//! [`CpuBackend`]: the [`Backend`] implementation for the host CPU.

use std::any::Any;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use ggml_core::backend::BackendKind;
use ggml_core::{
    Backend, BackendCaps, BackendError, BackendErrorKind, BackendResult, BufferId, BufferInfo,
    CopyQueue, EventId, EventRef, MemoryDomain, Name, TableId, Tensor, TensorId,
};

use crate::exec::Executor;
use crate::isa::Isa;
use crate::memory::{Region, Registry, ALIGNMENT, HOST};
use crate::op_timing::OpClock;
use crate::pool::Pool;
use crate::queue::{worker_main, EventState, Item, Queue};
use crate::simd::Kernels;

/// Options of a [`CpuBackend`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuBackendOptions {
    /// Threads that compute a graph (the queue worker plus `n_threads - 1` pool threads);
    /// at least 1. Results never depend on it.
    pub n_threads: usize,
    /// Queue on which [`Backend::cpy_tensor_async`] runs: [`CopyQueue::Source`] enqueues the
    /// copy on the source CPU backend's queue and makes this queue wait for a copy-done
    /// marker; [`CopyQueue::Destination`] enqueues it on this backend's queue.
    pub copy_queue: CopyQueue,
    /// Forces an instruction-set level (it must be available); `None` takes the one that
    /// `$GGML_RS_ISA` names (an error if it names an unknown or unavailable level), or
    /// else the best.
    pub isa: Option<Isa>,
    /// Seed of random sleeps of 0-200 µs before and after each queued item, to shake out
    /// missing synchronisation (the scheduler's chaos mode). `None` disables them.
    pub chaos: Option<u64>,
    /// Pins each compute thread to a CPU of its own, where the process's affinity mask
    /// has enough CPUs that no other live backend of the process has pinned (otherwise
    /// the threads are left free). Two compute threads that the kernel stacks on one CPU
    /// make every barrier wait for a time slice; pinning rules that out. Leave it off
    /// where other processes run compute threads on the same CPUs.
    pub pin_threads: bool,
}

impl Default for CpuBackendOptions {
    fn default() -> Self {
        CpuBackendOptions {
            n_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            copy_queue: CopyQueue::Destination,
            isa: None,
            chaos: None,
            pin_threads: false,
        }
    }
}

impl CpuBackendOptions {
    /// Default options with `n_threads` threads.
    pub fn with_threads(n_threads: usize) -> CpuBackendOptions {
        CpuBackendOptions {
            n_threads,
            ..CpuBackendOptions::default()
        }
    }

    /// Thread counts for `parts` backends sharing `total` threads (each at least 1; the
    /// first ones get the remainder), for `cpu:N` virtual devices.
    pub fn split_threads(total: usize, parts: usize) -> Vec<usize> {
        let parts = parts.max(1);
        (0..parts)
            .map(|i| (total / parts + usize::from(i < total % parts)).max(1))
            .collect()
    }
}

static INSTANCES: AtomicU32 = AtomicU32::new(0);

/// A CPU backend instance: host buffers in its own [`MemoryDomain`], an in-order queue
/// run by a worker thread, a thread pool, and events other CPU backends can wait on.
///
/// ```
/// use ggml_cpu::{CpuBackend, CpuBackendOptions};
/// use ggml_core::{Backend, Context, DType, Graph, Tensor, TensorId};
///
/// let cpu = CpuBackend::new(CpuBackendOptions::with_threads(2)).unwrap();
/// let mut slots = [Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 4];
/// let mut ctx = Context::new(&mut slots);
/// let a = ctx.new_tensor_1d(DType::F32, 4).unwrap();
/// let b = ctx.scale(a, 2.0).unwrap();
/// // Place both tensors in one buffer.
/// let buf = cpu.alloc_buffer(128).unwrap();
/// for (id, off) in [(a, 0u64), (b, 64)] {
///     ctx.get_mut(id).unwrap().data =
///         Some(ggml_core::DataRef { buffer: buf.id, addr: buf.base + off });
/// }
/// let input: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|x| x.to_le_bytes()).collect();
/// cpu.set_tensor_async(ctx.get(a).unwrap(), 0, &input).unwrap();
/// cpu.graph_compute(ctx.tensors(), &[b]).unwrap();
/// cpu.synchronize().unwrap();
/// let mut out = [0u8; 16];
/// cpu.get_tensor(ctx.get(b).unwrap(), 0, &mut out).unwrap();
/// assert_eq!(f32::from_le_bytes(out[12..16].try_into().unwrap()), 8.0);
/// ```
pub struct CpuBackend {
    queue: Arc<Queue>,
    events: Mutex<Vec<Option<Arc<EventState>>>>,
    /// Registered tensor tables (shared with queued computes that use them).
    tables: Mutex<Vec<Option<Arc<[Tensor]>>>>,
    worker: Option<JoinHandle<()>>,
    options: CpuBackendOptions,
    isa: Isa,
    pinned_cpus: Option<Vec<usize>>,
    clock: Arc<OpClock>,
}

impl CpuBackend {
    /// Starts a backend: its worker thread and `n_threads - 1` pool threads.
    pub fn new(options: CpuBackendOptions) -> BackendResult<CpuBackend> {
        let instance = INSTANCES.fetch_add(1, Ordering::Relaxed);
        let name = ggml_core::name!("cpu#{instance}");
        let err = |kind, detail| BackendError::new(kind, name, detail);
        let isa = match options.isa {
            Some(isa) => isa,
            None => Isa::from_env()
                .map_err(|detail| err(BackendErrorKind::InvalidArgument, detail))?
                .unwrap_or_else(Isa::detect),
        };
        if !isa.is_available() {
            return Err(err(
                BackendErrorKind::InvalidArgument,
                "the requested ISA is not available on this CPU",
            ));
        }
        let mut options = options;
        options.n_threads = options.n_threads.max(1);
        options.isa = Some(isa);
        let registry = Arc::new(Registry::new(MemoryDomain::fresh()));
        let queue = Arc::new(Queue::new(name, registry));
        let pool = Pool::new(options.n_threads, name.as_str(), options.pin_threads)
            .map_err(|_| err(BackendErrorKind::Device, "cannot spawn pool threads"))?;
        let pinned_cpus = pool.cpus();
        let clock = Arc::new(OpClock::default());
        let exec = Executor::new(Kernels::get(isa), name, clock.clone());
        let q = queue.clone();
        let chaos = options.chaos;
        let worker = std::thread::Builder::new()
            .name(format!("{name}-queue"))
            .spawn(move || worker_main(q, pool, exec, chaos))
            .map_err(|_| err(BackendErrorKind::Device, "cannot spawn the queue thread"))?;
        Ok(CpuBackend {
            queue,
            events: Mutex::new(Vec::new()),
            tables: Mutex::new(Vec::new()),
            worker: Some(worker),
            options,
            isa,
            pinned_cpus,
            clock,
        })
    }

    /// Times every node computed from now on (`true`), or stops and drops what was
    /// measured (`false`). Thread 0 reads the clock at the barrier that ends each node, so
    /// a node's time is the wall time of all threads on it, barrier waits included. Read
    /// the times with [`CpuBackend::take_op_times`].
    pub fn set_op_timing(&self, on: bool) {
        self.clock.set(on);
    }

    /// The time per kind of op (products by weight type) since timing started or the
    /// last call, longest first (empty while timing is off), and starts new sums. Waits
    /// for the queue first, so it returns the error of any earlier work.
    pub fn take_op_times(&self) -> BackendResult<Vec<ggml_core::OpTime>> {
        self.synchronize()?;
        Ok(self.clock.take())
    }

    /// The instruction-set level the kernels use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Threads per graph computation.
    pub fn n_threads(&self) -> usize {
        self.options.n_threads
    }

    /// The CPU each compute thread is pinned to (thread 0, the queue's, first), or `None`
    /// where [`CpuBackendOptions::pin_threads`] is off or too few CPUs were free.
    pub fn pinned_cpus(&self) -> Option<&[usize]> {
        self.pinned_cpus.as_deref()
    }

    /// The options in effect (`isa` filled in).
    pub fn options(&self) -> &CpuBackendOptions {
        &self.options
    }

    /// Wraps read-only host memory (a memory-mapped model file, say) as a buffer in
    /// [`MemoryDomain::HOST`] without copying. `memory` is kept alive until the buffer is
    /// freed with [`Backend::free_buffer`] (of any CPU backend). Writes to it fail.
    pub fn host_buffer(memory: Arc<dyn AsRef<[u8]> + Send + Sync>) -> BufferInfo {
        let (id, region) = HOST.insert(Region::shared(memory));
        BufferInfo {
            id,
            base: region.base(),
            size: region.len(),
        }
    }

    /// Wraps writable host memory as a buffer in [`MemoryDomain::HOST`] without copying.
    ///
    /// # Safety
    /// `ptr .. ptr + len` must stay valid for reads and writes, and not be accessed by
    /// anything but CPU backends while queued work may use it, until the buffer is freed
    /// with [`Backend::free_buffer`] and all work using it has completed.
    pub unsafe fn host_buffer_raw(ptr: *mut u8, len: usize) -> BufferInfo {
        // SAFETY: forwarded to the caller.
        let (id, region) = HOST.insert(unsafe { Region::raw(ptr, len) });
        BufferInfo {
            id,
            base: region.base(),
            size: region.len(),
        }
    }

    /// Enqueues a host function: it runs on the queue thread after everything enqueued
    /// before it and before anything enqueued after it.
    pub fn enqueue_host_fn(&self, f: impl FnOnce() + Send + 'static) -> BackendResult<()> {
        self.queue.push(Item::HostFn(Box::new(f)))
    }

    fn err(&self, kind: BackendErrorKind, detail: &'static str) -> BackendError {
        self.queue.err(kind, detail)
    }

    fn events(&self) -> MutexGuard<'_, Vec<Option<Arc<EventState>>>> {
        self.events.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn event(&self, id: EventId) -> BackendResult<Arc<EventState>> {
        self.events()
            .get(id.0 as usize)
            .and_then(|e| e.clone())
            .ok_or_else(|| self.err(BackendErrorKind::InvalidArgument, "unknown event"))
    }

    fn region(&self, buffer: BufferId) -> BackendResult<Arc<Region>> {
        let r = if buffer.domain == MemoryDomain::HOST {
            HOST.get(buffer)
        } else {
            self.queue.registry.get(buffer)
        };
        r.ok_or_else(|| {
            self.err(
                BackendErrorKind::InvalidArgument,
                "buffer is not a live buffer of this backend or of host memory",
            )
        })
    }

    fn buffer_range(
        &self,
        buffer: BufferId,
        offset: usize,
        len: usize,
    ) -> BackendResult<(Arc<Region>, *mut u8)> {
        let r = self.region(buffer)?;
        let ptr = r
            .ptr_at(r.base().wrapping_add(offset as u64), len)
            .filter(|_| offset <= r.len())
            .ok_or_else(|| self.err(BackendErrorKind::InvalidArgument, "range outside buffer"))?;
        Ok((r, ptr))
    }

    fn registry(&self) -> &Arc<Registry> {
        &self.queue.registry
    }
}

impl Drop for CpuBackend {
    fn drop(&mut self) {
        self.queue.stop();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        for ev in self.events().iter().flatten() {
            ev.kill();
        }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> Name {
        self.queue.name
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn caps(&self) -> BackendCaps {
        BackendCaps {
            async_compute: true,
            events: true,
            copy_queue: self.options.copy_queue,
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn domain(&self) -> MemoryDomain {
        self.registry().domain()
    }

    fn alignment(&self) -> usize {
        ALIGNMENT
    }

    fn supports_domain(&self, domain: MemoryDomain) -> bool {
        domain == self.domain() || domain == MemoryDomain::HOST
    }

    fn alloc_buffer(&self, size: usize) -> BackendResult<BufferInfo> {
        let region = Region::alloc(size)
            .ok_or_else(|| self.err(BackendErrorKind::OutOfMemory, "host allocation failed"))?;
        let (id, region) = self.registry().insert(region);
        Ok(BufferInfo {
            id,
            base: region.base(),
            size,
        })
    }

    /// Wraps the memory read-only in this backend's domain; writes to it fail. The
    /// trait's contract (memory valid and unchanged until the buffer is freed) is what
    /// makes this sound; `ptr == 0` or a range past the address space is refused.
    fn buffer_from_host_ptr(&self, ptr: u64, size: usize) -> BackendResult<Option<BufferInfo>> {
        let end = ptr.checked_add(size as u64);
        if ptr == 0 || end.is_none() || usize::try_from(ptr).is_err() {
            return Err(self.err(BackendErrorKind::InvalidArgument, "bad host pointer"));
        }
        // SAFETY: the caller keeps `ptr..ptr+size` valid and unchanged until the buffer
        // is freed (Backend::buffer_from_host_ptr contract); the region is read-only.
        let region = unsafe { Region::borrowed(ptr as usize as *const u8, size) };
        let (id, region) = self.registry().insert(region);
        Ok(Some(BufferInfo {
            id,
            base: region.base(),
            size,
        }))
    }

    fn free_buffer(&self, buffer: BufferId) -> BackendResult<()> {
        let r = if buffer.domain == MemoryDomain::HOST {
            HOST.remove(buffer)
        } else {
            self.registry().remove(buffer)
        };
        r.map(drop)
            .ok_or_else(|| self.err(BackendErrorKind::InvalidArgument, "unknown buffer"))
    }

    fn buffer_set(&self, buffer: BufferId, offset: usize, data: &[u8]) -> BackendResult<()> {
        let (r, ptr) = self.buffer_range(buffer, offset, data.len())?;
        if !r.writable() {
            return Err(self.err(BackendErrorKind::InvalidArgument, "read-only buffer"));
        }
        // SAFETY: the range lies in the live region `r`; `data` is caller memory that
        // cannot overlap a region we own for writing (ordering is the caller's, per the
        // contract of blocking buffer access).
        unsafe { std::ptr::copy(data.as_ptr(), ptr, data.len()) };
        Ok(())
    }

    fn buffer_get(&self, buffer: BufferId, offset: usize, out: &mut [u8]) -> BackendResult<()> {
        let (_r, ptr) = self.buffer_range(buffer, offset, out.len())?;
        // SAFETY: the range lies in the live region; see `buffer_set`.
        unsafe { std::ptr::copy(ptr, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn buffer_clear(&self, buffer: BufferId, value: u8) -> BackendResult<()> {
        let r = self.region(buffer)?;
        if !r.writable() {
            return Err(self.err(BackendErrorKind::InvalidArgument, "read-only buffer"));
        }
        let len = r.len();
        let ptr = r
            .ptr_at(r.base(), len)
            .ok_or_else(|| self.err(BackendErrorKind::InvalidArgument, "empty buffer"))?;
        // SAFETY: the whole live region.
        unsafe { std::ptr::write_bytes(ptr, value, len) };
        Ok(())
    }

    fn supports_op(&self, tensors: &[Tensor], node: TensorId) -> bool {
        crate::exec::supports(tensors, node).is_ok()
    }

    fn set_tensor_async(&self, tensor: &Tensor, offset: usize, data: &[u8]) -> BackendResult<()> {
        self.queue.push(Item::Set {
            tensor: *tensor,
            offset,
            data: data.to_vec(),
        })
    }

    fn get_tensor(&self, tensor: &Tensor, offset: usize, out: &mut [u8]) -> BackendResult<()> {
        self.queue.wait_idle(false)?;
        let bad = |d| {
            self.err(BackendErrorKind::InvalidArgument, d)
                .at("GET", tensor.name)
        };
        let d = tensor.data.ok_or_else(|| bad("tensor has no data"))?;
        if offset
            .checked_add(out.len())
            .is_none_or(|e| e > tensor.nbytes())
        {
            return Err(bad("read past the end of the tensor"));
        }
        let (_r, ptr) = crate::memory::resolve(
            self.registry(),
            ggml_core::DataRef {
                buffer: d.buffer,
                addr: d.addr + offset as u64,
            },
            out.len(),
        )
        .map_err(bad)?;
        // SAFETY: resolved inside a live region; the queue is idle.
        unsafe { std::ptr::copy(ptr, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    fn cpy_tensor_async(
        &self,
        src_backend: &dyn Backend,
        src: &Tensor,
        dst: &Tensor,
    ) -> BackendResult<bool> {
        let (Some(sd), Some(dd)) = (src.data, dst.data) else {
            return Err(self
                .err(BackendErrorKind::InvalidArgument, "tensor has no data")
                .at("CPY", dst.name));
        };
        if !self.supports_domain(dd.buffer.domain) {
            return Ok(false);
        }
        let src_cpu = src_backend.as_any().downcast_ref::<CpuBackend>();
        let src_reg = match src_cpu {
            Some(s) if s.supports_domain(sd.buffer.domain) => s.registry().clone(),
            _ if sd.buffer.domain == MemoryDomain::HOST || sd.buffer.domain == self.domain() => {
                self.registry().clone()
            }
            _ => return Ok(false),
        };
        if src.dtype != dst.dtype || src.ne != dst.ne {
            return Err(self
                .err(
                    BackendErrorKind::InvalidArgument,
                    "copy needs equal dtypes and shapes",
                )
                .at("CPY", dst.name));
        }
        let item = Item::Copy {
            src_reg,
            src: *src,
            dst_reg: self.registry().clone(),
            dst: *dst,
        };
        match (self.options.copy_queue, src_cpu) {
            (CopyQueue::Destination, _) => self.queue.push(item)?,
            (CopyQueue::Source, Some(s)) if std::ptr::eq(s, self) => self.queue.push(item)?,
            (CopyQueue::Source, Some(s)) => {
                let done = EventState::new();
                done.recorded.store(1, Ordering::Relaxed);
                s.queue.push(item)?;
                s.queue.push(Item::Record(done.clone(), 1))?;
                self.queue.push(Item::Wait(done, 1))?;
            }
            (CopyQueue::Source, None) => return Ok(false),
        }
        Ok(true)
    }

    fn engine_cpy_tensor_async(
        &self,
        src_backend: &dyn Backend,
        src: &Tensor,
        dst_backend: &dyn Backend,
        dst: &Tensor,
    ) -> BackendResult<bool> {
        let (Some(sd), Some(dd)) = (src.data, dst.data) else {
            return Err(self
                .err(BackendErrorKind::InvalidArgument, "tensor has no data")
                .at("CPY", dst.name));
        };
        // The registry that resolves a buffer of `b` (a CPU backend, or host memory).
        let reg = |b: &dyn Backend, domain: MemoryDomain| -> Option<Arc<Registry>> {
            match b.as_any().downcast_ref::<CpuBackend>() {
                Some(c) if c.supports_domain(domain) => Some(c.registry().clone()),
                _ if domain == MemoryDomain::HOST => Some(self.registry().clone()),
                _ => None,
            }
        };
        let (Some(src_reg), Some(dst_reg)) = (
            reg(src_backend, sd.buffer.domain),
            reg(dst_backend, dd.buffer.domain),
        ) else {
            return Ok(false);
        };
        if src.dtype != dst.dtype || src.ne != dst.ne {
            return Err(self
                .err(
                    BackendErrorKind::InvalidArgument,
                    "copy needs equal dtypes and shapes",
                )
                .at("CPY", dst.name));
        }
        self.queue.push(Item::Copy {
            src_reg,
            src: *src,
            dst_reg,
            dst: *dst,
        })?;
        Ok(true)
    }

    fn graph_compute(&self, tensors: &[Tensor], nodes: &[TensorId]) -> BackendResult<()> {
        self.queue.push(Item::Compute {
            tensors: Arc::from(tensors),
            nodes: nodes.to_vec(),
        })
    }

    fn table_register(&self, tensors: &[Tensor]) -> BackendResult<Option<TableId>> {
        let mut t = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        let slot = t.iter().position(Option::is_none).unwrap_or(t.len());
        let id = u32::try_from(slot)
            .map_err(|_| self.err(BackendErrorKind::OutOfMemory, "too many tables"))?;
        if slot == t.len() {
            t.push(None);
        }
        t[slot] = Some(Arc::from(tensors));
        Ok(Some(TableId(id)))
    }

    fn table_free(&self, table: TableId) -> BackendResult<()> {
        let mut t = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        match t.get_mut(table.0 as usize) {
            Some(s @ Some(_)) => {
                *s = None;
                Ok(())
            }
            _ => Err(self.err(BackendErrorKind::InvalidArgument, "unknown table")),
        }
    }

    fn graph_compute_table(&self, table: TableId, nodes: &[TensorId]) -> BackendResult<()> {
        let tensors = {
            let t = self.tables.lock().unwrap_or_else(|e| e.into_inner());
            t.get(table.0 as usize)
                .and_then(Clone::clone)
                .ok_or_else(|| self.err(BackendErrorKind::InvalidArgument, "unknown table"))?
        };
        self.queue.push(Item::Compute {
            tensors,
            nodes: nodes.to_vec(),
        })
    }

    fn synchronize(&self) -> BackendResult<()> {
        self.queue.wait_idle(true)
    }

    fn event_new(&self) -> BackendResult<Option<EventId>> {
        let mut ev = self.events();
        let id = u32::try_from(ev.len())
            .map_err(|_| self.err(BackendErrorKind::OutOfMemory, "too many events"))?;
        ev.push(Some(EventState::new()));
        Ok(Some(EventId(id)))
    }

    fn event_free(&self, event: EventId) -> BackendResult<()> {
        self.events()
            .get_mut(event.0 as usize)
            .and_then(|e| e.take())
            .map(drop)
            .ok_or_else(|| self.err(BackendErrorKind::InvalidArgument, "unknown event"))
    }

    fn event_record(&self, event: EventId) -> BackendResult<()> {
        let ev = self.event(event)?;
        let generation = ev.recorded.fetch_add(1, Ordering::AcqRel) + 1;
        self.queue.push(Item::Record(ev, generation))
    }

    fn event_wait(&self, event: EventRef<'_>) -> BackendResult<()> {
        let Some(owner) = event.owner.as_any().downcast_ref::<CpuBackend>() else {
            return Err(self.err(
                BackendErrorKind::ForeignEvent,
                "a CPU backend can only wait on events of CPU backends in its queue",
            ));
        };
        let ev = owner.event(event.id)?;
        let generation = ev.recorded.load(Ordering::Acquire);
        if generation == 0 {
            return Ok(());
        }
        self.queue.push(Item::Wait(ev, generation))
    }

    fn can_wait_on(&self, owner: &dyn Backend) -> bool {
        owner.as_any().is::<CpuBackend>()
    }

    fn event_synchronize(&self, event: EventId) -> BackendResult<()> {
        let ev = self.event(event)?;
        let generation = ev.recorded.load(Ordering::Acquire);
        ev.wait(generation, None);
        // As a GPU's event synchronize: work that failed is reported here, not lost.
        self.queue.pending_error().map_or(Ok(()), Err)
    }

    fn event_synchronize_timeout(
        &self,
        event: EventId,
        timeout: std::time::Duration,
    ) -> BackendResult<bool> {
        let ev = self.event(event)?;
        let generation = ev.recorded.load(Ordering::Acquire);
        let done = ev.wait_until(generation, std::time::Instant::now() + timeout);
        self.queue.pending_error().map_or(Ok(done), Err)
    }

    fn pending_error(&self) -> BackendResult<()> {
        self.queue.pending_error().map_or(Ok(()), Err)
    }

    fn synchronize_timeout(&self, timeout: std::time::Duration) -> BackendResult<bool> {
        self.queue
            .wait_idle_until(std::time::Instant::now() + timeout)
    }

    fn event_time_ns(&self, event: EventId) -> BackendResult<Option<u64>> {
        let ev = self.event(event)?;
        Ok(ev.completed_at(ev.recorded.load(Ordering::Acquire)))
    }
}
