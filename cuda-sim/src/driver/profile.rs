//! Profiling through the emulated driver: with profiling on, every kernel launch is
//! counted ([`crate::profile`]) and its DRAM traffic run through an L2 model of the
//! chosen GPU (one per device, persisting across launches until
//! [`Driver::reset_l2`]), and a [`LaunchRecord`] is kept per launch, in launch order.
//!
//! Launches are stamped when they are enqueued (their order, their stream's tag and the
//! profiling options then in force) and counted when they run. The L2 model sees the
//! launches in the order they run: deterministic for work on one stream per device.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use super::memory::DeviceView;
use super::ops::LaunchOp;
use super::{lock, Driver, StreamHandle};
use crate::cost::GpuSpec;
use crate::error::CuError;
use crate::exec::{self, LaunchError, LaunchStats};
use crate::fault::Checks;
use crate::profile::{L2Model, LaunchCounters, ProfileOptions};

/// What to profile with.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileConfig {
    /// The GPU whose L2 size the DRAM model uses, and whose latencies pick each
    /// launch's critical path.
    pub gpu: GpuSpec,
    /// Interpret at most this many evenly spaced blocks of each launch and scale the
    /// counts. The blocks skipped write nothing, so results computed under sampling are
    /// wrong: use it to count, never to check results (initcheck is off for sampled
    /// launches, since later kernels read what skipped blocks never wrote).
    pub sample_blocks: Option<u64>,
    /// Keep the critical warp's cycles by PTX source line in every launch's counters
    /// ([`LaunchCounters::critical_stalls`]).
    pub stall_lines: bool,
}

impl ProfileConfig {
    /// Profiling for `gpu`, every block interpreted.
    pub fn new(gpu: GpuSpec) -> ProfileConfig {
        ProfileConfig {
            gpu,
            sample_blocks: None,
            stall_lines: false,
        }
    }
}

/// One profiled launch.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchRecord {
    /// Its position among the launches enqueued while profiling (from 0).
    pub seq: u64,
    /// The device it ran on.
    pub device: usize,
    /// The stream it was launched on.
    pub stream: StreamHandle,
    /// The kernel.
    pub kernel: String,
    /// The PTX file name its module was loaded as.
    pub module_file: String,
    /// The stream's launch tag when it was enqueued ([`Driver::set_launch_tag`]).
    pub tag: Option<u64>,
    /// Launched with programmatic stream serialisation ([`Driver::launch_ex`]).
    pub programmatic: bool,
    /// What it executed; `dram` is set (from the device's L2 model) unless profiling
    /// was turned off before it ran.
    pub counters: LaunchCounters,
}

/// What a launch carries from its enqueue when profiling is on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaunchStamp {
    seq: u64,
    stream: u64,
    tag: Option<u64>,
    opts: ProfileOptions,
}

struct Active {
    cfg: ProfileConfig,
    /// One per device.
    l2: Vec<L2Model>,
    records: Vec<LaunchRecord>,
}

/// The driver's profiling state.
pub(crate) struct ProfileState {
    on: AtomicBool,
    active: Mutex<Option<Active>>,
    tags: Mutex<HashMap<u64, u64>>,
    seq: AtomicU64,
    devices: usize,
}

impl ProfileState {
    pub(crate) fn new(devices: usize) -> ProfileState {
        ProfileState {
            on: AtomicBool::new(false),
            active: Mutex::new(None),
            tags: Mutex::new(HashMap::new()),
            seq: AtomicU64::new(0),
            devices,
        }
    }

    /// The stamp of a launch enqueued now on stream `stream`, if profiling is on.
    pub(crate) fn stamp(&self, stream: u64) -> Option<LaunchStamp> {
        if !self.on.load(Ordering::Acquire) {
            return None;
        }
        let active = lock(&self.active);
        let a = active.as_ref()?;
        Some(LaunchStamp {
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            stream,
            tag: lock(&self.tags).get(&stream).copied(),
            opts: ProfileOptions {
                latencies: a.cfg.gpu.latencies(),
                sample_blocks: a.cfg.sample_blocks,
                stall_lines: a.cfg.stall_lines,
            },
        })
    }

    /// Runs launch `l` on device `dev`: profiled when it was stamped, plainly otherwise.
    pub(crate) fn run(
        &self,
        dev: usize,
        l: &LaunchOp,
        view: &DeviceView<'_>,
        checks: Checks,
        threads: usize,
    ) -> Result<LaunchStats, LaunchError> {
        let args: Vec<&[u8]> = l.args.iter().map(Vec::as_slice).collect();
        let m = &l.module.module;
        let Some(stamp) = l.stamp else {
            return exec::launch(m, &l.kernel, &l.cfg, &args, view, checks, threads);
        };
        // Sampled launches leave the skipped blocks' outputs unwritten, so later kernels
        // read bytes never written: initcheck would stop a profile that never claims
        // results, so it is off for them.
        let checks = match stamp.opts.sample_blocks {
            Some(_) => Checks {
                initcheck: false,
                ..checks
            },
            None => checks,
        };
        let (stats, mut counters) = exec::launch_profiled(
            m,
            &l.kernel,
            &l.cfg,
            &args,
            view,
            checks,
            threads,
            &stamp.opts,
        )?;
        let mut active = lock(&self.active);
        if let Some(a) = active.as_mut() {
            counters.apply_l2(&mut a.l2[dev]);
            a.records.push(LaunchRecord {
                seq: stamp.seq,
                device: dev,
                stream: StreamHandle(stamp.stream),
                kernel: l.kernel.clone(),
                module_file: l.module.file.clone(),
                tag: stamp.tag,
                programmatic: l.cfg.programmatic,
                counters,
            });
        }
        Ok(stats)
    }
}

impl Driver {
    /// Turns profiling on (or changes its settings) for launches enqueued from now on.
    /// A change of GPU starts the L2 models empty; records taken so far are kept.
    pub fn enable_profiling(&self, cfg: ProfileConfig) {
        let p = &self.shared.profile;
        let mut active = lock(&p.active);
        match active.as_mut() {
            Some(a) if a.cfg.gpu.arch.l2_bytes == cfg.gpu.arch.l2_bytes => a.cfg = cfg,
            _ => {
                let records = active.take().map(|a| a.records).unwrap_or_default();
                let l2 = (0..p.devices)
                    .map(|_| L2Model::new(cfg.gpu.arch.l2_bytes))
                    .collect();
                *active = Some(Active { cfg, l2, records });
            }
        }
        p.on.store(true, Ordering::Release);
    }

    /// Turns profiling off: launches enqueued from now on are not counted. Launches
    /// enqueued before still are, and records are kept until taken.
    pub fn disable_profiling(&self) {
        self.shared.profile.on.store(false, Ordering::Release);
    }

    /// The profiling settings, if profiling is on.
    pub fn profiling(&self) -> Option<ProfileConfig> {
        let p = &self.shared.profile;
        if !p.on.load(Ordering::Acquire) {
            return None;
        }
        lock(&p.active).as_ref().map(|a| a.cfg.clone())
    }

    /// Tags the launches enqueued on stream `s` from now on with `tag` (`None` clears
    /// it), so a caller can attribute each record to its own unit of work (a graph
    /// node, an op). `CUDA_ERROR_INVALID_HANDLE` for an unknown stream.
    pub fn set_launch_tag(&self, s: StreamHandle, tag: Option<u64>) -> Result<(), CuError> {
        let st = self.stream_of(s)?;
        let mut tags = lock(&self.shared.profile.tags);
        match tag {
            Some(t) => tags.insert(st.id, t),
            None => tags.remove(&st.id),
        };
        Ok(())
    }

    /// Takes the records of the launches that have run, in launch (enqueue) order.
    /// Synchronise the streams first to include every launch enqueued.
    pub fn take_launch_records(&self) -> Vec<LaunchRecord> {
        let mut records = lock(&self.shared.profile.active)
            .as_mut()
            .map(|a| std::mem::take(&mut a.records))
            .unwrap_or_default();
        records.sort_by_key(|r| r.seq);
        records
    }

    /// Empties every device's L2 model (the start of a pass: its first touches are
    /// DRAM traffic again).
    pub fn reset_l2(&self) {
        if let Some(a) = lock(&self.shared.profile.active).as_mut() {
            a.l2.iter_mut().for_each(L2Model::reset);
        }
    }
}
