//! The state the driver shares with its stream workers: device memories, each device
//! context's sticky error and peer settings, pinned memory, fault reports, counters and
//! the chaos setting.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::chaos::ChaosControl;
use super::config::SimConfig;
use super::inject::Armed;
use super::lock;
use super::memory::{device_of, Allocation, DeviceMemory};
use super::pinned::PinnedHeap;
use super::stream::StreamShared;
use crate::error::CuError;
use crate::fault::KernelFault;
use crate::mem::MemError;

/// One device's primary context.
pub(crate) struct Context {
    /// Set once the sticky error is.
    poisoned: AtomicBool,
    sticky: Mutex<Option<CuError>>,
    /// `peers[d]`: this context enabled access to device `d`'s memory.
    peers: Mutex<Vec<bool>>,
    /// The legacy NULL stream.
    pub(crate) legacy: Arc<StreamShared>,
    /// The blocking streams (created without `CU_STREAM_NON_BLOCKING`): the legacy
    /// stream orders against them.
    pub(crate) blocking: Mutex<Vec<Arc<StreamShared>>>,
    /// Users that retained the primary context.
    pub(crate) retained: Mutex<usize>,
    /// Bytes that resets freed because they were still allocated.
    pub(crate) reclaimed: AtomicU64,
}

impl Context {
    pub(crate) fn new(devices: usize, legacy: Arc<StreamShared>) -> Context {
        Context {
            poisoned: AtomicBool::new(false),
            sticky: Mutex::new(None),
            peers: Mutex::new(vec![false; devices]),
            legacy,
            blocking: Mutex::new(Vec::new()),
            retained: Mutex::new(0),
            reclaimed: AtomicU64::new(0),
        }
    }

    /// Back to a fresh context's state: no sticky error, no peer access.
    pub(crate) fn clear(&self) {
        let mut s = lock(&self.sticky);
        *s = None;
        self.poisoned.store(false, Ordering::Release);
        drop(s);
        lock(&self.peers).iter_mut().for_each(|p| *p = false);
    }

    /// Enables access to `peer`'s memory; false if it already was.
    pub(crate) fn enable_peer(&self, peer: usize) -> bool {
        let mut peers = lock(&self.peers);
        !std::mem::replace(&mut peers[peer], true)
    }

    pub(crate) fn peers(&self) -> Vec<bool> {
        lock(&self.peers).clone()
    }
}

/// What the driver and its workers share.
pub(crate) struct Shared {
    pub(crate) cfg: SimConfig,
    pub(crate) memories: Vec<DeviceMemory>,
    pub(crate) contexts: Vec<Context>,
    pub(crate) pinned: PinnedHeap,
    pub(crate) faults: Mutex<Vec<KernelFault>>,
    /// Armed injections, in the order they were armed.
    pub(crate) injected: Mutex<Vec<Armed>>,
    pub(crate) warp_instructions: AtomicU64,
    /// Kernel launches executed (interpreted or, without interpretation, checked).
    pub(crate) launches: AtomicU64,
    pub(crate) chaos: ChaosControl,
    pub(crate) profile: super::profile::ProfileState,
}

impl Shared {
    /// The sticky error of device `dev`'s context, if it is poisoned.
    pub(crate) fn sticky(&self, dev: usize) -> Option<CuError> {
        let c = &self.contexts[dev];
        if !c.poisoned.load(Ordering::Acquire) {
            return None;
        }
        lock(&c.sticky).clone()
    }

    /// Poisons device `dev`'s context with `e` (the first error stays).
    pub(crate) fn poison(&self, dev: usize, e: CuError) {
        let c = &self.contexts[dev];
        let mut s = lock(&c.sticky);
        if s.is_none() {
            *s = Some(e);
            c.poisoned.store(true, Ordering::Release);
        }
    }

    /// Records a kernel (or copy) fault on device `dev`: printed once, kept in the
    /// reports, and the context poisoned with its error.
    pub(crate) fn report_fault(&self, dev: usize, f: KernelFault) {
        eprintln!("cuda-sim: device {dev}: {f}");
        let e = f.to_cu_error();
        lock(&self.faults).push(f);
        self.poison(dev, e);
    }

    /// The live allocation holding all of `[addr, addr + len)`, on any device.
    pub(crate) fn lookup(&self, addr: u64, len: u64) -> Result<Arc<Allocation>, MemError> {
        match device_of(addr).and_then(|d| self.memories.get(d)) {
            Some(m) => m.lookup(addr, len),
            None => Err(MemError::OutOfBounds),
        }
    }
}
