//! Edge cases of the happens-before checker on hand-built traces: which conflict kind
//! and rule a race gets, which earlier accesses the history may forget and which it
//! must keep, the report cap, and which operands of a graph node count as reads. Each
//! expected verdict is argued from the vector-clock model of `ggml_sched::check`.

mod common;

use std::sync::Arc;

use common::wait_for;
use ggml_core::{Backend, BufferInfo, Context, DType, DataRef, Tensor, TensorId};
use ggml_sched::check::{classify, Conflict, Role};
use ggml_sched::plan::HbRule;
use ggml_sched::testing::{SimBackend, SimOptions};
use ggml_sched::{CheckedBackend, RaceLog};

/// Two recording-only queues A and B sharing one log, one buffer each.
struct Rig {
    log: Arc<RaceLog>,
    a: Arc<CheckedBackend>,
    b: Arc<CheckedBackend>,
    buf_a: BufferInfo,
    buf_b: BufferInfo,
}

fn rig() -> Rig {
    let log = RaceLog::new();
    let a = CheckedBackend::new(SimBackend::new(SimOptions::new("A")), &log);
    let b = CheckedBackend::new(SimBackend::new(SimOptions::new("B")), &log);
    let buf_a = a.alloc_buffer(1 << 16).unwrap();
    let buf_b = b.alloc_buffer(1 << 16).unwrap();
    Rig {
        log,
        a,
        b,
        buf_a,
        buf_b,
    }
}

/// The tensors `f` builds, with the names it gives them.
fn build(f: impl FnOnce(&mut Context<'_>) -> Vec<(TensorId, &'static str)>) -> Vec<Tensor> {
    let mut storage = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 16];
    let mut ctx = Context::new(&mut storage);
    for (id, name) in f(&mut ctx) {
        ctx.set_name(id, name).unwrap();
    }
    ctx.tensors().to_vec()
}

/// Places tensor `id` at byte `off` of `buf`.
fn place(t: &mut [Tensor], id: TensorId, buf: &BufferInfo, off: u64) {
    t[id.index()].data = Some(DataRef {
        buffer: buf.id,
        addr: buf.base + off,
    });
}

fn f32s(ctx: &mut Context<'_>, n: usize) -> TensorId {
    ctx.new_tensor(DType::F32, [n, 1, 1, 1]).unwrap()
}

/// (rule, conflict, earlier tensor, later role) of each distinct race.
fn verdicts(log: &RaceLog) -> Vec<(HbRule, Conflict, String, Role)> {
    log.races()
        .into_iter()
        .map(|r| (r.rule, r.conflict, r.earlier.tensor, r.later.role))
        .collect()
}

/// The log holds exactly one distinct race: (rule, conflict, earlier tensor, later role).
fn assert_one_race(log: &RaceLog, want: (HbRule, Conflict, &str, Role)) {
    let (rule, conflict, tensor, role) = want;
    assert_eq!(
        verdicts(log),
        vec![(rule, conflict, tensor.to_string(), role)]
    );
}

#[test]
fn input_write_then_unordered_consumer_is_hb1_read_after_write() {
    for ordered in [false, true] {
        // A's set_tensor_async writes x; B's node reads x. Without B waiting on an event
        // recorded after the write, B's clock has no A component: the read is not ordered
        // after the write, a read-after-write race the table files under HB1 (the input
        // written is the producer the consumer must wait for).
        let r = rig();
        let mut t = build(|ctx| {
            let x = f32s(ctx, 64);
            let c = ctx.scale(x, 2.0).unwrap();
            vec![(x, "x"), (c, "c")]
        });
        let (x, c) = (TensorId(0), TensorId(1));
        place(&mut t, x, &r.buf_a, 0);
        place(&mut t, c, &r.buf_b, 0);
        r.a.set_tensor_async(&t[x.index()], 0, &[0u8; 256]).unwrap();
        if ordered {
            wait_for(&r.b, &r.a);
        }
        r.b.graph_compute(&t, &[c]).unwrap();
        let want = if ordered {
            vec![]
        } else {
            vec![(
                HbRule::Hb1,
                Conflict::ReadAfterWrite,
                "x".to_string(),
                Role::Consumer,
            )]
        };
        assert_eq!(verdicts(&r.log), want, "ordered: {ordered}");
    }
}

#[test]
fn host_write_over_unsynchronised_read_is_write_after_read() {
    for ordered in [false, true] {
        // A's node reads x; the host then overwrites x with a blocking buffer_set. Only
        // synchronize(A) joins A's clock into the host's, so without it the host write is
        // not ordered after the queued read: write-after-read, HB5 (input rewritten).
        let r = rig();
        let mut t = build(|ctx| {
            let x = f32s(ctx, 64);
            let c = ctx.scale(x, 2.0).unwrap();
            vec![(x, "x"), (c, "c")]
        });
        let (x, c) = (TensorId(0), TensorId(1));
        place(&mut t, x, &r.buf_a, 0);
        place(&mut t, c, &r.buf_a, 1024);
        r.a.graph_compute(&t, &[c]).unwrap();
        if ordered {
            r.a.synchronize().unwrap();
        }
        r.a.buffer_set(r.buf_a.id, 0, &[0u8; 256]).unwrap();
        let want = if ordered {
            vec![]
        } else {
            vec![(
                HbRule::Hb5,
                Conflict::WriteAfterRead,
                "x".to_string(),
                Role::HostWrite,
            )]
        };
        assert_eq!(verdicts(&r.log), want, "ordered: {ordered}");
    }
}

#[test]
fn classify_gives_hb1_only_to_writes_before_a_copy_read() {
    // HB1 is "producer → copy": the earlier access must be a write. Two reads never
    // conflict, so a read before a copy read falls to the table's last row (HB6); the
    // checker itself never asks, but `classify` is public and documented by that table.
    for earlier in [Role::Consumer, Role::CopyRead, Role::HostRead] {
        assert_eq!(classify(earlier, Role::CopyRead, true), HbRule::Hb6);
    }
    for earlier in [
        Role::Producer,
        Role::CopyWrite,
        Role::InputWrite,
        Role::HostWrite,
    ] {
        assert_eq!(classify(earlier, Role::CopyRead, false), HbRule::Hb1);
    }
    assert_eq!(
        classify(Role::InputWrite, Role::Consumer, false),
        HbRule::Hb1
    );
}

#[test]
fn write_over_part_of_an_earlier_write_keeps_the_rest() {
    // A produces p over bytes [0, 256), then h over [0, 128). The history may forget p
    // only where h covers it; p's bytes [128, 256) are still p's, so an unsynchronised host
    // read of them races with p (HB7, host reads outputs).
    let r = rig();
    let mut t = build(|ctx| {
        let x = f32s(ctx, 64);
        let p = ctx.scale(x, 2.0).unwrap();
        let y = f32s(ctx, 32);
        let h = ctx.scale(y, 2.0).unwrap();
        vec![(x, "x"), (p, "p"), (y, "y"), (h, "h")]
    });
    let (x, p, y, h) = (TensorId(0), TensorId(1), TensorId(2), TensorId(3));
    place(&mut t, x, &r.buf_a, 4096);
    place(&mut t, p, &r.buf_a, 0);
    place(&mut t, y, &r.buf_a, 8192);
    place(&mut t, h, &r.buf_a, 0);
    r.a.graph_compute(&t, &[p, h]).unwrap();
    let mut out = [0u8; 128];
    r.a.buffer_get(r.buf_a.id, 128, &mut out).unwrap();
    assert_one_race(
        &r.log,
        (HbRule::Hb7, Conflict::ReadAfterWrite, "p", Role::HostRead),
    );
}

#[test]
fn ordered_covering_write_from_another_queue_replaces_the_earlier_one() {
    // A produces p over [0, 256); B waits for A and produces q over the same bytes. q is
    // ordered after p and covers it, so the history keeps only q: an unsynchronised host
    // read of the bytes is one racing pair (with q), not two. Anything racing with p
    // races with q too, so nothing is lost, and the history of a buffer rewritten by
    // every run stays bounded.
    let r = rig();
    let mut t = build(|ctx| {
        let x = f32s(ctx, 64);
        let p = ctx.scale(x, 2.0).unwrap();
        let q = ctx.scale(x, 3.0).unwrap();
        vec![(x, "x"), (p, "p"), (q, "q")]
    });
    let (x, p, q) = (TensorId(0), TensorId(1), TensorId(2));
    place(&mut t, x, &r.buf_a, 4096);
    place(&mut t, p, &r.buf_a, 0);
    place(&mut t, q, &r.buf_a, 0);
    r.a.graph_compute(&t, &[p]).unwrap();
    wait_for(&r.b, &r.a);
    r.b.graph_compute(&t, &[q]).unwrap();
    let mut out = [0u8; 256];
    r.a.buffer_get(r.buf_a.id, 0, &mut out).unwrap();
    assert_eq!(r.log.race_count(), 1);
    assert_one_race(
        &r.log,
        (HbRule::Hb7, Conflict::ReadAfterWrite, "q", Role::HostRead),
    );
}

#[test]
fn identical_reads_on_two_queues_both_race_with_a_host_write() {
    // A and B both read x; the host then overwrites x without synchronising either. The
    // write is ordered after neither read: two racing pairs (one distinct report, as both
    // have the same rule and tensors). B's read must not make the history forget A's.
    let r = rig();
    let mut t = build(|ctx| {
        let x = f32s(ctx, 64);
        let ca = ctx.scale(x, 2.0).unwrap();
        let cb = ctx.scale(x, 3.0).unwrap();
        vec![(x, "x"), (ca, "ca"), (cb, "cb")]
    });
    let (x, ca, cb) = (TensorId(0), TensorId(1), TensorId(2));
    place(&mut t, x, &r.buf_a, 0);
    place(&mut t, ca, &r.buf_a, 1024);
    place(&mut t, cb, &r.buf_b, 0);
    r.a.graph_compute(&t, &[ca]).unwrap();
    r.b.graph_compute(&t, &[cb]).unwrap();
    r.a.buffer_set(r.buf_a.id, 0, &[0u8; 256]).unwrap();
    assert_eq!(r.log.race_count(), 2);
    let races = r.log.races();
    assert_eq!(races.len(), 1);
    assert_eq!(races[0].rule, HbRule::Hb5);
}

#[test]
fn a_read_of_just_written_bytes_keeps_the_write() {
    // A produces p and then reads it (r = p * 2) on the same queue. The read is ordered
    // after the write but does not replace it: the host reading p without synchronising
    // still races with p's write (HB7).
    let r = rig();
    let mut t = build(|ctx| {
        let x = f32s(ctx, 64);
        let p = ctx.scale(x, 2.0).unwrap();
        let rd = ctx.scale(p, 2.0).unwrap();
        vec![(x, "x"), (p, "p"), (rd, "r")]
    });
    let (x, p, rd) = (TensorId(0), TensorId(1), TensorId(2));
    place(&mut t, x, &r.buf_a, 0);
    place(&mut t, p, &r.buf_a, 1024);
    place(&mut t, rd, &r.buf_a, 2048);
    r.a.graph_compute(&t, &[p, rd]).unwrap();
    let mut out = [0u8; 256];
    r.a.buffer_get(r.buf_a.id, 1024, &mut out).unwrap();
    assert_one_race(
        &r.log,
        (HbRule::Hb7, Conflict::ReadAfterWrite, "p", Role::HostRead),
    );
}

#[test]
fn a_read_ending_where_an_earlier_read_ends_keeps_the_earlier_one() {
    // A reads x1 = [0, 256) and then x2 = [128, 256) (same end, later start). Only an
    // identical range may replace an older read: the host overwriting [0, 128) without
    // synchronising races with the x1 read (write-after-read, HB5).
    let r = rig();
    let mut t = build(|ctx| {
        let x1 = f32s(ctx, 64);
        let x2 = f32s(ctx, 32);
        let n1 = ctx.scale(x1, 2.0).unwrap();
        let n2 = ctx.scale(x2, 2.0).unwrap();
        vec![(x1, "x1"), (x2, "x2"), (n1, "n1"), (n2, "n2")]
    });
    let (x1, x2, n1, n2) = (TensorId(0), TensorId(1), TensorId(2), TensorId(3));
    place(&mut t, x1, &r.buf_a, 0);
    place(&mut t, x2, &r.buf_a, 128);
    place(&mut t, n1, &r.buf_a, 1024);
    place(&mut t, n2, &r.buf_a, 2048);
    r.a.graph_compute(&t, &[n1, n2]).unwrap();
    r.a.buffer_set(r.buf_a.id, 0, &[0u8; 128]).unwrap();
    assert_one_race(
        &r.log,
        (HbRule::Hb5, Conflict::WriteAfterRead, "x1", Role::HostWrite),
    );
}

#[test]
fn distinct_reports_stop_at_256_but_all_are_counted() {
    // A produces p over 1200 bytes; the host then reads 257 separate 4-byte pieces of it
    // without synchronising. Each read races with p and names a different range, so each
    // is a distinct report; the log keeps the first 256 and counts all 257.
    let r = rig();
    let mut t = build(|ctx| {
        let x = f32s(ctx, 300);
        let p = ctx.scale(x, 2.0).unwrap();
        vec![(x, "x"), (p, "p")]
    });
    let (x, p) = (TensorId(0), TensorId(1));
    place(&mut t, x, &r.buf_a, 4096);
    place(&mut t, p, &r.buf_a, 0);
    r.a.graph_compute(&t, &[p]).unwrap();
    let mut out = [0u8; 4];
    for i in 0..257 {
        r.a.buffer_get(r.buf_a.id, i * 4, &mut out).unwrap();
    }
    assert_eq!(r.log.race_count(), 257);
    assert_eq!(r.log.races().len(), 256);
}

#[test]
fn accesses_counts_every_non_empty_access() {
    // scale(x) on A: a read of x and a write of c; set_tensor_async: one write; an
    // empty host read touches no bytes and is not counted.
    let r = rig();
    let mut t = build(|ctx| {
        let x = f32s(ctx, 64);
        let c = ctx.scale(x, 2.0).unwrap();
        vec![(x, "x"), (c, "c")]
    });
    let (x, c) = (TensorId(0), TensorId(1));
    place(&mut t, x, &r.buf_a, 0);
    place(&mut t, c, &r.buf_a, 1024);
    assert_eq!(r.log.accesses(), 0);
    r.a.graph_compute(&t, &[c]).unwrap();
    assert_eq!(r.log.accesses(), 2);
    r.a.set_tensor_async(&t[x.index()], 0, &[0u8; 256]).unwrap();
    r.a.buffer_get(r.buf_a.id, 0, &mut []).unwrap();
    assert_eq!(r.log.accesses(), 3);
}

#[test]
fn leaves_and_views_in_a_node_list_access_nothing() {
    // A's node list holds the leaf x and a view of x: neither runs a kernel, so neither
    // touches bytes, and B reading x without waiting for A is no race.
    let r = rig();
    let mut t = build(|ctx| {
        let x = f32s(ctx, 64);
        let v = ctx.reshape(x, [8, 8, 1, 1]).unwrap();
        let c = ctx.scale(x, 2.0).unwrap();
        vec![(x, "x"), (v, "v"), (c, "c")]
    });
    let (x, v, c) = (TensorId(0), TensorId(1), TensorId(2));
    place(&mut t, x, &r.buf_a, 0);
    place(&mut t, v, &r.buf_a, 0);
    place(&mut t, c, &r.buf_b, 0);
    r.a.graph_compute(&t, &[x, v]).unwrap();
    r.b.graph_compute(&t, &[c]).unwrap();
    assert_eq!(r.log.accesses(), 2, "{}", r.log.summary(4));
    assert!(r.log.is_clean(), "{}", r.log.summary(4));
}

#[test]
fn both_operands_of_a_binary_op_are_read() {
    // s = x + y on A reads y (its second operand); the host overwriting y without
    // synchronising is a write-after-read race (HB5).
    let r = rig();
    let mut t = build(|ctx| {
        let x = f32s(ctx, 64);
        let y = f32s(ctx, 64);
        let s = ctx.add(x, y).unwrap();
        vec![(x, "x"), (y, "y"), (s, "s")]
    });
    let (x, y, s) = (TensorId(0), TensorId(1), TensorId(2));
    place(&mut t, x, &r.buf_a, 0);
    place(&mut t, y, &r.buf_a, 256);
    place(&mut t, s, &r.buf_a, 1024);
    r.a.graph_compute(&t, &[s]).unwrap();
    r.a.buffer_set(r.buf_a.id, 256, &[0u8; 256]).unwrap();
    assert_one_race(
        &r.log,
        (HbRule::Hb5, Conflict::WriteAfterRead, "y", Role::HostWrite),
    );
}

#[test]
fn cpy_reads_its_source_and_only_writes_its_destination() {
    // k = cpy(x, y) on A reads x and writes y's bytes (k is a view of y). The host
    // overwriting x unsynchronised races with the read (HB5, write-after-read); the
    // host reading y unsynchronised races with the write only (HB7), not with any read
    // of y, as CPY does not read its destination.
    let r = rig();
    let mut t = build(|ctx| {
        let x = f32s(ctx, 64);
        let y = f32s(ctx, 64);
        let k = ctx.cpy(x, y).unwrap();
        vec![(x, "x"), (y, "y"), (k, "k")]
    });
    let (x, y, k) = (TensorId(0), TensorId(1), TensorId(2));
    place(&mut t, x, &r.buf_a, 0);
    place(&mut t, y, &r.buf_a, 256);
    place(&mut t, k, &r.buf_a, 256);
    r.a.graph_compute(&t, &[k]).unwrap();
    assert_eq!(r.log.accesses(), 2);
    r.a.buffer_set(r.buf_a.id, 0, &[0u8; 256]).unwrap();
    assert_one_race(
        &r.log,
        (HbRule::Hb5, Conflict::WriteAfterRead, "x", Role::HostWrite),
    );
}

#[test]
fn debug_output_names_the_queues() {
    let r = rig();
    let log = format!("{:?}", r.log);
    assert!(
        log.starts_with("RaceLog") && log.contains("\"A\"") && log.contains("\"B\""),
        "{log}"
    );
    let a = format!("{:?}", r.a);
    assert!(a.starts_with("CheckedBackend") && a.contains('A'), "{a}");
}

#[test]
fn a_read_starting_where_an_earlier_read_starts_keeps_the_earlier_one() {
    // A reads x1 = [0, 256) and then x3 = [0, 128) (same start, earlier end). Only an
    // identical range may replace an older read: the host overwriting [128, 256) without
    // synchronising races with the x1 read (write-after-read, HB5).
    let r = rig();
    let mut t = build(|ctx| {
        let x1 = f32s(ctx, 64);
        let x3 = f32s(ctx, 32);
        let n1 = ctx.scale(x1, 2.0).unwrap();
        let n3 = ctx.scale(x3, 2.0).unwrap();
        vec![(x1, "x1"), (x3, "x3"), (n1, "n1"), (n3, "n3")]
    });
    let (x1, x3, n1, n3) = (TensorId(0), TensorId(1), TensorId(2), TensorId(3));
    place(&mut t, x1, &r.buf_a, 0);
    place(&mut t, x3, &r.buf_a, 0);
    place(&mut t, n1, &r.buf_a, 1024);
    place(&mut t, n3, &r.buf_a, 2048);
    r.a.graph_compute(&t, &[n1, n3]).unwrap();
    r.a.buffer_set(r.buf_a.id, 128, &[0u8; 128]).unwrap();
    assert_one_race(
        &r.log,
        (HbRule::Hb5, Conflict::WriteAfterRead, "x1", Role::HostWrite),
    );
}

/// A backend without events that hands a freed buffer's id out again (as a caching
/// allocator does) and reports any node list of two or more as one fused run.
fn reusing(log: &Arc<RaceLog>) -> Arc<CheckedBackend> {
    let opts = SimOptions {
        events: false,
        foreign_waits: false,
        reuse_freed: true,
        fuse_runs: true,
        ..SimOptions::new("A")
    };
    CheckedBackend::new(SimBackend::new(opts), log)
}

#[test]
fn a_reallocated_buffer_id_starts_without_history() {
    // A's node writes p into a buffer; the buffer is freed (a device free waits for the
    // queue's pending work, as cuMemFree does) and the same id and bytes come back from
    // the next allocation. The new allocation's bytes have no earlier accesses, so the
    // host writing them is no race with p's write to the old allocation.
    let log = RaceLog::new();
    let a = reusing(&log);
    let buf = a.alloc_buffer(4096).unwrap();
    let mut t = build(|ctx| {
        let x = f32s(ctx, 64);
        let p = ctx.scale(x, 2.0).unwrap();
        vec![(x, "x"), (p, "p")]
    });
    let (x, p) = (TensorId(0), TensorId(1));
    place(&mut t, x, &buf, 0);
    place(&mut t, p, &buf, 1024);
    a.graph_compute(&t, &[p]).unwrap();
    a.free_buffer(buf.id).unwrap();
    let again = a.alloc_buffer(4096).unwrap();
    assert_eq!(again.id, buf.id, "the wrapper reuses ids");
    a.buffer_set(again.id, 0, &[0u8; 4096]).unwrap();
    assert!(log.is_clean(), "{}", log.summary(4));
    assert_eq!(log.accesses(), 3);
}

#[test]
fn fused_runs_are_the_inner_backends() {
    // The scheduler asks the (wrapped) backend which nodes it fuses; under the checker it
    // must see the inner backend's answer, or checked plans would differ from real ones.
    let log = RaceLog::new();
    let a = reusing(&log);
    let t = build(|ctx| {
        let x = f32s(ctx, 64);
        let p = ctx.scale(x, 2.0).unwrap();
        let q = ctx.scale(p, 2.0).unwrap();
        vec![(x, "x"), (p, "p"), (q, "q")]
    });
    let mut runs = Vec::new();
    a.fused_runs(&t, &[TensorId(1), TensorId(2)], &mut |start, len| {
        runs.push((start, len))
    });
    assert_eq!(runs, vec![(0, 2)]);
}
