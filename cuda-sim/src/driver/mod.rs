//! The emulated CUDA driver: what code written against the driver API needs, with the
//! real driver's documented semantics, so that its ordering bugs show up on any
//! machine.
//!
//! - Devices ([`SimConfig::devices`]) have separate memory; addresses are unique across
//!   devices and never reused, so a use after free is recognised.
//! - Every stream has a worker thread running its operations in order; streams really
//!   run concurrently. The legacy NULL stream of each context orders against the
//!   context's blocking streams, not against non-blocking ones.
//! - Events capture a stream's position; waits on them order streams, of any devices.
//! - A kernel fault poisons its device's context: the error is sticky, as on a GPU,
//!   until the context is reset (by its last user's release, or on request).
//! - Injected errors ([`Driver::inject_error`]): the errors a GPU returns on its own, on
//!   request, at a chosen point.
//! - Chaos ([`Driver::set_chaos`]): seeded random delays before stream operations make
//!   missing synchronisation visible as wrong results.
//!
//! Handles are ids, unique across kinds and never reused. Nothing here panics on bad
//! input: bad handles, ordinals and ranges are errors with the real driver's codes.

mod chaos;
mod config;
mod event;
mod graph;
mod inject;
mod memory;
mod module;
mod ops;
mod order;
mod pinned;
mod primary;
mod profile;
mod shared;
mod stream;
mod transfer;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub use chaos::MAX_DELAY_US;
pub use config::{
    default_threads, parse_checks, parse_size, SimConfig, DEFAULT_DEVICES, DEFAULT_MEMORY,
    MAX_DEVICES,
};
pub use graph::{CaptureMode, CaptureStatus, GraphExecHandle, GraphHandle};
pub use inject::InjectedError;
pub use memory::{device_of, ADDRESS_BASE, ALLOC_ALIGN, RED_ZONE, WINDOW_SHIFT};
pub use module::{
    DEFAULT_MAX_DYNAMIC_SHARED, MAX_BLOCK_DIM, MAX_GRID_DIM, MAX_SHARED_PER_BLOCK,
    MAX_THREADS_PER_BLOCK,
};
pub use pinned::PINNED_ALIGN;
pub use profile::{LaunchRecord, ProfileConfig};

use crate::error::{CuError, ErrorCode};
use crate::fault::KernelFault;
use chaos::ChaosControl;
use event::EventShared;
use memory::DeviceMemory;
use module::{LoadedFunction, LoadedModule};
use pinned::PinnedHeap;
use shared::{Context, Shared};
use stream::{StreamKind, StreamShared};

/// The CUDA version the emulated driver reports (`cuDriverGetVersion`): 13.0, as
/// driver 580.
pub const DRIVER_VERSION: i32 = 13000;
/// The compute capability of the emulated devices unless configured otherwise (sm_80;
/// see [`SimConfig::compute_capability`]).
pub const COMPUTE_CAPABILITY: (i32, i32) = (8, 0);

macro_rules! handle {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub struct $name(pub u64);
    )*};
}

handle!(
    /// A stream (`CUstream`): a worker executing its operations in order.
    StreamHandle,
    /// An event (`CUevent`), without timing.
    EventHandle,
    /// A loaded PTX module (`CUmodule`).
    ModuleHandle,
    /// A kernel of a module (`CUfunction`).
    FunctionHandle,
);

/// Locks a mutex, ignoring poisoning (the driver's state stays consistent across a
/// panic of a caller's thread: every critical section is a few plain updates).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// The emulated driver: devices, their contexts, memory, streams, events and modules.
/// Dropping it (the last `Arc`) waits for every stream's queued work and joins the
/// workers.
pub struct Driver {
    shared: Arc<Shared>,
    /// Every stream, the legacy NULL streams included.
    streams: RwLock<HashMap<u64, Arc<StreamShared>>>,
    events: RwLock<HashMap<u64, Arc<EventShared>>>,
    modules: RwLock<HashMap<u64, Arc<LoadedModule>>>,
    functions: RwLock<HashMap<u64, Arc<LoadedFunction>>>,
    graphs: graph::Graphs,
    next_handle: AtomicU64,
}

/// The process-wide driver of [`Driver::global`].
static GLOBAL: Mutex<Option<Arc<Driver>>> = Mutex::new(None);

impl Driver {
    /// A driver emulating what `cfg` describes (at most [`MAX_DEVICES`] devices: more
    /// are cut to that), its legacy streams' workers started.
    ///
    /// # Panics
    /// If the host cannot start a thread.
    pub fn new(mut cfg: SimConfig) -> Arc<Driver> {
        cfg.devices = cfg.devices.min(MAX_DEVICES);
        let n = cfg.devices;
        let mut next = 1;
        let legacy: Vec<Arc<StreamShared>> = (0..n)
            .map(|d| {
                let st = StreamShared::new(next, d, StreamKind::Legacy);
                next += 1;
                st
            })
            .collect();
        let shared = Arc::new(Shared {
            memories: (0..n)
                .map(|d| DeviceMemory::new(d, cfg.memory_per_device, cfg.checks.initcheck))
                .collect(),
            contexts: legacy
                .iter()
                .map(|st| Context::new(n, Arc::clone(st)))
                .collect(),
            pinned: PinnedHeap::new(),
            faults: Mutex::new(Vec::new()),
            injected: Mutex::new(Vec::new()),
            warp_instructions: AtomicU64::new(0),
            launches: AtomicU64::new(0),
            chaos: ChaosControl::new(cfg.chaos_seed),
            profile: profile::ProfileState::new(n),
            cfg,
        });
        for st in &legacy {
            if let Err(e) = st.start(Arc::clone(&shared)) {
                panic!("cuda-sim: {e}");
            }
        }
        Arc::new(Driver {
            shared,
            streams: RwLock::new(legacy.into_iter().map(|st| (st.id, st)).collect()),
            events: RwLock::new(Default::default()),
            modules: RwLock::new(Default::default()),
            functions: RwLock::new(Default::default()),
            graphs: Default::default(),
            next_handle: AtomicU64::new(next),
        })
    }

    /// The process-wide driver: the one [`configure_global`](Driver::configure_global)
    /// made, else one made now from [`SimConfig::from_env`]. A bad `CUDA_SIM_*`
    /// variable is `CUDA_ERROR_INVALID_VALUE` naming it (and nothing is created).
    pub fn global() -> Result<Arc<Driver>, CuError> {
        let mut g = lock(&GLOBAL);
        if let Some(d) = &*g {
            return Ok(Arc::clone(d));
        }
        let cfg = SimConfig::from_env().map_err(|m| CuError::new(ErrorCode::InvalidValue, m))?;
        let d = Driver::new(cfg);
        *g = Some(Arc::clone(&d));
        Ok(d)
    }

    /// Creates the process-wide driver with `cfg` instead of the environment's
    /// configuration. Once it exists, the same configuration is accepted again and a
    /// different one is `CUDA_ERROR_INVALID_VALUE`.
    pub fn configure_global(cfg: SimConfig) -> Result<(), CuError> {
        let mut g = lock(&GLOBAL);
        match &*g {
            Some(d) if d.shared.cfg == cfg => Ok(()),
            Some(d) => Err(CuError::new(
                ErrorCode::InvalidValue,
                format!(
                    "cuda-sim's global driver is already initialised with {:?}",
                    d.shared.cfg
                ),
            )),
            None => {
                *g = Some(Driver::new(cfg));
                Ok(())
            }
        }
    }

    /// The configuration, with the chaos seed currently in effect.
    pub fn config(&self) -> SimConfig {
        SimConfig {
            chaos_seed: self.shared.chaos.seed(),
            ..self.shared.cfg.clone()
        }
    }

    /// Sets (or, with `None`, stops) the chaos delays of every stream, from their next
    /// operation on.
    pub fn set_chaos(&self, seed: Option<u64>) {
        self.shared.chaos.set(seed);
    }

    /// The CUDA version, as `cuDriverGetVersion` reports it: 13000 (CUDA 13.0).
    pub fn version(&self) -> i32 {
        DRIVER_VERSION
    }

    /// Number of emulated devices.
    pub fn device_count(&self) -> usize {
        self.shared.memories.len()
    }

    /// `Ok` for a valid ordinal, `CUDA_ERROR_INVALID_DEVICE` otherwise.
    fn device(&self, dev: usize) -> Result<(), CuError> {
        if dev < self.device_count() {
            Ok(())
        } else {
            Err(CuError::new(
                ErrorCode::InvalidDevice,
                format!("no device {dev} ({} configured)", self.device_count()),
            ))
        }
    }

    /// A valid ordinal whose context is not poisoned.
    fn live_device(&self, dev: usize) -> Result<(), CuError> {
        self.device(dev)?;
        self.check_sticky(dev)
    }

    fn check_sticky(&self, dev: usize) -> Result<(), CuError> {
        self.shared.sticky(dev).map_or(Ok(()), Err)
    }

    fn next_id(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    /// The device's name, e.g. `cuda-sim GPU 0 (emulated sm_80)`.
    pub fn device_name(&self, dev: usize) -> Result<String, CuError> {
        self.device(dev)?;
        let (major, minor) = self.shared.cfg.compute_capability;
        Ok(format!("cuda-sim GPU {dev} (emulated sm_{major}{minor})"))
    }

    /// The compute capability: (8, 0) unless configured otherwise.
    pub fn compute_capability(&self, dev: usize) -> Result<(i32, i32), CuError> {
        self.device(dev)?;
        Ok(self.shared.cfg.compute_capability)
    }

    /// The device's memory size (the configured `memory_per_device`).
    pub fn total_memory(&self, dev: usize) -> Result<u64, CuError> {
        self.device(dev)?;
        Ok(self.shared.cfg.memory_per_device)
    }

    /// Bytes of live allocations on the device (for leak checks).
    pub fn used_memory(&self, dev: usize) -> Result<u64, CuError> {
        self.device(dev)?;
        Ok(self.shared.memories[dev].used())
    }

    /// Bytes of live pinned host memory.
    pub fn pinned_bytes(&self) -> u64 {
        self.shared.pinned.bytes()
    }

    /// Whether device `dev` can access `peer`'s memory: true for two different devices.
    pub fn can_access_peer(&self, dev: usize, peer: usize) -> Result<bool, CuError> {
        self.device(dev)?;
        self.device(peer)?;
        Ok(dev != peer)
    }

    /// Lets kernels of device `dev` access `peer`'s memory. A second time is
    /// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`; `dev == peer` is
    /// `CUDA_ERROR_INVALID_VALUE`. Copies between devices work without it.
    pub fn enable_peer_access(&self, dev: usize, peer: usize) -> Result<(), CuError> {
        self.live_device(dev)?;
        self.device(peer)?;
        if dev == peer {
            return Err(CuError::new(
                ErrorCode::InvalidValue,
                format!("device {dev} cannot enable peer access to itself"),
            ));
        }
        if self.shared.contexts[dev].enable_peer(peer) {
            Ok(())
        } else {
            Err(CuError::new(
                ErrorCode::PeerAccessAlreadyEnabled,
                format!("device {dev} already accesses device {peer}'s memory"),
            ))
        }
    }

    /// The sticky error of device `dev`'s context, if a fault poisoned it (`None` for a
    /// healthy context or a bad ordinal).
    pub fn context_error(&self, dev: usize) -> Option<CuError> {
        self.device(dev).ok()?;
        self.shared.sticky(dev)
    }

    /// Every kernel fault so far, in order (faults of the copy engine, such as a copy of
    /// freed memory, included: their `kernel` names the copy function).
    pub fn fault_reports(&self) -> Vec<KernelFault> {
        lock(&self.shared.faults).clone()
    }

    /// Warp instructions executed by all launches so far.
    pub fn warp_instructions(&self) -> u64 {
        self.shared.warp_instructions.load(Ordering::Relaxed)
    }

    /// Kernel launches executed so far by the streams (each kernel node of a replayed
    /// graph counts), interpreted or, with [`SimConfig::interpret`] off, only checked.
    pub fn launches_executed(&self) -> u64 {
        self.shared.launches.load(Ordering::Relaxed)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let streams: Vec<Arc<StreamShared>> = self
            .streams
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .map(|(_, st)| st)
            .collect();
        for st in &streams {
            st.request_shutdown();
        }
        for st in &streams {
            st.join();
        }
    }
}

// The driver is shared between threads (`Arc<Driver>`), and modules between workers.
const _: () = {
    const fn shareable<T: Send + Sync>() {}
    shareable::<Driver>();
    shareable::<crate::ptx::Module>();
};
