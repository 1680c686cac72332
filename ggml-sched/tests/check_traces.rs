//! The happens-before checker on traces built by hand, without the scheduler: for each
//! HB rule, the unordered sequence is reported as that rule's race, and the same
//! sequence with the wait that orders it passes. Two recording-only backends (A and B)
//! stand for two devices; their copies run on the queue each case names.

mod common;

use std::sync::Arc;

use common::wait_for;
use ggml_core::{Backend, BufferInfo, Context, CopyQueue, DType, DataRef, Tensor, TensorId};
use ggml_sched::plan::HbRule;
use ggml_sched::testing::{SimBackend, SimOptions};
use ggml_sched::{CheckedBackend, RaceLog};

/// Two checked backends sharing one log; B's copies run on `copy_queue`.
struct Devices {
    log: Arc<RaceLog>,
    a: Arc<CheckedBackend>,
    b: Arc<CheckedBackend>,
    buf_a: BufferInfo,
    buf_b: BufferInfo,
}

fn devices(copy_queue: CopyQueue) -> Devices {
    let log = RaceLog::new();
    let a = CheckedBackend::new(SimBackend::new(SimOptions::new("A")), &log);
    let b = CheckedBackend::new(
        SimBackend::new(SimOptions {
            copy_queue,
            ..SimOptions::new("B")
        }),
        &log,
    );
    let buf_a = a.alloc_buffer(1 << 16).unwrap();
    let buf_b = b.alloc_buffer(1 << 16).unwrap();
    Devices {
        log,
        a,
        b,
        buf_a,
        buf_b,
    }
}

/// Tensors of the traces: `x` (input on A), `p = x * 2` (produced on A), `s` (B's copy
/// slot of `p`), `c = s * 2` (consumed on B), `q = x * 3` (another node on A placed
/// over `p`'s bytes, as an allocator reusing them).
struct Graph {
    tensors: Vec<Tensor>,
    x: TensorId,
    p: TensorId,
    s: TensorId,
    c: TensorId,
    q: TensorId,
}

fn graph(d: &Devices) -> Graph {
    let mut storage = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 8];
    let mut ctx = Context::new(&mut storage);
    let x = ctx.new_tensor(DType::F32, [64, 1, 1, 1]).unwrap();
    let p = ctx.scale(x, 2.0).unwrap();
    let s = ctx.new_tensor(DType::F32, [64, 1, 1, 1]).unwrap();
    let c = ctx.scale(s, 2.0).unwrap();
    let q = ctx.scale(x, 3.0).unwrap();
    for (name, id) in [("x", x), ("p", p), ("s", s), ("c", c), ("q", q)] {
        ctx.set_name(id, name).unwrap();
    }
    let at = |buf: &BufferInfo, off: u64| {
        Some(DataRef {
            buffer: buf.id,
            addr: buf.base + off,
        })
    };
    let t = ctx.tensors_mut();
    t[x.index()].data = at(&d.buf_a, 0);
    t[p.index()].data = at(&d.buf_a, 1024);
    t[q.index()].data = at(&d.buf_a, 1024);
    t[s.index()].data = at(&d.buf_b, 0);
    t[c.index()].data = at(&d.buf_b, 1024);
    Graph {
        tensors: ctx.tensors().to_vec(),
        x,
        p,
        s,
        c,
        q,
    }
}

impl Graph {
    fn t(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.index()]
    }
}

/// The rules of the races reported, in order.
fn rules(log: &RaceLog) -> Vec<HbRule> {
    log.races().iter().map(|r| r.rule).collect()
}

/// Copy `p` (on A) to `s` (on B) through B, on the queue B's caps name.
fn copy_p_to_s(d: &Devices, g: &Graph) {
    assert!(d
        .b
        .cpy_tensor_async(d.a.as_ref(), g.t(g.p), g.t(g.s))
        .unwrap());
}

#[test]
fn hb1_producer_before_copy() {
    for ordered in [false, true] {
        // A destination-queue copy reads p on B's queue: B must wait for A's producer.
        let d = devices(CopyQueue::Destination);
        let g = graph(&d);
        d.a.graph_compute(&g.tensors, &[g.p]).unwrap();
        if ordered {
            wait_for(&d.b, &d.a);
        }
        copy_p_to_s(&d, &g);
        let want: Vec<HbRule> = if ordered { vec![] } else { vec![HbRule::Hb1] };
        assert_eq!(rules(&d.log), want, "ordered: {ordered}");
    }
}

#[test]
fn hb2_copy_before_consumer() {
    for ordered in [false, true] {
        // B's copy writes s on B's queue; A consumes s (a view of B's memory it reads)
        // on its own queue: A must wait for the copy.
        let d = devices(CopyQueue::Destination);
        let mut g = graph(&d);
        g.tensors[g.c.index()].data = Some(DataRef {
            buffer: d.buf_a.id,
            addr: d.buf_a.base + 4096,
        });
        wait_for(&d.b, &d.a);
        copy_p_to_s(&d, &g);
        if ordered {
            wait_for(&d.a, &d.b);
        }
        d.a.graph_compute(&g.tensors, &[g.c]).unwrap();
        let want: Vec<HbRule> = if ordered { vec![] } else { vec![HbRule::Hb2] };
        assert_eq!(rules(&d.log), want, "ordered: {ordered}");
    }
}

#[test]
fn hb3_slot_reuse_waits_for_the_last_reader() {
    for ordered in [false, true] {
        // Source-queue copies (CUDA style): the copy into s runs on A's queue. Run r's
        // consumer reads s on B; run r + 1's copy into s must wait for it.
        let d = devices(CopyQueue::Source);
        let g = graph(&d);
        d.a.graph_compute(&g.tensors, &[g.p]).unwrap();
        copy_p_to_s(&d, &g);
        d.b.graph_compute(&g.tensors, &[g.c]).unwrap();
        d.a.graph_compute(&g.tensors, &[g.p]).unwrap();
        if ordered {
            wait_for(&d.a, &d.b);
        }
        copy_p_to_s(&d, &g);
        let want: Vec<HbRule> = if ordered { vec![] } else { vec![HbRule::Hb3] };
        assert_eq!(rules(&d.log), want, "ordered: {ordered}");
    }
}

#[test]
fn hb4_source_reuse_waits_for_the_copy() {
    for ordered in [false, true] {
        // A destination-queue copy reads p on B; run r + 1 rewrites p on A.
        let d = devices(CopyQueue::Destination);
        let g = graph(&d);
        d.a.graph_compute(&g.tensors, &[g.p]).unwrap();
        wait_for(&d.b, &d.a);
        copy_p_to_s(&d, &g);
        if ordered {
            wait_for(&d.a, &d.b);
        }
        d.a.graph_compute(&g.tensors, &[g.p]).unwrap();
        let want: Vec<HbRule> = if ordered { vec![] } else { vec![HbRule::Hb4] };
        assert_eq!(rules(&d.log), want, "ordered: {ordered}");
    }
}

#[test]
fn hb5_user_input_rewritten_after_its_readers() {
    for ordered in [false, true] {
        // A reads input x; the host writes x again (a blocking write) for the next run.
        let d = devices(CopyQueue::Destination);
        let g = graph(&d);
        d.a.set_tensor_async(g.t(g.x), 0, &[0u8; 256]).unwrap();
        d.a.graph_compute(&g.tensors, &[g.p]).unwrap();
        if ordered {
            d.a.synchronize().unwrap();
        }
        d.a.buffer_set(d.buf_a.id, 0, &[1u8; 256]).unwrap();
        let want: Vec<HbRule> = if ordered { vec![] } else { vec![HbRule::Hb5] };
        assert_eq!(rules(&d.log), want, "ordered: {ordered}");
    }
}

#[test]
fn hb6_reused_bytes_wait_for_the_other_device() {
    for ordered in [false, true] {
        // B's destination-queue copy reads p; A's allocator then places q over p's
        // bytes: A must wait for B's copy before writing q.
        let d = devices(CopyQueue::Destination);
        let g = graph(&d);
        d.a.graph_compute(&g.tensors, &[g.p]).unwrap();
        wait_for(&d.b, &d.a);
        copy_p_to_s(&d, &g);
        if ordered {
            wait_for(&d.a, &d.b);
        }
        d.a.graph_compute(&g.tensors, &[g.q]).unwrap();
        let want: Vec<HbRule> = if ordered { vec![] } else { vec![HbRule::Hb6] };
        assert_eq!(rules(&d.log), want, "ordered: {ordered}");
    }
}

#[test]
fn hb7_host_reads_after_the_producer() {
    for ordered in [false, true] {
        // The host reads p's bytes (a blocking buffer read) after A produced them.
        let d = devices(CopyQueue::Destination);
        let g = graph(&d);
        d.a.graph_compute(&g.tensors, &[g.p]).unwrap();
        if ordered {
            d.a.synchronize().unwrap();
        }
        let mut out = [0u8; 256];
        d.a.buffer_get(d.buf_a.id, 1024, &mut out).unwrap();
        let want: Vec<HbRule> = if ordered { vec![] } else { vec![HbRule::Hb7] };
        assert_eq!(rules(&d.log), want, "ordered: {ordered}");
    }
}

/// A report names both tensors, both queues and the bytes.
#[test]
fn a_report_says_who_raced_where() {
    let d = devices(CopyQueue::Destination);
    let g = graph(&d);
    d.a.graph_compute(&g.tensors, &[g.p]).unwrap();
    copy_p_to_s(&d, &g);
    let r = d.log.races();
    assert_eq!(r.len(), 1);
    let text = r[0].to_string();
    for part in ["HB1", "'p'", "on A", "on B", "Producer", "CopyRead"] {
        assert!(text.contains(part), "{part} missing: {text}");
    }
    assert_eq!(r[0].range, (d.buf_a.base + 1024, d.buf_a.base + 1024 + 256));
}

/// `n` f32 values named `name` at `off` bytes into `buf`, and `scale(it)` at `out_off`
/// into `out`: a node whose run reads the first tensor's bytes and writes the second's.
fn placed_pair(
    ctx: &mut Context,
    name: &str,
    n: usize,
    (buf, off): (&BufferInfo, u64),
    (out, out_off): (&BufferInfo, u64),
) -> (TensorId, TensorId) {
    let src = ctx.new_tensor(DType::F32, [n, 1, 1, 1]).unwrap();
    let dst = ctx.scale(src, 2.0).unwrap();
    ctx.set_name(src, name).unwrap();
    ctx.set_name(dst, &format!("{name}2")).unwrap();
    let t = ctx.tensors_mut();
    t[src.index()].data = Some(DataRef {
        buffer: buf.id,
        addr: buf.base + off,
    });
    t[dst.index()].data = Some(DataRef {
        buffer: out.id,
        addr: out.base + out_off,
    });
    (src, dst)
}

/// `is_clean`, `race_count` and `summary` follow the races found, and `clear_races`
/// forgets them.
#[test]
fn the_log_reports_what_it_found() {
    let d = devices(CopyQueue::Destination);
    let g = graph(&d);
    d.a.graph_compute(&g.tensors, &[g.p]).unwrap();
    assert!(d.log.is_clean());
    assert_eq!(d.log.summary(4), "0 races (0 distinct)\n");
    copy_p_to_s(&d, &g);
    assert!(!d.log.is_clean());
    assert_eq!(d.log.race_count(), 1);
    let s = d.log.summary(4);
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(lines.len(), 2, "{s}");
    assert_eq!(lines[0], "1 races (1 distinct)");
    assert_eq!(lines[1], format!("  {}", d.log.races()[0]));
    assert_eq!(d.log.summary(0), "1 races (1 distinct)\n");
    d.log.clear_races();
    assert!(d.log.is_clean());
}

/// A write at an offset into a tensor races on its own bytes only: reported with the
/// range it wrote, and not at all where it misses the earlier reader's bytes.
#[test]
fn a_partial_write_races_on_the_bytes_it_writes() {
    for (offset, len) in [(128usize, 64usize), (0, 64), (192, 64)] {
        let d = devices(CopyQueue::Destination);
        let g = graph(&d);
        d.a.graph_compute(&g.tensors, &[g.p]).unwrap();
        wait_for(&d.b, &d.a);
        copy_p_to_s(&d, &g); // B reads all of p
        d.a.set_tensor_async(g.t(g.p), offset, &vec![0u8; len])
            .unwrap();
        let r = d.log.races();
        assert_eq!(r.len(), 1, "offset {offset}");
        let lo = d.buf_a.base + 1024 + offset as u64;
        assert_eq!(r[0].range, (lo, lo + len as u64), "offset {offset}");
    }
    // Bytes of x (read by A's node before, on the same queue) are no race at all, at any
    // offset: one queue is ordered with itself.
    let d = devices(CopyQueue::Destination);
    let g = graph(&d);
    d.a.graph_compute(&g.tensors, &[g.p]).unwrap();
    d.a.set_tensor_async(g.t(g.x), 192, &[0u8; 64]).unwrap();
    assert!(d.log.is_clean());
}

/// An unordered write over another queue's write does not make the earlier write
/// forgotten: a second write by the same queue races with it again.
#[test]
fn an_unordered_covering_write_keeps_the_earlier_access() {
    let d = devices(CopyQueue::Destination);
    let mut storage = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 4];
    let mut ctx = Context::new(&mut storage);
    // A writes o (bytes 1024..1280 of A's buffer); B's node writes the same bytes.
    let (_, oa) = placed_pair(&mut ctx, "i", 64, (&d.buf_a, 0), (&d.buf_a, 1024));
    let (_, ob) = placed_pair(&mut ctx, "j", 64, (&d.buf_b, 0), (&d.buf_a, 1024));
    let t = ctx.tensors().to_vec();
    d.a.graph_compute(&t, &[oa]).unwrap();
    d.b.graph_compute(&t, &[ob]).unwrap();
    assert_eq!(d.log.race_count(), 1);
    d.b.graph_compute(&t, &[ob]).unwrap();
    assert_eq!(d.log.race_count(), 2, "{}", d.log.summary(4));
    // Once B waits for A, A's write is ordered before B's: no more races.
    wait_for(&d.b, &d.a);
    d.b.graph_compute(&t, &[ob]).unwrap();
    assert_eq!(d.log.race_count(), 2, "{}", d.log.summary(4));
}

/// A queue's read is forgotten only for an identical later read (same bytes), not for a
/// read that ends at the same byte: a write into the bytes only the first read covered
/// still races with it.
#[test]
fn only_identical_reads_replace_each_other() {
    let d = devices(CopyQueue::Destination);
    let mut storage = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 4];
    let mut ctx = Context::new(&mut storage);
    // B reads w (A's bytes 1024..1280), then u (A's bytes 1152..1280).
    let (w, zw) = placed_pair(&mut ctx, "w", 64, (&d.buf_a, 1024), (&d.buf_b, 2048));
    let (_u, zu) = placed_pair(&mut ctx, "u", 32, (&d.buf_a, 1152), (&d.buf_b, 4096));
    let t = ctx.tensors().to_vec();
    d.b.graph_compute(&t, &[zw]).unwrap();
    d.b.graph_compute(&t, &[zu]).unwrap();
    // A rewrites w's first half without waiting for B: only B's read of w saw it.
    d.a.set_tensor_async(&t[w.index()], 0, &[0u8; 128]).unwrap();
    let r = d.log.races();
    assert_eq!(r.len(), 1, "{}", d.log.summary(4));
    assert_eq!(r[0].earlier.tensor, "w");
    assert_eq!(r[0].range, (d.buf_a.base + 1024, d.buf_a.base + 1152));
}

/// What the wrapper does not record it passes through unchanged: name, alignment,
/// domain, op support and offload wishes of the backend it wraps.
#[test]
fn the_wrapper_answers_as_the_backend_it_wraps() {
    for offload in [false, true] {
        let log = RaceLog::new();
        let inner = SimBackend::new(SimOptions {
            offload,
            unsupported: vec!["SCALE"],
            ..SimOptions::new("G")
        });
        let w = CheckedBackend::new(inner.clone(), &log);
        let d = devices(CopyQueue::Destination);
        let g = graph(&d);
        assert_eq!(w.name(), inner.name());
        assert_eq!(w.alignment(), inner.alignment());
        assert_eq!(w.domain(), inner.domain());
        assert_eq!(w.offload_op(&g.tensors, g.p), offload);
        assert!(!w.supports_op(&g.tensors, g.p));
        assert!(w.supports_op(&g.tensors, g.x));
    }
}

/// A prefetch the backend keeps is a read of the range on its queue, at the offset
/// asked: a write by another queue into those bytes, not ordered after it, races.
#[test]
fn a_kept_prefetch_reads_its_range_on_the_queue() {
    for (prefetch, offset) in [(true, 1024usize + 64), (true, 1024), (false, 1024)] {
        let log = RaceLog::new();
        let a = CheckedBackend::new(SimBackend::new(SimOptions::new("A")), &log);
        let b = CheckedBackend::new(
            SimBackend::new(SimOptions {
                prefetch,
                ..SimOptions::new("B")
            }),
            &log,
        );
        let buf_a = a.alloc_buffer(1 << 16).unwrap();
        let buf_b = b.alloc_buffer(1 << 16).unwrap();
        let mut storage = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 2];
        let mut ctx = Context::new(&mut storage);
        // A writes o: B's buffer bytes 1024..1280.
        let (_, o) = placed_pair(&mut ctx, "i", 64, (&buf_a, 0), (&buf_b, 1024));
        let t = ctx.tensors().to_vec();
        assert_eq!(b.buffer_prefetch(buf_b.id, offset, 64).unwrap(), prefetch);
        a.graph_compute(&t, &[o]).unwrap();
        let r = log.races();
        assert_eq!(r.len(), usize::from(prefetch), "{}", log.summary(4));
        if prefetch {
            let lo = buf_b.base + offset as u64;
            assert_eq!(r[0].range, (lo, lo + 64));
        }
    }
}
