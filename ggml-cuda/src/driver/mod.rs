//! Everything ggml-cuda asks of a CUDA driver, behind one interface ([`Api`]) with two
//! implementations: libcuda loaded at run time through cudarc ([`libcuda`]), and the
//! emulated driver of `cuda-sim` (`sim`, cargo feature `sim`). The backend above it is the
//! same code for both.
//!
//! Per-device state (the context, the loaded PTX modules and their kernels) lives in
//! [`Device`], shared by every backend instance on that device.

pub(crate) mod counted;
pub(crate) mod libcuda;
#[cfg(feature = "sim")]
pub(crate) mod sim;

use std::cell::Cell;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::kernels::{KernelId, MODULES};
use crate::launch::{Args, LaunchDims};
use crate::qmm_variant::QmmVariant;

pub use libcuda::REQUIRED_SYMBOLS;

/// A failed driver call: what was called and the `CUresult` code (0 when the failure
/// is not a driver code, e.g. a missing library).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CuError {
    /// What failed, e.g. `"cuMemAlloc failed"`.
    pub what: &'static str,
    /// The `CUresult` value.
    pub code: i64,
}

impl CuError {
    pub(crate) fn new(what: &'static str, code: i64) -> CuError {
        CuError { what, code }
    }
}

impl std::fmt::Display for CuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.code == 0 {
            f.write_str(self.what)
        } else {
            write!(f, "{} (CUresult {})", self.what, self.code)
        }
    }
}

/// A message made at run time, kept for the life of the process so that it fits
/// [`CuError::what`]; equal texts are stored once.
pub(crate) fn intern(text: String) -> &'static str {
    static TEXTS: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut texts = TEXTS.lock().unwrap_or_else(|e| e.into_inner());
    let set = texts.get_or_insert_with(HashSet::new);
    if let Some(&t) = set.get(text.as_str()) {
        return t;
    }
    let t: &'static str = Box::leak(text.into_boxed_str());
    set.insert(t);
    t
}

/// Bumped whenever a context is released: a thread's note of its current context (see
/// [`is_current`]) is only trusted within one epoch, as a released primary context may
/// be destroyed and its handle reused.
static BIND_EPOCH: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The context this thread made current last (through [`Api::bind`]), and the epoch
    /// it did so in.
    static CURRENT: Cell<(u64, u64)> = const { Cell::new((u64::MAX, u64::MAX)) };
}

/// Whether `ctx` is the context this thread made current last, in this epoch: binding
/// it again would not change anything (this crate is the only one that makes its
/// contexts current on the threads that call it).
pub(crate) fn is_current(ctx: Ctx) -> bool {
    CURRENT.get() == (ctx.0, BIND_EPOCH.load(Ordering::Acquire))
}

/// Notes that this thread made `ctx` current.
pub(crate) fn note_current(ctx: Ctx) {
    CURRENT.set((ctx.0, BIND_EPOCH.load(Ordering::Acquire)));
}

/// Which driver a backend runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DriverKind {
    /// The NVIDIA driver (libcuda), loaded at run time: real GPUs, named `cuda:N`.
    Cuda,
    /// cuda-sim's emulated driver and PTX interpreter (cargo feature `sim`): emulated
    /// GPUs named `cuda-sim:N`, available on every machine.
    Sim,
}

impl DriverKind {
    /// The device-name prefix: `cuda` or `cuda-sim`.
    pub fn prefix(self) -> &'static str {
        match self {
            DriverKind::Cuda => "cuda",
            DriverKind::Sim => "cuda-sim",
        }
    }

    pub(crate) fn api(self) -> Result<&'static dyn Api, CuError> {
        match self {
            DriverKind::Cuda => libcuda::api(),
            #[cfg(feature = "sim")]
            DriverKind::Sim => sim::api(),
            #[cfg(not(feature = "sim"))]
            DriverKind::Sim => Err(CuError::new(
                "cuda-sim devices need ggml-cuda built with the cargo feature `sim`",
                0,
            )),
        }
    }

    /// Whether the driver can be used, or why not.
    pub fn available(self) -> Result<(), CuError> {
        self.api().map(|_| ())
    }

    /// Number of devices of this driver.
    pub fn device_count(self) -> Result<usize, CuError> {
        self.api()?.device_count()
    }

    /// The driver's CUDA version as `1000 · major + 10 · minor`.
    pub fn version(self) -> Result<i32, CuError> {
        self.api()?.version()
    }
}

/// Opaque driver handles (a pointer for libcuda, an id for cuda-sim).
macro_rules! handle {
    ($($name:ident),*) => {$(
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub(crate) struct $name(pub(crate) u64);
    )*};
}
handle!(Ctx, Stream, Event, Module, Func, Graph, GraphExec);

/// A device as opened by [`Api::open`].
pub(crate) struct Opened {
    pub ctx: Ctx,
    pub name: String,
    pub cc: (i32, i32),
}

/// What ggml-cuda asks of a driver. Calls that act on "the current context" in the
/// CUDA driver API take it explicitly here; the libcuda implementation makes it current
/// first where needed.
///
/// There are no synchronous copies or memsets here on purpose: the driver runs those on
/// the legacy NULL stream, which does not order against the non-blocking streams
/// ggml-cuda uses, so a kernel enqueued after them could overtake them. Host transfers
/// go on the backend's own stream instead (and are waited for where they must be
/// complete on return). Reads into the host go through pinned memory: a copy into
/// pageable memory is a host wait inside the driver, and cannot be captured.
pub(crate) trait Api: Send + Sync {
    fn version(&self) -> Result<i32, CuError>;
    fn device_count(&self) -> Result<usize, CuError>;
    /// Retains device `ordinal`'s primary context; `release` balances it.
    fn open(&self, ordinal: usize) -> Result<Opened, CuError>;
    fn release(&self, ordinal: usize, ctx: Ctx);
    /// Makes `ctx` current on the calling thread.
    fn bind(&self, ctx: Ctx) -> Result<(), CuError>;
    /// Enables access from `ctx` (device `ordinal`) to `peer`'s memory if the hardware
    /// allows it; whether it is on.
    fn enable_peer(&self, ctx: Ctx, ordinal: usize, peer_ctx: Ctx, peer: usize) -> bool;

    fn module_load(&self, ctx: Ctx, file: &str, ptx: &str) -> Result<Module, CuError>;
    fn module_unload(&self, m: Module);
    fn module_function(&self, m: Module, name: &str) -> Result<Func, CuError>;
    fn func_set_max_dynamic_shared(&self, f: Func, bytes: u32) -> Result<(), CuError>;
    fn launch(&self, f: Func, d: &LaunchDims, s: Stream, args: &mut Args) -> Result<(), CuError>;
    /// Tags the launches enqueued on `s` from now on (cuda-sim's profiler reports the tag
    /// with each launch, so a caller can attribute it); a real driver has no such thing
    /// and ignores it.
    fn set_launch_tag(&self, _s: Stream, _tag: Option<u64>) {}

    fn mem_alloc(&self, ctx: Ctx, size: usize) -> Result<u64, CuError>;
    fn mem_free(&self, ctx: Ctx, p: u64) -> Result<(), CuError>;
    fn mem_alloc_host(&self, ctx: Ctx, size: usize) -> Result<*mut u8, CuError>;
    fn mem_free_host(&self, ctx: Ctx, p: *mut u8) -> Result<(), CuError>;

    /// # Safety
    /// `src` must stay valid and unchanged for `len` bytes until the copy completed
    /// (pinned memory: until the stream passed it).
    unsafe fn memcpy_htod_async(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
        s: Stream,
    ) -> Result<(), CuError>;
    /// Into pinned memory from [`Api::mem_alloc_host`]: enqueued on `s`, returns at once.
    ///
    /// # Safety
    /// `dst` must be pinned memory valid for `len` bytes until the copy completed, and
    /// not be accessed before then.
    unsafe fn memcpy_dtoh_pinned_async(
        &self,
        dst: *mut u8,
        src: u64,
        len: usize,
        s: Stream,
    ) -> Result<(), CuError>;
    fn memcpy_dtod_async(&self, dst: u64, src: u64, len: usize, s: Stream) -> Result<(), CuError>;
    #[allow(clippy::too_many_arguments)]
    fn memcpy_peer_async(
        &self,
        dst: u64,
        dst_ctx: Ctx,
        src: u64,
        src_ctx: Ctx,
        len: usize,
        s: Stream,
    ) -> Result<(), CuError>;
    fn memset_d8_async(&self, dst: u64, value: u8, len: usize, s: Stream) -> Result<(), CuError>;

    /// A stream that does not order against the legacy NULL stream
    /// (`CU_STREAM_NON_BLOCKING`).
    fn stream_create(&self, ctx: Ctx) -> Result<Stream, CuError>;
    fn stream_destroy(&self, s: Stream);
    fn stream_synchronize(&self, s: Stream) -> Result<(), CuError>;
    fn stream_wait_event(&self, s: Stream, e: Event) -> Result<(), CuError>;

    /// Begins capturing `s` into a graph in thread-local mode
    /// (`CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`: the calling thread may not make
    /// potentially unsafe calls, such as allocations, until the capture ends).
    fn stream_begin_capture(&self, s: Stream) -> Result<(), CuError>;
    /// Ends the capture on `s`, returning its graph (an error, no graph, if the capture
    /// was invalidated).
    fn stream_end_capture(&self, s: Stream) -> Result<Graph, CuError>;
    fn graph_instantiate(&self, g: Graph) -> Result<GraphExec, CuError>;
    fn graph_destroy(&self, g: Graph);
    /// Launches an executable graph on `s`: its nodes run in order after everything
    /// enqueued on `s` before.
    fn graph_launch(&self, e: GraphExec, s: Stream) -> Result<(), CuError>;
    /// Destroys an executable graph; a launch still in flight completes.
    fn graph_exec_destroy(&self, e: GraphExec);

    /// An event without timing (`CU_EVENT_DISABLE_TIMING`).
    fn event_create(&self, ctx: Ctx) -> Result<Event, CuError>;
    /// An event with timing (`CU_EVENT_DEFAULT`), for [`Api::event_elapsed_ms`].
    fn event_create_timed(&self, ctx: Ctx) -> Result<Event, CuError>;
    /// Milliseconds between two completed records of timed events.
    fn event_elapsed_ms(&self, start: Event, end: Event) -> Result<f32, CuError>;
    fn event_destroy(&self, e: Event);
    fn event_record(&self, e: Event, s: Stream) -> Result<(), CuError>;
    /// `Ok(true)` when complete, `Ok(false)` while pending.
    fn event_query(&self, e: Event) -> Result<bool, CuError>;
    fn event_synchronize(&self, e: Event) -> Result<(), CuError>;
}

/// The loaded kernels of one device.
pub(crate) struct Kernels {
    funcs: Vec<Func>,
    /// Per kernel: whether its code as loaded runs `griddepcontrol.wait` (so that it may
    /// be launched with programmatic stream serialisation).
    waits: Vec<bool>,
}

impl Kernels {
    pub(crate) fn get(&self, id: KernelId) -> Func {
        self.funcs[id as usize]
    }

    /// Whether kernel `id` waits for the grid before it (`griddepcontrol.wait`): only
    /// on sm_90 and newer, where its module keeps the instruction.
    pub(crate) fn waits_for_grid(&self, id: KernelId) -> bool {
        self.waits.get(id as usize).copied().unwrap_or(false)
    }
}

/// Per-GPU state shared by every backend instance on it (virtual devices included).
pub(crate) struct Device {
    pub api: &'static dyn Api,
    pub kind: DriverKind,
    pub ordinal: usize,
    pub ctx: Ctx,
    pub name: String,
    pub cc: (i32, i32),
    pub kernels: Kernels,
    modules: Vec<Module>,
    /// The `qmm` variants loaded so far, each in a module of its own
    /// ([`Device::qmm_variant`]).
    variants: Mutex<Vec<(QmmVariant, Func, Module)>>,
    /// Device ordinals whose contexts this context has enabled peer access to (or for
    /// which that failed: `false`).
    peers: Mutex<Vec<(usize, bool)>>,
}

impl Device {
    /// The function of `qmm` variant `v`: compiled and loaded on its first use on this
    /// device, kept until the device is dropped.
    pub(crate) fn qmm_variant(&self, v: QmmVariant) -> Result<Func, CuError> {
        let mut loaded = self.variants.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, f, _)) = loaded.iter().find(|(k, _, _)| *k == v) {
            return Ok(f);
        }
        let sm = (self.cc.0 * 10 + self.cc.1) as u32;
        let module = MODULES
            .iter()
            .find(|m| m.file == "qmm.ptx")
            .ok_or_else(|| CuError::new("qmm variant: no qmm module", 0))?;
        let text = v.ptx(&cuda_sim::ptx::for_arch(module.source, sm))?;
        self.bind()?;
        let m = self.api.module_load(self.ctx, "qmm.ptx (variant)", &text)?;
        let f = match self.api.module_function(m, &v.entry()) {
            Ok(f) => f,
            Err(e) => {
                self.api.module_unload(m);
                return Err(e);
            }
        };
        loaded.push((v, f, m));
        Ok(f)
    }

    /// Makes this device's context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<(), CuError> {
        self.api.bind(self.ctx)
    }

    /// Enables access from this context to `peer`'s memory if the hardware allows it.
    /// Returns whether peer access is on. Copies work without it (staged by the driver).
    pub(crate) fn enable_peer(&self, peer: &Device) -> bool {
        if peer.ordinal == self.ordinal {
            return true;
        }
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, on)) = peers.iter().find(|(o, _)| *o == peer.ordinal) {
            return on;
        }
        let on = self
            .api
            .enable_peer(self.ctx, self.ordinal, peer.ctx, peer.ordinal);
        peers.push((peer.ordinal, on));
        on
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if self.bind().is_ok() {
            for &m in &self.modules {
                self.api.module_unload(m);
            }
            let variants = self.variants.get_mut().unwrap_or_else(|e| e.into_inner());
            for &(_, _, m) in variants.iter() {
                self.api.module_unload(m);
            }
        }
        BIND_EPOCH.fetch_add(1, Ordering::AcqRel);
        self.api.release(self.ordinal, self.ctx);
    }
}

/// The shared state of device `ordinal` of driver `kind`, created (context retained,
/// modules loaded) on first use and kept while any backend uses it.
pub(crate) fn device(kind: DriverKind, ordinal: usize) -> Result<Arc<Device>, CuError> {
    type Registry = Vec<(DriverKind, usize, Weak<Device>)>;
    static DEVICES: Mutex<Registry> = Mutex::new(Vec::new());
    let api = kind.api()?;
    let mut devices = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = devices
        .iter()
        .find(|(k, o, _)| *k == kind && *o == ordinal)
        .and_then(|(_, _, w)| w.upgrade())
    {
        return Ok(d);
    }
    let d = Arc::new(open_device(api, kind, ordinal)?);
    devices.retain(|(k, o, w)| !(*k == kind && *o == ordinal) && w.strong_count() > 0);
    devices.push((kind, ordinal, Arc::downgrade(&d)));
    Ok(d)
}

fn open_device(api: &'static dyn Api, kind: DriverKind, ordinal: usize) -> Result<Device, CuError> {
    let count = api.device_count()?;
    if ordinal >= count {
        return Err(CuError::new(
            match kind {
                DriverKind::Cuda => "no CUDA device with this ordinal",
                DriverKind::Sim => {
                    "no cuda-sim device with this ordinal (CUDA_SIM_DEVICES sets how many)"
                }
            },
            0,
        ));
    }
    let opened = api.open(ordinal)?;
    let mut device = Device {
        api,
        kind,
        ordinal,
        ctx: opened.ctx,
        name: opened.name,
        cc: opened.cc,
        kernels: Kernels {
            funcs: Vec::new(),
            waits: Vec::new(),
        },
        modules: Vec::new(),
        variants: Mutex::new(Vec::new()),
        peers: Mutex::new(Vec::new()),
    };
    if device.cc.0 < 8 {
        return Err(CuError::new(
            "GPU too old: the PTX kernels target sm_80 (Ampere) and newer",
            0,
        ));
    }
    device.bind()?;
    let sm = (device.cc.0 * 10 + device.cc.1) as u32;
    for m in MODULES {
        let source = cuda_sim::ptx::for_arch(m.source, sm);
        let module = api.module_load(device.ctx, m.file, &source)?;
        device.modules.push(module);
        for &(id, entry) in m.kernels {
            let f = api.module_function(module, entry)?;
            let idx = id as usize;
            if device.kernels.funcs.len() <= idx {
                device.kernels.funcs.resize(idx + 1, Func(0));
                device.kernels.waits.resize(idx + 1, false);
            }
            device.kernels.funcs[idx] = f;
            device.kernels.waits[idx] = crate::kernels::entry_waits_for_grid(&source, entry);
        }
    }
    Ok(device)
}
