//! Execution on threaded test backends with random delays: exact numbers, zero races for
//! the correct plans, each weakened rule reported by the checker and visible in numbers,
//! failures mid-graph, and no leaks.

mod common;

use common::*;
use ggml_core::CopyQueue;
use ggml_sched::testing::{FailMode, TestBackend, TestBackendOptions};
use ggml_sched::{HbRule, PlanStyle, SchedOptions, WeakenKnob};

fn layers_for(n_backends: usize) -> Vec<usize> {
    (0..2 * n_backends).map(|l| l / 2).collect()
}

/// The correct scheduler over every configuration: exact numbers, no race.
#[test]
fn minimal_plan_is_exact_and_race_free_under_delays() {
    for (i, setup) in Setup::all().into_iter().enumerate() {
        let seed = i as u64;
        let mut placements = vec![layers_for(setup.n_backends)];
        if setup.n_backends == 2 {
            // Back and forth: A, B, A, B, with copies of p reused across splits.
            placements.push(vec![0, 1, 0, 1, 1, 0]);
        }
        for layers in placements {
            let (b, log) = checked(dyns(setup.tests(Some(seed), 150)));
            let mut c = chain(8, &layers);
            let mut s = c.scheduler(b, setup.opts(PlanStyle::Minimal, &[]));
            let bad = c.run_pipelined(&mut s, 6);
            let plan = s.plan(0).unwrap();
            assert!(
                bad.is_empty(),
                "{setup:?} {layers:?}: runs {bad:?} wrong\n{plan}"
            );
            assert!(
                log.is_clean(),
                "{setup:?} {layers:?}\n{}\n{plan}",
                log.summary(8)
            );
            let st = s.stats();
            assert_eq!(st.runs, 6);
            if setup.events && setup.foreign_waits {
                // One host wait per run, for the user-input copies (HB5).
                assert_eq!(st.host_syncs, 6, "{setup:?} {layers:?}\n{plan}");
            }
            assert!(st.bytes_copied > 0);
        }
    }
}

/// Outputs staged on their producer's queue stay exact when the host reads them only
/// after many more runs than there are slots, race-free under delays, for both copy
/// queues; their memory is reused and freed with the scheduler.
#[test]
fn staged_outputs_outlive_their_slots() {
    for queues in 0..2 {
        let setup = Setup::with_events(3, queues, true, 2);
        let tests = setup.tests(Some(11), 150);
        let (b, log) = checked(dyns(tests.clone()));
        let mut c = chain(8, &[0, 0, 1, 1, 2, 2]);
        let mut s = c.scheduler(b, setup.opts(PlanStyle::Minimal, &[]));
        assert!(c.run_staged(&mut s, 7).is_empty(), "{setup:?}");
        assert!(
            c.run_staged(&mut s, 3).is_empty(),
            "{setup:?} (reused staging)"
        );
        assert!(log.is_clean(), "{setup:?}\n{}", log.summary(8));
        drop(s);
        for t in &tests {
            // Only the test's two weights per backend remain.
            assert_eq!((t.live_buffers(), t.live_events()), (2, 0), "{setup:?}");
        }
    }
}

#[test]
fn declined_copies_fall_back_to_blocking_and_stay_exact() {
    for queues in 0..2 {
        let setup = Setup::with_events(3, queues, false, 2);
        let (b, log) = checked(dyns(setup.tests(Some(7), 100)));
        let mut c = chain(8, &layers_for(3));
        let mut s = c.scheduler(b, setup.opts(PlanStyle::Minimal, &[]));
        assert!(c.run_pipelined(&mut s, 4).is_empty());
        assert!(log.is_clean(), "{}", log.summary(8));
        assert_eq!(s.stats().async_copies, 0);
        assert!(s.stats().blocking_copies > 0);
    }
}

#[test]
fn naive_plan_is_exact_without_pipelining() {
    let setup = Setup::with_events(3, 0, true, 1);
    let (b, log) = checked(dyns(setup.tests(Some(3), 100)));
    let mut c = chain(8, &layers_for(3));
    let mut s = c.scheduler(b, setup.opts(PlanStyle::Naive, &[]));
    assert!(c.run_pipelined(&mut s, 4).is_empty());
    assert!(log.is_clean(), "{}", log.summary(8));
    let naive = s.stats().host_syncs_per_compute();
    let (b, _) = checked(dyns(setup.tests(Some(3), 100)));
    let mut c = chain(8, &layers_for(3));
    let mut s = c.scheduler(b, setup.opts(PlanStyle::Minimal, &[]));
    assert!(c.run_pipelined(&mut s, 4).is_empty());
    let minimal = s.stats().host_syncs_per_compute();
    assert!(minimal < naive, "minimal {minimal} naive {naive}");
}

struct KnobCase {
    knob: WeakenKnob,
    specs: [(CopyQueue, u64); 2],
    n_copies: usize,
    reuse: bool,
    input_on_b: bool,
}

/// (knob, specs, n_copies, reuse, input_on_b) per case.
fn knob_cases() -> Vec<KnobCase> {
    use CopyQueue::*;
    #[rustfmt::skip] // one case a line
    let cases = [
        // Destination-queue copies with a slow producer: waiting on B's own event lets
        // B copy x before A wrote it.
        (WeakenKnob::OwnEvent, [(Destination, 1500), (Destination, 0)], 2, false, false),
        // Source-queue copies, a fast producer and a slow consumer with runs in flight:
        // without the slot-release wait A overwrites the slot B still has to read.
        (WeakenKnob::NoSlotWait, [(Source, 0), (Source, 1500)], 2, false, false),
        // The input lives on A and is copied on B's (slow) queue: without the final
        // host wait the caller's next write lands before the copy read it.
        (WeakenKnob::AsyncUserInput, [(Destination, 0), (Destination, 1500)], 2, false, true),
        // Destination-queue copy of x on a slow B while A reuses x's bytes for z.
        (WeakenKnob::NoAllocWait, [(Destination, 0), (Destination, 1500)], 1, true, false),
    ];
    cases
        .into_iter()
        .map(|(knob, specs, n_copies, reuse, input_on_b)| KnobCase {
            knob,
            specs,
            n_copies,
            reuse,
            input_on_b,
        })
        .collect()
}

/// Each weakened rule is reported by the checker (with the rule it breaks) and, with
/// delays, changes the numbers for some seeds; the unweakened plan on the same setups is
/// clean and exact.
#[test]
fn each_weakened_rule_is_caught() {
    for case in knob_cases() {
        let input_backend = 0;
        let opts = |weak: bool| SchedOptions {
            n_copies: case.n_copies,
            weaken: if weak {
                [case.knob].into()
            } else {
                Default::default()
            },
            ..SchedOptions::default()
        };
        // The checker reports it.
        let (b, log) = checked(dyns(test_backends(&case.specs, 1)));
        let mut p = pipe(8, case.reuse, case.input_on_b);
        p.run(b, opts(true), input_backend, 6);
        assert!(
            log.rules().contains(&case.knob.rule()),
            "{:?}: expected {} in\n{}",
            case.knob,
            case.knob.rule(),
            log.summary(10)
        );
        let r = log
            .races()
            .into_iter()
            .find(|r| r.rule == case.knob.rule())
            .unwrap();
        assert!(
            r.later.ctx.run.is_some() && r.earlier.ctx.run.is_some(),
            "{r}"
        );
        // The correct plan on the same setup: clean.
        let (b, log) = checked(dyns(test_backends(&case.specs, 1)));
        let mut p = pipe(8, case.reuse, case.input_on_b);
        assert!(p.run(b, opts(false), input_backend, 6));
        assert!(
            log.is_clean(),
            "{:?} unweakened:\n{}",
            case.knob,
            log.summary(10)
        );
        // Numbers: some seed goes wrong with the knob, none without.
        let mut wrong = 0;
        for seed in 0..12 {
            let mut p = pipe(8, case.reuse, case.input_on_b);
            if !p.run(
                dyns(test_backends(&case.specs, seed)),
                opts(true),
                input_backend,
                8,
            ) {
                wrong += 1;
                if wrong >= 2 {
                    break;
                }
            }
            let mut p = pipe(8, case.reuse, case.input_on_b);
            assert!(
                p.run(
                    dyns(test_backends(&case.specs, seed)),
                    opts(false),
                    input_backend,
                    8
                ),
                "{:?}: correct plan wrong at seed {seed}",
                case.knob
            );
        }
        assert!(wrong > 0, "{:?}: no seed changed the numbers", case.knob);
    }
}

#[test]
fn failure_mid_graph_returns_error_and_recovers_without_leaks() {
    for fail in [
        FailMode::EnqueueCompute { nth: 3 },
        FailMode::RuntimeCompute { nth: 3 },
    ] {
        let tb = TestBackend::many(3, |i, o| {
            o.delay_seed = Some(i as u64);
            o.max_delay_us = 100;
            if i == 1 {
                o.fail = Some(fail);
            }
        });
        let b = dyns(tb.clone());
        let mut c = chain(8, &layers_for(3));
        let mut s = c.scheduler(
            b,
            SchedOptions {
                n_copies: 2,
                ..Default::default()
            },
        );
        let mut errors = 0;
        for r in 0..6u64 {
            let (x, p) = c.inputs(r);
            s.set_input(c.x, &to_bytes(&x)).unwrap();
            s.set_input(c.p, &to_bytes(&p)).unwrap();
            match s.compute() {
                Ok(_) => {}
                Err(e) => {
                    errors += 1;
                    assert!(e.to_string().contains("injected"), "{e}");
                }
            }
        }
        if matches!(fail, FailMode::RuntimeCompute { .. }) {
            // Kernel errors surface at the next synchronize.
            let e = s.synchronize().unwrap_err();
            assert!(e.to_string().contains("injected"), "{e}");
            errors += 1;
        }
        assert_eq!(errors, 1, "{fail:?}");
        s.synchronize().unwrap();
        // The scheduler runs again, exactly.
        assert!(c.run_pipelined(&mut s, 4).is_empty());
        drop(s);
        for t in &tb {
            assert_eq!(t.live_events(), 0, "{fail:?}");
            // Only the test's two weights per backend remain: compute buffers are freed.
            assert_eq!(t.live_buffers(), 2, "{fail:?}");
        }
    }
}

#[test]
fn caller_graph_is_untouched_and_outputs_of_older_runs_stay_readable() {
    let b = dyns(TestBackend::many(2, |i, o| {
        o.delay_seed = Some(i as u64 + 11);
    }));
    let mut c = chain(8, &layers_for(2));
    let before = c.g.tensors.clone();
    let mut s = c.scheduler(
        b,
        SchedOptions {
            n_copies: 3,
            ..Default::default()
        },
    );
    // Only weights got data (placed by the test); the scheduler changed nothing.
    for (a, b) in before.iter().zip(&c.g.tensors) {
        assert_eq!(a.src, b.src);
        assert_eq!(a.op, b.op);
    }
    for r in 0..3 {
        let (x, p) = c.inputs(r);
        s.compute_with(&[(c.x, &to_bytes(&x)), (c.p, &to_bytes(&p))])
            .unwrap();
    }
    let mut out = vec![0u8; 32];
    for r in 0..3 {
        s.get_tensor_run(r, c.out, &mut out).unwrap();
        assert_eq!(to_f32(&out), c.expected(r));
    }
    s.get_tensor(c.out, &mut out).unwrap();
    assert_eq!(to_f32(&out), c.expected(2));
    // A fourth run reuses run 0's slot.
    s.compute().unwrap();
    assert!(s.get_tensor_run(0, c.out, &mut out).is_err());
    // Wrong sizes and non-inputs are errors.
    assert!(s.set_input(c.x, &[0u8; 3]).is_err());
    assert!(s.set_input(c.out, &[0u8; 32]).is_err());
    assert!(s.get_tensor(c.out, &mut [0u8; 4]).is_err());
    // Re-alloc of the same graph works and keeps running.
    s.alloc_nodes(&c.g.tensors, &c.g.nodes, &c.g.leafs).unwrap();
    assert!(c.run_pipelined(&mut s, 3).is_empty());
}

#[test]
fn foreign_event_waits_become_host_waits() {
    let tb = TestBackend::many(3, |i, o| {
        o.foreign_waits = false;
        o.copy_queue = if i == 1 {
            CopyQueue::Source
        } else {
            CopyQueue::Destination
        };
        o.delay_seed = Some(i as u64);
    });
    let (b, log) = checked(dyns(tb));
    let mut c = chain(8, &layers_for(3));
    let mut s = c.scheduler(
        b,
        SchedOptions {
            n_copies: 2,
            ..Default::default()
        },
    );
    let plan = s.plan(0).unwrap().to_string();
    assert!(plan.contains("host-wait"), "{plan}");
    assert!(
        !plan.contains("    wait "),
        "no queue waits on foreign events\n{plan}"
    );
    assert!(c.run_pipelined(&mut s, 5).is_empty());
    assert!(log.is_clean(), "{}", log.summary(8));
}

#[test]
fn reports_name_tensors_split_slot_and_rule() {
    let case = &knob_cases()[0];
    let (b, log) = checked(dyns(test_backends(&case.specs, 1)));
    let mut p = pipe(8, false, false);
    p.run(
        b,
        SchedOptions {
            n_copies: 2,
            weaken: [WeakenKnob::OwnEvent].into(),
            ..Default::default()
        },
        0,
        3,
    );
    let r = log
        .races()
        .into_iter()
        .find(|r| r.rule == HbRule::Hb1)
        .unwrap();
    let text = r.to_string();
    assert!(
        text.contains("HB1")
            && text.contains("'x'")
            && text.contains("split")
            && text.contains("slot"),
        "{text}"
    );
    let _ = TestBackendOptions::new("unused");
}
