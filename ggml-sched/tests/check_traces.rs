//! The happens-before checker on traces built by hand, without the scheduler: for each
//! HB rule, the unordered sequence is reported as that rule's race, and the same
//! sequence with the wait that orders it passes. Two recording-only backends (A and B)
//! stand for two devices; their copies run on the queue each case names.

use std::sync::Arc;

use ggml_core::{
    Backend, BufferInfo, Context, CopyQueue, DType, DataRef, EventRef, Tensor, TensorId,
};
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

/// `waiter`'s queue waits for everything enqueued on `owner` so far.
fn wait_for(waiter: &Arc<CheckedBackend>, owner: &Arc<CheckedBackend>) {
    let e = owner.event_new().unwrap().expect("events");
    owner.event_record(e).unwrap();
    waiter
        .event_wait(EventRef {
            owner: owner.as_ref(),
            id: e,
        })
        .unwrap();
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
