//! Partition and planner tests on simulated backends: assignment order, splits and
//! copies, plan listings and host-sync counts, and the recording-only race checker.

mod common;

use std::sync::Arc;

use common::*;
use ggml_core::{Backend, CopyQueue, DType, TensorFlags, TensorId};
use ggml_sched::testing::{SimBackend, SimOptions};
use ggml_sched::{
    partition, Action, CopyOn, HbRule, PartitionConfig, PlanStyle, SchedError, Scheduler,
    SourceKind, WeakenKnob,
};

fn sims(n: usize, f: impl Fn(usize, &mut SimOptions)) -> Vec<Arc<dyn Backend>> {
    (0..n)
        .map(|i| {
            let mut o = SimOptions::new(&format!("dev{i}"));
            f(i, &mut o);
            SimBackend::new(o) as Arc<dyn Backend>
        })
        .collect()
}

fn cfg(n_copies: usize, input_backend: usize, pins: Vec<(TensorId, usize)>) -> PartitionConfig {
    PartitionConfig {
        n_copies,
        input_backend,
        op_offload: false,
        pins,
        ring: false,
    }
}

#[test]
fn weights_decide_then_expansion_fills_in() {
    let b = sims(3, |_, _| {});
    let mut c = chain(4, &[0, 0, 1, 1, 2, 2]);
    c.place_weights(&b);
    let refs: Vec<&dyn Backend> = b.iter().map(|x| &**x).collect();
    // No pins: the add with a weight goes to the weight's backend, the rest follows.
    let p = partition(
        &c.g.tensors,
        &c.g.nodes,
        &c.g.leafs,
        &refs,
        &cfg(2, 2, vec![]),
    )
    .unwrap();
    let by_name = |n: &str| {
        let id =
            c.g.tensors
                .iter()
                .position(|t| t.name.as_str() == n)
                .unwrap();
        p.backend_of[id].unwrap()
    };
    for l in 0..6 {
        assert_eq!(by_name(&format!("a{l}")), c.layers[l], "a{l}");
    }
    assert_eq!(by_name("x"), 2, "inputs live on the input backend");
    assert_eq!(by_name("p"), 2);
    // s0 reads only the input: the forward sweep without the last backend has nothing
    // to carry, the backward sweep carries dev0 up from a0.
    assert_eq!(by_name("s0"), 0);
    // Splits are maximal runs of one backend.
    for w in p.splits.windows(2) {
        assert_ne!(w[0].backend, w[1].backend);
    }
    // Each cross-backend input has one slot per copy, and the caller's table is intact.
    for cp in &p.copies {
        assert_eq!(cp.slots.len(), 2);
        assert_ne!(cp.from, cp.to);
        if cp.name == "x" || cp.name == "p" {
            assert_eq!(cp.kind, SourceKind::UserInput);
        } else {
            assert_eq!(cp.kind, SourceKind::Computed);
        }
    }
    assert_eq!(p.slot_tensors.len(), 2 * p.copies.len());
    for &(node, j, ci) in &p.remap {
        assert_eq!(c.g.tensors[node.index()].src[j], Some(p.copies[ci].tensor));
    }
}

#[test]
fn pins_win_and_unsupported_ops_move() {
    let b = sims(2, |i, o| {
        if i == 0 {
            o.unsupported = vec!["SCALE"];
        }
    });
    let mut c = chain(4, &[0, 0]);
    c.place_weights(&b);
    let refs: Vec<&dyn Backend> = b.iter().map(|x| &**x).collect();
    let p = partition(
        &c.g.tensors,
        &c.g.nodes,
        &c.g.leafs,
        &refs,
        &cfg(1, 1, vec![]),
    )
    .unwrap();
    for (i, t) in c.g.tensors.iter().enumerate() {
        if t.name.as_str().starts_with('s') {
            assert_eq!(
                p.backend_of[i],
                Some(1),
                "SCALE must go where it is supported"
            );
        }
    }
    // Pinning an op to a backend that cannot run it is an error naming the op.
    let s0 = c.pins[0].0;
    let err = partition(
        &c.g.tensors,
        &c.g.nodes,
        &c.g.leafs,
        &refs,
        &cfg(1, 1, vec![(s0, 0)]),
    )
    .unwrap_err();
    assert!(
        matches!(err, SchedError::Unsupported { op: "SCALE", .. }),
        "{err}"
    );
    // An op nobody supports.
    let none = sims(2, |_, o| o.unsupported = vec!["ADD"]);
    let refs: Vec<&dyn Backend> = none.iter().map(|x| &**x).collect();
    let mut c2 = chain(4, &[0]);
    c2.place_weights(&none);
    let err = partition(
        &c2.g.tensors,
        &c2.g.nodes,
        &c2.g.leafs,
        &refs,
        &cfg(1, 1, vec![]),
    )
    .unwrap_err();
    assert!(err.to_string().contains("ADD"), "{err}");
}

#[test]
fn views_and_cpy_follow_their_root() {
    let b = sims(2, |_, _| {});
    let mut acc = TensorId(0);
    let mut g = build(32, |ctx| {
        let x = ctx.new_tensor_1d(DType::F32, 8).unwrap();
        ctx.set_flags(x, TensorFlags::INPUT).unwrap();
        acc = ctx.new_tensor_1d(DType::F32, 8).unwrap();
        let y = ctx.scale(x, 2.0).unwrap();
        let v = ctx.view_2d(y, 4, 1, 16, 16).unwrap();
        let r = ctx.reshape(v, [2, 2, 1, 1]).unwrap();
        let c = ctx.cont(r).unwrap();
        let sum = ctx.add(acc, y).unwrap();
        let upd = ctx.cpy(sum, acc).unwrap();
        vec![c, upd]
    });
    place(&*b[1], &mut g.tensors[acc.index()], &[0.0; 8]);
    let refs: Vec<&dyn Backend> = b.iter().map(|x| &**x).collect();
    let y = TensorId(2);
    let p = partition(
        &g.tensors,
        &g.nodes,
        &g.leafs,
        &refs,
        &cfg(1, 1, vec![(y, 0)]),
    )
    .unwrap();
    for &n in &g.nodes {
        let t = &g.tensors[n.index()];
        if let Some(r) = t.view_src {
            assert_eq!(
                p.backend_of[n.index()],
                p.backend_of[r.index()],
                "{:?}",
                t.op
            );
        }
    }
    // The CPY writes into acc's memory on backend 1.
    let upd = *g.nodes.last().unwrap();
    assert_eq!(p.backend_of[upd.index()], Some(1));
    // View ops run no kernel and are not in any split.
    for s in &p.splits {
        assert!(s.nodes.iter().all(|n| !g.tensors[n.index()].op.is_view()));
    }
}

fn layer_plan(q: CopyQueue, events: bool, style: PlanStyle) -> (String, ggml_sched::Plan) {
    let b = sims(2, |_, o| {
        o.copy_queue = q;
        o.events = events;
    });
    let mut c = chain(4, &[0, 0, 1, 1]);
    let mut s = c.scheduler(
        b,
        ggml_sched::SchedOptions {
            n_copies: 2,
            style,
            ..Default::default()
        },
    );
    let plan = s.plan(1).unwrap().clone();
    let text = plan.to_string();
    s.synchronize().unwrap();
    (text, plan)
}

#[test]
fn layer_split_listings_and_host_syncs() {
    let mut out = String::new();
    for (q, ev) in [
        (CopyQueue::Source, true),
        (CopyQueue::Destination, true),
        (CopyQueue::Destination, false),
    ] {
        let (min_text, min) = layer_plan(q, ev, PlanStyle::Minimal);
        let (naive_text, naive) = layer_plan(q, ev, PlanStyle::Naive);
        out.push_str(&format!("== {q:?}, events {ev}\n{min_text}{naive_text}"));
        if ev {
            // One host wait per run, for the user-input copies (HB5); naive blocks for
            // every user input.
            assert_eq!(min.host_syncs(), 1, "{min_text}");
            assert!(naive.host_syncs() >= 4, "{naive_text}");
            for s in &min.splits {
                assert!(
                    s.actions
                        .iter()
                        .filter(|a| matches!(a, Action::Wait { .. }))
                        .count()
                        <= 1,
                    "at most one queue wait per split\n{min_text}"
                );
            }
        }
        assert!(
            min.host_syncs() < naive.host_syncs(),
            "{min_text}{naive_text}"
        );
    }
    println!("{out}");
    // The minimal destination-queue plan waits on the producer's event (HB1), never on
    // the split's own.
    let (_, p) = layer_plan(CopyQueue::Destination, true, PlanStyle::Minimal);
    for s in &p.splits {
        for a in &s.actions {
            if let Action::Wait { queue, event, why } = a {
                if *why == HbRule::Hb1 {
                    assert_ne!(*queue, event.backend);
                }
            }
        }
    }
    // Source-queue copies: the slot-release wait is on the source queue (HB3).
    let (_, p) = layer_plan(CopyQueue::Source, true, PlanStyle::Minimal);
    let hb3: Vec<_> = p
        .actions()
        .filter(|a| {
            matches!(
                a,
                Action::Wait {
                    why: HbRule::Hb3,
                    ..
                }
            )
        })
        .collect();
    assert!(!hb3.is_empty());
    for a in hb3 {
        if let Action::Wait { queue, event, .. } = a {
            assert_ne!(*queue, event.backend);
        }
    }
    assert!(p.actions().any(|a| matches!(
        a,
        Action::Copy {
            on: CopyOn::Src,
            ..
        }
    )));
}

#[test]
fn plans_are_pure() {
    let (a, pa) = layer_plan(CopyQueue::Destination, true, PlanStyle::Minimal);
    let (b, pb) = layer_plan(CopyQueue::Destination, true, PlanStyle::Minimal);
    assert_eq!(a, b);
    assert_eq!(pa, pb);
}

/// Every configuration, checked by enqueue order alone (no kernels): the minimal plan
/// is race-free across many pipelined runs.
#[test]
fn recording_checker_finds_no_race_in_minimal_plans() {
    for setup in Setup::all() {
        for layers in [vec![0, 1], vec![0, 0, 1, 1, 0, 1]] {
            let layers: Vec<usize> = layers.iter().map(|l| l % setup.n_backends).collect();
            let layers: Vec<usize> = if setup.n_backends > 2 {
                (0..2 * setup.n_backends).map(|l| l / 2).collect()
            } else {
                layers
            };
            let (b, log) = checked(setup.sims());
            let mut c = chain(4, &layers);
            let mut s = c.scheduler(b, setup.opts(PlanStyle::Minimal, &[]));
            for r in 0..6 {
                let (x, p) = c.inputs(r);
                s.set_input(c.x, &to_bytes(&x)).unwrap();
                s.set_input(c.p, &to_bytes(&p)).unwrap();
                s.compute().unwrap();
            }
            let mut out = vec![0u8; 16];
            s.get_tensor(c.out, &mut out).unwrap();
            assert!(
                log.is_clean(),
                "{setup:?} {layers:?}\n{}\n{}",
                log.summary(8),
                s.plan(0).unwrap()
            );
            assert!(log.accesses() > 0);
        }
    }
}

/// The compact shape of a plan: its pattern, then each wait, host wait and host sync as
/// its listing line (who waits for which event, and why), one per line.
fn plan_shape(plan: &ggml_sched::Plan) -> String {
    let pattern = plan.pattern();
    assert_eq!(plan.queue_waits(), pattern.matches('w').count(), "{plan}");
    assert_eq!(
        plan.host_syncs(),
        pattern.matches(['s', 'c']).count(),
        "{plan}"
    );
    let mut out = format!("  {pattern}\n");
    for line in plan.to_string().lines() {
        let l = line.trim_start();
        if l.starts_with("wait ") || l.starts_with("host-") {
            out.push_str(&format!(
                "    {}\n",
                l.split_whitespace().collect::<Vec<_>>().join(" ")
            ));
        }
    }
    out
}

/// Every plan of every configuration, minimal and naive, against the listing committed in
/// `tests/data/plan_shapes.txt`: a planner change that adds, drops or retargets a wait
/// shows as a diff to review, not only when it breaks an order (the checker's side) —
/// a wait too many passes every race test. `GGML_RS_BLESS=1` rewrites the file.
#[test]
fn plan_shapes_match_the_committed_listing() {
    let mut got = String::new();
    for setup in Setup::all() {
        for layers in [vec![0, 1], vec![0, 0, 1, 1, 0, 1]] {
            let layers: Vec<usize> = if setup.n_backends > 2 {
                (0..2 * setup.n_backends).map(|l| l / 2).collect()
            } else {
                layers
            };
            for style in [PlanStyle::Minimal, PlanStyle::Naive] {
                let mut c = chain(4, &layers);
                let s = c.scheduler(setup.sims(), setup.opts(style, &[]));
                got.push_str(&format!("{setup:?} {layers:?} {style:?}\n"));
                for k in 0..setup.n_copies {
                    got.push_str(&plan_shape(s.plan(k).unwrap()));
                }
            }
        }
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/plan_shapes.txt");
    if std::env::var_os("GGML_RS_BLESS").is_some() {
        std::fs::write(&path, &got).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    if got != want {
        let first = got
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(got.lines().count().min(want.lines().count()));
        panic!(
            "plans differ from {} from line {}: got {:?}, want {:?} (GGML_RS_BLESS=1 rewrites it after review)",
            path.display(),
            first + 1,
            got.lines().nth(first),
            want.lines().nth(first)
        );
    }
}

#[test]
fn recording_checker_flags_naive_destination_queue_as_hb1() {
    let setup = Setup::with_events(2, 1, true, 2);
    let (b, log) = checked(setup.sims());
    let mut c = chain(4, &[0, 1]);
    let mut s = c.scheduler(b, setup.opts(PlanStyle::Naive, &[]));
    for r in 0..3 {
        let (x, p) = c.inputs(r);
        s.set_input(c.x, &to_bytes(&x)).unwrap();
        s.set_input(c.p, &to_bytes(&p)).unwrap();
        s.compute().unwrap();
    }
    assert!(log.rules().contains(&HbRule::Hb1), "{}", log.summary(8));
    let r = log
        .races()
        .into_iter()
        .find(|r| r.rule == HbRule::Hb1)
        .unwrap();
    assert!(
        r.later.ctx.split.is_some() && r.later.ctx.slot.is_some(),
        "{r}"
    );
}

#[test]
fn naive_source_queue_without_pipelining_is_clean() {
    for n_backends in 2..=3 {
        let setup = Setup::with_events(n_backends, 0, true, 1);
        let (b, log) = checked(setup.sims());
        let mut c = chain(4, &(0..2 * n_backends).map(|l| l / 2).collect::<Vec<_>>());
        let mut s = c.scheduler(b, setup.opts(PlanStyle::Naive, &[]));
        for _ in 0..4 {
            s.compute().unwrap();
        }
        assert!(log.is_clean(), "{}", log.summary(8));
    }
}

#[test]
fn scheduler_rejects_bad_options() {
    let b = sims(2, |_, _| {});
    let bad = ggml_sched::SchedOptions {
        n_copies: 5,
        ..Default::default()
    };
    assert!(Scheduler::new(b.clone(), bad).is_err());
    let bad = ggml_sched::SchedOptions {
        input_backend: Some(2),
        ..Default::default()
    };
    assert!(Scheduler::new(b.clone(), bad).is_err());
    assert!(Scheduler::new(vec![], Default::default()).is_err());
    let mut s = Scheduler::new(b, Default::default()).unwrap();
    assert!(matches!(s.compute(), Err(SchedError::NoGraph)));
    assert!(s.set_tensor_backend(TensorId(0), 7).is_err());
}

#[test]
fn knob_names_round_trip() {
    for k in WeakenKnob::ALL {
        assert_eq!(WeakenKnob::from_name(k.name()), Some(k));
    }
    assert_eq!(HbRule::Hb6.to_string(), "HB6");
}

#[test]
fn compute_buffers_reuse_bytes() {
    let b = sims(2, |_, _| {});
    let n = 64;
    let layers = vec![0; 12];
    let mut c = chain(n, &layers);
    let mut s = c.scheduler(b, ggml_sched::SchedOptions::default());
    // 36 nodes of 256 bytes computed on backend 0: with reuse only a few are live at once
    // (plus the per-slot output and the input copies).
    let sizes = s.buffer_sizes();
    assert!(sizes[0] <= 8 * 256, "{sizes:?}");
    // Inputs live on the input backend.
    assert_eq!(sizes[1], 2 * 256);
    s.synchronize().unwrap();
    // Outputs get one copy per slot.
    let b = sims(2, |_, _| {});
    let mut c = chain(n, &layers);
    let s2 = c.scheduler(
        b,
        ggml_sched::SchedOptions {
            n_copies: 3,
            ..Default::default()
        },
    );
    let out0 = s2.tensor(0, c.out).unwrap().data.unwrap();
    let out1 = s2.tensor(1, c.out).unwrap().data.unwrap();
    assert_ne!(out0.addr, out1.addr);
    let h0 =
        c.g.tensors
            .iter()
            .position(|t| t.name.as_str() == "h0")
            .unwrap();
    let d0 = s2.tensor(0, TensorId(h0 as u32)).unwrap().data.unwrap();
    let d1 = s2.tensor(1, TensorId(h0 as u32)).unwrap().data.unwrap();
    assert_eq!(
        d0.addr, d1.addr,
        "intermediates share their bytes across slots"
    );
}

/// Each knob, on simulated backends (nothing runs): the checker reports the rule it
/// breaks from the enqueue order alone.
#[test]
fn recording_checker_reports_each_knob() {
    use CopyQueue::*;
    let cases = [
        (WeakenKnob::OwnEvent, Destination, 2, false, false),
        (WeakenKnob::NoSlotWait, Source, 2, false, false),
        (WeakenKnob::AsyncUserInput, Destination, 2, false, true),
        (WeakenKnob::NoAllocWait, Destination, 1, true, false),
    ];
    for (knob, q, n_copies, reuse, input_on_b) in cases {
        for weak in [false, true] {
            let b = sims(2, |_, o| o.copy_queue = q);
            let (b, log) = checked(b);
            let mut p = pipe(8, reuse, input_on_b);
            let opts = ggml_sched::SchedOptions {
                n_copies,
                weaken: if weak {
                    [knob].into()
                } else {
                    Default::default()
                },
                ..Default::default()
            };
            p.run(b, opts, 0, 4);
            if weak {
                assert!(
                    log.rules().contains(&knob.rule()),
                    "{knob:?}\n{}",
                    log.summary(8)
                );
            } else {
                assert!(log.is_clean(), "{knob:?} unweakened\n{}", log.summary(8));
            }
        }
    }
}

#[test]
fn style_names() {
    assert_eq!(PlanStyle::from_name("naive"), Some(PlanStyle::Naive));
    assert_eq!(PlanStyle::from_name("minimal"), Some(PlanStyle::Minimal));
    assert_eq!(PlanStyle::from_name("x"), None);
}

/// The all-gather of tensor parallelism: each device scales its half, then every device
/// joins both halves and goes on, three times. After device B copies A's half, A's next
/// split does not depend on B at all, so only an explicit HB6 wait keeps A from
/// overwriting the half B still has to copy (the planner once dropped that wait: queue
/// positions counted splits, so B's copy-done event looked implied by its split event).
#[test]
fn all_gather_keeps_its_source_reuse_waits() {
    for setup in Setup::all().into_iter().filter(|s| s.n_backends == 2) {
        let (b, log) = checked(setup.sims());
        let n = 64;
        let mut pins = Vec::new();
        let mut x = TensorId(0);
        let mut out = TensorId(0);
        let g = build(64, |ctx| {
            x = ctx.new_tensor_1d(DType::F32, n).unwrap();
            ctx.set_name(x, "x").unwrap();
            ctx.set_flags(x, TensorFlags::INPUT).unwrap();
            let mut full = [x, x];
            for step in 0..3 {
                let halves: Vec<TensorId> = (0..2)
                    .map(|d| {
                        let v = ctx
                            .view_2d(full[d], n / 2, 1, n / 2 * 4, d * n / 2 * 4)
                            .unwrap();
                        let h = ctx.scale(v, 0.5 + d as f32).unwrap();
                        ctx.set_name(h, &format!("half{step}.{d}")).unwrap();
                        pins.push((h, d));
                        h
                    })
                    .collect();
                for (d, f) in full.iter_mut().enumerate() {
                    let c = ctx.concat(halves[0], halves[1], 0).unwrap();
                    ctx.set_name(c, &format!("gather{step}.{d}")).unwrap();
                    pins.push((c, d));
                    *f = c;
                }
            }
            out = ctx.add(full[0], full[1]).unwrap();
            pins.push((out, 0));
            ctx.set_flags(out, TensorFlags::OUTPUT).unwrap();
            vec![out]
        });
        let mut s = Scheduler::new(b, setup.opts(PlanStyle::Minimal, &[])).unwrap();
        for &(id, d) in &pins {
            s.set_tensor_backend(id, d).unwrap();
        }
        s.alloc_nodes(&g.tensors, &g.nodes, &g.leafs).unwrap();
        for r in 0..4 {
            s.set_input(x, &to_bytes(&vec![r as f32; n])).unwrap();
            s.compute().unwrap();
        }
        let plan = s.plan(0).unwrap();
        assert!(log.accesses() > 0);
        assert!(log.is_clean(), "{setup:?}\n{}\n{plan}", log.summary(8));
    }
}
