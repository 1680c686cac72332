//! Copy engines: cross-device copies of computed tensors on a queue of their own, so that
//! they overlap compute. Exact numbers and zero races under random delays for the
//! minimal plan, and each engine rule, weakened, reported by the checker and visible in
//! the numbers.

mod common;

use std::sync::Arc;

use common::*;
use ggml_core::{Backend, CopyQueue};
use ggml_sched::testing::TestBackend;
use ggml_sched::{Action, CopyOn, HbRule, PlanStyle, SchedOptions, WeakenKnob};

fn layers_for(n_backends: usize) -> Vec<usize> {
    (0..2 * n_backends).map(|l| l / 2).collect()
}

/// One engine per device, each with its own random delays.
fn engines(n: usize, seed: u64, max_delay_us: u64) -> Vec<Arc<TestBackend>> {
    TestBackend::many(n, |i, o| {
        o.delay_seed = Some(seed * 17 + 100 + i as u64);
        o.max_delay_us = max_delay_us;
    })
}

#[test]
fn engine_plans_are_exact_and_race_free_under_delays() {
    for (i, setup) in Setup::all().into_iter().enumerate() {
        if !setup.events {
            continue;
        }
        let seed = i as u64;
        let mut placements = vec![layers_for(setup.n_backends)];
        if setup.n_backends == 2 {
            placements.push(vec![0, 1, 0, 1, 1, 0]);
        }
        for layers in placements {
            let mut all = dyns(setup.tests(Some(seed), 150));
            all.extend(dyns(engines(setup.n_backends, seed, 150)));
            let (all, log) = checked(all);
            let eng = all[setup.n_backends..].to_vec();
            let dev = all[..setup.n_backends].to_vec();
            let mut c = chain(8, &layers);
            let mut s = c.scheduler_with(dev, eng, setup.opts(PlanStyle::Minimal, &[]));
            let bad = c.run_pipelined(&mut s, 6);
            let plan = s.plan(0).unwrap();
            assert!(bad.is_empty(), "{setup:?} {layers:?}: runs {bad:?}\n{plan}");
            assert!(
                log.is_clean(),
                "{setup:?} {layers:?}\n{}\n{plan}",
                log.summary(8)
            );
            // Computed tensors cross on engines, user inputs on the devices' queues.
            let on: Vec<CopyOn> = plan
                .actions()
                .filter_map(|a| match a {
                    Action::Copy { on, .. } => Some(*on),
                    _ => None,
                })
                .collect();
            assert!(on.iter().any(|o| matches!(o, CopyOn::Engine(_))), "{plan}");
            assert_eq!(s.copy_engines().len(), setup.n_backends);
            assert_eq!(s.backends().len(), setup.n_backends);
        }
    }
}

struct EngineCase {
    knob: WeakenKnob,
    /// Delays of devices A and B and of B's engine.
    delays: [u64; 3],
    n_copies: usize,
}

fn engine_cases() -> Vec<EngineCase> {
    vec![
        // A slow producer: an engine that does not wait for it copies x too early.
        EngineCase {
            knob: WeakenKnob::EngineEarly,
            delays: [1500, 0, 0],
            n_copies: 1,
        },
        // A slow consumer with runs in flight: the engine overwrites the receive buffer
        // before B read it in run r - N.
        EngineCase {
            knob: WeakenKnob::EngineReuse,
            delays: [0, 1500, 0],
            n_copies: 2,
        },
        // A slow engine: B reads the receive buffer before the chunk arrived.
        EngineCase {
            knob: WeakenKnob::EngineNoArrival,
            delays: [0, 0, 1500],
            n_copies: 1,
        },
    ]
}

/// Devices and their copy engines.
type DevicesAndEngines = (Vec<Arc<dyn Backend>>, Vec<Arc<dyn Backend>>);

fn case_backends(case: &EngineCase, seed: u64) -> DevicesAndEngines {
    let specs = [
        (CopyQueue::Destination, case.delays[0]),
        (CopyQueue::Destination, case.delays[1]),
    ];
    let dev = dyns(test_backends(&specs, seed));
    let eng = dyns(TestBackend::many(2, |i, o| {
        if i == 1 && case.delays[2] > 0 {
            o.delay_seed = Some(seed * 7 + 3);
            o.max_delay_us = case.delays[2];
        }
    }));
    (dev, eng)
}

#[test]
fn each_weakened_engine_rule_is_caught() {
    for case in engine_cases() {
        let opts = |weak: bool| SchedOptions {
            n_copies: case.n_copies,
            weaken: if weak {
                [case.knob].into()
            } else {
                Default::default()
            },
            ..SchedOptions::default()
        };
        // The checker reports the rule the knob breaks.
        let (dev, eng) = case_backends(&case, 1);
        let (dev, log) = checked(dev);
        let eng = ggml_sched::CheckedBackend::wrap_all(&eng, &log);
        let mut p = pipe(8, false, false);
        p.run_with(dev, eng, opts(true), 0, 6);
        assert!(
            log.rules().contains(&case.knob.rule()),
            "{:?}: expected {} in\n{}",
            case.knob,
            case.knob.rule(),
            log.summary(10)
        );
        // Unweakened: clean.
        let (dev, eng) = case_backends(&case, 1);
        let (dev, log) = checked(dev);
        let eng = ggml_sched::CheckedBackend::wrap_all(&eng, &log);
        let mut p = pipe(8, false, false);
        assert!(p.run_with(dev, eng, opts(false), 0, 6));
        assert!(
            log.is_clean(),
            "{:?} unweakened:\n{}",
            case.knob,
            log.summary(10)
        );
        // Numbers: some seed goes wrong with the knob, none without.
        let mut wrong = 0;
        for seed in 0..12 {
            let (dev, eng) = case_backends(&case, seed);
            let mut p = pipe(8, false, false);
            if !p.run_with(dev, eng, opts(true), 0, 8) {
                wrong += 1;
                if wrong >= 2 {
                    break;
                }
            }
            let (dev, eng) = case_backends(&case, seed);
            let mut p = pipe(8, false, false);
            assert!(
                p.run_with(dev, eng, opts(false), 0, 8),
                "{:?}: correct plan wrong at seed {seed}",
                case.knob
            );
        }
        assert!(wrong > 0, "{:?}: no seed changed the numbers", case.knob);
    }
}

#[test]
fn engine_knobs_break_the_rule_they_name() {
    let rules: Vec<HbRule> = WeakenKnob::ENGINE.iter().map(|k| k.rule()).collect();
    assert_eq!(rules, [HbRule::Hb1, HbRule::Hb3, HbRule::Hb2]);
}

#[test]
fn engines_must_match_devices() {
    let dev = dyns(TestBackend::many(2, |_, _| {}));
    let eng = dyns(TestBackend::many(1, |_, _| {}));
    let e = ggml_sched::Scheduler::with_copy_engines(dev, eng, SchedOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("1 copy engines for 2 devices"), "{e}");
}

/// Copies round the ring of devices: a tensor of device a reaches device b through every
/// device between them, each hop on the receiving device's engine from the previous
/// device's receive buffer. Exact and race-free under delays, for every slot count.
#[test]
fn ring_forwards_are_exact_and_race_free() {
    for n_copies in 1..=3 {
        for seed in 0..4u64 {
            // Layers jump backwards and across: 0 -> 2 crosses device 1, 2 -> 1 crosses 0.
            let layers = [0, 2, 1, 0, 2, 2, 1];
            let mut all = dyns(TestBackend::many(3, |i, o| {
                o.delay_seed = Some(seed * 13 + i as u64);
                o.max_delay_us = 200;
            }));
            all.extend(dyns(engines(3, seed, 200)));
            let (all, log) = checked(all);
            let opts = SchedOptions {
                n_copies,
                ring: true,
                ..SchedOptions::default()
            };
            let mut c = chain(8, &layers);
            let mut s = c.scheduler_with(all[..3].to_vec(), all[3..].to_vec(), opts);
            let bad = c.run_pipelined(&mut s, 6);
            let plan = s.plan(0).unwrap();
            assert!(
                bad.is_empty(),
                "n_copies {n_copies} seed {seed}: {bad:?}\n{plan}"
            );
            assert!(log.is_clean(), "{}\n{plan}", log.summary(8));
            let part = s.partition().unwrap();
            let forwards = part.copies.iter().filter(|cp| cp.via.is_some()).count();
            assert!(forwards > 0, "{plan}");
            for cp in &part.copies {
                if cp.kind == ggml_sched::SourceKind::Computed {
                    assert_eq!(cp.to, (cp.from + 1) % 3, "{} hops one link", cp.name);
                }
            }
        }
    }
}

/// Forwarding a chunk before it arrived in the previous device's receive buffer is the
/// race `engine-early` shows: the checker reports HB1 on the forward.
#[test]
fn early_forward_is_caught() {
    let layers = [0, 2, 1, 0, 2];
    let mut all = dyns(TestBackend::many(3, |_, _| {}));
    all.extend(dyns(engines(3, 1, 300)));
    let (all, log) = checked(all);
    let opts = SchedOptions {
        n_copies: 2,
        ring: true,
        weaken: [WeakenKnob::EngineEarly].into(),
        ..SchedOptions::default()
    };
    let mut c = chain(8, &layers);
    let mut s = c.scheduler_with(all[..3].to_vec(), all[3..].to_vec(), opts);
    c.run_pipelined(&mut s, 4);
    assert!(log.rules().contains(&HbRule::Hb1), "{}", log.summary(8));
    assert!(
        log.races()
            .iter()
            .any(|r| r.rule == HbRule::Hb1 && r.earlier.tensor.contains('#')),
        "a forward out of a receive buffer:\n{}",
        log.summary(8)
    );
}

#[test]
fn ring_needs_engines_and_the_minimal_plan() {
    let opts = SchedOptions {
        ring: true,
        ..SchedOptions::default()
    };
    let e = ggml_sched::Scheduler::new(dyns(TestBackend::many(2, |_, _| {})), opts.clone())
        .unwrap_err()
        .to_string();
    assert!(e.contains("need copy engines"), "{e}");
    let naive = SchedOptions {
        style: PlanStyle::Naive,
        ..opts
    };
    let e = ggml_sched::Scheduler::with_copy_engines(
        dyns(TestBackend::many(2, |_, _| {})),
        dyns(TestBackend::many(2, |_, _| {})),
        naive,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("minimal plan"), "{e}");
}
