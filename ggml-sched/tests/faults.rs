//! Faults in the middle of pipelined runs: every injected failure (an allocation, an op
//! reporting an error, a queue that never completes) comes back as an error naming the
//! device, the op and the cause; nothing hangs; memory returns to its level; a new
//! scheduler on the same backends gives the exact numbers again.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use ggml_core::Backend;
use ggml_sched::testing::TestBackend;
use ggml_sched::{FaultKind, FaultPlan, FaultyBackend, SchedOptions, Scheduler};

const NEVER: FaultPlan = FaultPlan {
    op: usize::MAX,
    kind: FaultKind::Kernel,
};

/// Runs `runs` pipelined runs of `c` on `backends`; the first error, if any. A device
/// given up on is reset (`release`) before its scheduler is dropped, as a hung GPU's
/// context would be.
fn try_runs(
    c: &mut Chain,
    backends: Vec<Arc<dyn Backend>>,
    faulty: &[Arc<FaultyBackend>],
    runs: u64,
) -> Result<(), String> {
    try_runs_within(c, backends, faulty, runs, Duration::from_millis(300)).0
}

/// [`try_runs`] with the host's wait limit `timeout`; also the time until the runs
/// returned (the error, for a faulty run), before the scheduler is dropped.
fn try_runs_within(
    c: &mut Chain,
    backends: Vec<Arc<dyn Backend>>,
    faulty: &[Arc<FaultyBackend>],
    runs: u64,
    timeout: Duration,
) -> (Result<(), String>, Duration) {
    let opts = SchedOptions {
        n_copies: 2,
        timeout: Some(timeout),
        ..SchedOptions::default()
    };
    c.place_weights(&backends);
    let mut s = match Scheduler::new(backends, opts) {
        Ok(s) => s,
        Err(e) => return (Err(e.to_string()), Duration::ZERO),
    };
    let t0 = Instant::now();
    let mut go = || -> Result<(), String> {
        for &(id, b) in &c.pins {
            s.set_tensor_backend(id, b).map_err(|e| e.to_string())?;
        }
        s.alloc_nodes(&c.g.tensors, &c.g.nodes, &c.g.leafs)
            .map_err(|e| e.to_string())?;
        let mut out = vec![0u8; c.n * 4];
        for r in 0..runs {
            let (x, p) = c.inputs(r);
            s.set_input(c.x, &to_bytes(&x)).map_err(|e| e.to_string())?;
            s.set_input(c.p, &to_bytes(&p)).map_err(|e| e.to_string())?;
            s.compute().map_err(|e| e.to_string())?;
            if r >= 1 {
                s.get_tensor_run(r - 1, c.out, &mut out)
                    .map_err(|e| e.to_string())?;
                if to_f32(&out) != c.expected(r - 1) {
                    return Err(format!("run {} wrong", r - 1));
                }
            }
        }
        s.synchronize().map_err(|e| e.to_string())
    };
    let r = go();
    let took = t0.elapsed();
    for f in faulty {
        f.release();
    }
    drop(s);
    (r, took)
}

fn wrapped(target: usize, plan: FaultPlan) -> (Vec<Arc<dyn Backend>>, Vec<Arc<FaultyBackend>>) {
    let inner = TestBackend::many(2, |i, o| {
        o.delay_seed = Some(i as u64 + 5);
        o.max_delay_us = 100;
    });
    let faulty: Vec<Arc<FaultyBackend>> = inner
        .into_iter()
        .enumerate()
        .map(|(i, b)| FaultyBackend::new(b, if i == target { plan } else { NEVER }))
        .collect();
    let dyns = faulty
        .iter()
        .map(|f| f.clone() as Arc<dyn Backend>)
        .collect();
    (dyns, faulty)
}

#[test]
fn every_fault_is_reported_nothing_hangs_and_memory_returns() {
    let layers = [0, 0, 1, 1];
    let (mut reported, mut fired) = (0, 0);
    for kind in FaultKind::ALL {
        for target in 0..2 {
            // Allocations: 0 and 1 are the weights of the device's two layers (placed by
            // the caller, who unwraps them); from 2 on the scheduler's.
            let ops = if kind == FaultKind::Alloc { 2..5 } else { 0..8 };
            for op in ops {
                let plan = FaultPlan { op, kind };
                let mut c = chain(8, &layers);
                let (b, faulty) = wrapped(target, plan);
                let t0 = Instant::now();
                let r = try_runs(&mut c, b, &faulty, 4);
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "{plan:?} took {:?}",
                    t0.elapsed()
                );
                let f = &faulty[target];
                if !f.fired() {
                    assert!(r.is_ok(), "{plan:?} on {target}: {r:?} without a fault");
                    continue;
                }
                fired += 1;
                let e = r.expect_err("an injected fault is an error");
                let name = f.name().as_str().to_string();
                assert!(e.contains(&name), "{plan:?}: the device in {e}");
                assert!(
                    e.contains("injected") || e.contains("timed out"),
                    "{plan:?}: the cause in {e}"
                );
                match kind {
                    FaultKind::Kernel => assert!(e.contains("on '"), "{plan:?}: the op in {e}"),
                    // Which wait, and the device's last work (the split that hung).
                    FaultKind::Hang => {
                        assert!(
                            e.contains("timed out") && e.contains("its last work: split "),
                            "{e}"
                        );
                        f.release();
                    }
                    FaultKind::Alloc => {}
                    FaultKind::Trigger => unreachable!("not in FaultKind::ALL"),
                }
                reported += 1;
                // Everything the run allocated is freed once its scheduler is gone, but the
                // weights the caller placed (kept by the chain's descriptors).
                drop(c);
                for w in &faulty {
                    assert!(
                        w.live_bytes() <= 8 * 4 * layers.len(),
                        "{plan:?}: {} bytes left",
                        w.live_bytes()
                    );
                }
                // Fresh backends compute the exact numbers again.
                let mut c = chain(8, &layers);
                let (b, f) = wrapped(target, NEVER);
                try_runs(&mut c, b, &f, 4).unwrap();
            }
        }
    }
    assert!(fired >= 30, "{fired} faults fired");
    assert_eq!(reported, fired);
}

#[test]
fn a_trigger_runs_once_before_its_node_and_the_run_is_otherwise_untouched() {
    use std::sync::Mutex;
    let layers = [0, 0, 1, 1];
    let seen: Arc<Mutex<Vec<(String, usize)>>> = Arc::default();
    let log = seen.clone();
    let inner = TestBackend::many(2, |i, o| {
        o.delay_seed = Some(i as u64 + 5);
        o.max_delay_us = 100;
    });
    let mut faulty = vec![FaultyBackend::new(inner[0].clone(), NEVER)];
    faulty.push(FaultyBackend::with_trigger(
        inner[1].clone(),
        3,
        Box::new(move |node, op| {
            log.lock()
                .unwrap()
                .push((node.name.as_str().to_string(), op))
        }),
    ));
    let b = faulty
        .iter()
        .map(|f| f.clone() as Arc<dyn Backend>)
        .collect();
    let mut c = chain(8, &layers);
    try_runs(&mut c, b, &faulty, 4).expect("a trigger alone changes nothing");
    assert!(faulty[1].fired());
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].1, 3);
    assert!(!seen[0].0.is_empty());
}

/// A hang costs one timeout: once a wait timed out, the scheduler does not wait the
/// whole timeout again for the stuck devices before returning the error (it used to,
/// once per stuck device), nor when it is dropped (at most `STUCK_GRACE` each).
#[test]
fn a_hang_is_reported_after_one_timeout() {
    let layers = [0, 0, 1, 1];
    let timeout = Duration::from_secs(1);
    for target in 0..2 {
        let plan = FaultPlan {
            op: 1,
            kind: FaultKind::Hang,
        };
        let mut c = chain(8, &layers);
        let (b, faulty) = wrapped(target, plan);
        let t0 = Instant::now();
        let (r, took) = try_runs_within(&mut c, b, &faulty, 4, timeout);
        let e = r.expect_err("a hang is an error");
        assert!(e.contains("timed out"), "{e}");
        assert!(took >= timeout, "{took:?}");
        assert!(
            took < timeout + timeout / 2,
            "device {target}: the error took {took:?}"
        );
        assert!(
            t0.elapsed() < took + 2 * ggml_sched::STUCK_GRACE + timeout / 2,
            "device {target}: the drop took {:?}",
            t0.elapsed() - took
        );
    }
}
