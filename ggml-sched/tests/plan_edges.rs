//! Plans of partitions that the layer chains of `plan.rs` never produce: a split without
//! inputs after another backend's split, splits of different sizes, plans with and
//! without a prologue. Each expected plan is derived by hand from the style's rules
//! (DESIGN.md HB1..HB7, the naive style's documented ggml behaviour), not printed.

mod common;

use std::sync::Arc;

use common::*;
use ggml_core::{Backend, CopyQueue, DType, TensorFlags, TensorId};
use ggml_sched::testing::{SimBackend, SimOptions};
use ggml_sched::{
    build_plan, partition, Action, BackendProps, CopyOn, EventKey, EventKind, HbRule, Partition,
    PartitionConfig, PlanSettings, PlanStyle, WeakenKnob,
};

fn sims(n: usize) -> Vec<Arc<dyn Backend>> {
    (0..n)
        .map(|i| SimBackend::new(SimOptions::new(&format!("dev{i}"))) as Arc<dyn Backend>)
        .collect()
}

fn props(n: usize, q: CopyQueue, events: bool) -> Vec<BackendProps> {
    (0..n)
        .map(|i| BackendProps {
            name: format!("dev{i}"),
            events,
            copy_queue: q,
            can_wait_on: vec![true; n],
        })
        .collect()
}

fn settings(n_copies: usize, slot: usize, style: PlanStyle) -> PlanSettings {
    PlanSettings {
        n_copies,
        slot,
        style,
        ..Default::default()
    }
}

fn split_ev(backend: usize, slot: usize) -> EventKey {
    EventKey {
        backend,
        kind: EventKind::Split,
        slot,
    }
}

/// Two branches off the input `x` (on `input_backend`): `o0 = scale(x)` pinned to dev0,
/// then `o2 = scale(scale(x))` pinned to dev1 (two nodes). With `input_backend` 1 the
/// dev1 split reads `x` in place: a split without inputs after dev0's split. With
/// `swap`, the dev1 branch comes first in the node order.
fn branches(input_backend: usize, swap: bool) -> Partition {
    let mut pins: Vec<(TensorId, usize)> = Vec::new();
    let g = build(16, |ctx| {
        let x = ctx.new_tensor_1d(DType::F32, 4).unwrap();
        ctx.set_name(x, "x").unwrap();
        ctx.set_flags(x, TensorFlags::INPUT).unwrap();
        let o0 = ctx.scale(x, 2.0).unwrap();
        ctx.set_name(o0, "o0").unwrap();
        ctx.set_flags(o0, TensorFlags::OUTPUT).unwrap();
        let o1 = ctx.scale(x, 3.0).unwrap();
        ctx.set_name(o1, "o1").unwrap();
        let o2 = ctx.scale(o1, 0.5).unwrap();
        ctx.set_name(o2, "o2").unwrap();
        ctx.set_flags(o2, TensorFlags::OUTPUT).unwrap();
        pins = vec![(o0, 0), (o1, 1), (o2, 1)];
        if swap {
            vec![o2, o0]
        } else {
            vec![o0, o2]
        }
    });
    let b = sims(2);
    let refs: Vec<&dyn Backend> = b.iter().map(|x| &**x).collect();
    let cfg = PartitionConfig {
        n_copies: 2,
        input_backend,
        op_offload: false,
        pins,
        ring: false,
    };
    partition(&g.tensors, &g.nodes, &g.leafs, &refs, &cfg).unwrap()
}

/// The naive style models ggml's `compute_splits`: a split whose inputs are all in place
/// (no copies) host-waits for the previous split's backend before it starts (HB6 in
/// ggml's model: the allocator may hand the bytes that backend still reads to the next
/// split). Here dev1's split reads `x` in place after dev0's split, so it must carry
/// exactly that wait, on dev0 (the previous split's backend, not its own) — with events
/// (n_copies 2) a host wait on dev0's split event of the run's slot, without events a
/// host sync of dev0.
#[test]
fn naive_split_without_inputs_host_waits_for_the_previous_backend() {
    let part = branches(1, false);
    assert_eq!(part.splits.len(), 2);
    assert_eq!(part.splits[0].backend, 0);
    assert_eq!(part.splits[1].backend, 1);
    assert!(part.splits[1].inputs.is_empty(), "dev1 reads x in place");
    assert_eq!(part.splits[0].inputs.len(), 1);
    let copy = |slot| Action::Copy {
        copy: 0,
        tensor: part.copies[0].tensor,
        slot,
        from: 1,
        to: 0,
        on: CopyOn::Host,
    };
    for slot in 0..2 {
        let plan = build_plan(
            &part,
            &props(2, CopyQueue::Destination, true),
            &settings(2, slot, PlanStyle::Naive),
        );
        let hw = |why| Action::HostWait {
            event: split_ev(0, slot),
            why,
        };
        // Split 0: ggml's user-input path, a host wait on the split's own backend and a
        // blocking copy (HB3), then the compute and its event.
        assert_eq!(
            plan.splits[0].actions,
            vec![
                hw(HbRule::Hb3),
                copy(slot),
                Action::Compute { split: 0 },
                Action::Record {
                    event: split_ev(0, slot)
                },
            ]
        );
        assert_eq!(
            plan.splits[1].actions,
            vec![
                hw(HbRule::Hb6),
                Action::Compute { split: 1 },
                Action::Record {
                    event: split_ev(1, slot)
                },
            ],
            "{plan}"
        );
    }
    // Without events (or with n_copies 1, where ggml creates none) the waits are host
    // syncs of the same backend.
    for (events, n_copies) in [(false, 2), (true, 1)] {
        let plan = build_plan(
            &part,
            &props(2, CopyQueue::Destination, events),
            &settings(n_copies, 0, PlanStyle::Naive),
        );
        assert_eq!(
            plan.splits[1].actions,
            vec![
                Action::HostSync {
                    backend: 0,
                    why: HbRule::Hb6
                },
                Action::Compute { split: 1 },
            ],
            "{plan}"
        );
    }
}

/// The first split has no previous split to wait for, even without inputs: dev1's
/// branch first (reading `x` in place), then dev0's split with its copy of `x`.
#[test]
fn naive_first_split_without_inputs_waits_for_nothing() {
    let part = branches(1, true);
    assert_eq!(part.splits.len(), 2);
    assert_eq!(part.splits[0].backend, 1);
    assert!(part.splits[0].inputs.is_empty());
    let plan = build_plan(
        &part,
        &props(2, CopyQueue::Destination, true),
        &settings(2, 0, PlanStyle::Naive),
    );
    assert_eq!(
        plan.splits[0].actions,
        vec![
            Action::Compute { split: 0 },
            Action::Record {
                event: split_ev(1, 0)
            },
        ]
    );
    assert_eq!(plan.pattern(), "g|scg");
}

/// The whole listing of the naive plan above, line by line: the header (no weakened
/// rules: no `WEAKENED`), no prologue section (naive plans have none), and each compute
/// line with its own split's node count (1 and 2).
#[test]
fn naive_listing_is_exact() {
    let part = branches(1, false);
    let plan = build_plan(
        &part,
        &props(2, CopyQueue::Destination, true),
        &settings(2, 1, PlanStyle::Naive),
    );
    let want = [
        "plan naive (ggml), n_copies 2, slot 1: 2 splits, 3 host syncs, 0 queue waits".to_string(),
        "  backend 0: dev0 (copies on dst queue, events)".to_string(),
        "  backend 1: dev1 (copies on dst queue, events)".to_string(),
        "  split 0 on dev0 (1 nodes) [scg]".to_string(),
        format!("    host-wait  {:<40} HB3", "split[dev0]@1"),
        format!(
            "    copy       {:<40} dev1 -> dev0 blocking",
            "x -> dev0#x#1"
        ),
        "    compute    split 0 (1 nodes)".to_string(),
        "    record     split[dev0]@1".to_string(),
        "  split 1 on dev1 (2 nodes) [sg]".to_string(),
        format!("    host-wait  {:<40} HB6", "split[dev0]@1"),
        "    compute    split 1 (2 nodes)".to_string(),
        "    record     split[dev1]@1".to_string(),
        "  pattern: scg|sg".to_string(),
    ];
    assert_eq!(plan.to_string(), want.join("\n") + "\n");
}

/// A minimal plan whose destination-queue copy reads a user input gets a prologue (the
/// `inputs` event on the input backend, HB1 for the copy), listed before the splits; a
/// weakened plan names its knobs in the header.
#[test]
fn minimal_listing_shows_prologue_and_weakened_knobs() {
    let part = branches(1, false);
    let plan = minimal_plan(&part, 2, CopyQueue::Destination);
    let text = plan.to_string();
    assert!(
        text.contains("\n  prologue\n    record     inputs[dev1]@0\n  split 0 on dev0"),
        "{text}"
    );
    assert!(!text.contains("WEAKENED"), "{text}");
    let mut s = settings(2, 0, PlanStyle::Minimal);
    s.weaken.insert(WeakenKnob::NoAllocWait);
    let text = build_plan(&part, &props(2, CopyQueue::Destination, true), &s).to_string();
    let header = text.lines().next().unwrap();
    assert!(header.ends_with(", WEAKENED: no-alloc-wait"), "{text}");
    // Source-queue copies need no inputs event: no prologue section at all.
    let text = minimal_plan(&part, 2, CopyQueue::Source).to_string();
    assert!(!text.contains("prologue"), "{text}");
}

/// The actions of split `k` as listed by the plan's `Display`, whitespace collapsed
/// (`wait dev1 <- split[dev0]@0 HB1`).
/// The minimal plan of slot 0 of two over `n` backends with events and `q` copy queues.
fn minimal_plan(part: &Partition, n: usize, q: CopyQueue) -> ggml_sched::Plan {
    build_plan(
        part,
        &props(n, q, true),
        &settings(2, 0, PlanStyle::Minimal),
    )
}

/// Builds the chain `ops` over `n` backends (`weights`: static tensors and their
/// backends), checks that its splits run on dev0, dev1, ... in order and that split `k`
/// of its minimal plan (destination queues) is `want`; returns the partition and plan.
fn assert_minimal_split(
    ops: &[(&str, &str, &[&str], usize)],
    n: usize,
    weights: &[(&str, usize)],
    k: usize,
    want: &[&str],
) -> (Partition, ggml_sched::Plan) {
    let (g, pins) = graph(ops);
    let part = part_of(g, n, 0, pins, weights);
    assert_eq!(backends_of(&part), (0..n).collect::<Vec<_>>());
    let plan = minimal_plan(&part, n, CopyQueue::Destination);
    assert_eq!(split_lines(&plan, k), want, "{plan}");
    (part, plan)
}

fn split_lines(plan: &ggml_sched::Plan, k: usize) -> Vec<String> {
    let text = plan.to_string();
    let head = format!("  split {k} on ");
    text.lines()
        .skip_while(|l| !l.starts_with(&head))
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// Partitions `g` over `n` simulated backends with `pins`; leaves named in `placed` get
/// data on the given backend first (weights, or caller memory the graph writes).
fn part_of(
    mut g: Built,
    n: usize,
    input_backend: usize,
    pins: Vec<(TensorId, usize)>,
    placed: &[(&str, usize)],
) -> Partition {
    let b = sims(n);
    for &(name, d) in placed {
        let i = g
            .tensors
            .iter()
            .position(|t| t.name.as_str() == name)
            .unwrap();
        place(&*b[d], &mut g.tensors[i], &[1.0; 4]);
    }
    let refs: Vec<&dyn Backend> = b.iter().map(|x| &**x).collect();
    let cfg = PartitionConfig {
        n_copies: 2,
        input_backend,
        op_offload: false,
        pins,
        ring: false,
    };
    partition(&g.tensors, &g.nodes, &g.leafs, &refs, &cfg).unwrap()
}

/// Builds a graph of named nodes: `ops` are `(name, op, srcs, pin)` with op `scale`,
/// `add` or `cpy` (into its second source); `x`, `p` are inputs, `w`, `kv` leaves with
/// data (placed by [`part_of`]). Every node is expanded in the order given.
fn graph(ops: &[(&str, &str, &[&str], usize)]) -> (Built, Vec<(TensorId, usize)>) {
    let mut pins = Vec::new();
    let g = build(32, |ctx| {
        let mut ids: Vec<(String, TensorId)> = Vec::new();
        for name in ["x", "p", "w", "kv"] {
            let t = ctx.new_tensor_1d(DType::F32, 4).unwrap();
            ctx.set_name(t, name).unwrap();
            if name == "x" || name == "p" {
                ctx.set_flags(t, TensorFlags::INPUT).unwrap();
            }
            ids.push((name.to_string(), t));
        }
        let mut outs = Vec::new();
        for &(name, op, srcs, pin) in ops {
            let s: Vec<TensorId> = srcs
                .iter()
                .map(|n| ids.iter().find(|(m, _)| m == n).unwrap().1)
                .collect();
            let t = match op {
                "scale" => ctx.scale(s[0], 2.0).unwrap(),
                "add" => ctx.add(s[0], s[1]).unwrap(),
                "cpy" => ctx.cpy(s[0], s[1]).unwrap(),
                _ => unreachable!("{op}"),
            };
            ctx.set_name(t, name).unwrap();
            pins.push((t, pin));
            ids.push((name.to_string(), t));
            outs.push(t);
        }
        outs
    });
    (g, pins)
}

fn backends_of(part: &Partition) -> Vec<usize> {
    part.splits.iter().map(|s| s.backend).collect()
}

/// Caller memory `kv` on dev0 is read by dev1's first split and rewritten by dev0's
/// later split (`cpy(o, kv)`). The copy of `kv` into dev1 is of a computed tensor whose
/// last writer ran in the *previous* run, on dev0, which has no split yet in this run:
/// HB1 makes Q(dev1) wait for dev0's split event of the previous run's slot,
/// `(c + N - 1) mod N` (slot 0 after slot N - 1). HB4 then makes dev0 wait for dev1's
/// copy before its split overwrites `kv`.
#[test]
fn minimal_waits_for_the_previous_runs_writer_in_the_previous_slot() {
    let (g, pins) = graph(&[
        ("r", "scale", &["kv"], 1),
        ("o", "scale", &["x"], 0),
        ("wkv", "cpy", &["o", "kv"], 0),
    ]);
    let part = part_of(g, 2, 0, pins, &[("kv", 0)]);
    assert_eq!(backends_of(&part), [1, 0]);
    assert_eq!(part.copies.len(), 1);
    assert_eq!(part.copies[0].producer, None);
    for (n_copies, c, prev) in [
        (2, 0, 1),
        (2, 1, 0),
        (3, 0, 2),
        (3, 1, 0),
        (3, 2, 1),
        (4, 0, 3),
        (4, 3, 2),
    ] {
        let plan = build_plan(
            &part,
            &props(2, CopyQueue::Destination, true),
            &settings(n_copies, c, PlanStyle::Minimal),
        );
        assert_eq!(
            split_lines(&plan, 0),
            [
                format!("wait dev1 <- split[dev0]@{prev} HB1"),
                format!("copy kv -> dev1#kv#{c} dev0 -> dev1 on dst"),
                format!("record copydone[dev1]@{c}"),
                "compute split 0 (1 nodes)".to_string(),
                format!("record split[dev1]@{c}"),
            ],
            "{plan}"
        );
        assert_eq!(
            split_lines(&plan, 1),
            [
                format!("wait dev0 <- copydone[dev1]@{c} HB6"),
                "compute split 1 (2 nodes)".to_string(),
                format!("record split[dev0]@{c}"),
            ],
            "{plan}"
        );
    }
}

/// As above with dev0 copying on the source queue: dev0's split reads `r` (dev1's), so
/// the copy runs on Q(dev1) and must first wait for the readers of the slot from run
/// r - N (HB3: dev0's split of slot c). Q(dev1)'s earlier wait on dev0's split of the
/// previous slot (run r - 1) does not order it after run r - N when N > 1, so the HB3
/// wait stays — whether dev1 waits on the queue or (when it cannot wait on dev0's
/// events) on the host.
#[test]
fn previous_slot_wait_does_not_release_the_slot() {
    let (g, pins) = graph(&[
        ("r", "scale", &["kv"], 1),
        ("o", "add", &["x", "r"], 0),
        ("wkv", "cpy", &["o", "kv"], 0),
    ]);
    let part = part_of(g, 2, 0, pins, &[("kv", 0)]);
    assert_eq!(backends_of(&part), [1, 0]);
    for host_wait in [false, true] {
        let mut pr = props(2, CopyQueue::Destination, true);
        pr[0].copy_queue = CopyQueue::Source;
        pr[1].can_wait_on[0] = !host_wait;
        let plan = build_plan(&part, &pr, &settings(2, 0, PlanStyle::Minimal));
        let first = if host_wait {
            "host-wait split[dev0]@1 HB1"
        } else {
            "wait dev1 <- split[dev0]@1 HB1"
        };
        assert_eq!(split_lines(&plan, 0)[0], first, "{plan}");
        let s1 = split_lines(&plan, 1);
        let hb3 = if host_wait {
            "host-wait split[dev0]@0 HB3"
        } else {
            "wait dev1 <- split[dev0]@0 HB3"
        };
        assert_eq!(s1[0], hb3, "{plan}");
        assert_eq!(s1[1], "copy r -> dev0#r#0 dev1 -> dev0 on src", "{plan}");
    }
}

/// dev0 computes `t` (split 0), dev1 computes `u` (split 1), dev0 computes `v` from `u`
/// (split 2), dev2 reads `t` (split 3). HB1 for the copy of `t` into dev2 needs split 0
/// only: split 0 records its own `split0` event and dev2 waits on it, not on dev0's
/// split event (recorded after split 2, which dev2 does not need). Split 2's producer
/// (dev1's split 1) is dev1's latest split: it needs no event of its own. Every other
/// wait: dev0 waits for the previous run's copy of `t` out of its buffer before
/// recomputing it (HB6, copydone of the previous slot), dev1 for the caller's write of
/// `x` (HB1, inputs event), dev0 for `u`'s producer (HB1), the host for the user-input
/// copy (HB5).
#[test]
fn copy_waits_for_its_producer_not_the_producers_later_split() {
    let (g, pins) = graph(&[
        ("t", "scale", &["x"], 0),
        ("u", "scale", &["x"], 1),
        ("v", "scale", &["u"], 0),
        ("wt", "scale", &["t"], 2),
    ]);
    let part = part_of(g, 3, 0, pins, &[]);
    assert_eq!(backends_of(&part), [0, 1, 0, 2]);
    let plan = minimal_plan(&part, 3, CopyQueue::Destination);
    let want: [&[&str]; 4] = [
        &[
            "wait dev0 <- copydone[dev2]@1 HB6",
            "compute split 0 (1 nodes)",
            "record split0[dev0]@0",
            "record split[dev0]@0",
        ],
        &[
            "wait dev1 <- inputs[dev0]@0 HB1",
            "copy x -> dev1#x#0 dev0 -> dev1 on dst",
            "record copydone[dev1]@0",
            "compute split 1 (1 nodes)",
            "record split[dev1]@0",
        ],
        &[
            "wait dev0 <- split[dev1]@0 HB1",
            "copy u -> dev0#u#0 dev1 -> dev0 on dst",
            "record copydone[dev0]@0",
            "compute split 2 (1 nodes)",
            "record split[dev0]@0",
        ],
        &[
            "wait dev2 <- split0[dev0]@0 HB1",
            "copy t -> dev2#t#0 dev0 -> dev2 on dst",
            "record copydone[dev2]@0",
            "compute split 3 (1 nodes)",
            "record split[dev2]@0",
        ],
    ];
    for (k, w) in want.iter().enumerate() {
        assert_eq!(split_lines(&plan, k), *w, "split {k}\n{plan}");
    }
    assert_eq!(plan.pattern(), "wg|wag|wag|wag|s", "{plan}");
}

/// dev0 has no events, so its waits are host syncs, which order a queue after
/// everything dev0 had enqueued at that point. Split 1's HB1 host sync of dev0 (for
/// `t1`) comes after split 0 computed `t3` too, so when split 3 copies `t3` — with
/// dev0's split 2 run since (`producer < latest`), or only a source-queue copy out of
/// dev0 run since (`producer == latest`) — Q(dev1) already is ordered after the
/// producer and no second host sync is needed. The only host syncs are the HB1 one of
/// split 1 and dev0's HB6/HB3 host waits.
#[test]
fn host_sync_of_an_eventless_producer_covers_its_later_copies() {
    let mut pr = props(3, CopyQueue::Destination, true);
    pr[0].events = false;
    // producer < latest: dev0's split 2 (`v`) runs between.
    let (g, pins) = graph(&[
        ("t1", "scale", &["x"], 0),
        ("t3", "scale", &["x"], 0),
        ("u1", "scale", &["t1"], 1),
        ("v", "scale", &["x"], 0),
        ("wv", "add", &["u1", "t3"], 1),
    ]);
    let part = part_of(g, 2, 0, pins, &[]);
    assert_eq!(backends_of(&part), [0, 1, 0, 1]);
    let plan = build_plan(&part, &pr[..2], &settings(2, 0, PlanStyle::Minimal));
    assert_eq!(
        split_lines(&plan, 1)[..2],
        [
            "host-sync dev0 HB1",
            "copy t1 -> dev1#t1#0 dev0 -> dev1 on dst"
        ],
        "{plan}"
    );
    assert_eq!(
        split_lines(&plan, 3),
        [
            "copy t3 -> dev1#t3#0 dev0 -> dev1 on dst",
            "record copydone[dev1]@0",
            "compute split 3 (1 nodes)",
            "record split[dev1]@0",
        ],
        "{plan}"
    );
    // producer == latest: dev2 (source queue) copies `t3` on Q(dev0) in between.
    pr[2].copy_queue = CopyQueue::Source;
    let (g, pins) = graph(&[
        ("t1", "scale", &["x"], 0),
        ("t3", "scale", &["x"], 0),
        ("u1", "scale", &["t1"], 1),
        ("y", "scale", &["t3"], 2),
        ("wv", "add", &["u1", "t3"], 1),
    ]);
    let part = part_of(g, 3, 0, pins, &[]);
    assert_eq!(backends_of(&part), [0, 1, 2, 1]);
    let plan = build_plan(&part, &pr, &settings(2, 0, PlanStyle::Minimal));
    assert_eq!(
        split_lines(&plan, 2)[..2],
        [
            "host-wait split[dev2]@0 HB3",
            "copy t3 -> dev2#t3#0 dev0 -> dev2 on src"
        ],
        "{plan}"
    );
    assert_eq!(
        split_lines(&plan, 3),
        [
            "copy t3 -> dev1#t3#0 dev0 -> dev1 on dst",
            "record copydone[dev1]@0",
            "compute split 3 (1 nodes)",
            "record split[dev1]@0",
        ],
        "{plan}"
    );
}

/// dev1's split reads two user inputs (`x`, `p`) and a computed tensor (`t`). The
/// producer wait of `t` comes first (HB1; it also orders Q(dev1) after the caller's
/// writes, recorded on dev0 before split 0), the user-input copies next, then
/// `inputs-copied` marks their end on Q(dev1) before `t`'s copy, so the HB5 host wait
/// waits for the user inputs only.
#[test]
fn user_inputs_are_marked_copied_before_the_computed_copy() {
    let (_, plan) = assert_minimal_split(
        &[
            ("t", "scale", &["x"], 0),
            ("a1", "add", &["t", "x"], 1),
            ("b1", "add", &["a1", "p"], 1),
        ],
        2,
        &[],
        1,
        &[
            "wait dev1 <- split[dev0]@0 HB1",
            "copy x -> dev1#x#0 dev0 -> dev1 on dst",
            "copy p -> dev1#p#0 dev0 -> dev1 on dst",
            "record inputs-copied[dev1]@0",
            "copy t -> dev1#t#0 dev0 -> dev1 on dst",
            "record copydone[dev1]@0",
            "compute split 1 (2 nodes)",
            "record split[dev1]@0",
        ],
    );
    assert!(
        plan.to_string()
            .contains("  epilogue\n    host-wait  inputs-copied[dev1]@0"),
        "{plan}"
    );
}

/// A weight (static, no ordering needed) copied after a user input: only the user
/// input's HB1 wait (on the caller's writes, `inputs`), no wait on dev0's split.
#[test]
fn static_copies_need_no_producer_wait() {
    let (part, _) = assert_minimal_split(
        &[("t", "scale", &["x"], 0), ("a1", "add", &["x", "w"], 1)],
        2,
        &[("w", 0)],
        1,
        &[
            "wait dev1 <- inputs[dev0]@0 HB1",
            "copy x -> dev1#x#0 dev0 -> dev1 on dst",
            "record inputs-copied[dev1]@0",
            "copy w -> dev1#w#0 dev0 -> dev1 on dst",
            "record copydone[dev1]@0",
            "compute split 1 (1 nodes)",
            "record split[dev1]@0",
        ],
    );
    assert!(part
        .copies
        .iter()
        .any(|c| c.name == "w" && c.kind == ggml_sched::SourceKind::Static));
}

/// A split without user inputs reading computed tensors of two backends: each copy
/// follows its own producer wait (HB1), in input order.
#[test]
fn computed_copies_wait_one_producer_each_in_order() {
    assert_minimal_split(
        &[
            ("t0", "scale", &["x"], 0),
            ("t1", "scale", &["x"], 1),
            ("z", "add", &["t0", "t1"], 2),
        ],
        3,
        &[],
        2,
        &[
            "wait dev2 <- split[dev0]@0 HB1",
            "copy t0 -> dev2#t0#0 dev0 -> dev2 on dst",
            "wait dev2 <- split[dev1]@0 HB1",
            "copy t1 -> dev2#t1#0 dev1 -> dev2 on dst",
            "record copydone[dev2]@0",
            "compute split 2 (1 nodes)",
            "record split[dev2]@0",
        ],
    );
}

/// Ring routing with copy engines (e0..e2 for dev0..dev2): dev2's split reads `t` of
/// dev0, which reaches it through dev1 (e1 copies it into dev1's receive buffer, e2
/// forwards it from there). dev1's next split reads only the user input `x`. Before it,
/// dev1 waits for the caller's write of `x` (HB1) and for e1's copy into its receive
/// buffer (HB2), and for nothing else: the forward out of dev1 read a receive buffer,
/// which dev1's compute never overwrites (slot tensors are not reused by the allocator),
/// so no HB6 wait on e2's copy-done.
#[test]
fn forwards_out_of_a_receive_buffer_need_no_reuse_wait() {
    let (g, pins) = graph(&[
        ("t", "scale", &["x"], 0),
        ("z", "scale", &["t"], 2),
        ("y", "scale", &["x"], 1),
    ]);
    let b = sims(3);
    let refs: Vec<&dyn Backend> = b.iter().map(|x| &**x).collect();
    let cfg = PartitionConfig {
        n_copies: 2,
        input_backend: 0,
        op_offload: false,
        pins,
        ring: true,
    };
    let part = partition(&g.tensors, &g.nodes, &g.leafs, &refs, &cfg).unwrap();
    assert_eq!(backends_of(&part), [0, 2, 1]);
    assert!(
        part.copies.iter().any(|c| c.via.is_some()),
        "t is forwarded"
    );
    let mut pr = props(6, CopyQueue::Destination, true);
    for (e, p) in pr[3..].iter_mut().enumerate() {
        p.name = format!("e{e}");
    }
    let mut s = settings(2, 0, PlanStyle::Minimal);
    s.engines = vec![Some(3), Some(4), Some(5), None, None, None];
    let plan = build_plan(&part, &pr, &s);
    assert_eq!(
        split_lines(&plan, 2),
        [
            "wait dev1 <- inputs[dev0]@0 HB1",
            "copy x -> dev1#x#0 dev0 -> dev1 on dst",
            "record copydone[dev1]@0",
            "wait dev1 <- copydone[e1]@0 HB2",
            "compute split 2 (1 nodes)",
            "record split[dev1]@0",
        ],
        "{plan}"
    );
}
