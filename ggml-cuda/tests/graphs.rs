//! CUDA graphs and the host side of a pass: a split is captured the second time it comes
//! and replayed after that, bit for bit what launching its kernels one by one gives;
//! kernel errors of replays name their node; small uploads travel in one batch. Runs on
//! cuda-sim, or on the GPU under `GGML_RS_REQUIRE_GPU` (the counts are the backend's own,
//! the same on both).

// Not every helper of the shared module is used here.
#[allow(dead_code)]
mod common;

use common::{f32_bytes, gpu, Lcg};
use ggml_core::{
    Backend, BackendErrorKind, BufferInfo, Context, DType, DataRef, Op, Tensor, TensorId,
};
use ggml_cuda::{CudaBackend, CudaTuning, HostCounters, MMQ_MIN_N};
use ggml_test_kit::bytes::i32_bytes;
use ggml_test_kit::quantize_rows;

/// Places every non-view tensor of `ts` in one new zeroed buffer of `be` (views at their
/// roots).
fn place(be: &CudaBackend, ts: &mut [Tensor]) -> BufferInfo {
    let mut offs = vec![0usize; ts.len()];
    let mut total = 0;
    for (i, t) in ts.iter().enumerate() {
        if t.view_src.is_none() {
            offs[i] = total;
            total += t.nbytes().div_ceil(256) * 256 + 256;
        }
    }
    let buf = be.alloc_buffer(total).unwrap();
    be.buffer_clear(buf.id, 0).unwrap();
    for (i, t) in ts.iter_mut().enumerate() {
        let (root, extra) = match t.view_src {
            Some(r) => (r.index(), t.view_offs),
            None => (i, 0),
        };
        t.data = Some(DataRef {
            buffer: buf.id,
            addr: buf.base + (offs[root] + extra) as u64,
        });
    }
    buf
}

fn nodes_of(ts: &[Tensor]) -> Vec<TensorId> {
    (0..ts.len() as u32)
        .map(TensorId)
        .filter(|id| ts[id.index()].op != Op::None)
        .collect()
}

fn read(be: &CudaBackend, t: &Tensor) -> Vec<u8> {
    let mut out = vec![0u8; t.nbytes()];
    be.get_tensor(t, 0, &mut out).unwrap();
    out
}

/// A decoder-layer-like split: embedding rows by token id, RMS norm, a Q4_0 product (so
/// Q8_1 scratch), a residual add, and a store of rows into a cache by index, which are
/// the kernels with error words.
struct Layer {
    ts: Vec<Tensor>,
    ids: TensorId,
    rows: TensorId,
    out: TensorId,
    cache: TensorId,
    emb: TensorId,
    w: TensorId,
}

fn layer(tokens: usize) -> Layer {
    let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 32];
    let mut ctx = Context::new(&mut s);
    let k = 64;
    let emb = ctx.new_tensor(DType::F32, [k, 16, 1, 1]).unwrap();
    let ids = ctx.new_tensor(DType::I32, [tokens, 1, 1, 1]).unwrap();
    let x = ctx.get_rows(emb, ids).unwrap();
    let n = ctx.rms_norm(x, 1e-5).unwrap();
    let w = ctx.new_tensor(DType::Q4_0, [k, k, 1, 1]).unwrap();
    let y = ctx.mul_mat(w, n).unwrap();
    let out = ctx.add(y, x).unwrap();
    let cache = ctx.new_tensor(DType::F16, [k, 8, 1, 1]).unwrap();
    let rows = ctx.new_tensor(DType::I32, [tokens, 1, 1, 1]).unwrap();
    ctx.set_rows(cache, out, rows).unwrap();
    Layer {
        ts: ctx.tensors().to_vec(),
        ids,
        rows,
        out,
        cache,
        emb,
        w,
    }
}

/// The layer placed on `be` with seeded weights.
fn setup(be: &CudaBackend, l: &mut Layer) -> BufferInfo {
    let buf = place(be, &mut l.ts);
    let mut rng = Lcg(7);
    let emb = l.ts[l.emb.index()];
    be.set_tensor_async(&emb, 0, &f32_bytes(&rng.vec(emb.nelements())))
        .unwrap();
    let w = l.ts[l.w.index()];
    let q = quantize_rows(DType::Q4_0, &rng.vec(w.nelements()), w.ne[0]);
    be.set_tensor_async(&w, 0, &q).unwrap();
    be.synchronize().unwrap();
    buf
}

/// Step `i` of a token loop: token ids and cache rows change every step.
fn step(be: &CudaBackend, l: &Layer, i: usize, tokens: usize) -> (Vec<u8>, Vec<u8>) {
    let ids: Vec<i32> = (0..tokens).map(|t| ((i * 5 + t * 3) % 16) as i32).collect();
    let rows: Vec<i32> = (0..tokens).map(|t| ((i + t) % 8) as i32).collect();
    be.set_tensor_async(&l.ts[l.ids.index()], 0, &i32_bytes(&ids))
        .unwrap();
    be.set_tensor_async(&l.ts[l.rows.index()], 0, &i32_bytes(&rows))
        .unwrap();
    be.graph_compute(&l.ts, &nodes_of(&l.ts)).unwrap();
    (
        read(be, &l.ts[l.out.index()]),
        read(be, &l.ts[l.cache.index()]),
    )
}

fn backend(tuning: CudaTuning) -> CudaBackend {
    let be = gpu();
    be.set_tuning(tuning);
    be
}

/// A backend without graphs and one with, each with the layer of `tokens` placed.
fn eager_and_graphs(tokens: usize) -> ((CudaBackend, Layer), (CudaBackend, Layer)) {
    let eager = backend(CudaTuning {
        graphs: false,
        ..CudaTuning::default()
    });
    let graphs = backend(CudaTuning::default());
    let (mut a, mut b) = (layer(tokens), layer(tokens));
    setup(&eager, &mut a);
    setup(&graphs, &mut b);
    ((eager, a), (graphs, b))
}

#[test]
fn graphs_replay_bit_for_bit_what_launches_give() {
    let tokens = 2;
    let ((eager, a), (graphs, b)) = eager_and_graphs(tokens);
    let mut per_step: Vec<HostCounters> = Vec::new();
    for i in 0..5 {
        let before = graphs.host_counters();
        let got = step(&graphs, &b, i, tokens);
        per_step.push(graphs.host_counters() - before);
        let want = step(&eager, &a, i, tokens);
        assert_eq!(got, want, "step {i}");
    }
    // Seen once: launched one by one. Twice: captured, then launched as a graph. After
    // that: the graph alone, no kernel launched from the host.
    let kernels = per_step[0].kernel_launches;
    // get_rows, the norm + product + add as one fused qmm, set_rows, the upload scatter.
    assert!(kernels >= 4, "{:?}", per_step[0]);
    assert_eq!(per_step[0].graph_launches, 0);
    assert_eq!(per_step[0].calls.launch, kernels);
    assert_eq!(
        (per_step[1].graph_captures, per_step[1].graph_launches),
        (1, 1)
    );
    for c in &per_step[2..] {
        assert_eq!(c.graph_captures, 0, "{c:?}");
        assert_eq!(c.graph_launches, 1, "{c:?}");
        assert_eq!(c.calls.launch, 0, "{c:?}");
        assert_eq!(c.kernel_launches, kernels, "{c:?}");
        // The kernels, the scatter of the two uploads and the copy of the error words.
        assert_eq!(c.graph_nodes, kernels + 1, "{c:?}");
    }
    assert_eq!(graphs.kernel_stats(), eager.kernel_stats());
    // Without graphs nothing is captured.
    assert_eq!(eager.host_counters().graph_captures, 0);
}

#[test]
fn prompt_sized_splits_are_never_captured() {
    // One token short of the tiled class is captured on its second sight; the tiled class
    // (a prompt's products) is launched one by one every time, with the same bits.
    for (tokens, captured) in [(MMQ_MIN_N - 1, true), (MMQ_MIN_N, false)] {
        let ((eager, a), (graphs, b)) = eager_and_graphs(tokens);
        for i in 0..3 {
            assert_eq!(step(&graphs, &b, i, tokens), step(&eager, &a, i, tokens));
        }
        let c = graphs.host_counters();
        assert_eq!(c.graph_captures > 0, captured, "{tokens} tokens: {c:?}");
        assert_eq!(c.graph_launches > 0, captured, "{tokens} tokens: {c:?}");
        assert_eq!(graphs.kernel_stats(), eager.kernel_stats());
    }
}

#[test]
fn timed_runs_never_capture() {
    let be = backend(CudaTuning::default());
    let mut l = layer(1);
    setup(&be, &mut l);
    be.set_op_timing(true).unwrap();
    for i in 0..3 {
        step(&be, &l, i, 1);
    }
    assert!(!be.take_op_times().unwrap().is_empty());
    be.set_op_timing(false).unwrap();
    let c = be.host_counters();
    assert_eq!((c.graph_captures, c.graph_launches), (0, 0));
}

#[test]
fn kernel_errors_of_replays_name_their_node() {
    let be = backend(CudaTuning::default());
    let mut l = layer(1);
    setup(&be, &mut l);
    let nodes = nodes_of(&l.ts);
    let ids = l.ts[l.ids.index()];
    let rows = l.ts[l.rows.index()];
    let run = |id: i32, row: i32| {
        be.set_tensor_async(&ids, 0, &i32_bytes(&[id])).unwrap();
        be.set_tensor_async(&rows, 0, &i32_bytes(&[row])).unwrap();
        be.graph_compute(&l.ts, &nodes).unwrap();
    };
    run(1, 1);
    run(2, 2);
    be.synchronize().unwrap();
    assert_eq!(be.host_counters().graph_captures, 1);
    // A bad token id in a replay: named at the next synchronisation, and already
    // visible without waiting once the replay ran.
    run(99, 3);
    let ev = be.event_new().unwrap().unwrap();
    be.event_record(ev).unwrap();
    be.event_synchronize(ev).unwrap();
    let e = be.pending_error().unwrap_err();
    assert_eq!(e.kind, BackendErrorKind::BadData);
    let e = be.synchronize().unwrap_err();
    assert_eq!(e.kind, BackendErrorKind::BadData);
    let text = e.to_string();
    assert!(text.contains("GET_ROWS"), "{text}");
    // Cleared: good ids replay cleanly, and a bad cache row names SET_ROWS.
    run(3, 4);
    be.synchronize().unwrap();
    be.pending_error().unwrap();
    run(3, -1);
    let e = be.synchronize().unwrap_err();
    assert!(e.to_string().contains("SET_ROWS"), "{e}");
    run(3, 5);
    be.synchronize().unwrap();
    assert_eq!(be.host_counters().graph_captures, 1);
    be.event_free(ev).unwrap();
}

#[test]
fn freeing_memory_or_growing_the_scratch_drops_the_graphs() {
    let be = backend(CudaTuning::default());
    let mut small = layer(1);
    setup(&be, &mut small);
    for i in 0..3 {
        step(&be, &small, i, 1);
    }
    assert_eq!(be.host_counters().graph_launches, 2);
    // A product whose Q8_1 activations (1.2 MB) outgrow the scratch: the graphs go with
    // the old scratch.
    let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 4];
    let mut ctx = Context::new(&mut s);
    let w = ctx.new_tensor(DType::Q4_0, [1024, 4, 1, 1]).unwrap();
    let x = ctx.new_tensor(DType::F32, [1024, 1024, 1, 1]).unwrap();
    ctx.mul_mat(w, x).unwrap();
    let mut big = ctx.tensors().to_vec();
    let buf = place(&be, &mut big);
    be.graph_compute(&big, &nodes_of(&big)).unwrap();
    be.synchronize().unwrap();
    let before = be.host_counters();
    // Seen again after the reset: launched one by one, then captured.
    let a = step(&be, &small, 3, 1);
    let b = step(&be, &small, 4, 1);
    let c = be.host_counters() - before;
    assert_eq!((c.graph_captures, c.graph_launches), (1, 1), "{c:?}");
    let fresh = backend(CudaTuning {
        graphs: false,
        ..CudaTuning::default()
    });
    let mut check = layer(1);
    setup(&fresh, &mut check);
    for i in 0..3 {
        step(&fresh, &check, i, 1);
    }
    assert_eq!(a, step(&fresh, &check, 3, 1));
    assert_eq!(b, step(&fresh, &check, 4, 1));
    // Freeing a buffer: graphs may hold its addresses.
    be.free_buffer(buf.id).unwrap();
    let before = be.host_counters();
    step(&be, &small, 5, 1);
    assert_eq!((be.host_counters() - before).graph_launches, 0);
}

#[test]
fn small_uploads_travel_in_one_copy_and_keep_their_order() {
    let be = gpu();
    let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 8];
    let mut ctx = Context::new(&mut s);
    let a = ctx.new_tensor(DType::F32, [1000, 1, 1, 1]).unwrap();
    let b = ctx.new_tensor(DType::F32, [10000, 1, 1, 1]).unwrap();
    let c = ctx.new_tensor(DType::F32, [3, 1, 1, 1]).unwrap();
    let d = ctx.new_tensor(DType::F32, [40000, 1, 1, 1]).unwrap();
    let mut ts = ctx.tensors().to_vec();
    place(&be, &mut ts);
    let mut rng = Lcg(3);
    let va = f32_bytes(&rng.vec(1000));
    let vb = f32_bytes(&rng.vec(10000));
    let vd = f32_bytes(&rng.vec(40000));
    let before = be.host_counters();
    // Word-aligned, several blocks of one piece, an unaligned 5 bytes, a piece written
    // twice (the second write wins) and one too large to batch.
    be.set_tensor_async(&ts[a.index()], 0, &va).unwrap();
    be.set_tensor_async(&ts[b.index()], 0, &vb).unwrap();
    be.set_tensor_async(&ts[c.index()], 3, &[1, 2, 3, 4, 5])
        .unwrap();
    be.set_tensor_async(&ts[a.index()], 8, &[9; 8]).unwrap();
    be.set_tensor_async(&ts[d.index()], 0, &vd).unwrap();
    be.synchronize().unwrap();
    let n = be.host_counters() - before;
    // Batch 1 (a, b, c): one copy and one scatter; batch 2 (the second write to a, which
    // must land after the first): one piece, one copy; d: staged on its own.
    assert_eq!(n.calls.memcpy_htod, 3, "{n:?}");
    assert_eq!(n.calls.launch, 1, "{n:?}");
    let mut want_a = va.clone();
    want_a[8..16].copy_from_slice(&[9; 8]);
    assert_eq!(read(&be, &ts[a.index()]), want_a);
    assert_eq!(read(&be, &ts[b.index()]), vb);
    assert_eq!(
        read(&be, &ts[c.index()]),
        [0, 0, 0, 1, 2, 3, 4, 5, 0, 0, 0, 0]
    );
    assert_eq!(read(&be, &ts[d.index()]), vd);
}
