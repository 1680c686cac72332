//! The queue, events, copies between backends, errors and shutdown.

mod common;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{f32s, place};
use ggml_core::{
    Backend, BackendErrorKind, Context, CopyQueue, DType, DataRef, EventRef, Tensor, TensorId,
};
use ggml_cpu::{CpuBackend, CpuBackendOptions};
use ggml_test_kit::{xorshift_quant_blocks, Xorshift};
use rstest::rstest;

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn cpu(n: usize, copy_queue: CopyQueue) -> CpuBackend {
    CpuBackend::new(CpuBackendOptions {
        n_threads: n,
        copy_queue,
        chaos: Some(7),
        ..CpuBackendOptions::default()
    })
    .unwrap()
}

/// Blocks the backend's queue until the returned sender is dropped or sent to.
fn gate(be: &CpuBackend) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    be.enqueue_host_fn(move || {
        let _ = rx.recv();
    })
    .unwrap();
    tx
}

#[test]
fn graph_compute_returns_before_completion() {
    let be = cpu(2, CopyQueue::Destination);
    let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 4];
    let mut ctx = Context::new(&mut s);
    let x = ctx.new_tensor_1d(DType::F32, 64).unwrap();
    let y = ctx.scale(x, 2.0).unwrap();
    let (tensors, buf) = place(&ctx, &be);
    let open = gate(&be);
    be.set_tensor_async(&tensors[x.index()], 0, &bytes(&[1.5; 64]))
        .unwrap();
    be.graph_compute(&tensors, &[y]).unwrap();
    // The queue is held: nothing ran yet (blocking reads are not ordered with the queue).
    std::thread::sleep(Duration::from_millis(20));
    let mut raw = vec![0u8; 256];
    let off =
        (tensors[y.index()].data.unwrap().addr - tensors[x.index()].data.unwrap().addr) as usize;
    be.buffer_get(buf, off, &mut raw).unwrap();
    assert!(f32s(&raw).iter().all(|&v| v == 0.0));
    drop(open);
    be.synchronize().unwrap();
    be.get_tensor(&tensors[y.index()], 0, &mut raw).unwrap();
    assert!(f32s(&raw).iter().all(|&v| v == 3.0));
}

#[test]
fn events_order_work_across_queues() {
    let a = cpu(1, CopyQueue::Destination);
    let b = cpu(2, CopyQueue::Destination);
    let log = Arc::new(Mutex::new(Vec::new()));
    let open = gate(&a);
    let l = log.clone();
    a.enqueue_host_fn(move || l.lock().unwrap().push("a"))
        .unwrap();
    let e = a.event_new().unwrap().unwrap();
    a.event_record(e).unwrap();
    assert!(b.can_wait_on(&a));
    b.event_wait(EventRef { owner: &a, id: e }).unwrap();
    let l = log.clone();
    b.enqueue_host_fn(move || l.lock().unwrap().push("b"))
        .unwrap();
    std::thread::sleep(Duration::from_millis(30));
    assert!(log.lock().unwrap().is_empty(), "b ran before a's event");
    drop(open);
    b.synchronize().unwrap();
    assert_eq!(*log.lock().unwrap(), ["a", "b"]);
    a.event_synchronize(e).unwrap();
    a.event_free(e).unwrap();
}

/// A producer on backend A, a copy into backend B's memory, a consumer on B: correct in
/// both copy-queue modes with the waits the design prescribes.
#[rstest]
fn cross_backend_copy(#[values(CopyQueue::Source, CopyQueue::Destination)] mode: CopyQueue) {
    let a = cpu(2, mode);
    let b = cpu(3, mode);
    assert_ne!(a.domain(), b.domain());
    for round in 0..5 {
        let mut sa = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 4];
        let mut ca = Context::new(&mut sa);
        let x = ca.new_tensor_1d(DType::F32, 300).unwrap();
        let y = ca.scale(x, 2.0).unwrap(); // produced on A
        let (ta, _) = place(&ca, &a);
        let mut sb = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 4];
        let mut cb = Context::new(&mut sb);
        let yb = cb.new_tensor_1d(DType::F32, 300).unwrap();
        let z = cb.scale(yb, 3.0).unwrap(); // consumed on B
        let (tb, _) = place(&cb, &b);
        let open = gate(&a);
        let v: Vec<f32> = (0..300).map(|i| i as f32 + round as f32).collect();
        a.set_tensor_async(&ta[x.index()], 0, &bytes(&v)).unwrap();
        a.graph_compute(&ta, &[y]).unwrap();
        if mode == CopyQueue::Destination {
            // HB1: B's queue waits for the producer's event before the copy.
            let e = a.event_new().unwrap().unwrap();
            a.event_record(e).unwrap();
            b.event_wait(EventRef { owner: &a, id: e }).unwrap();
        }
        assert!(b
            .cpy_tensor_async(&a, &ta[y.index()], &tb[yb.index()])
            .unwrap());
        b.graph_compute(&tb, &[z]).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        drop(open);
        b.synchronize().unwrap();
        a.synchronize().unwrap();
        let mut out = vec![0u8; 1200];
        b.get_tensor(&tb[z.index()], 0, &mut out).unwrap();
        let want: Vec<f32> = v.iter().map(|x| x * 2.0 * 3.0).collect();
        assert_eq!(f32s(&out), want, "{mode:?} round {round}");
    }
}

#[test]
fn bad_ops_surface_at_synchronize_and_the_queue_survives() {
    let be = cpu(2, CopyQueue::Destination);
    let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 8];
    let mut ctx = Context::new(&mut s);
    let emb = ctx.new_tensor(DType::F32, [8, 4, 1, 1]).unwrap();
    let idx = ctx.new_tensor(DType::I32, [2, 1, 1, 1]).unwrap();
    let rows = ctx.get_rows(emb, idx).unwrap();
    ctx.set_name(rows, "inp_embd").unwrap();
    let w = ctx.new_tensor(DType::Q8_1, [32, 2, 1, 1]).unwrap();
    let x = ctx.new_tensor(DType::F32, [32, 1, 1, 1]).unwrap();
    let mm = ctx.mul_mat(w, x).unwrap();
    ctx.set_name(mm, "bad_mm").unwrap();
    let ok = ctx.scale(emb, 0.5).unwrap();
    let (t, _) = place(&ctx, &be);
    // Out-of-range row index.
    be.set_tensor_async(&t[idx.index()], 0, &[1, 0, 0, 0, 9, 0, 0, 0])
        .unwrap();
    be.graph_compute(&t, &[rows]).unwrap();
    let e = be.synchronize().unwrap_err();
    assert_eq!(e.kind, BackendErrorKind::BadData);
    assert_eq!(e.op, Some("GET_ROWS"));
    assert_eq!(e.tensor.as_str(), "inp_embd");
    // Unsupported op (Q8_1 weights) reported as such, naming the node.
    assert!(!be.supports_op(&t, mm));
    be.graph_compute(&t, &[mm]).unwrap();
    let e = be.synchronize().unwrap_err();
    assert_eq!(
        (e.kind, e.op, e.tensor.as_str()),
        (BackendErrorKind::UnsupportedOp, Some("MUL_MAT"), "bad_mm")
    );
    // The queue still works, and errors were cleared.
    be.set_tensor_async(&t[emb.index()], 0, &bytes(&[4.0; 32]))
        .unwrap();
    be.graph_compute(&t, &[ok]).unwrap();
    be.synchronize().unwrap();
    let mut out = vec![0u8; 128];
    be.get_tensor(&t[ok.index()], 0, &mut out).unwrap();
    assert!(f32s(&out).iter().all(|&v| v == 2.0));
    // A tensor whose buffer was freed is an error, not a crash.
    let mut gone = t[ok.index()];
    gone.data = Some(DataRef {
        buffer: ggml_core::BufferId {
            domain: be.domain(),
            index: 999,
        },
        addr: 64,
    });
    let mut t2 = t.clone();
    t2[ok.index()] = gone;
    be.graph_compute(&t2, &[ok]).unwrap();
    assert_eq!(
        be.synchronize().unwrap_err().kind,
        BackendErrorKind::InvalidArgument
    );
}

#[test]
fn drop_does_not_hang() {
    let a = cpu(2, CopyQueue::Destination);
    let b = cpu(3, CopyQueue::Destination);
    let open = gate(&b);
    let e = b.event_new().unwrap().unwrap();
    b.event_record(e).unwrap(); // stuck behind the gate
    a.event_wait(EventRef { owner: &b, id: e }).unwrap();
    for _ in 0..100 {
        a.enqueue_host_fn(|| std::thread::sleep(Duration::from_millis(1)))
            .unwrap();
    }
    let t0 = Instant::now();
    drop(a); // its queue is waiting on b's event: the wait is abandoned
    assert!(t0.elapsed() < Duration::from_secs(2));
    // Dropping b with its queue gated by a host function that ends when the sender goes.
    let c = cpu(1, CopyQueue::Destination);
    let e2 = b.event_new().unwrap().unwrap();
    b.event_record(e2).unwrap();
    c.event_wait(EventRef { owner: &b, id: e2 }).unwrap();
    drop(open);
    drop(b); // c's wait ends when b's events complete or b is gone
    c.synchronize().unwrap();
}

#[test]
fn host_buffers_are_read_only_when_shared() {
    let be = cpu(2, CopyQueue::Destination);
    let weights: Vec<u8> = bytes(&(0..64).map(|i| i as f32).collect::<Vec<_>>());
    let hb = CpuBackend::host_buffer(Arc::new(weights));
    assert_eq!(hb.id.domain, ggml_core::MemoryDomain::HOST);
    assert!(be.supports_domain(hb.id.domain));
    assert!(be.buffer_set(hb.id, 0, &[1, 2]).is_err());
    let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 4];
    let mut ctx = Context::new(&mut s);
    let w = ctx.new_tensor(DType::F32, [16, 4, 1, 1]).unwrap();
    let x = ctx.new_tensor(DType::F32, [16, 1, 1, 1]).unwrap();
    let y = ctx.mul_mat(w, x).unwrap();
    let (mut t, _) = place(&ctx, &be);
    t[w.index()].data = Some(DataRef {
        buffer: hb.id,
        addr: hb.base,
    });
    be.set_tensor_async(&t[x.index()], 0, &bytes(&[1.0; 16]))
        .unwrap();
    be.graph_compute(&t, &[y]).unwrap();
    be.synchronize().unwrap();
    let mut out = vec![0u8; 16];
    be.get_tensor(&t[y.index()], 0, &mut out).unwrap();
    let want: Vec<f32> = (0..4)
        .map(|r| (0..16).map(|c| (r * 16 + c) as f32).sum())
        .collect();
    assert_eq!(f32s(&out), want);
    // Writing into it from a graph is refused.
    let z = TensorId(y.0);
    let mut t2 = t.clone();
    t2[z.index()].data = Some(DataRef {
        buffer: hb.id,
        addr: hb.base,
    });
    be.graph_compute(&t2, &[z]).unwrap();
    assert!(be.synchronize().is_err());
    be.free_buffer(hb.id).unwrap();
}

#[test]
fn buffer_from_host_ptr_reads_in_place_and_refuses_writes() {
    let be = cpu(1, CopyQueue::Destination);
    let weights: Vec<u8> = bytes(&(0..64).map(|i| i as f32).collect::<Vec<_>>());
    let info = be
        .buffer_from_host_ptr(weights.as_ptr() as u64, weights.len())
        .unwrap()
        .expect("the CPU backend reads host memory directly");
    assert_eq!(info.id.domain, be.domain());
    assert_eq!(info.base, weights.as_ptr() as u64, "no copy");
    let mut back = vec![0u8; 8];
    be.buffer_get(info.id, 4, &mut back).unwrap();
    assert_eq!(back, weights[4..12]);
    assert!(be.buffer_set(info.id, 0, &[1]).is_err());
    assert!(be.buffer_from_host_ptr(0, 16).is_err());
    assert!(be.buffer_from_host_ptr(u64::MAX - 4, 16).is_err());
    be.free_buffer(info.id).unwrap();
    assert_eq!(
        weights[0..4],
        0f32.to_le_bytes(),
        "freeing does not touch the memory"
    );
}

#[test]
fn options_split_threads() {
    assert_eq!(CpuBackendOptions::split_threads(2, 2), [1, 1]);
    assert_eq!(CpuBackendOptions::split_threads(5, 2), [3, 2]);
    assert_eq!(CpuBackendOptions::split_threads(1, 3), [1, 1, 1]);
    assert!(
        CpuBackend::new(CpuBackendOptions {
            n_threads: 0,
            ..Default::default()
        })
        .unwrap()
        .n_threads()
            >= 1
    );
}

#[test]
fn events_are_timed_on_the_host_clock() {
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    };
    let a = cpu(1, CopyQueue::Destination);
    let e = a.event_new().unwrap().unwrap();
    assert_eq!(a.event_time_ns(e).unwrap(), None, "never recorded");
    let open = gate(&a);
    let t0 = now();
    a.event_record(e).unwrap();
    assert_eq!(a.event_time_ns(e).unwrap(), None, "not reached yet");
    std::thread::sleep(Duration::from_millis(20));
    drop(open);
    a.event_synchronize(e).unwrap();
    let t = a.event_time_ns(e).unwrap().expect("completed");
    assert!(t >= t0 + 20_000_000 && t <= now(), "{t0} {t}");
    // A new record hides the old time until it completes.
    let open = gate(&a);
    a.event_record(e).unwrap();
    assert_eq!(a.event_time_ns(e).unwrap(), None);
    drop(open);
    a.synchronize().unwrap();
    assert!(a.event_time_ns(e).unwrap().unwrap() > t);
}

/// A registered table runs graph parts like `graph_compute` and outlives its free for
/// work already queued; unknown tables are refused.
#[test]
fn registered_tables_compute_and_free() {
    let be = cpu(2, CopyQueue::Destination);
    let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 4];
    let mut ctx = Context::new(&mut s);
    let x = ctx.new_tensor_1d(DType::F32, 64).unwrap();
    let y = ctx.scale(x, 2.0).unwrap();
    let z = ctx.scale(y, 3.0).unwrap();
    let (tensors, _buf) = place(&ctx, &be);
    be.set_tensor_async(&tensors[x.index()], 0, &bytes(&[1.5; 64]))
        .unwrap();
    let t = be
        .table_register(&tensors)
        .unwrap()
        .expect("the CPU keeps tables");
    let open = gate(&be);
    be.graph_compute_table(t, &[y]).unwrap();
    be.graph_compute_table(t, &[z]).unwrap();
    be.table_free(t).unwrap();
    drop(open);
    be.synchronize().unwrap();
    let mut raw = vec![0u8; 256];
    be.get_tensor(&tensors[z.index()], 0, &mut raw).unwrap();
    assert!(f32s(&raw).iter().all(|&v| v == 9.0));
    let e = be.graph_compute_table(t, &[y]).unwrap_err();
    assert_eq!(e.kind, BackendErrorKind::InvalidArgument);
    assert!(be.table_free(t).is_err());
}

/// A third backend copies between two others on its own queue: the copy waits for
/// nothing on either device's queue.
#[test]
fn engine_copies_run_on_their_own_queue() {
    let a = cpu(1, CopyQueue::Destination);
    let b = cpu(1, CopyQueue::Destination);
    let engine = cpu(1, CopyQueue::Destination);
    let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 2];
    let mut ctx = Context::new(&mut s);
    let x = ctx.new_tensor_1d(DType::F32, 16).unwrap();
    let (ta, _ba) = place(&ctx, &a);
    let (tb, _bb) = place(&ctx, &b);
    a.set_tensor_async(&ta[x.index()], 0, &bytes(&[4.0; 16]))
        .unwrap();
    a.synchronize().unwrap();
    // Both devices' queues are held; the engine still copies.
    let (ga, gb) = (gate(&a), gate(&b));
    assert!(engine
        .engine_cpy_tensor_async(&a, &ta[x.index()], &b, &tb[x.index()])
        .unwrap());
    engine.synchronize().unwrap();
    drop((ga, gb));
    let mut raw = vec![0u8; 64];
    b.get_tensor(&tb[x.index()], 0, &mut raw).unwrap();
    assert!(f32s(&raw).iter().all(|&v| v == 4.0));
}

/// A failed op is reported by the next event wait (not only by `synchronize`), and timed
/// waits give up on a queue that does not move.
#[test]
fn event_waits_report_errors_and_time_out() {
    let be = cpu(1, CopyQueue::Destination);
    let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 8];
    let mut ctx = Context::new(&mut s);
    let dst = ctx.new_tensor(DType::F32, [4, 2, 1, 1]).unwrap();
    let src = ctx.new_tensor(DType::F32, [4, 1, 1, 1]).unwrap();
    let idx = ctx.new_tensor(DType::I32, [1, 1, 1, 1]).unwrap();
    let w = ctx.set_rows(dst, src, idx).unwrap();
    let (tensors, _buf) = place(&ctx, &be);
    be.set_tensor_async(&tensors[idx.index()], 0, &7i32.to_le_bytes())
        .unwrap();
    let e = be.event_new().unwrap().unwrap();
    // Held: the timed waits give up.
    let open = gate(&be);
    be.graph_compute(&tensors, &[w]).unwrap();
    be.event_record(e).unwrap();
    let t = Duration::from_millis(30);
    assert!(!be.event_synchronize_timeout(e, t).unwrap());
    assert!(!be.synchronize_timeout(t).unwrap());
    drop(open);
    let err = be.event_synchronize(e).unwrap_err();
    assert_eq!(err.kind, BackendErrorKind::BadData, "{err}");
    assert!(be.event_synchronize_timeout(e, t).is_err());
    // synchronize reports it once more and clears it.
    assert!(be.synchronize().is_err());
    be.synchronize().unwrap();
    assert!(be.synchronize_timeout(t).unwrap());
}

/// The CPUs the threads of backend `name` may run on, from `/proc/self/task/*/status`.
#[cfg(target_os = "linux")]
fn allowed_cpus_of_threads(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(&format!("{name}-")) {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let line = status.lines().find(|l| l.starts_with("Cpus_allowed_list:"));
        out.push(line.unwrap().split_whitespace().nth(1).unwrap().to_string());
    }
    out.sort();
    out
}

#[test]
#[cfg(target_os = "linux")]
fn pinned_threads_run_on_cpus_of_their_own_and_compute_the_same() {
    let run = |be: &CpuBackend| {
        let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 4];
        let mut ctx = Context::new(&mut s);
        let x = ctx.new_tensor_1d(DType::F32, 4096).unwrap();
        let y = ctx.scale(x, 3.0).unwrap();
        let (tensors, _buf) = place(&ctx, be);
        let input: Vec<f32> = (0..4096).map(|i| i as f32 * 0.25).collect();
        be.set_tensor_async(&tensors[x.index()], 0, &bytes(&input))
            .unwrap();
        be.graph_compute(&tensors, &[y]).unwrap();
        be.synchronize().unwrap();
        let mut raw = vec![0u8; 4 * 4096];
        be.get_tensor(&tensors[y.index()], 0, &mut raw).unwrap();
        raw
    };
    let pin = |n: usize| {
        CpuBackend::new(CpuBackendOptions {
            n_threads: n,
            pin_threads: true,
            ..CpuBackendOptions::default()
        })
        .unwrap()
    };
    let free = CpuBackend::new(CpuBackendOptions::with_threads(2)).unwrap();
    assert!(free.pinned_cpus().is_none());
    let mut mask = 0usize;
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        mask += libc::CPU_COUNT(&set) as usize;
    }
    if mask < 2 {
        // One CPU: a 2-thread backend cannot have two of its own.
        assert!(pin(2).pinned_cpus().is_none());
        return;
    }
    let a = pin(2);
    let cpus = a.pinned_cpus().expect("two CPUs are free").to_vec();
    assert_eq!(cpus.len(), 2);
    assert_ne!(cpus[0], cpus[1]);
    let expect: Vec<String> = {
        let mut v: Vec<String> = cpus.iter().map(|c| c.to_string()).collect();
        v.sort();
        v
    };
    assert_eq!(run(&a), run(&free), "pinning changes no bits");
    assert_eq!(allowed_cpus_of_threads(a.name().as_str()), expect);
    // Every CPU of the mask for a second backend: two are held by `a`, so it stays free.
    assert!(pin(mask).pinned_cpus().is_none());
    drop(a);
    let all = pin(mask);
    let got = all.pinned_cpus().expect("every CPU is free again");
    assert!(cpus.iter().all(|c| got.contains(c)));
}

/// Op timing: every node that computes is counted once per run under its op (products
/// by weight type), a read starts new sums, turning it off empties them, and the bits do
/// not change.
#[rstest]
#[case::one_thread(1)]
#[case::three_threads(3)]
fn op_timing_counts_each_node_and_keeps_the_bits(#[case] threads: usize) {
    let be = cpu(threads, CopyQueue::Source);
    let mut rng = Xorshift::new(5);
    let mut storage = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 16];
    let mut ctx = Context::new(&mut storage);
    let w = ctx.new_tensor(DType::Q4_0, [64, 8, 1, 1]).unwrap();
    let x = ctx.new_tensor(DType::F32, [64, 2, 1, 1]).unwrap();
    let p = ctx.mul_mat(w, x).unwrap();
    let q = ctx.mul_mat(w, x).unwrap();
    let view = ctx.view_2d(q, 8, 2, 32, 0).unwrap();
    let sum = ctx.add(p, view).unwrap();
    let out = ctx.rms_norm(sum, 1e-6).unwrap();
    let (tensors, _) = place(&ctx, &be);
    be.set_tensor_async(
        &tensors[w.index()],
        0,
        &xorshift_quant_blocks(DType::Q4_0, 16, &mut rng),
    )
    .unwrap();
    let xs: Vec<f32> = (0..128).map(|_| rng.f()).collect();
    be.set_tensor_async(&tensors[x.index()], 0, &bytes(&xs))
        .unwrap();
    let nodes = [p, q, view, sum, out];
    let run = || {
        be.graph_compute(&tensors, &nodes).unwrap();
        be.synchronize().unwrap();
        let mut got = vec![0u8; 64];
        be.get_tensor(&tensors[out.index()], 0, &mut got).unwrap();
        got
    };
    let untimed = run();
    assert!(be.take_op_times().unwrap().is_empty(), "timing is off");

    be.set_op_timing(true);
    assert_eq!(run(), untimed);
    assert_eq!(run(), untimed);
    let times = be.take_op_times().unwrap();
    let mut calls: Vec<(String, u64)> = times.iter().map(|t| (t.to_string(), t.calls)).collect();
    calls.sort();
    let want = [("ADD", 2), ("MUL_MAT q4_0", 4), ("RMS_NORM", 2)].map(|(o, c)| (o.to_string(), c));
    assert_eq!(calls, want, "two runs; the view is not timed");
    assert!(times.iter().all(|t| t.ms >= 0.0));
    assert!(
        times.windows(2).all(|w| w[0].ms >= w[1].ms),
        "longest first: {times:?}"
    );
    assert!(
        be.take_op_times().unwrap().is_empty(),
        "a read starts new sums"
    );

    run();
    be.set_op_timing(false);
    assert!(
        be.take_op_times().unwrap().is_empty(),
        "turning it off drops the sums"
    );
    assert_eq!(run(), untimed);
    assert!(be.take_op_times().unwrap().is_empty());
}
