//! What only the emulator can show: host-ordering races under cuda-sim's chaos delays,
//! fault reports, and memory returned. These run on cuda-sim alone (a GPU has no chaos
//! knob); every other test of the backend runs on both drivers (tests/gpu.rs).

use ggml_core::{Backend, Context, DType, DataRef, Tensor, TensorId};
use ggml_cuda::{CudaBackend, DriverKind};

fn sim(instance: u32) -> CudaBackend {
    CudaBackend::with_driver(DriverKind::Sim, 0, instance).expect("cuda-sim device 0")
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// `y = 2 x` on `n` floats, `x` and `y` in one buffer: (tensors, x, y, buffer).
fn doubling_graph(
    be: &CudaBackend,
    storage: &mut [Tensor],
    n: usize,
) -> (Vec<Tensor>, TensorId, TensorId, ggml_core::BufferInfo) {
    let mut ctx = Context::new(storage);
    let x = ctx.new_tensor(DType::F32, [n, 1, 1, 1]).unwrap();
    let y = ctx.scale(x, 2.0).unwrap();
    let buf = be.alloc_buffer(2 * n * 4 + 512).unwrap();
    let ts = ctx.tensors_mut();
    ts[x.index()].data = Some(DataRef {
        buffer: buf.id,
        addr: buf.base,
    });
    ts[y.index()].data = Some(DataRef {
        buffer: buf.id,
        addr: buf.base + (n * 4).next_multiple_of(256) as u64,
    });
    (ctx.tensors().to_vec(), x, y, buf)
}

/// `buffer_set` / `buffer_clear` promise a write that is complete when they return, so a
/// kernel enqueued afterwards must see it. Through the synchronous driver calls on the
/// legacy NULL stream it is not: the backend's stream is non-blocking, so the kernel can
/// overtake the copy's DMA. With chaos delays cuda-sim makes that visible.
#[test]
fn host_writes_are_complete_before_later_kernels() {
    let drv = ggml_cuda::sim_driver().unwrap();
    let be = sim(0);
    let n = 4096;
    let mut storage = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 4];
    let (ts, x, y, buf) = doubling_graph(&be, &mut storage, n);
    let mut stale = Vec::new();
    for round in 0..24u64 {
        drv.set_chaos(Some(round));
        // Alternate: a fill of the whole buffer, or a write of x's bytes.
        let value = round as f32 + 1.0;
        if round % 2 == 0 {
            be.buffer_set(buf.id, 0, &f32_bytes(&vec![value; n]))
                .unwrap();
        } else {
            be.buffer_clear(buf.id, 0).unwrap();
        }
        be.graph_compute(&ts, &[y]).unwrap();
        // Before the fix, the first round already failed here: initcheck saw the kernel
        // read bytes the copy had not written yet (CUDA_ERROR_LAUNCH_FAILED).
        if let Err(e) = be.synchronize() {
            stale.push((round, e.to_string()));
            break;
        }
        let mut out = vec![0u8; n * 4];
        be.get_tensor(&ts[y.index()], 0, &mut out).unwrap();
        let want = if round % 2 == 0 { 2.0 * value } else { 0.0 };
        if let Some(v) = to_f32(&out).into_iter().find(|&v| v != want) {
            stale.push((round, format!("read {v}, want {want}")));
        }
    }
    drv.set_chaos(None);
    let _ = x;
    assert!(
        stale.is_empty(),
        "kernels overtook buffer_set/buffer_clear in rounds {stale:?}"
    );
}

/// Host copies go through pinned staging; a long run of large copies (each larger than a
/// staging chunk, queued faster than the stream drains them under chaos) must keep the
/// pinned memory within STAGING_LIMIT and still deliver every byte.
#[test]
fn pinned_staging_stays_bounded_over_large_copies() {
    let drv = ggml_cuda::sim_driver().unwrap();
    drv.set_chaos(Some(3));
    let be = sim(0);
    let n = 6 << 20; // f32 elements: 24 MiB per copy
    let t0 = Tensor::contiguous(DType::F32, [n, 1, 1, 1]).unwrap();
    let buf = be.alloc_buffer(n * 4).unwrap();
    let mut t = t0;
    t.data = Some(DataRef {
        buffer: buf.id,
        addr: buf.base,
    });
    let mut peak = 0;
    for round in 0..12u8 {
        let bytes = vec![round; n * 4];
        be.set_tensor_async(&t, 0, &bytes).unwrap();
        peak = peak.max(drv.pinned_bytes());
    }
    drv.set_chaos(None);
    let mut out = vec![0u8; n * 4];
    be.get_tensor(&t, 0, &mut out).unwrap();
    assert!(
        out.iter().all(|&b| b == 11),
        "the last copy's bytes arrived"
    );
    assert!(
        peak as usize <= ggml_cuda::STAGING_LIMIT,
        "pinned staging grew to {peak} bytes"
    );
    be.free_buffer(buf.id).unwrap();
}

/// Timed waits: a recorded event after a kernel completes within the limit, and so does
/// the stream; the result is the one an untimed wait gives.
#[test]
fn timed_waits_complete_within_the_limit() {
    let be = sim(0);
    let mut storage = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 4];
    let (tensors, x, y, _buf) = doubling_graph(&be, &mut storage, 1000);
    be.set_tensor_async(&tensors[x.index()], 0, &f32_bytes(&[1.5; 1000]))
        .unwrap();
    be.graph_compute(&tensors, &[y]).unwrap();
    let e = be.event_new().unwrap().unwrap();
    be.event_record(e).unwrap();
    let t = std::time::Duration::from_secs(30);
    assert!(be.event_synchronize_timeout(e, t).unwrap());
    assert!(be.synchronize_timeout(t).unwrap());
    let mut out = vec![0u8; 4000];
    be.get_tensor(&tensors[y.index()], 0, &mut out).unwrap();
    assert!(to_f32(&out).iter().all(|&v| v == 3.0));
    be.event_free(e).unwrap();
}
