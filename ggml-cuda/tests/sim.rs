//! What only the emulator can show: host-ordering races under cuda-sim's chaos delays,
//! fault reports, memory returned, and the bytes of `quantize_q8_1`, whose output no
//! graph op exposes (it feeds the quantised products). These run on cuda-sim alone (a
//! GPU has no chaos knob); every other test of the backend runs on both drivers
//! (tests/gpu.rs).

use ggml_core::{Backend, Context, DType, DataRef, Tensor, TensorId};
use ggml_cuda::{CudaBackend, DriverKind};
use ggml_test_kit::bytes::{f32_bytes, f32s};

fn sim(instance: u32) -> CudaBackend {
    CudaBackend::with_driver(DriverKind::Sim, 0, instance).expect("cuda-sim device 0")
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
        if let Some(v) = f32s(&out).into_iter().find(|&v| v != want) {
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
        // The backend's own staging: the driver's total counts other tests' backends.
        peak = peak.max(be.pinned_staging_bytes());
    }
    drv.set_chaos(None);
    let mut out = vec![0u8; n * 4];
    be.get_tensor(&t, 0, &mut out).unwrap();
    assert!(
        out.iter().all(|&b| b == 11),
        "the last copy's bytes arrived"
    );
    assert!(
        peak <= ggml_cuda::STAGING_LIMIT,
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
    assert!(f32s(&out).iter().all(|&v| v == 3.0));
    be.event_free(e).unwrap();
}

/// `quantize_q8_1` launched on its own through cuda-sim's interpreter (all checks on):
/// its Q8_1 bytes equal the host mirror's, block by block, for ties at every half, zero
/// blocks, infinities, NaN, blocks of NaN only, subnormal scales whose reciprocal
/// overflows, huge values and random rows; and a partial last group of 8 blocks.
#[test]
fn quantize_q8_1_bytes_equal_the_mirror() {
    use cuda_sim::exec::{launch, LaunchConfig};
    use ggml_cuda::kernels::{KernelId, MODULES};
    use ggml_cuda::reference::{quantize_q8_1, Q8_1_BLOCK};

    let (file, entry) = KernelId::QuantizeQ8_1.entry();
    let source = MODULES
        .iter()
        .find(|m| m.file == file)
        .expect("module")
        .source;
    let module = cuda_sim::ptx::Module::parse(file, source).expect("quant.ptx parses");
    let (nchunks, rows) = (10usize, 3usize);
    let k = 32 * nchunks;
    let mut x = vec![0f32; k * rows];
    let mut r = 0x2545_f491_4f6c_dd1du64;
    let mut rand = || {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        (r >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    for v in x.iter_mut() {
        *v = rand();
    }
    let blk = |row: usize, j: usize| row * k + 32 * j..row * k + 32 * j + 32;
    // Row 0: one special block per chunk.
    let b = blk(0, 0);
    x[b.start] = 127.0; // d = 1: every x.5 is a tie
    for (i, v) in x[b.start + 1..b.end].iter_mut().enumerate() {
        *v = i as f32 - 15.5;
    }
    let b = blk(0, 1);
    x[b].fill(0.0);
    let b = blk(0, 2);
    x[b.start + 3] = f32::INFINITY;
    let b = blk(0, 3);
    x[b.start + 5] = f32::NAN;
    x[b.start + 6] = -f32::NAN;
    let b = blk(0, 4);
    x[b].fill(f32::NAN);
    let b = blk(0, 5);
    for (i, v) in x[b].iter_mut().enumerate() {
        *v = f32::from_bits(1 + i as u32) * if i % 2 == 0 { 1.0 } else { -1.0 };
    }
    let b = blk(0, 6);
    for v in x[b].iter_mut() {
        *v *= 3e38;
    }
    let b = blk(0, 7);
    x[b.start] = -0.0;
    for v in x[b.start + 1..b.end].iter_mut() {
        *v = 0.0;
    }
    // Rows 1 and 2: random values at two scales.
    for v in x[2 * k..].iter_mut() {
        *v *= 1e-3;
    }

    const BASE: u64 = 0x1000_0000;
    let dst = BASE + (4 * x.len() as u64).next_multiple_of(256);
    let out_bytes = rows * nchunks * Q8_1_BLOCK;
    let mem = cuda_sim::mem::FlatMemory::new(BASE, (dst - BASE) as usize + out_bytes, true);
    mem.write(BASE, &f32_bytes(&x));
    let (nbs1, nbd1) = ((4 * k) as u64, (nchunks * Q8_1_BLOCK) as u64);
    let args: Vec<Vec<u8>> = vec![
        BASE.to_le_bytes().to_vec(),
        dst.to_le_bytes().to_vec(),
        (nchunks as u32).to_le_bytes().to_vec(),
        1u32.to_le_bytes().to_vec(),
        nbs1.to_le_bytes().to_vec(),
        (nbs1 * rows as u64).to_le_bytes().to_vec(),
        (nbs1 * rows as u64).to_le_bytes().to_vec(),
        nbd1.to_le_bytes().to_vec(),
        (nbd1 * rows as u64).to_le_bytes().to_vec(),
        (nbd1 * rows as u64).to_le_bytes().to_vec(),
    ];
    let arg_refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
    let cfg = LaunchConfig {
        grid: [nchunks.div_ceil(8) as u32, rows as u32, 1],
        block: [256, 1, 1],
        dynamic_shared: 0,
        programmatic: false,
    };
    launch(
        &module,
        entry,
        &cfg,
        &arg_refs,
        &mem,
        cuda_sim::Checks::ALL,
        2,
    )
    .unwrap_or_else(|e| panic!("quantize_q8_1: {e:?}"));
    let mut got = vec![0u8; out_bytes];
    mem.read(dst, &mut got);
    let mut want = vec![0u8; out_bytes];
    for (row, out) in x.chunks(k).zip(want.chunks_mut(nchunks * Q8_1_BLOCK)) {
        quantize_q8_1(row, out);
    }
    for (i, (g, w)) in got
        .chunks(Q8_1_BLOCK)
        .zip(want.chunks(Q8_1_BLOCK))
        .enumerate()
    {
        assert_eq!(g, w, "row {} block {}", i / nchunks, i % nchunks);
    }
    // The ties rounded away from zero, as ggml's roundf: -15.5 -> -16, -0.5 -> -1,
    // 0.5 -> 1.
    let q = |i: usize| got[4 + i] as i8;
    assert_eq!((q(1), q(16), q(17)), (-16, -1, 1));
}
