//! The operations a stream executes, and how: copies and memsets on device memory
//! (checked again when they run: memory freed since the enqueue is a fault, as a DMA
//! to a freed page is on a GPU), and kernel launches through the interpreter.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use super::graph::Node;
use super::lock;
use super::memory::{Allocation, DeviceView};
use super::module::LoadedModule;
use super::pinned::HostPtr;
use super::shared::Shared;
use crate::error::CuError;
use crate::exec::{LaunchConfig, LaunchError};
use crate::fault::{FaultKind, KernelFault};
use crate::mem::MemError;

/// Bytes a device-to-device copy moves per step.
const COPY_CHUNK: usize = 1 << 20;

/// Where a host-to-device copy reads.
pub(crate) enum HostSrc {
    /// Bytes copied at the call (pageable source).
    Staged(Vec<u8>),
    /// Pinned memory, read when the copy executes.
    Pinned(HostPtr, usize),
}

/// Where a device-to-host copy writes.
pub(crate) enum HostDst {
    /// A buffer the caller waits on (pageable destination).
    Staged(Arc<Mutex<Vec<u8>>>),
    /// Pinned memory, written when the copy executes.
    Pinned(HostPtr),
}

/// A kernel launch, its arguments copied at the call.
#[derive(Clone)]
pub(crate) struct LaunchOp {
    pub(crate) module: Arc<LoadedModule>,
    pub(crate) kernel: String,
    pub(crate) cfg: LaunchConfig,
    pub(crate) args: Vec<Vec<u8>>,
    /// Set when profiling was on at the enqueue.
    pub(crate) stamp: Option<super::profile::LaunchStamp>,
}

/// A copy of `len` bytes from device address `src` to `dst`, on one device or between
/// peers; `api` names the call that enqueued it.
#[derive(Clone, Copy)]
pub(crate) struct DeviceCopy {
    pub dst: u64,
    pub src: u64,
    pub len: usize,
    pub api: &'static str,
}

/// `len` bytes of `value` from device address `dst`; `api` names the call that enqueued
/// it.
#[derive(Clone, Copy)]
pub(crate) struct Fill {
    pub dst: u64,
    pub value: u8,
    pub len: usize,
    pub api: &'static str,
}

/// One operation of a stream.
pub(crate) enum Op {
    /// Nothing: an event record, an event wait or a synchronisation point (what it
    /// waits for is in its dependencies).
    Marker,
    /// A marker that notes the time it ran at (the record of a timed event).
    Stamp(Arc<OnceLock<Instant>>),
    /// Host to device.
    HtoD {
        dst: u64,
        src: HostSrc,
        api: &'static str,
    },
    /// Device to host.
    DtoH {
        dst: HostDst,
        src: u64,
        len: usize,
        api: &'static str,
    },
    /// Device to device, same device or peers.
    DtoD(DeviceCopy),
    /// Byte fill.
    Memset(Fill),
    /// A kernel.
    Launch(Box<LaunchOp>),
    /// An operation that fails with this sticky error when it runs (an injected error
    /// in place of a launch or a copy).
    Fail(CuError),
    /// The nodes of an executable graph, run in order; the first failure ends it.
    Graph(Arc<[Node]>),
}

impl Op {
    /// A short description for messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Op::Marker => "a marker".to_string(),
            Op::Stamp(_) => "a timed event record".to_string(),
            Op::HtoD { api, .. }
            | Op::DtoH { api, .. }
            | Op::DtoD(DeviceCopy { api, .. })
            | Op::Memset(Fill { api, .. }) => api.to_string(),
            Op::Launch(l) => format!("kernel {} of {}", l.kernel, l.module.file),
            Op::Fail(e) => e.detail.clone(),
            Op::Graph(nodes) => format!("a graph of {} nodes", nodes.len()),
        }
    }
}

/// Why an operation did not complete.
pub(crate) enum Failure {
    /// A fault: poisons the context.
    Fault(Box<KernelFault>),
    /// A launch the interpreter refused: returned by the next synchronize, not sticky.
    Deferred(CuError),
    /// An error of the operation itself ([`Op::Fail`]): poisons the context.
    Sticky(CuError),
}

/// A fault of the copy engine, reported like a kernel's.
fn copy_fault(api: &str, kind: FaultKind, addr: u64, len: usize, detail: String) -> Failure {
    Failure::Fault(Box::new(KernelFault {
        kind,
        kernel: api.to_string(),
        file: "<copy engine>".to_string(),
        line: 0,
        instruction: format!("{api} of {len} bytes"),
        block: [0; 3],
        thread: [0; 3],
        address: Some(addr),
        detail,
    }))
}

/// The live allocation of a copy's device range, or the fault.
fn device_range(
    shared: &Shared,
    api: &str,
    addr: u64,
    len: usize,
) -> Result<Arc<Allocation>, Failure> {
    shared.lookup(addr, len as u64).map_err(|e| {
        let (kind, why) = match e {
            MemError::Freed => (FaultKind::UseAfterFree, "was freed before the copy ran"),
            MemError::OutOfBounds => (FaultKind::OutOfBounds, "is not live device memory"),
        };
        let end = addr.saturating_add(len as u64);
        copy_fault(api, kind, addr, len, format!("{addr:#x}..{end:#x} {why}"))
    })
}

fn pinned_gone(api: &str, p: HostPtr, len: usize) -> Failure {
    copy_fault(
        api,
        FaultKind::OutOfBounds,
        p.0 as u64,
        len,
        format!(
            "pinned host memory at {:p} was freed before the copy ran",
            p.0
        ),
    )
}

/// Runs `op` for a stream of device `dev`.
pub(crate) fn execute(shared: &Shared, dev: usize, op: Op) -> Result<(), Failure> {
    match op {
        Op::Marker => Ok(()),
        Op::Stamp(at) => {
            let _ = at.set(Instant::now());
            Ok(())
        }
        Op::Fail(e) => Err(Failure::Sticky(e)),
        Op::Graph(nodes) => nodes
            .iter()
            .try_for_each(|n| execute(shared, dev, n.to_op())),
        Op::HtoD { dst, src, api } => match src {
            HostSrc::Staged(bytes) => {
                let a = device_range(shared, api, dst, bytes.len())?;
                a.region().write(dst, &bytes);
                Ok(())
            }
            HostSrc::Pinned(p, len) => {
                let a = device_range(shared, api, dst, len)?;
                shared
                    .pinned
                    .with_block(p.0, len, || {
                        // SAFETY: `[p, p + len)` lies in a live pinned block, which
                        // cannot be freed while `with_block` holds its lock.
                        let src = unsafe { std::slice::from_raw_parts(p.0, len) };
                        a.region().write(dst, src);
                    })
                    .ok_or_else(|| pinned_gone(api, p, len))
            }
        },
        Op::DtoH { dst, src, len, api } => {
            let a = device_range(shared, api, src, len)?;
            match dst {
                HostDst::Staged(buf) => {
                    let mut v = vec![0u8; len];
                    let _ = a.region().read(src, &mut v);
                    *lock(&buf) = v;
                    Ok(())
                }
                HostDst::Pinned(p) => shared
                    .pinned
                    .with_block(p.0, len, || {
                        // SAFETY: `[p, p + len)` lies in a live pinned block, which
                        // cannot be freed while `with_block` holds its lock; the caller
                        // of the async copy gave up access to it until completion.
                        let out = unsafe { std::slice::from_raw_parts_mut(p.0, len) };
                        let _ = a.region().read(src, out);
                    })
                    .ok_or_else(|| pinned_gone(api, p, len)),
            }
        }
        Op::DtoD(DeviceCopy { dst, src, len, api }) => {
            let s = device_range(shared, api, src, len)?;
            let d = device_range(shared, api, dst, len)?;
            let mut buf = vec![0u8; len.min(COPY_CHUNK)];
            let mut off = 0;
            while off < len {
                let n = (len - off).min(COPY_CHUNK);
                let _ = s.region().read(src + off as u64, &mut buf[..n]);
                d.region().write(dst + off as u64, &buf[..n]);
                off += n;
            }
            Ok(())
        }
        Op::Memset(Fill {
            dst,
            value,
            len,
            api,
        }) => {
            let a = device_range(shared, api, dst, len)?;
            a.fill(dst, value, len);
            Ok(())
        }
        Op::Launch(l) => {
            shared
                .launches
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if !shared.cfg.interpret {
                let args: Vec<&[u8]> = l.args.iter().map(Vec::as_slice).collect();
                return crate::exec::check_launch(&l.module.module, &l.kernel, &l.cfg, &args)
                    .map_err(launch_failure);
            }
            let view = DeviceView::new(&shared.memories, dev, &shared.contexts[dev].peers());
            let r = shared.profile.run(
                dev,
                &l,
                &view,
                shared.cfg.checks,
                shared.cfg.exec_threads.max(1),
            );
            match r {
                Ok(stats) => {
                    shared.warp_instructions.fetch_add(
                        stats.warp_instructions,
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    Ok(())
                }
                Err(e) => Err(launch_failure(e)),
            }
        }
    }
}

fn launch_failure(e: LaunchError) -> Failure {
    match e {
        LaunchError::Fault(f) => Failure::Fault(f),
        LaunchError::Invalid(e) => Failure::Deferred(e),
    }
}
