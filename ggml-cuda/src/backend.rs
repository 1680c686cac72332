//! `CudaBackend`: one CUDA stream on one GPU, implementing the core `Backend` trait.

use std::any::Any;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ggml_core::{
    Backend, BackendCaps, BackendError, BackendErrorKind, BackendKind, BackendResult, BufferId,
    BufferInfo, CopyQueue, EventId, EventRef, MemoryDomain, Name, Tensor, TensorId,
};

use crate::driver::counted::Counted;
use crate::driver::{self, Api, CuError, Device, DriverKind, Event, Stream};
use crate::err_words::{Regions, REGION_WORDS};
use crate::fusion::{self, Step};
use crate::graphs::{GraphCache, KeyBuilder, MAX_GRAPHS};
use crate::host_counters::{Counters, HostCounters};
use crate::kernels::KernelId;
use crate::launch::MulMatClass;
use crate::op_timing::OpTimer;
use crate::uploads::{Uploads, PIECE_MAX};
use crate::waiter::Waiter;

mod kernel_errors;
mod kernel_stats;
mod op_times;
mod staging;

pub use kernel_stats::KernelStats;

/// The slot of `class_launches` that counts `qmm` variant launches.
pub(crate) const QMM_VARIANT_SLOT: usize = 2;

/// Alignment of buffer bases and tensor offsets (bytes).
pub const ALIGNMENT: usize = 256;
/// Smallest pinned staging chunk (bytes).
const STAGING_MIN: usize = 1 << 20;
/// Error words (u32 each) of the kernels that check indices: a region for launches made
/// one by one and one per cached CUDA graph (see `err_words`).
const ERR_WORDS: usize = (1 + MAX_GRAPHS) * REGION_WORDS;
/// Largest pinned staging chunk (bytes): a larger host copy goes through several.
pub(crate) const STAGING_CHUNK_MAX: usize = 8 << 20;
/// Most pinned staging memory one backend keeps (bytes). Past it, a copy waits for the
/// least recently used busy chunk and reuses (or replaces) it.
pub const STAGING_LIMIT: usize = 64 << 20;

pub(crate) struct Staging {
    pub(crate) ptr: *mut u8,
    size: usize,
    event: Event,
    pub(crate) busy: bool,
    /// When it was last handed out (a counter), to wait for the oldest first.
    last_use: u64,
}

pub(crate) struct State {
    buffers: HashMap<u32, (u64, usize)>,
    next_buffer: u32,
    events: HashMap<u32, Event>,
    next_event: u32,
    pub(crate) staging: Vec<Staging>,
    staging_clock: u64,
    pub(crate) scratch: u64,
    pub(crate) scratch_size: usize,
    pub(crate) retired: Vec<u64>,
    /// Who writes which error word, by region.
    pub(crate) err: Regions,
    /// Timed events around each node, while op timing is on.
    pub(crate) timer: Option<OpTimer>,
    /// The speed features in use.
    pub(crate) tuning: crate::CudaTuning,
    /// Every launch since recording started, while it is on (`record_launches`).
    pub(crate) recorded: Option<Vec<crate::replay::RecordedLaunch>>,
    /// Keys of splits seen and their CUDA graphs.
    pub(crate) graphs: GraphCache,
    pub(crate) key: KeyBuilder,
    /// The stream is capturing a graph: nothing may allocate, free or wait.
    pub(crate) capturing: bool,
    /// Small uploads waiting for the next operation on the stream.
    pub(crate) uploads: Uploads,
    /// Sequence numbers of the stream's upload copies (bumped by each) and the last one
    /// known complete; an event record takes the current number.
    pub(crate) seq_enqueued: u64,
    pub(crate) seq_completed: u64,
    pub(crate) event_seq: HashMap<u32, u64>,
    /// Decode attention's per-tile partials (address, bytes), grown like `scratch`.
    pub(crate) attn_part: (u64, usize),
    /// Decode attention's u32 counters (address, count): zeroed when allocated, and every
    /// launch leaves the ones it used at 0 again.
    pub(crate) attn_ctr: (u64, usize),
    /// Pinned copies of results enqueued for a read with one wait (`buffer_prefetch`).
    pub(crate) readback: crate::readback::Readbacks,
}

/// A CUDA backend instance: one non-blocking stream on GPU `ordinal`.
///
/// Several instances on one GPU are the virtual devices `cuda:0xN` (see
/// [`CudaBackend::new_virtual`]): they share the device's primary context and kernels but
/// each has its own stream, events and memory domain, so a scheduler treats them as
/// separate devices (copies between them are device-to-device copies).
pub struct CudaBackend {
    pub(crate) dev: Arc<Device>,
    instance: u32,
    name: Name,
    domain: MemoryDomain,
    pub(crate) stream: Stream,
    copy_event: Event,
    copy_lock: Mutex<()>,
    /// Device base of the error words.
    pub(crate) err_word: u64,
    /// Their pinned host mirror.
    pub(crate) err_host: *mut u32,
    pub(crate) waiter: Waiter,
    pub(crate) state: Mutex<State>,
    pub(crate) launches: [AtomicU64; KernelId::COUNT],
    /// Quantised products run in each class (both generations): matrix-vector, tiled;
    /// then, at [`QMM_VARIANT_SLOT`], the `qmm` launches that ran a variant compiled for
    /// their dtype and form (counted, captured and replayed like the classes).
    pub(crate) class_launches: [AtomicU64; 3],
    pub(crate) last_class: Mutex<Option<MulMatClass>>,
    pub(crate) counters: Counters,
}

// SAFETY: the raw handles (stream, events, pinned pointers) are driver objects usable from
// any thread with the context current, which every method makes so first; mutable state
// is behind Mutexes.
unsafe impl Send for CudaBackend {}
// SAFETY: see above.
unsafe impl Sync for CudaBackend {}

fn name_of(kind: DriverKind, ordinal: usize, instance: u32) -> Name {
    let mut n = Name::EMPTY;
    let _ = write!(n, "{}:{ordinal}#{instance}", kind.prefix());
    n
}

pub(crate) fn cu_err(name: Name, kind: BackendErrorKind, e: CuError) -> BackendError {
    BackendError::new(kind, name, e.what).with_code(e.code)
}

/// The source and destination device addresses and the bytes of a plain copy of `src`
/// (held by `sb`) to `dst` (held by `db`), or `None` where the two differ in size or
/// dtype or either is not contiguous (the scheduler then copies another way); `api`
/// names the caller in errors.
fn copy_ranges(
    sb: &CudaBackend,
    src: &Tensor,
    db: &CudaBackend,
    dst: &Tensor,
    api: &'static str,
) -> BackendResult<Option<(u64, u64, usize)>> {
    let n = src.nbytes();
    if n != dst.nbytes() || !src.is_contiguous() || !dst.is_contiguous() || src.dtype != dst.dtype {
        return Ok(None);
    }
    let s_addr = sb
        .tensor_range(&lock(&sb.state), src, 0, n)
        .map_err(|e| e.at(api, src.name))?;
    let d_addr = db
        .tensor_range(&lock(&db.state), dst, 0, n)
        .map_err(|e| e.at(api, dst.name))?;
    Ok(Some((s_addr, d_addr, n)))
}

/// `b` as a CUDA backend on driver `kind`.
fn same_driver(b: &dyn Backend, kind: DriverKind) -> Option<&CudaBackend> {
    b.as_any()
        .downcast_ref::<CudaBackend>()
        .filter(|c| c.dev.kind == kind)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl CudaBackend {
    /// A backend on GPU `ordinal` with its own stream; `instance` numbers virtual devices
    /// on the same GPU (it only appears in the name, `cuda:0#1`).
    ///
    /// Fails, never panics, when libcuda is missing, no GPU is present, the ordinal does
    /// not exist, the GPU is older than sm_80 or the kernels do not JIT.
    pub fn new(ordinal: usize, instance: u32) -> BackendResult<CudaBackend> {
        CudaBackend::with_driver(DriverKind::Cuda, ordinal, instance)
    }

    /// A backend on device `ordinal` of driver `kind`: [`DriverKind::Cuda`] is
    /// [`CudaBackend::new`]; [`DriverKind::Sim`] is the emulated GPU `cuda-sim:N` (cargo
    /// feature `sim`), named `cuda-sim:0#1`, whose kernels run in cuda-sim's PTX
    /// interpreter with its checks on.
    pub fn with_driver(
        kind: DriverKind,
        ordinal: usize,
        instance: u32,
    ) -> BackendResult<CudaBackend> {
        let name = name_of(kind, ordinal, instance);
        let unavailable = |e: CuError| cu_err(name, BackendErrorKind::Unavailable, e);
        let dev = driver::device(kind, ordinal).map_err(unavailable)?;
        let counters = Counters::default();
        let api = Counted {
            api: dev.api,
            counters: &counters,
        };
        api.bind(dev.ctx).map_err(unavailable)?;
        let stream = api.stream_create(dev.ctx).map_err(unavailable)?;
        let copy_event = match api.event_create(dev.ctx) {
            Ok(e) => e,
            Err(e) => {
                api.stream_destroy(stream);
                return Err(unavailable(e));
            }
        };
        let err_word = api.mem_alloc(dev.ctx, 4 * ERR_WORDS).and_then(|p| {
            // The words must be zero before the first kernel can set one: ordered on our
            // stream, then waited for.
            api.memset_d8_async(p, 0, 4 * ERR_WORDS, stream)
                .and_then(|_| api.stream_synchronize(stream))
                .map(|_| p)
                .inspect_err(|_| {
                    let _ = api.mem_free(dev.ctx, p);
                })
        });
        let err_mem = err_word.and_then(|p| match api.mem_alloc_host(dev.ctx, 4 * ERR_WORDS) {
            Ok(h) => {
                // SAFETY: 4 * ERR_WORDS bytes of pinned memory, not yet used by any copy.
                unsafe { std::ptr::write_bytes(h, 0, 4 * ERR_WORDS) };
                Ok((p, h as *mut u32))
            }
            Err(e) => {
                let _ = api.mem_free(dev.ctx, p);
                Err(e)
            }
        });
        let (err_word, err_host) = match err_mem {
            Ok(p) => p,
            Err(e) => {
                api.event_destroy(copy_event);
                api.stream_destroy(stream);
                return Err(unavailable(e));
            }
        };
        Ok(CudaBackend {
            dev,
            instance,
            name,
            domain: MemoryDomain::fresh(),
            stream,
            copy_event,
            copy_lock: Mutex::new(()),
            err_word,
            err_host,
            waiter: Waiter::default(),
            state: Mutex::new(State {
                buffers: HashMap::new(),
                next_buffer: 0,
                events: HashMap::new(),
                next_event: 0,
                staging: Vec::new(),
                staging_clock: 0,
                scratch: 0,
                scratch_size: 0,
                retired: Vec::new(),
                err: Regions::new(MAX_GRAPHS),
                timer: None,
                tuning: crate::CudaTuning::default(),
                recorded: None,
                graphs: GraphCache::default(),
                key: KeyBuilder::default(),
                capturing: false,
                uploads: Uploads::default(),
                seq_enqueued: 0,
                seq_completed: 0,
                event_seq: HashMap::new(),
                readback: Default::default(),
                attn_part: (0, 0),
                attn_ctr: (0, 0),
            }),
            launches: std::array::from_fn(|_| AtomicU64::new(0)),
            class_launches: std::array::from_fn(|_| AtomicU64::new(0)),
            last_class: Mutex::new(None),
            counters,
        })
    }

    /// `n` instances on GPU `ordinal` (the virtual device `cuda:{ordinal}x{n}`), each with
    /// its own stream.
    pub fn new_virtual(ordinal: usize, n: u32) -> BackendResult<Vec<CudaBackend>> {
        CudaBackend::new_virtual_with(DriverKind::Cuda, ordinal, n)
    }

    /// `n` instances on device `ordinal` of driver `kind` (`cuda-sim:0x2` for
    /// [`DriverKind::Sim`]).
    pub fn new_virtual_with(
        kind: DriverKind,
        ordinal: usize,
        n: u32,
    ) -> BackendResult<Vec<CudaBackend>> {
        (0..n)
            .map(|i| CudaBackend::with_driver(kind, ordinal, i))
            .collect()
    }

    /// A copy engine beside this backend: another stream on the same GPU (named
    /// `…#{instance + 100}`), with no buffers of its own, that runs
    /// [`Backend::engine_cpy_tensor_async`] between CUDA backends of the same driver, so
    /// that copies overlap the kernels on this backend's stream.
    pub fn copy_engine(&self) -> BackendResult<CudaBackend> {
        CudaBackend::with_driver(self.dev.kind, self.dev.ordinal, self.instance + 100)
    }

    /// Number of CUDA devices, or the reason CUDA cannot be used (libcuda missing, no
    /// device, driver too old).
    pub fn device_count() -> BackendResult<usize> {
        CudaBackend::device_count_of(DriverKind::Cuda)
    }

    /// Number of devices of driver `kind`, or the reason it cannot be used.
    pub fn device_count_of(kind: DriverKind) -> BackendResult<usize> {
        kind.device_count()
            .map_err(|e| cu_err(Name::new(kind.prefix()), BackendErrorKind::Unavailable, e))
    }

    /// The driver this backend runs on.
    pub fn driver_kind(&self) -> DriverKind {
        self.dev.kind
    }

    /// The GPU ordinal.
    pub fn ordinal(&self) -> usize {
        self.dev.ordinal
    }

    /// The instance number on the GPU.
    pub fn instance(&self) -> u32 {
        self.instance
    }

    /// The GPU's name as the driver reports it.
    pub fn device_name(&self) -> &str {
        &self.dev.name
    }

    /// The GPU's compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.dev.cc
    }

    /// How many times each kernel was launched so far.
    pub fn kernel_stats(&self) -> KernelStats {
        let launches = std::array::from_fn(|k| self.launches[k].load(Ordering::Relaxed));
        KernelStats {
            mmvq: self.class_launches[0].load(Ordering::Relaxed),
            mmq: self.class_launches[1].load(Ordering::Relaxed),
            qmm_variants: self.class_launches[QMM_VARIANT_SLOT].load(Ordering::Relaxed),
            launches,
        }
    }

    /// Counts a quantised MUL_MAT of `class` and remembers it as the last one.
    pub(crate) fn count_class(&self, class: MulMatClass) {
        let i = match class {
            MulMatClass::Mmvq => 0,
            MulMatClass::Mmq => 1,
        };
        self.class_launches[i].fetch_add(1, Ordering::Relaxed);
        *lock(&self.last_class) = Some(class);
    }

    /// Chooses the speed features (CUDA graphs, fusions, kernel generations) of the
    /// nodes computed from now on. See [`CudaTuning`](crate::CudaTuning).
    pub fn set_tuning(&self, tuning: crate::CudaTuning) {
        lock(&self.state).tuning = tuning;
    }

    /// Bytes of pinned host memory this backend holds for staging host copies (at most
    /// [`STAGING_LIMIT`]).
    pub fn pinned_staging_bytes(&self) -> usize {
        lock(&self.state).staging.iter().map(|s| s.size).sum()
    }

    /// The speed features in use.
    pub fn tuning(&self) -> crate::CudaTuning {
        lock(&self.state).tuning
    }

    /// The class of the last quantised mul_mat enqueued, if any.
    pub fn last_mul_mat_class(&self) -> Option<MulMatClass> {
        *lock(&self.last_class)
    }

    pub(crate) fn err(&self, kind: BackendErrorKind, detail: &'static str) -> BackendError {
        BackendError::new(kind, self.name, detail)
    }

    pub(crate) fn cu(&self, e: CuError) -> BackendError {
        cu_err(self.name, BackendErrorKind::Device, e)
    }

    pub(crate) fn bind(&self) -> BackendResult<()> {
        self.api().bind(self.dev.ctx).map_err(|e| self.cu(e))
    }

    /// The driver, each call counted in this backend's host counters.
    pub(crate) fn api(&self) -> Counted<'_> {
        Counted {
            api: self.dev.api,
            counters: &self.counters,
        }
    }

    /// What this backend asked of the driver on the host since it was created or since
    /// [`CudaBackend::reset_host_counters`]: driver calls by kind, kernels run, graph
    /// launches, host waits, bytes copied, host time of `graph_compute`. Snapshots
    /// subtract (`after - before`) and add (over devices).
    pub fn host_counters(&self) -> HostCounters {
        self.counters.snapshot()
    }

    /// Sets every host counter back to zero.
    pub fn reset_host_counters(&self) {
        self.counters.reset()
    }

    /// Device address and length of a buffer range, checked to lie within the buffer.
    fn buffer_range(
        &self,
        st: &State,
        buffer: BufferId,
        offset: usize,
        len: usize,
    ) -> BackendResult<u64> {
        if buffer.domain != self.domain {
            return Err(self.err(
                BackendErrorKind::InvalidArgument,
                "buffer belongs to another backend",
            ));
        }
        let &(base, size) = st
            .buffers
            .get(&buffer.index)
            .ok_or_else(|| self.err(BackendErrorKind::InvalidArgument, "unknown buffer"))?;
        let end = offset
            .checked_add(len)
            .ok_or_else(|| self.err(BackendErrorKind::InvalidArgument, "range overflows"))?;
        if end > size {
            return Err(self.err(
                BackendErrorKind::InvalidArgument,
                "range past the end of the buffer",
            ));
        }
        Ok(base + offset as u64)
    }

    /// Device address of byte `offset` of `t`, checking that `len` bytes from there lie in
    /// one of this backend's buffers.
    pub(crate) fn tensor_range(
        &self,
        st: &State,
        t: &Tensor,
        offset: usize,
        len: usize,
    ) -> BackendResult<u64> {
        let d = t.data.ok_or_else(|| {
            self.err(BackendErrorKind::InvalidArgument, "tensor has no data")
                .at("tensor", t.name)
        })?;
        if d.buffer.domain != self.domain {
            return Err(self
                .err(
                    BackendErrorKind::InvalidArgument,
                    "tensor is not in this backend's memory",
                )
                .at("tensor", t.name));
        }
        let &(base, size) = st.buffers.get(&d.buffer.index).ok_or_else(|| {
            self.err(
                BackendErrorKind::InvalidArgument,
                "tensor's buffer is unknown",
            )
            .at("tensor", t.name)
        })?;
        let start = d.addr.checked_sub(base).map(|s| s as usize);
        let ok = start
            .and_then(|s| s.checked_add(offset))
            .and_then(|s| s.checked_add(len))
            .is_some_and(|e| e <= size);
        if !ok {
            return Err(self
                .err(
                    BackendErrorKind::InvalidArgument,
                    "tensor range outside its buffer",
                )
                .at("tensor", t.name));
        }
        Ok(d.addr + offset as u64)
    }

    fn event_handle(&self, id: EventId) -> BackendResult<Event> {
        lock(&self.state)
            .events
            .get(&id.0)
            .copied()
            .ok_or_else(|| self.err(BackendErrorKind::InvalidArgument, "unknown event"))
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Uncounted: nothing reads the counters of a backend being dropped.
        let (api, ctx) = (self.dev.api, self.dev.ctx);
        if self.dev.bind().is_err() {
            // A poisoned context: the driver frees everything with it; still give the
            // handles back so nothing of ours stays registered.
        }
        let _ = api.stream_synchronize(self.stream);
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        // After the stream drained nothing uses these objects any more.
        for (_, (p, _)) in st.buffers.drain() {
            let _ = api.mem_free(ctx, p);
        }
        for (_, e) in st.events.drain() {
            api.event_destroy(e);
        }
        for s in st.staging.drain(..) {
            api.event_destroy(s.event);
            let _ = api.mem_free_host(ctx, s.ptr);
        }
        for p in st.readback.drain_ptrs() {
            let _ = api.mem_free_host(ctx, p);
        }
        for p in st.retired.drain(..) {
            let _ = api.mem_free(ctx, p);
        }
        if let Some(mut t) = st.timer.take() {
            t.destroy(api);
        }
        for p in [st.scratch, st.attn_part.0, st.attn_ctr.0] {
            if p != 0 {
                let _ = api.mem_free(ctx, p);
            }
        }
        for e in st.graphs.take_all() {
            if let Some(c) = e.captured {
                api.graph_exec_destroy(c.exec);
            }
        }
        for a in st.uploads.areas.drain(..) {
            let _ = api.mem_free_host(ctx, a.ptr);
        }
        if st.uploads.dev != 0 {
            let _ = api.mem_free(ctx, st.uploads.dev);
        }
        let _ = api.mem_free_host(ctx, self.err_host as *mut u8);
        let _ = api.mem_free(ctx, self.err_word);
        api.event_destroy(self.copy_event);
        api.stream_destroy(self.stream);
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> Name {
        self.name
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn caps(&self) -> BackendCaps {
        BackendCaps {
            async_compute: true,
            events: true,
            copy_queue: CopyQueue::Source,
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn domain(&self) -> MemoryDomain {
        self.domain
    }

    fn alignment(&self) -> usize {
        ALIGNMENT
    }

    fn supports_domain(&self, domain: MemoryDomain) -> bool {
        domain == self.domain
    }

    fn alloc_buffer(&self, size: usize) -> BackendResult<BufferInfo> {
        self.bind()?;
        // A zero-size request allocates one byte instead.
        let p = self
            .api()
            .mem_alloc(self.dev.ctx, size.max(1))
            .map_err(|e| cu_err(self.name, BackendErrorKind::OutOfMemory, e))?;
        let mut st = lock(&self.state);
        let index = st.next_buffer;
        st.next_buffer += 1;
        st.buffers.insert(index, (p, size));
        Ok(BufferInfo {
            id: BufferId {
                domain: self.domain,
                index,
            },
            base: p,
            size,
        })
    }

    fn free_buffer(&self, buffer: BufferId) -> BackendResult<()> {
        // A poisoned context (a sticky error) still frees: the buffer leaves this backend,
        // and whatever the driver keeps of it goes with the context's reset when its last
        // user releases it. Reporting the sticky error here again would only make callers
        // keep the buffer's accounting for memory that is gone.
        let healthy = self.bind().is_ok();
        let mut st = lock(&self.state);
        self.buffer_range(&st, buffer, 0, 0)?;
        // Graphs may hold addresses in it (a later buffer may get the same ones).
        self.clear_graphs(&mut st);
        let (p, _) = st.buffers.remove(&buffer.index).unwrap_or((0, 0));
        st.readback.forget(buffer);
        // The caller guarantees no queued use.
        let freed = self.api().mem_free(self.dev.ctx, p);
        match healthy {
            true => freed.map_err(|e| self.cu(e)),
            false => Ok(()),
        }
    }

    fn buffer_set(&self, buffer: BufferId, offset: usize, data: &[u8]) -> BackendResult<()> {
        self.bind()?;
        let dst = self.buffer_range(&lock(&self.state), buffer, offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.flush_now()?;
        // On our own stream, then waited for: the driver's synchronous cuMemcpyHtoD runs
        // on the legacy NULL stream, which does not order against our non-blocking
        // stream, and may return before the bytes landed, so a kernel enqueued next
        // could read the old bytes.
        let api = self.api();
        // SAFETY: `data` is pageable memory, staged by the driver during the call; the
        // synchronisation below completes the copy before `data` can change.
        unsafe { api.memcpy_htod_async(dst, data.as_ptr(), data.len(), self.stream) }
            .and_then(|_| api.stream_synchronize(self.stream))
            .map_err(|e| self.cu(e))?;
        self.stream_drained(&mut lock(&self.state));
        Ok(())
    }

    fn buffer_get(&self, buffer: BufferId, offset: usize, out: &mut [u8]) -> BackendResult<()> {
        self.bind()?;
        let mut st = lock(&self.state);
        let src = self.buffer_range(&st, buffer, offset, out.len())?;
        if out.is_empty() || self.take_prefetched(&mut st, buffer, offset, out) {
            return Ok(());
        }
        // Ordered on our stream (see buffer_set), through pinned memory.
        self.flush_uploads(&mut st, false)?;
        self.read_pinned(&mut st, src, out)
    }

    fn buffer_prefetch(&self, buffer: BufferId, offset: usize, len: usize) -> BackendResult<bool> {
        self.bind()?;
        let mut st = lock(&self.state);
        let src = self.buffer_range(&st, buffer, offset, len)?;
        self.prefetch(&mut st, buffer, offset, src, len)
    }

    fn buffer_clear(&self, buffer: BufferId, value: u8) -> BackendResult<()> {
        self.bind()?;
        let mut st = lock(&self.state);
        let (base, size) = st
            .buffers
            .get(&buffer.index)
            .copied()
            .filter(|_| buffer.domain == self.domain)
            .ok_or_else(|| self.err(BackendErrorKind::InvalidArgument, "unknown buffer"))?;
        self.flush_uploads(&mut st, false)?;
        // On our stream, then waited for (see buffer_set: cuMemsetD8 is asynchronous and
        // on the legacy NULL stream).
        let api = self.api();
        api.memset_d8_async(base, value, size, self.stream)
            .and_then(|_| api.stream_synchronize(self.stream))
            .map_err(|e| self.cu(e))?;
        self.stream_drained(&mut st);
        Ok(())
    }

    fn supports_op(&self, tensors: &[Tensor], node: TensorId) -> bool {
        crate::ops::check(tensors, node).is_ok()
    }

    fn offload_op(&self, tensors: &[Tensor], node: TensorId) -> bool {
        // As ggml-cuda: worth moving a host-weight matmul here from a batch of 32 on.
        tensors.get(node.index()).is_some_and(|t| {
            t.op == ggml_core::Op::MulMat
                && t.ne[1] >= 32
                && crate::ops::check(tensors, node).is_ok()
        })
    }

    fn set_tensor_async(&self, tensor: &Tensor, offset: usize, data: &[u8]) -> BackendResult<()> {
        self.bind()?;
        let api = self.api();
        let mut st = lock(&self.state);
        let dst = self
            .tensor_range(&st, tensor, offset, data.len())
            .map_err(|e| e.at("set_tensor_async", tensor.name))?;
        if data.is_empty() {
            return Ok(());
        }
        if data.len() <= PIECE_MAX {
            // Batched with the other small uploads before the next stream operation.
            return self
                .upload_small(&mut st, dst, data)
                .map_err(|e| e.at("set_tensor_async", tensor.name));
        }
        self.flush_uploads(&mut st, false)?;
        // Through pinned chunks of at most STAGING_CHUNK_MAX bytes, so pinned memory stays
        // bounded whatever the size of the copy.
        for (k, piece) in data.chunks(STAGING_CHUNK_MAX).enumerate() {
            let i = self.staging(&mut st, piece.len())?;
            st.staging_clock += 1;
            let clock = st.staging_clock;
            let s = &mut st.staging[i];
            // SAFETY: the chunk holds at least piece.len() bytes and no queued copy reads
            // it.
            unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), s.ptr, piece.len()) };
            let at = dst + (k * STAGING_CHUNK_MAX) as u64;
            // SAFETY: the pinned source stays allocated and unchanged until the copy-done
            // event completed (the chunk is busy until then).
            let r = unsafe { api.memcpy_htod_async(at, s.ptr, piece.len(), self.stream) }
                .and_then(|_| api.event_record(s.event, self.stream));
            r.map_err(|e| self.cu(e).at("set_tensor_async", tensor.name))?;
            s.busy = true;
            s.last_use = clock;
        }
        Ok(())
    }

    fn get_tensor(&self, tensor: &Tensor, offset: usize, out: &mut [u8]) -> BackendResult<()> {
        self.synchronize()?;
        let mut st = lock(&self.state);
        let src = self
            .tensor_range(&st, tensor, offset, out.len())
            .map_err(|e| e.at("get_tensor", tensor.name))?;
        if out.is_empty() {
            return Ok(());
        }
        self.read_pinned(&mut st, src, out)
            .map_err(|e| e.at("get_tensor", tensor.name))
    }

    fn cpy_tensor_async(
        &self,
        src_backend: &dyn Backend,
        src: &Tensor,
        dst: &Tensor,
    ) -> BackendResult<bool> {
        let Some(sb) = src_backend
            .as_any()
            .downcast_ref::<CudaBackend>()
            .filter(|sb| sb.dev.kind == self.dev.kind)
        else {
            return Ok(false);
        };
        let Some((s_addr, d_addr, n)) = copy_ranges(sb, src, self, dst, "cpy_tensor_async")? else {
            return Ok(false);
        };
        if n == 0 {
            return Ok(true);
        }
        let fail = |e: CuError| self.cu(e).at("cpy_tensor_async", dst.name);
        let api = self.api();
        if std::ptr::eq(sb, self) {
            self.bind()?;
            self.flush_now()?;
            api.memcpy_dtod_async(d_addr, s_addr, n, self.stream)
                .map_err(fail)?;
            return Ok(true);
        }
        // The copy runs on the SOURCE stream (after the producer), then the destination
        // stream waits on the source's copy-done event (CopyQueue::Source).
        self.bind()?;
        self.flush_now()?;
        sb.bind()?;
        sb.flush_now()?;
        let _guard = lock(&sb.copy_lock);
        let r = if Arc::ptr_eq(&sb.dev, &self.dev) {
            api.memcpy_dtod_async(d_addr, s_addr, n, sb.stream)
        } else {
            // Without peer access the driver stages the copy through the host.
            sb.dev.enable_peer(&self.dev);
            api.memcpy_peer_async(d_addr, self.dev.ctx, s_addr, sb.dev.ctx, n, sb.stream)
        };
        r.map_err(fail)?;
        api.event_record(sb.copy_event, sb.stream).map_err(fail)?;
        // The wait captures the event state recorded just now.
        api.stream_wait_event(self.stream, sb.copy_event)
            .map_err(fail)?;
        Ok(true)
    }

    fn engine_cpy_tensor_async(
        &self,
        src_backend: &dyn Backend,
        src: &Tensor,
        dst_backend: &dyn Backend,
        dst: &Tensor,
    ) -> BackendResult<bool> {
        let kind = self.dev.kind;
        let (Some(sb), Some(db)) = (
            same_driver(src_backend, kind),
            same_driver(dst_backend, kind),
        ) else {
            return Ok(false);
        };
        let Some((s_addr, d_addr, n)) = copy_ranges(sb, src, db, dst, "engine_cpy_tensor_async")?
        else {
            return Ok(false);
        };
        if n == 0 {
            return Ok(true);
        }
        let fail = |e: CuError| self.cu(e).at("engine_cpy_tensor_async", dst.name);
        let api = self.api();
        self.bind()?;
        self.flush_now()?;
        let r = if Arc::ptr_eq(&sb.dev, &db.dev) {
            api.memcpy_dtod_async(d_addr, s_addr, n, self.stream)
        } else {
            sb.dev.enable_peer(&db.dev);
            api.memcpy_peer_async(d_addr, db.dev.ctx, s_addr, sb.dev.ctx, n, self.stream)
        };
        r.map_err(fail)?;
        Ok(true)
    }

    fn fused_runs(
        &self,
        tensors: &[Tensor],
        nodes: &[TensorId],
        found: &mut dyn FnMut(usize, usize),
    ) {
        let tuning = lock(&self.state).tuning;
        for step in fusion::plan(tensors, nodes, &tuning) {
            if let Step::Fused { start, end, .. } = step {
                found(start, end);
            }
        }
    }

    fn graph_compute(&self, tensors: &[Tensor], nodes: &[TensorId]) -> BackendResult<()> {
        let t0 = std::time::Instant::now();
        let r = self.compute_steps(tensors, nodes);
        self.counters
            .graph_compute(nodes.len(), t0.elapsed().as_nanos() as u64);
        r
    }

    fn synchronize(&self) -> BackendResult<()> {
        self.bind()?;
        let api = self.api();
        {
            let mut st = lock(&self.state);
            self.flush_uploads(&mut st, false)?;
            self.mirror_eager_words(&st)?;
        }
        api.stream_synchronize(self.stream)
            .map_err(|e| self.cu(e))?;
        let mut st = lock(&self.state);
        self.stream_drained(&mut st);
        if let Some(t) = st.timer.as_mut() {
            t.settle(&api);
        }
        for p in std::mem::take(&mut st.retired) {
            // The stream is idle, nothing uses the retired scratch.
            let _ = api.mem_free(self.dev.ctx, p);
        }
        self.check_kernel_errors(&mut st)
    }

    fn pending_error(&self) -> BackendResult<()> {
        let mut st = lock(&self.state);
        self.replayed_kernel_error(&mut st)
    }

    fn event_new(&self) -> BackendResult<Option<EventId>> {
        self.bind()?;
        let ev = self
            .api()
            .event_create(self.dev.ctx)
            .map_err(|e| self.cu(e))?;
        let mut st = lock(&self.state);
        let id = st.next_event;
        st.next_event += 1;
        st.events.insert(id, ev);
        Ok(Some(EventId(id)))
    }

    fn event_free(&self, event: EventId) -> BackendResult<()> {
        self.bind()?;
        let mut st = lock(&self.state);
        st.event_seq.remove(&event.0);
        let ev = st
            .events
            .remove(&event.0)
            .ok_or_else(|| self.err(BackendErrorKind::InvalidArgument, "unknown event"))?;
        drop(st);
        // The caller guarantees no pending wait.
        self.api().event_destroy(ev);
        Ok(())
    }

    fn event_record(&self, event: EventId) -> BackendResult<()> {
        self.bind()?;
        let ev = self.event_handle(event)?;
        let mut st = lock(&self.state);
        self.flush_uploads(&mut st, false)?;
        self.api()
            .event_record(ev, self.stream)
            .map_err(|e| self.cu(e))?;
        let seq = st.seq_enqueued;
        st.event_seq.insert(event.0, seq);
        Ok(())
    }

    fn event_wait(&self, event: EventRef<'_>) -> BackendResult<()> {
        let Some(owner) = event.owner.as_any().downcast_ref::<CudaBackend>() else {
            return Err(self.err(
                BackendErrorKind::ForeignEvent,
                "a CUDA stream can only wait on events of CUDA backends",
            ));
        };
        if owner.dev.kind != self.dev.kind {
            return Err(self.err(
                BackendErrorKind::ForeignEvent,
                "a CUDA stream can only wait on events of the same driver (cuda or cuda-sim)",
            ));
        }
        let ev = owner.event_handle(event.id)?;
        self.bind()?;
        // Events of another context are allowed.
        self.api()
            .stream_wait_event(self.stream, ev)
            .map_err(|e| self.cu(e))
    }

    fn can_wait_on(&self, owner: &dyn Backend) -> bool {
        owner
            .as_any()
            .downcast_ref::<CudaBackend>()
            .is_some_and(|o| o.dev.kind == self.dev.kind)
    }

    fn event_synchronize(&self, event: EventId) -> BackendResult<()> {
        self.bind()?;
        let ev = self.event_handle(event)?;
        // An unrecorded event completes at once.
        self.api().event_synchronize(ev).map_err(|e| self.cu(e))?;
        self.event_passed(&mut lock(&self.state), event.0);
        Ok(())
    }

    fn event_synchronize_timeout(
        &self,
        event: EventId,
        timeout: std::time::Duration,
    ) -> BackendResult<bool> {
        self.bind()?;
        let ev = self.event_handle(event)?;
        let done = self.wait_timed(ev, timeout)?;
        if done {
            self.event_passed(&mut lock(&self.state), event.0);
        }
        Ok(done)
    }

    fn synchronize_timeout(&self, timeout: std::time::Duration) -> BackendResult<bool> {
        self.bind()?;
        self.flush_now()?;
        let api = self.api();
        let ev = api.event_create(self.dev.ctx).map_err(|e| self.cu(e))?;
        let done = api
            .event_record(ev, self.stream)
            .map_err(|e| self.cu(e))
            .and_then(|()| self.wait_timed(ev, timeout));
        api.event_destroy(ev);
        match done? {
            true => self.synchronize().map(|()| true),
            false => Ok(false),
        }
    }
}
