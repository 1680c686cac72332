//! Test doubles (feature `testing`): [`TestBackend`], a real asynchronous backend with a
//! worker-thread queue, events, seeded random delays and f32 kernels for a few ops; and
//! [`SimBackend`], a recording-only backend that runs nothing (for plan checks with
//! [`crate::CheckedBackend`]).
//!
//! `TestBackend` memory is host memory behind a mutex per buffer, in a memory domain of
//! its own, so the scheduler copies between instances. Logical races (a copy running
//! before the producer) give wrong numbers, never undefined behaviour.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use ggml_core::{
    Backend, BackendCaps, BackendError, BackendErrorKind, BackendKind, BackendResult, BufferId,
    BufferInfo, CopyQueue, DType, DataRef, EventId, EventRef, MemoryDomain, Name, Op, Tensor,
    TensorId,
};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Injected failures of [`TestBackend::graph_compute`] (counted from 0 per backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailMode {
    /// The `nth` call returns an error at once (nothing is enqueued).
    EnqueueCompute {
        /// Which call.
        nth: usize,
    },
    /// The `nth` call's kernels fail when the queue runs them (reported by the next
    /// `synchronize`).
    RuntimeCompute {
        /// Which call.
        nth: usize,
    },
}

/// Options of a [`TestBackend`].
#[derive(Clone, Debug)]
pub struct TestBackendOptions {
    /// Backend name.
    pub name: String,
    /// Queue `cpy_tensor_async` runs on.
    pub copy_queue: CopyQueue,
    /// Whether it has events.
    pub events: bool,
    /// Whether `cpy_tensor_async` accepts copies from other test backends (else it
    /// declines and the scheduler copies through the host).
    pub async_copy: bool,
    /// Whether its queue can wait on other test backends' events.
    pub foreign_waits: bool,
    /// Seed of random delays before each queued item (`None`: no delays).
    pub delay_seed: Option<u64>,
    /// Largest delay in microseconds.
    pub max_delay_us: u64,
    /// Injected failure.
    pub fail: Option<FailMode>,
    /// ggml names of ops it refuses (`"MUL"`, ...), to exercise assignment.
    pub unsupported: Vec<&'static str>,
}

impl TestBackendOptions {
    /// Defaults: copies on the destination queue, events, async copies, foreign waits,
    /// no delays, no failures, every supported op.
    pub fn new(name: &str) -> TestBackendOptions {
        TestBackendOptions {
            name: name.to_string(),
            copy_queue: CopyQueue::Destination,
            events: true,
            async_copy: true,
            foreign_waits: true,
            delay_seed: None,
            max_delay_us: 200,
            fail: None,
            unsupported: Vec::new(),
        }
    }
}

struct Mem {
    base: u64,
    bytes: Mutex<Vec<u8>>,
}

fn registry() -> &'static Mutex<HashMap<BufferId, Arc<Mem>>> {
    static R: OnceLock<Mutex<HashMap<BufferId, Arc<Mem>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// A one-shot-per-generation event: `recorded` counts records enqueued, `completed` the
/// latest one the queue reached.
#[derive(Default)]
struct EventState {
    gens: Mutex<(u64, u64)>,
    cv: Condvar,
}

impl EventState {
    fn record(&self) -> u64 {
        let mut g = lock(&self.gens);
        g.0 += 1;
        g.0
    }

    fn target(&self) -> u64 {
        lock(&self.gens).0
    }

    fn complete(&self, gen: u64) {
        let mut g = lock(&self.gens);
        g.1 = g.1.max(gen);
        self.cv.notify_all();
    }

    fn wait_for(&self, gen: u64) {
        let mut g = lock(&self.gens);
        while g.1 < gen {
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

type Job = Box<dyn FnOnce() -> BackendResult<()> + Send>;

struct Shared {
    opts: TestBackendOptions,
    name: Name,
    domain: MemoryDomain,
    buffers: Mutex<HashMap<u32, Arc<Mem>>>,
    next_buf: AtomicU32,
    events: Mutex<HashMap<u32, Arc<EventState>>>,
    next_event: AtomicU32,
    error: Mutex<Option<BackendError>>,
    computes: AtomicUsize,
}

impl Shared {
    fn err(&self, kind: BackendErrorKind, detail: &'static str) -> BackendError {
        BackendError::new(kind, self.name, detail)
    }
}

/// A test backend with a real asynchronous queue (one worker thread), events, host
/// memory in its own domain, optional seeded delays, and f32 kernels for ADD, MUL,
/// SCALE, CPY, CONT and the view ops.
pub struct TestBackend {
    shared: Arc<Shared>,
    tx: Mutex<Option<Sender<Job>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for TestBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestBackend")
            .field("name", &self.shared.opts.name)
            .finish_non_exhaustive()
    }
}

fn resolve(d: DataRef, name: Name, len: usize) -> BackendResult<(Arc<Mem>, usize)> {
    let bad = |detail| BackendError::new(BackendErrorKind::InvalidArgument, name, detail);
    let mem = lock(registry())
        .get(&d.buffer)
        .cloned()
        .ok_or_else(|| bad("unknown buffer"))?;
    let off = d
        .addr
        .checked_sub(mem.base)
        .ok_or_else(|| bad("address below buffer"))? as usize;
    if off + len > lock(&mem.bytes).len() {
        return Err(bad("range past the end of the buffer"));
    }
    Ok((mem, off))
}

fn elem_offsets(t: &Tensor) -> impl Iterator<Item = usize> + '_ {
    let ne = t.ne;
    (0..ne[3]).flat_map(move |i3| {
        (0..ne[2]).flat_map(move |i2| {
            (0..ne[1]).flat_map(move |i1| (0..ne[0]).map(move |i0| t.offset_of([i0, i1, i2, i3])))
        })
    })
}

fn read_f32(t: &Tensor) -> BackendResult<Vec<f32>> {
    let d = t.data.ok_or_else(|| {
        BackendError::new(
            BackendErrorKind::InvalidArgument,
            t.name,
            "tensor has no data",
        )
    })?;
    let (mem, off) = resolve(d, t.name, t.nbytes())?;
    let bytes = lock(&mem.bytes);
    Ok(elem_offsets(t)
        .map(|o| {
            let o = off + o;
            f32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]])
        })
        .collect())
}

fn write_f32(t: &Tensor, vals: &[f32]) -> BackendResult<()> {
    let d = t.data.ok_or_else(|| {
        BackendError::new(
            BackendErrorKind::InvalidArgument,
            t.name,
            "tensor has no data",
        )
    })?;
    let (mem, off) = resolve(d, t.name, t.nbytes())?;
    let mut bytes = lock(&mem.bytes);
    for (o, v) in elem_offsets(t).zip(vals) {
        let o = off + o;
        bytes[o..o + 4].copy_from_slice(&v.to_le_bytes());
    }
    Ok(())
}

fn broadcast_index(a: &Tensor, b: &Tensor) -> Vec<usize> {
    let mut idx = Vec::with_capacity(a.nelements());
    for i3 in 0..a.ne[3] {
        for i2 in 0..a.ne[2] {
            for i1 in 0..a.ne[1] {
                for i0 in 0..a.ne[0] {
                    let j = [i0 % b.ne[0], i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]];
                    idx.push(j[0] + b.ne[0] * (j[1] + b.ne[1] * (j[2] + b.ne[2] * j[3])));
                }
            }
        }
    }
    idx
}

fn run_node(node: &Tensor, srcs: &[Option<Tensor>; 4]) -> BackendResult<()> {
    let src = |i: usize| {
        srcs[i].ok_or_else(|| {
            BackendError::new(
                BackendErrorKind::InvalidArgument,
                node.name,
                "missing source",
            )
        })
    };
    let out = match node.op {
        Op::Add | Op::Mul => {
            let (a, b) = (src(0)?, src(1)?);
            let (va, vb) = (read_f32(&a)?, read_f32(&b)?);
            let idx = broadcast_index(&a, &b);
            va.iter()
                .zip(idx)
                .map(|(x, j)| {
                    if node.op == Op::Add {
                        x + vb[j]
                    } else {
                        x * vb[j]
                    }
                })
                .collect()
        }
        Op::Scale { scale } => read_f32(&src(0)?)?.iter().map(|x| x * scale).collect(),
        Op::Cpy | Op::Cont => read_f32(&src(0)?)?,
        _ => return Ok(()),
    };
    write_f32(node, &out)
}

fn supported(opts: &TestBackendOptions, tensors: &[Tensor], node: TensorId) -> bool {
    let Some(t) = tensors.get(node.index()) else {
        return false;
    };
    if t.op.is_view() || t.op == Op::None {
        return true;
    }
    if opts.unsupported.contains(&t.op.name()) {
        return false;
    }
    let f32_ok = |id: &Option<TensorId>| {
        id.is_none_or(|s| {
            tensors
                .get(s.index())
                .is_some_and(|st| st.dtype == DType::F32)
        })
    };
    matches!(
        t.op,
        Op::Add | Op::Mul | Op::Scale { .. } | Op::Cpy | Op::Cont
    ) && t.dtype == DType::F32
        && t.src.iter().all(f32_ok)
}

impl TestBackend {
    /// A backend with `opts`, its worker thread started.
    pub fn new(opts: TestBackendOptions) -> Arc<TestBackend> {
        let shared = Arc::new(Shared {
            name: Name::new(&opts.name),
            domain: MemoryDomain::fresh(),
            opts,
            buffers: Mutex::new(HashMap::new()),
            next_buf: AtomicU32::new(0),
            events: Mutex::new(HashMap::new()),
            next_event: AtomicU32::new(0),
            error: Mutex::new(None),
            computes: AtomicUsize::new(0),
        });
        let (tx, rx) = channel::<Job>();
        let sh = shared.clone();
        let worker = std::thread::spawn(move || {
            let mut rng = sh.opts.delay_seed.map(|s| s ^ 0x9e37_79b9_7f4a_7c15 | 1);
            while let Ok(job) = rx.recv() {
                if let Some(x) = rng.as_mut() {
                    *x ^= *x << 13;
                    *x ^= *x >> 7;
                    *x ^= *x << 17;
                    let us = *x % (sh.opts.max_delay_us + 1);
                    if us > 0 {
                        std::thread::sleep(Duration::from_micros(us));
                    }
                }
                if let Err(e) = job() {
                    lock(&sh.error).get_or_insert(e);
                }
            }
        });
        Arc::new(TestBackend {
            shared,
            tx: Mutex::new(Some(tx)),
            worker: Mutex::new(Some(worker)),
        })
    }

    /// `n` backends named `test0..`, each with `f(i, options)` applied to the defaults.
    pub fn many(
        n: usize,
        mut f: impl FnMut(usize, &mut TestBackendOptions),
    ) -> Vec<Arc<TestBackend>> {
        (0..n)
            .map(|i| {
                let mut o = TestBackendOptions::new(&format!("test{i}"));
                f(i, &mut o);
                TestBackend::new(o)
            })
            .collect()
    }

    /// Buffers allocated and not freed.
    pub fn live_buffers(&self) -> usize {
        lock(&self.shared.buffers).len()
    }

    /// Events created and not freed.
    pub fn live_events(&self) -> usize {
        lock(&self.shared.events).len()
    }

    fn enqueue(&self, job: Job) -> BackendResult<()> {
        match lock(&self.tx).as_ref() {
            Some(tx) => tx.send(job).map_err(|_| {
                self.shared
                    .err(BackendErrorKind::Unavailable, "worker stopped")
            }),
            None => Err(self
                .shared
                .err(BackendErrorKind::Unavailable, "backend shut down")),
        }
    }

    fn drain(&self) -> BackendResult<()> {
        let gate = Arc::new(EventState::default());
        let t = gate.record();
        let g = gate.clone();
        self.enqueue(Box::new(move || {
            g.complete(t);
            Ok(())
        }))?;
        gate.wait_for(t);
        Ok(())
    }

    /// The copy of `src` (in `sb`'s memory) to `dst` (in `db`'s) as a job for a queue,
    /// once both are found to have data of the same size; `self` reports what is wrong.
    fn copy_job(
        &self,
        sb: &TestBackend,
        src: &Tensor,
        db: &TestBackend,
        dst: &Tensor,
    ) -> BackendResult<impl FnOnce() + Send + 'static> {
        let n = src.nbytes();
        if dst.nbytes() != n {
            return Err(self.shared.err(
                BackendErrorKind::InvalidArgument,
                "copy between tensors of different sizes",
            ));
        }
        let missing = || {
            self.shared.err(
                BackendErrorKind::InvalidArgument,
                "copy of a tensor without data",
            )
        };
        let (smem, soff) = sb.own_mem(src.data.ok_or_else(missing)?, src.name, n)?;
        let (dmem, doff) = db.own_mem(dst.data.ok_or_else(missing)?, dst.name, n)?;
        Ok(move || {
            let bytes = lock(&smem.bytes)[soff..soff + n].to_vec();
            lock(&dmem.bytes)[doff..doff + n].copy_from_slice(&bytes);
        })
    }

    fn own_mem(&self, d: DataRef, name: Name, len: usize) -> BackendResult<(Arc<Mem>, usize)> {
        if d.buffer.domain != self.shared.domain {
            return Err(self.shared.err(
                BackendErrorKind::InvalidArgument,
                "tensor is not in this backend's memory",
            ));
        }
        resolve(d, name, len)
    }
}

impl Drop for TestBackend {
    fn drop(&mut self) {
        lock(&self.tx).take();
        if let Some(w) = lock(&self.worker).take() {
            let _ = w.join();
        }
        let mut reg = lock(registry());
        for (i, _) in lock(&self.shared.buffers).drain() {
            reg.remove(&BufferId {
                domain: self.shared.domain,
                index: i,
            });
        }
    }
}

impl Backend for TestBackend {
    fn name(&self) -> Name {
        self.shared.name
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Other
    }

    fn caps(&self) -> BackendCaps {
        BackendCaps {
            async_compute: true,
            events: self.shared.opts.events,
            copy_queue: self.shared.opts.copy_queue,
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn domain(&self) -> MemoryDomain {
        self.shared.domain
    }

    fn alignment(&self) -> usize {
        32
    }

    fn supports_domain(&self, domain: MemoryDomain) -> bool {
        domain == self.shared.domain
    }

    fn alloc_buffer(&self, size: usize) -> BackendResult<BufferInfo> {
        let index = self.shared.next_buf.fetch_add(1, Ordering::Relaxed);
        let id = BufferId {
            domain: self.shared.domain,
            index,
        };
        let base = ((self.shared.domain.0 as u64) << 44) | ((index as u64 + 1) << 30);
        let mem = Arc::new(Mem {
            base,
            bytes: Mutex::new(vec![0u8; size]),
        });
        lock(&self.shared.buffers).insert(index, mem.clone());
        lock(registry()).insert(id, mem);
        Ok(BufferInfo { id, base, size })
    }

    fn free_buffer(&self, buffer: BufferId) -> BackendResult<()> {
        if buffer.domain != self.shared.domain
            || lock(&self.shared.buffers).remove(&buffer.index).is_none()
        {
            return Err(self.shared.err(
                BackendErrorKind::InvalidArgument,
                "not a buffer of this backend",
            ));
        }
        lock(registry()).remove(&buffer);
        Ok(())
    }

    fn buffer_set(&self, buffer: BufferId, offset: usize, data: &[u8]) -> BackendResult<()> {
        let mem = lock(&self.shared.buffers).get(&buffer.index).cloned();
        let mem = mem.ok_or_else(|| {
            self.shared
                .err(BackendErrorKind::InvalidArgument, "unknown buffer")
        })?;
        let mut b = lock(&mem.bytes);
        let end = offset + data.len();
        if end > b.len() {
            return Err(self
                .shared
                .err(BackendErrorKind::InvalidArgument, "write past buffer end"));
        }
        b[offset..end].copy_from_slice(data);
        Ok(())
    }

    fn buffer_get(&self, buffer: BufferId, offset: usize, out: &mut [u8]) -> BackendResult<()> {
        let mem = lock(&self.shared.buffers).get(&buffer.index).cloned();
        let mem = mem.ok_or_else(|| {
            self.shared
                .err(BackendErrorKind::InvalidArgument, "unknown buffer")
        })?;
        let b = lock(&mem.bytes);
        let end = offset + out.len();
        if end > b.len() {
            return Err(self
                .shared
                .err(BackendErrorKind::InvalidArgument, "read past buffer end"));
        }
        out.copy_from_slice(&b[offset..end]);
        Ok(())
    }

    fn buffer_clear(&self, buffer: BufferId, value: u8) -> BackendResult<()> {
        let mem = lock(&self.shared.buffers).get(&buffer.index).cloned();
        let mem = mem.ok_or_else(|| {
            self.shared
                .err(BackendErrorKind::InvalidArgument, "unknown buffer")
        })?;
        lock(&mem.bytes).fill(value);
        Ok(())
    }

    fn supports_op(&self, tensors: &[Tensor], node: TensorId) -> bool {
        supported(&self.shared.opts, tensors, node)
    }

    fn set_tensor_async(&self, tensor: &Tensor, offset: usize, data: &[u8]) -> BackendResult<()> {
        let d = tensor.data.ok_or_else(|| {
            self.shared
                .err(BackendErrorKind::InvalidArgument, "tensor has no data")
        })?;
        let (mem, off) = self.own_mem(d, tensor.name, offset + data.len())?;
        let data = data.to_vec();
        self.enqueue(Box::new(move || {
            let o = off + offset;
            lock(&mem.bytes)[o..o + data.len()].copy_from_slice(&data);
            Ok(())
        }))
    }

    fn get_tensor(&self, tensor: &Tensor, offset: usize, out: &mut [u8]) -> BackendResult<()> {
        let d = tensor.data.ok_or_else(|| {
            self.shared
                .err(BackendErrorKind::InvalidArgument, "tensor has no data")
        })?;
        let (mem, off) = self.own_mem(d, tensor.name, offset + out.len())?;
        self.drain()?;
        let o = off + offset;
        out.copy_from_slice(&lock(&mem.bytes)[o..o + out.len()]);
        Ok(())
    }

    fn cpy_tensor_async(
        &self,
        src_backend: &dyn Backend,
        src: &Tensor,
        dst: &Tensor,
    ) -> BackendResult<bool> {
        let Some(sb) = src_backend.as_any().downcast_ref::<TestBackend>() else {
            return Ok(false);
        };
        if !self.shared.opts.async_copy {
            return Ok(false);
        }
        let job = self.copy_job(sb, src, self, dst)?;
        match self.shared.opts.copy_queue {
            CopyQueue::Destination => self.enqueue(Box::new(move || {
                job();
                Ok(())
            }))?,
            CopyQueue::Source => {
                let gate = Arc::new(EventState::default());
                let t = gate.record();
                let g = gate.clone();
                sb.enqueue(Box::new(move || {
                    job();
                    g.complete(t);
                    Ok(())
                }))?;
                self.enqueue(Box::new(move || {
                    gate.wait_for(t);
                    Ok(())
                }))?;
            }
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
        let (Some(sb), Some(db)) = (
            src_backend.as_any().downcast_ref::<TestBackend>(),
            dst_backend.as_any().downcast_ref::<TestBackend>(),
        ) else {
            return Ok(false);
        };
        let job = self.copy_job(sb, src, db, dst)?;
        self.enqueue(Box::new(move || {
            job();
            Ok(())
        }))?;
        Ok(true)
    }

    fn graph_compute(&self, tensors: &[Tensor], nodes: &[TensorId]) -> BackendResult<()> {
        let count = self.shared.computes.fetch_add(1, Ordering::Relaxed);
        if self.shared.opts.fail == Some(FailMode::EnqueueCompute { nth: count }) {
            return Err(self
                .shared
                .err(BackendErrorKind::Device, "injected enqueue failure")
                .with_code(count as i64));
        }
        let mut work = Vec::with_capacity(nodes.len());
        for &n in nodes {
            let t = tensors.get(n.index()).ok_or_else(|| {
                self.shared
                    .err(BackendErrorKind::InvalidArgument, "node id out of range")
            })?;
            if !supported(&self.shared.opts, tensors, n) {
                return Err(self
                    .shared
                    .err(BackendErrorKind::UnsupportedOp, "op not supported")
                    .at(t.op.name(), t.name));
            }
            let mut srcs = [None; 4];
            for (s, id) in srcs.iter_mut().zip(t.src) {
                *s = id.and_then(|i| tensors.get(i.index()).copied());
            }
            work.push((*t, srcs));
        }
        let fail = self.shared.opts.fail == Some(FailMode::RuntimeCompute { nth: count });
        let name = self.shared.name;
        self.enqueue(Box::new(move || {
            if fail {
                return Err(BackendError::new(
                    BackendErrorKind::BadData,
                    name,
                    "injected kernel failure",
                ));
            }
            for (t, srcs) in &work {
                run_node(t, srcs)?;
            }
            Ok(())
        }))
    }

    fn synchronize(&self) -> BackendResult<()> {
        self.drain()?;
        match lock(&self.shared.error).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn event_new(&self) -> BackendResult<Option<EventId>> {
        if !self.shared.opts.events {
            return Ok(None);
        }
        let id = self.shared.next_event.fetch_add(1, Ordering::Relaxed);
        lock(&self.shared.events).insert(id, Arc::new(EventState::default()));
        Ok(Some(EventId(id)))
    }

    fn event_free(&self, event: EventId) -> BackendResult<()> {
        lock(&self.shared.events)
            .remove(&event.0)
            .map(|_| ())
            .ok_or_else(|| {
                self.shared
                    .err(BackendErrorKind::InvalidArgument, "unknown event")
            })
    }

    fn event_record(&self, event: EventId) -> BackendResult<()> {
        let ev = lock(&self.shared.events).get(&event.0).cloned();
        let ev = ev.ok_or_else(|| {
            self.shared
                .err(BackendErrorKind::InvalidArgument, "unknown event")
        })?;
        let t = ev.record();
        self.enqueue(Box::new(move || {
            ev.complete(t);
            Ok(())
        }))
    }

    fn event_wait(&self, event: EventRef<'_>) -> BackendResult<()> {
        if !self.can_wait_on(event.owner) {
            return Err(self
                .shared
                .err(BackendErrorKind::ForeignEvent, "cannot wait on this event"));
        }
        let owner = event
            .owner
            .as_any()
            .downcast_ref::<TestBackend>()
            .ok_or_else(|| {
                self.shared.err(
                    BackendErrorKind::ForeignEvent,
                    "event of another backend kind",
                )
            })?;
        let ev = lock(&owner.shared.events).get(&event.id.0).cloned();
        let ev = ev.ok_or_else(|| {
            self.shared
                .err(BackendErrorKind::InvalidArgument, "unknown event")
        })?;
        let t = ev.target();
        self.enqueue(Box::new(move || {
            ev.wait_for(t);
            Ok(())
        }))
    }

    fn can_wait_on(&self, owner: &dyn Backend) -> bool {
        match owner.as_any().downcast_ref::<TestBackend>() {
            Some(o) => {
                self.shared.opts.events
                    && o.shared.opts.events
                    && (Arc::ptr_eq(&o.shared, &self.shared) || self.shared.opts.foreign_waits)
            }
            None => false,
        }
    }

    fn event_synchronize(&self, event: EventId) -> BackendResult<()> {
        let ev = lock(&self.shared.events).get(&event.0).cloned();
        let ev = ev.ok_or_else(|| {
            self.shared
                .err(BackendErrorKind::InvalidArgument, "unknown event")
        })?;
        ev.wait_for(ev.target());
        Ok(())
    }
}

/// Options of a [`SimBackend`].
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Backend name.
    pub name: String,
    /// Queue its copies run on.
    pub copy_queue: CopyQueue,
    /// Whether it has events.
    pub events: bool,
    /// Whether its queue can wait on other sim backends' events.
    pub foreign_waits: bool,
    /// ggml names of ops it refuses.
    pub unsupported: Vec<&'static str>,
    /// Whether `buffer_prefetch` keeps a host copy (as a GPU's pinned readback).
    pub prefetch: bool,
    /// Whether `offload_op` asks for every node (as a GPU for large batches).
    pub offload: bool,
    /// Whether a freed buffer's id and address go to the next allocation it fits (as a
    /// caching allocator hands them out again).
    pub reuse_freed: bool,
    /// Whether `fused_runs` reports every node list of two or more as one fused run.
    pub fuse_runs: bool,
}

impl SimOptions {
    /// Defaults: copies on the destination queue, events, foreign waits, every op.
    pub fn new(name: &str) -> SimOptions {
        SimOptions {
            name: name.to_string(),
            copy_queue: CopyQueue::Destination,
            events: true,
            foreign_waits: true,
            unsupported: Vec::new(),
            prefetch: false,
            offload: false,
            reuse_freed: false,
            fuse_runs: false,
        }
    }
}

/// A backend that runs nothing: every call succeeds at once (reads return zeros). With
/// [`crate::CheckedBackend`] it checks plans by their enqueue order alone.
pub struct SimBackend {
    opts: SimOptions,
    name: Name,
    domain: MemoryDomain,
    next_buf: AtomicU32,
    next_event: AtomicU32,
    /// With `reuse_freed`: buffers allocated and not freed, and freed ones.
    live: Mutex<Vec<BufferInfo>>,
    freed: Mutex<Vec<BufferInfo>>,
}

impl std::fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimBackend")
            .field("name", &self.opts.name)
            .finish_non_exhaustive()
    }
}

impl SimBackend {
    /// A simulated backend with `opts` in a fresh memory domain.
    pub fn new(opts: SimOptions) -> Arc<SimBackend> {
        Arc::new(SimBackend {
            name: Name::new(&opts.name),
            opts,
            domain: MemoryDomain::fresh(),
            next_buf: AtomicU32::new(0),
            next_event: AtomicU32::new(0),
            live: Mutex::new(Vec::new()),
            freed: Mutex::new(Vec::new()),
        })
    }
}

impl SimBackend {
    fn new_buffer(&self, size: usize) -> BufferInfo {
        let index = self.next_buf.fetch_add(1, Ordering::Relaxed);
        BufferInfo {
            id: BufferId {
                domain: self.domain,
                index,
            },
            base: (index as u64 + 1) << 32,
            size,
        }
    }
}

impl Backend for SimBackend {
    fn name(&self) -> Name {
        self.name
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Other
    }

    fn caps(&self) -> BackendCaps {
        BackendCaps {
            async_compute: true,
            events: self.opts.events,
            copy_queue: self.opts.copy_queue,
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn domain(&self) -> MemoryDomain {
        self.domain
    }

    fn alignment(&self) -> usize {
        64
    }

    fn supports_domain(&self, domain: MemoryDomain) -> bool {
        domain == self.domain
    }

    fn alloc_buffer(&self, size: usize) -> BackendResult<BufferInfo> {
        if !self.opts.reuse_freed {
            return Ok(self.new_buffer(size));
        }
        let reused = {
            let mut freed = lock(&self.freed);
            let fits = freed.iter().position(|b| b.size >= size);
            fits.map(|i| freed.swap_remove(i))
        };
        let info = reused.unwrap_or_else(|| self.new_buffer(size));
        lock(&self.live).push(info);
        Ok(info)
    }

    fn free_buffer(&self, buffer: BufferId) -> BackendResult<()> {
        if self.opts.reuse_freed {
            let mut live = lock(&self.live);
            if let Some(i) = live.iter().position(|b| b.id == buffer) {
                lock(&self.freed).push(live.swap_remove(i));
            }
        }
        Ok(())
    }

    fn buffer_set(&self, _buffer: BufferId, _offset: usize, _data: &[u8]) -> BackendResult<()> {
        Ok(())
    }

    fn buffer_get(&self, _buffer: BufferId, _offset: usize, out: &mut [u8]) -> BackendResult<()> {
        out.fill(0);
        Ok(())
    }

    fn buffer_clear(&self, _buffer: BufferId, _value: u8) -> BackendResult<()> {
        Ok(())
    }

    fn buffer_prefetch(
        &self,
        _buffer: BufferId,
        _offset: usize,
        _len: usize,
    ) -> BackendResult<bool> {
        Ok(self.opts.prefetch)
    }

    fn offload_op(&self, _tensors: &[Tensor], _node: TensorId) -> bool {
        self.opts.offload
    }

    fn fused_runs(
        &self,
        _tensors: &[Tensor],
        nodes: &[TensorId],
        found: &mut dyn FnMut(usize, usize),
    ) {
        if self.opts.fuse_runs && nodes.len() >= 2 {
            found(0, nodes.len());
        }
    }

    fn supports_op(&self, tensors: &[Tensor], node: TensorId) -> bool {
        tensors
            .get(node.index())
            .is_some_and(|t| !self.opts.unsupported.contains(&t.op.name()))
    }

    fn set_tensor_async(
        &self,
        _tensor: &Tensor,
        _offset: usize,
        _data: &[u8],
    ) -> BackendResult<()> {
        Ok(())
    }

    fn get_tensor(&self, _tensor: &Tensor, _offset: usize, out: &mut [u8]) -> BackendResult<()> {
        out.fill(0);
        Ok(())
    }

    fn cpy_tensor_async(
        &self,
        src_backend: &dyn Backend,
        _src: &Tensor,
        _dst: &Tensor,
    ) -> BackendResult<bool> {
        Ok(src_backend.as_any().is::<SimBackend>())
    }

    fn engine_cpy_tensor_async(
        &self,
        src_backend: &dyn Backend,
        _src: &Tensor,
        dst_backend: &dyn Backend,
        _dst: &Tensor,
    ) -> BackendResult<bool> {
        Ok(src_backend.as_any().is::<SimBackend>() && dst_backend.as_any().is::<SimBackend>())
    }

    fn graph_compute(&self, _tensors: &[Tensor], _nodes: &[TensorId]) -> BackendResult<()> {
        Ok(())
    }

    fn synchronize(&self) -> BackendResult<()> {
        Ok(())
    }

    fn event_new(&self) -> BackendResult<Option<EventId>> {
        if !self.opts.events {
            return Ok(None);
        }
        Ok(Some(EventId(
            self.next_event.fetch_add(1, Ordering::Relaxed),
        )))
    }

    fn event_free(&self, _event: EventId) -> BackendResult<()> {
        Ok(())
    }

    fn event_record(&self, _event: EventId) -> BackendResult<()> {
        Ok(())
    }

    fn event_wait(&self, event: EventRef<'_>) -> BackendResult<()> {
        if self.can_wait_on(event.owner) {
            Ok(())
        } else {
            Err(BackendError::new(
                BackendErrorKind::ForeignEvent,
                self.name,
                "cannot wait on this event",
            ))
        }
    }

    fn can_wait_on(&self, owner: &dyn Backend) -> bool {
        match owner.as_any().downcast_ref::<SimBackend>() {
            Some(o) => {
                self.opts.events
                    && o.opts.events
                    && (std::ptr::eq(o, self) || self.opts.foreign_waits)
            }
            None => false,
        }
    }

    fn event_synchronize(&self, _event: EventId) -> BackendResult<()> {
        Ok(())
    }
}
