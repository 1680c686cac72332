//! Faults injected mid-graph (`--inject-fault D:OP:KIND`) and the sweep that injects one
//! at every op of a forward pass (`ggml-harness fault-sweep`, `cargo xtask faults`).
//!
//! Each faulty run must come back as an error naming the device, the op and the cause,
//! within a time limit (no thread left blocked), with the devices' memory back at its
//! level before the run; and a new session afterwards must give the bits of a run
//! without faults.

use std::any::Any;
use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ggml_core::Backend;
use ggml_cuda::cuda_sim::driver::{Driver, InjectedError};
use ggml_cuda::{CudaBackend, DriverKind};
use ggml_sched::{FaultKind, FaultPlan, FaultyBackend};

use crate::devices::DeviceSpec;

use crate::error::{HarnessError, ModelError, Result};
use crate::perplexity::perplexity;
use crate::regress::{Cell, RegressSettings};
use crate::session::{FaultInjector, Session};

pub use crate::session::DEFAULT_WAIT_TIMEOUT;

/// What goes wrong: a fault of the backend wrapper, on any device, or an error of
/// cuda-sim's emulated driver under the CUDA backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InjectKind {
    /// `alloc`, `kernel`, `hang` ([`FaultyBackend`]).
    Backend(FaultKind),
    /// `illegal-address`, `launch`, `peer-copy`, `event`: armed in the emulated driver
    /// just before the node is submitted, raised by the first matching driver call after
    /// it (see [`InjectedError`]). cuda-sim devices only.
    Driver(InjectedError),
}

impl InjectKind {
    /// Every kind, the backend wrapper's first.
    pub const ALL: [InjectKind; 7] = [
        InjectKind::Backend(FaultKind::Alloc),
        InjectKind::Backend(FaultKind::Kernel),
        InjectKind::Backend(FaultKind::Hang),
        InjectKind::Driver(InjectedError::IllegalAddress),
        InjectKind::Driver(InjectedError::Launch),
        InjectKind::Driver(InjectedError::PeerCopy),
        InjectKind::Driver(InjectedError::Event),
    ];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            InjectKind::Backend(k) => k.name(),
            InjectKind::Driver(e) => e.name(),
        }
    }

    /// The kind named `name`.
    pub fn from_name(name: &str) -> Option<InjectKind> {
        InjectKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// `--inject-fault D:OP:KIND`: device `D` (its index in `--devices`) fails at the `OP`-th
/// node of its part of the graph (for `alloc`: its `OP`-th buffer allocation, counting
/// the weights' and the KV cache's before the scheduler's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FaultSpec {
    /// Device index.
    pub device: usize,
    /// Node (or allocation) index.
    pub op: usize,
    /// What goes wrong.
    pub kind: InjectKind,
}

impl fmt::Display for FaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.device, self.op, self.kind.name())
    }
}

impl FromStr for FaultSpec {
    type Err = HarnessError;

    fn from_str(s: &str) -> Result<FaultSpec> {
        let bad = |why: &str| {
            HarnessError::Usage(format!(
                "--inject-fault {s:?}: {why} (expected D:OP:KIND, KIND alloc, kernel or hang, or on cuda-sim illegal-address, launch, peer-copy or event)"
            ))
        };
        let parts: Vec<&str> = s.split(':').collect();
        let [d, op, kind] = parts[..] else {
            return Err(bad("three fields"));
        };
        let device = d.parse().map_err(|_| bad("D is not a device index"))?;
        let op = op.parse().map_err(|_| bad("OP is not a node index"))?;
        let kind = InjectKind::from_name(kind).ok_or_else(|| bad("unknown KIND"))?;
        Ok(FaultSpec { device, op, kind })
    }
}

impl FaultSpec {
    /// The spec as a session's [`RunConfig::inject_fault`](crate::session::RunConfig).
    pub fn injector(self) -> Arc<dyn FaultInjector> {
        Arc::new(self)
    }

    /// The spec a session was opened with, if any.
    pub fn of(session: &Session) -> Option<FaultSpec> {
        let f = session.config.inject_fault.as_ref()?;
        f.as_any().downcast_ref::<FaultSpec>().copied()
    }
}

impl FaultInjector for FaultSpec {
    fn wrap(
        &self,
        backends: &[Arc<dyn Backend>],
    ) -> ggml_model::error::Result<Vec<Arc<FaultyBackend>>> {
        wrap(backends, *self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Every backend of `backends` wrapped, device `spec.device` with the fault. A device
/// index past the devices, or a driver error on a device that is not a cuda-sim one, is
/// refused.
pub fn wrap(
    backends: &[Arc<dyn Backend>],
    spec: FaultSpec,
) -> ggml_model::error::Result<Vec<Arc<FaultyBackend>>> {
    if spec.device >= backends.len() {
        return Err(ModelError::Usage(format!(
            "--inject-fault {spec}: device {} of {} (--devices counts from 0)",
            spec.device,
            backends.len()
        )));
    }
    const NEVER: FaultPlan = FaultPlan {
        op: usize::MAX,
        kind: FaultKind::Kernel,
    };
    let mut out = Vec::with_capacity(backends.len());
    for (i, b) in backends.iter().enumerate() {
        let w = match (i == spec.device, spec.kind) {
            (false, _) => FaultyBackend::new(b.clone(), NEVER),
            (true, InjectKind::Backend(kind)) => {
                FaultyBackend::new(b.clone(), FaultPlan { op: spec.op, kind })
            }
            (true, InjectKind::Driver(error)) => {
                let (drv, ordinal) = sim_device(&**b).ok_or_else(|| {
                    ModelError::Usage(format!(
                        "--inject-fault {spec}: {} is raised by cuda-sim's driver; device {i} is {}",
                        error.name(),
                        b.name()
                    ))
                })?;
                let device = b.name().as_str().to_string();
                let trigger = move |node: &ggml_core::Tensor, op: usize| {
                    let note = format!("{device} node {op} '{}'", node.name);
                    // A valid ordinal: the arming cannot fail.
                    let _ = drv.inject_error(ordinal, error, note);
                };
                FaultyBackend::with_trigger(b.clone(), spec.op, Box::new(trigger))
            }
        };
        out.push(w);
    }
    Ok(out)
}

/// The emulated driver and GPU ordinal of a cuda-sim backend.
fn sim_device(b: &dyn Backend) -> Option<(Arc<Driver>, usize)> {
    let cuda = b.as_any().downcast_ref::<CudaBackend>()?;
    if cuda.driver_kind() != DriverKind::Sim {
        return None;
    }
    Some((ggml_cuda::sim_driver().ok()?, cuda.ordinal()))
}

/// cuda-sim's memory as a leak check sees it: per GPU the bytes in use and the bytes
/// context resets had to free, and the pinned bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SimMemory {
    used: Vec<u64>,
    reclaimed: Vec<u64>,
    pinned: u64,
}

impl SimMemory {
    /// The level now, if `cell` runs on cuda-sim devices.
    fn of(cell: &Cell) -> Option<SimMemory> {
        let sim = cell.devices.0.iter().any(|d| {
            matches!(
                d,
                DeviceSpec::Cuda {
                    driver: DriverKind::Sim,
                    ..
                }
            )
        });
        let drv = ggml_cuda::sim_driver().ok().filter(|_| sim)?;
        let n = drv.device_count();
        Some(SimMemory {
            used: (0..n).map(|d| drv.used_memory(d).unwrap_or(0)).collect(),
            reclaimed: (0..n)
                .map(|d| drv.reclaimed_bytes(d).unwrap_or(0))
                .collect(),
            pinned: drv.pinned_bytes(),
        })
    }

    /// Bytes held now beyond `self`, counting what resets had to free as held.
    fn leaked_since(&self, now: &SimMemory) -> u64 {
        let grown = |a: &[u64], b: &[u64]| -> u64 {
            a.iter().zip(b).map(|(n, l)| n.saturating_sub(*l)).sum()
        };
        grown(&now.used, &self.used)
            + grown(&now.reclaimed, &self.reclaimed)
            + now.pinned.saturating_sub(self.pinned)
    }
}

/// What one faulty run did.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultRun {
    /// The fault.
    pub spec: FaultSpec,
    /// Whether it happened (an op index past the device's work never fires).
    pub fired: bool,
    /// The error the run returned (one line), if any.
    pub error: Option<String>,
    /// Whether the error names the device, the op (or the wait, for a hang) and the cause.
    pub named: bool,
    /// Seconds the run took.
    pub seconds: f64,
    /// Bytes the devices held after the run beyond their level before it.
    pub leaked_bytes: usize,
}

/// One perplexity run of `cell` with `spec` injected; memory is measured with the KV
/// cache and weights in place, before the run and after its executor is gone.
pub fn run_with_fault(
    model: &Path,
    text: &str,
    cell: &Cell,
    s: &RegressSettings,
    spec: FaultSpec,
    timeout: Duration,
) -> Result<FaultRun> {
    let mut config = cell.config();
    config.chaos = s.chaos;
    config.wait_timeout = Some(timeout);
    config.inject_fault = Some(spec.injector());
    let sim_level = SimMemory::of(cell);
    let t0 = Instant::now();
    let session = Session::open(model, config);
    let session = match session {
        Ok(s) => s,
        // The weights' allocations: the fault fired before any run.
        Err(e) => {
            return Ok(FaultRun {
                spec,
                fired: true,
                named: names_fault(&e.to_string(), spec, None),
                error: Some(e.to_string()),
                seconds: t0.elapsed().as_secs_f64(),
                leaked_bytes: 0,
            })
        }
    };
    let tokens = session.tokenizer.encode(text);
    let bos = session
        .tokenizer
        .add_bos()
        .then(|| session.tokenizer.bos())
        .flatten();
    let n_seq = (s.ppl.n_batch / s.ppl.n_ctx).max(1);
    let device_name = session.backends[spec.device].name().as_str().to_string();
    let result = (|| -> Result<()> {
        let mut kv = session.kv_cache(s.ppl.n_ctx * n_seq)?;
        let level: Vec<usize> = session.faulty.iter().map(|f| f.live_bytes()).collect();
        let r = {
            let mut exec = session.executor()?;
            let r = perplexity(
                &session.model,
                exec.as_mut(),
                &mut kv,
                &tokens,
                bos,
                s.ppl,
                |_, _, _| {},
            );
            // Having given up on a hung device, reset it (as a GPU context is reset)
            // before its scheduler frees the memory it may still touch; then no thread
            // stays blocked.
            for f in &session.faulty {
                f.release();
            }
            r
        };
        let after: Vec<usize> = session.faulty.iter().map(|f| f.live_bytes()).collect();
        let leaked: usize = after
            .iter()
            .zip(&level)
            .map(|(a, l)| a.saturating_sub(*l))
            .sum();
        if leaked > 0 {
            return Err(HarnessError::Usage(format!("leaked {leaked} bytes")));
        }
        r.map(|_| ())
    })();
    let fired = fault_fired(&session).unwrap_or(false);
    // The session's end releases the devices: a poisoned context is reset there.
    drop(session);
    let seconds = t0.elapsed().as_secs_f64();
    let (error, mut leaked_bytes) = match &result {
        Ok(()) => (None, 0),
        Err(e) => {
            let e = e.to_string();
            let leaked = e
                .strip_prefix("leaked ")
                .and_then(|r| r.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            (Some(e), leaked)
        }
    };
    if let (Some(before), Some(after)) = (sim_level, SimMemory::of(cell)) {
        leaked_bytes += before.leaked_since(&after) as usize;
    }
    let named = error
        .as_deref()
        .is_some_and(|e| names_fault(e, spec, Some(&device_name)));
    Ok(FaultRun {
        spec,
        fired,
        error,
        named,
        seconds,
        leaked_bytes,
    })
}

/// Whether the session's `--inject-fault` happened (`None` without one). A driver error
/// armed but never raised (no matching driver call came after its node) is cancelled
/// here, before a teardown's calls could raise it.
pub fn fault_fired(session: &Session) -> Option<bool> {
    let spec = FaultSpec::of(session)?;
    let mut fired = session.faulty.get(spec.device)?.fired();
    if let InjectKind::Driver(_) = spec.kind {
        if let Ok(drv) = ggml_cuda::sim_driver() {
            let pending: usize = (0..drv.device_count())
                .map(|d| drv.cancel_injected(d).len())
                .sum();
            fired &= pending == 0;
        }
    }
    Some(fired)
}

/// An error when the session's `--inject-fault` never happened: a fault test that
/// addresses nothing must not pass. It names what the device did have ("device 1 made 3
/// allocations").
pub fn require_fired(session: &Session) -> Result<()> {
    let (Some(false), Some(spec)) = (fault_fired(session), FaultSpec::of(session)) else {
        return Ok(());
    };
    let Some(f) = session.faulty.get(spec.device) else {
        return Ok(());
    };
    let had = match spec.kind {
        InjectKind::Backend(FaultKind::Alloc) => {
            format!("made {} allocations", f.allocations_seen())
        }
        InjectKind::Backend(_) => format!("computed {} nodes", f.nodes_seen()),
        InjectKind::Driver(_) => format!(
            "computed {} nodes, and no matching driver call came after node {}",
            f.nodes_seen(),
            spec.op
        ),
    };
    Err(HarnessError::Usage(format!(
        "--inject-fault {spec} never happened: device {} {had} in this run (the index counts from 0)",
        spec.device
    )))
}

/// Whether the error `e` names the device, the op (for a hang: the wait and the device's
/// last work) and the cause of `spec`.
fn names_fault(e: &str, spec: FaultSpec, device: Option<&str>) -> bool {
    let device_ok = device.is_none_or(|d| e.contains(d));
    let cause_ok = match spec.kind {
        InjectKind::Backend(FaultKind::Alloc) => e.contains("injected allocation failure"),
        InjectKind::Backend(FaultKind::Kernel) => {
            e.contains("injected kernel fault") && e.contains(" on '")
        }
        InjectKind::Backend(FaultKind::Hang) => {
            e.contains("timed out") && e.contains("its last work: split ")
        }
        InjectKind::Backend(FaultKind::Trigger) => false,
        // The driver's code and its text: what failed, and the node it was armed at.
        InjectKind::Driver(d) => {
            e.contains(d.code().name()) && e.contains(&format!(" node {} '", spec.op))
        }
    };
    device_ok && cause_ok && !e.contains('\n')
}

/// Nodes each device computes in one pass of `cell` (the sweep's op range).
pub fn ops_per_device(model: &Path, cell: &Cell, s: &RegressSettings) -> Result<Vec<usize>> {
    let session = Session::open(model, cell.config())?;
    let n_seq = (s.ppl.n_batch / s.ppl.n_ctx).max(1);
    let mut kv = session.kv_cache(s.ppl.n_ctx * n_seq)?;
    let mut exec = session.sched_executor(ggml_sched::PlanStyle::Minimal)?;
    let mut batch = crate::batch::Batch::default();
    let n = match cell.n_ubatch {
        0 => s.ppl.n_ctx,
        u => u.min(s.ppl.n_ctx),
    };
    for i in 0..n {
        batch.push(0, i as i32, 0, true);
    }
    exec.prepare(&session.model, &mut kv, &batch)?;
    let part = exec
        .scheduler()
        .partition()
        .ok_or_else(|| HarnessError::Usage("the scheduler made no partition".into()))?;
    let mut counts = vec![0; session.backends.len()];
    for sp in &part.splits {
        counts[sp.backend] += sp.nodes.len();
    }
    Ok(counts)
}

/// Allocations the sweep tries per device (weights, KV cache, compute and staging
/// buffers).
pub const SWEEP_ALLOCS: usize = 6;

/// How a [`sweep`] samples and waits.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepOptions {
    /// Only these kinds (empty: every kind the devices support).
    pub kinds: Vec<InjectKind>,
    /// Inject at every `every`-th op.
    pub every: usize,
    /// How long the host waits for a hung device.
    pub timeout: Duration,
    /// Seconds a faulty run may take before it counts as a hang.
    pub limit: f64,
}

/// Injects every fault kind (with cuda-sim devices, the driver's errors too) at every
/// `o.every`-th op of every device of `cell` (and at each of the first
/// [`SWEEP_ALLOCS`] allocations), each run followed by a clean run on
/// fresh backends that must give the bits of a run without faults. `on_run` sees each
/// faulty run and whether its later run was correct.
pub fn sweep(
    model: &Path,
    text: &str,
    cell: &Cell,
    s: &RegressSettings,
    o: SweepOptions,
    mut on_run: impl FnMut(&FaultRun, Option<bool>),
) -> Result<SweepSummary> {
    let (every, timeout, limit) = (o.every, o.timeout, o.limit);
    let reference = crate::regress::run_cell(model, text, cell, s)?.logits_sha256;
    let ops = ops_per_device(model, cell, s)?;
    let mut summary = SweepSummary::default();
    let all_sim = cell.devices.0.iter().all(|d| {
        matches!(
            d,
            DeviceSpec::Cuda {
                driver: DriverKind::Sim,
                ..
            }
        )
    });
    let kinds = InjectKind::ALL
        .into_iter()
        .filter(|k| all_sim || matches!(k, InjectKind::Backend(_)))
        .filter(|k| o.kinds.is_empty() || o.kinds.contains(k));
    for kind in kinds {
        for (device, &n_ops) in ops.iter().enumerate() {
            let n = match kind {
                InjectKind::Backend(FaultKind::Alloc) => SWEEP_ALLOCS,
                _ => n_ops,
            };
            for op in (0..n).step_by(every.max(1)) {
                let spec = FaultSpec { device, op, kind };
                let r = run_with_fault(model, text, cell, s, spec, timeout)?;
                let mut later = None;
                if r.fired {
                    let again = crate::regress::run_cell(model, text, cell, s)?;
                    later = Some(again.logits_sha256 == reference);
                }
                summary.add(&r, later, limit);
                on_run(&r, later);
            }
        }
    }
    Ok(summary)
}

/// The sweep's counts, the closing note's table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepSummary {
    /// Runs with a fault that happened.
    pub injected: usize,
    /// Of those, runs that returned an error naming device, op and cause.
    pub reported: usize,
    /// Runs that took longer than the limit (a hang not turned into an error).
    pub hangs: usize,
    /// Runs that left memory behind.
    pub leaks: usize,
    /// Clean runs after a faulty one that gave the expected bits.
    pub later_correct: usize,
    /// Clean runs after a faulty one.
    pub later_runs: usize,
}

impl SweepSummary {
    /// Adds a faulty run and whether the clean run after it was correct (`limit`:
    /// seconds a run may take).
    pub fn add(&mut self, r: &FaultRun, later_correct: Option<bool>, limit: f64) {
        if !r.fired {
            return;
        }
        self.injected += 1;
        self.reported += usize::from(r.error.is_some() && r.named);
        self.hangs += usize::from(r.seconds > limit);
        self.leaks += usize::from(r.leaked_bytes > 0);
        if let Some(ok) = later_correct {
            self.later_runs += 1;
            self.later_correct += usize::from(ok);
        }
    }

    /// Whether every fault was reported, nothing hung or leaked, and every later run
    /// was correct.
    pub fn clean(&self) -> bool {
        self.reported == self.injected
            && self.hangs == 0
            && self.leaks == 0
            && self.later_correct == self.later_runs
    }

    /// The header of [`row`](SweepSummary::row)'s table.
    pub const HEADER: &'static str = "| devices | kind | faults injected | errors reported | hangs | leaks | later runs correct |\n|---|---|---|---|---|---|---|";

    /// A Markdown table row: `| devices | kind | injected | reported | hangs | leaks | later correct |`.
    pub fn row(&self, devices: &str, kind: &str) -> String {
        format!(
            "| {devices} | {kind} | {} | {} | {} | {} | {}/{} |",
            self.injected,
            self.reported,
            self.hangs,
            self.leaks,
            self.later_correct,
            self.later_runs
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_or_say_why() {
        let s: FaultSpec = "1:17:hang".parse().unwrap();
        assert_eq!(
            s,
            FaultSpec {
                device: 1,
                op: 17,
                kind: InjectKind::Backend(FaultKind::Hang)
            }
        );
        let d: FaultSpec = "0:3:peer-copy".parse().unwrap();
        assert_eq!(d.kind, InjectKind::Driver(InjectedError::PeerCopy));
        for k in InjectKind::ALL {
            assert_eq!(InjectKind::from_name(k.name()), Some(k));
        }
        assert_eq!(s.to_string(), "1:17:hang");
        for (bad, why) in [
            ("1:2", "three fields"),
            ("x:2:alloc", "D is not"),
            ("0:-1:alloc", "OP is not"),
            ("0:1:boom", "unknown KIND"),
        ] {
            let e = bad.parse::<FaultSpec>().unwrap_err().to_string();
            assert!(e.contains(why) && !e.contains('\n'), "{e}");
        }
    }
}
