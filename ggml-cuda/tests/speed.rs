//! GPU time of SmolLM2-135M's decode-step products (30 layers of norm, Q/K/V, O +
//! residual, norm, gate/up/SwiGLU, down + residual, then the output head; random Q4_1
//! weights and a Q8_0 head of 49152 rows) for each generation of kernels and fusion
//! setting. A measurement, not a check (ignored by default): on a GPU,
//!
//! ```text
//! GGML_RS_REQUIRE_GPU=1 cargo test --release -p ggml-cuda --test speed -- --ignored --nocapture
//! ```
//!
//! A long float product enqueued first keeps the stream busy while the host enqueues the
//! tokens, so the GPU runs them back to back: their time, less the product's, is the
//! GPU's time per token without the host's launch gaps. Then op timing brackets every
//! step (a node, or a fused run) with timed events for a breakdown (the events' own
//! cost included).

// Not every helper of the shared module is needed here.
#[allow(dead_code)]
mod common;

use std::collections::BTreeMap;
use std::time::Instant;

use common::{f32_bytes, gpu, Rng};
use ggml_core::{Backend, Context, DType, DataRef, Tensor, TensorId};
use ggml_cuda::{CudaTuning, DriverKind};

/// Random quantised rows with sane scales (the bytes of the quants are random).
fn quant_rows(dt: DType, k: usize, rows: usize, rng: &mut Rng) -> Vec<u8> {
    let ts = dt.type_size();
    let nb = k / dt.block_size() * rows;
    let mut v: Vec<u8> = (0..nb * ts).map(|_| rng.next() as u8).collect();
    let f16 = |x: f32| ggml_cuda::reference::f32_to_f16(x).to_le_bytes();
    for blk in v.chunks_mut(ts) {
        blk[0..2].copy_from_slice(&f16(0.01 + 0.005 * rng.f()));
        if dt == DType::Q4_1 {
            blk[2..4].copy_from_slice(&f16(0.01 * rng.f()));
        }
    }
    v
}

#[test]
#[ignore = "a measurement for a GPU: run with --ignored"]
fn smollm2_decode_products() {
    let be = gpu();
    // On cuda-sim (a check that the measurement runs) one small layer.
    let sim = common::driver() == DriverKind::Sim;
    let (e, kv, ff, vocab, layers) = if sim {
        (576, 192, 1536, 1024, 1)
    } else {
        (576, 192, 1536, 49152, 30)
    };
    let (big_k, n_busy) = if sim { (64, 1) } else { (4096, 48) };
    let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 1024];
    let mut ctx = Context::new(&mut s);
    let mut r = Rng(1);
    let mut inputs: Vec<(TensorId, Vec<u8>)> = Vec::new();
    let mut nodes = Vec::new();
    let mut x = ctx.new_tensor(DType::F32, [e, 1, 1, 1]).unwrap();
    inputs.push((x, f32_bytes(&r.vec(e))));
    let mut w = |ctx: &mut Context<'_>, inputs: &mut Vec<(TensorId, Vec<u8>)>, dt, k, m| {
        let t = ctx.new_tensor(dt, [k, m, 1, 1]).unwrap();
        inputs.push((t, quant_rows(dt, k, m, &mut r)));
        t
    };
    let g = |ctx: &mut Context<'_>, inputs: &mut Vec<(TensorId, Vec<u8>)>| {
        let t = ctx.new_tensor(DType::F32, [e, 1, 1, 1]).unwrap();
        inputs.push((t, f32_bytes(&vec![1.0; e])));
        t
    };
    for _ in 0..layers {
        let (g1, g2) = (g(&mut ctx, &mut inputs), g(&mut ctx, &mut inputs));
        let wq = w(&mut ctx, &mut inputs, DType::Q4_1, e, e);
        let wk = w(&mut ctx, &mut inputs, DType::Q4_1, e, kv);
        let wv = w(&mut ctx, &mut inputs, DType::Q4_1, e, kv);
        let wo = w(&mut ctx, &mut inputs, DType::Q4_1, e, e);
        let wg = w(&mut ctx, &mut inputs, DType::Q4_1, e, ff);
        let wu = w(&mut ctx, &mut inputs, DType::Q4_1, e, ff);
        let wd = w(&mut ctx, &mut inputs, DType::Q4_1, ff, e);
        let rn = ctx.rms_norm(x, 1e-5).unwrap();
        let cur = ctx.mul(rn, g1).unwrap();
        let q = ctx.mul_mat(wq, cur).unwrap();
        let k = ctx.mul_mat(wk, cur).unwrap();
        let v = ctx.mul_mat(wv, cur).unwrap();
        // The attention output stands in as Q (the attention is not measured here).
        let o = ctx.mul_mat(wo, q).unwrap();
        let h = ctx.add(o, x).unwrap();
        let rn2 = ctx.rms_norm(h, 1e-5).unwrap();
        let cur2 = ctx.mul(rn2, g2).unwrap();
        let gate = ctx.mul_mat(wg, cur2).unwrap();
        let up = ctx.mul_mat(wu, cur2).unwrap();
        let act = ctx.swiglu(gate, up).unwrap();
        let d = ctx.mul_mat(wd, act).unwrap();
        let out = ctx.add(d, h).unwrap();
        nodes.extend([rn, cur, q, k, v, o, h, rn2, cur2, gate, up, act, d, out]);
        x = out;
    }
    let gf = g(&mut ctx, &mut inputs);
    let head = w(&mut ctx, &mut inputs, DType::Q8_0, e, vocab);
    let rn = ctx.rms_norm(x, 1e-5).unwrap();
    let cur = ctx.mul(rn, gf).unwrap();
    let logits = ctx.mul_mat(head, cur).unwrap();
    nodes.extend([rn, cur, logits]);
    // The float product that keeps the stream busy.
    let big = ctx.new_tensor(DType::F32, [big_k, big_k, 1, 1]).unwrap();
    let bx = ctx.new_tensor(DType::F32, [big_k, 256, 1, 1]).unwrap();
    let busy: Vec<TensorId> = (0..n_busy).map(|_| ctx.mul_mat(big, bx).unwrap()).collect();

    // Every tensor in one buffer, apart.
    let mut total = 0usize;
    let mut offs = vec![0usize; ctx.len()];
    for (i, t) in ctx.tensors().iter().enumerate() {
        offs[i] = total;
        total += t.nbytes().div_ceil(256) * 256;
    }
    let buf = be.alloc_buffer(total).unwrap();
    be.buffer_clear(buf.id, 0).unwrap();
    for (i, off) in offs.iter().enumerate() {
        ctx.tensors_mut()[i].data = Some(DataRef {
            buffer: buf.id,
            addr: buf.base + *off as u64,
        });
    }
    let ts = ctx.tensors();
    for (id, bytes) in &inputs {
        be.set_tensor_async(&ts[id.index()], 0, bytes).unwrap();
    }
    be.synchronize().unwrap();

    let tunings = [
        (
            "legacy (first products, unfused)",
            CudaTuning::legacy(),
            None,
        ),
        (
            "qmm, unfused",
            CudaTuning::default().without_fusions(),
            None,
        ),
        ("qmm, fused", CudaTuning::default(), None),
        (
            "qmm, fused, 16 rows per block",
            CudaTuning::default(),
            Some(16),
        ),
        (
            "qmm, fused, 32 rows per block",
            CudaTuning::default(),
            Some(32),
        ),
    ];
    let reps = 5;
    let tokens = 10;
    let wall = |f: &dyn Fn()| {
        let t = Instant::now();
        f();
        be.synchronize().unwrap();
        t.elapsed().as_secs_f64() * 1e6
    };
    let busy_us = {
        let mut v: Vec<f64> = (0..3)
            .map(|_| wall(&|| be.graph_compute(ts, &busy).unwrap()))
            .collect();
        v.sort_by(f64::total_cmp);
        v[1]
    };
    println!(
        "GPU: {}; the busy product: {busy_us:.0} µs",
        be.device_name()
    );
    for (name, tuning, rows) in tunings {
        ggml_cuda::launch::set_qmm_rows(rows);
        be.set_tuning(CudaTuning {
            graphs: false,
            ..tuning
        });
        be.graph_compute(ts, &nodes).unwrap();
        be.synchronize().unwrap();
        // GPU time per token: `tokens` tokens queued behind the busy product, less it.
        let mut per_token = Vec::new();
        let mut enqueue = 0f64;
        for _ in 0..reps {
            let t = Instant::now();
            be.graph_compute(ts, &busy).unwrap();
            for _ in 0..tokens {
                be.graph_compute(ts, &nodes).unwrap();
            }
            enqueue = enqueue.max(t.elapsed().as_secs_f64() * 1e6);
            be.synchronize().unwrap();
            let total = t.elapsed().as_secs_f64() * 1e6;
            per_token.push((total - busy_us) / tokens as f64);
        }
        per_token.sort_by(f64::total_cmp);
        println!(
            "\n{name}: {:.1} µs per token (median of {reps}; host enqueue {enqueue:.0} µs for {tokens})",
            per_token[reps / 2]
        );
        // Per step, with a pair of timed events around each (their cost included).
        be.set_op_timing(true).unwrap();
        let mut sums: BTreeMap<String, (u64, f64)> = BTreeMap::new();
        for _ in 0..reps {
            be.graph_compute(ts, &busy).unwrap();
            be.graph_compute(ts, &nodes).unwrap();
            be.synchronize().unwrap();
            for t in be.take_op_times().unwrap() {
                let k = t.to_string();
                if k == "MUL_MAT f32" {
                    continue;
                }
                let s = sums.entry(k).or_default();
                s.0 += t.calls;
                s.1 += t.ms;
            }
        }
        be.set_op_timing(false).unwrap();
        let total: f64 = sums.values().map(|v| v.1).sum::<f64>() * 1e3 / reps as f64;
        let steps: u64 = sums.values().map(|v| v.0).sum::<u64>() / reps as u64;
        println!("  timed step by step: {total:.1} µs, {steps} steps");
        let mut rows: Vec<_> = sums.into_iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        for (k, (calls, ms)) in rows {
            let per = calls / reps as u64;
            println!(
                "  {k:32} {per:4} x {:7.2} µs = {:8.1} µs",
                ms * 1e3 / calls as f64,
                ms * 1e3 / reps as f64
            );
        }
    }
    ggml_cuda::launch::set_qmm_rows(None);
    be.free_buffer(buf.id).unwrap();
}

/// GPU time of SmolLM2-135M's products for a prompt batch of 512 tokens (the tiled
/// class; no fusion applies), first generation against qmm, with op timing (these
/// kernels are long enough that the host's launches do not matter).
#[test]
#[ignore = "a measurement for a GPU: run with --ignored"]
fn smollm2_prompt_products() {
    let be = gpu();
    let sim = common::driver() == DriverKind::Sim;
    let (e, kv, ff, n, layers) = if sim {
        (576, 192, 1536, 8, 1)
    } else {
        (576, 192, 1536, 512, 30)
    };
    let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 1024];
    let mut ctx = Context::new(&mut s);
    let mut r = Rng(2);
    let mut inputs: Vec<(TensorId, Vec<u8>)> = Vec::new();
    let mut nodes = Vec::new();
    let x = ctx.new_tensor(DType::F32, [e, n, 1, 1]).unwrap();
    inputs.push((x, f32_bytes(&r.vec(e * n))));
    let h = ctx.new_tensor(DType::F32, [ff, n, 1, 1]).unwrap();
    inputs.push((h, f32_bytes(&r.vec(ff * n))));
    for _ in 0..layers {
        for (k, m) in [(e, e), (e, kv), (e, kv), (e, e), (e, ff), (e, ff), (ff, e)] {
            let w = ctx.new_tensor(DType::Q4_1, [k, m, 1, 1]).unwrap();
            inputs.push((w, quant_rows(DType::Q4_1, k, m, &mut r)));
            nodes.push(ctx.mul_mat(w, if k == e { x } else { h }).unwrap());
        }
    }
    let mut total = 0usize;
    let mut offs = vec![0usize; ctx.len()];
    for (i, t) in ctx.tensors().iter().enumerate() {
        offs[i] = total;
        total += t.nbytes().div_ceil(256) * 256;
    }
    let buf = be.alloc_buffer(total).unwrap();
    for (i, off) in offs.iter().enumerate() {
        ctx.tensors_mut()[i].data = Some(DataRef {
            buffer: buf.id,
            addr: buf.base + *off as u64,
        });
    }
    let ts = ctx.tensors();
    for (id, bytes) in &inputs {
        be.set_tensor_async(&ts[id.index()], 0, bytes).unwrap();
    }
    be.synchronize().unwrap();
    println!(
        "GPU: {}; {n} tokens, {layers} layers of products",
        be.device_name()
    );
    for (name, tuning) in [
        ("legacy (quantize_q8_1 + mmq)", CudaTuning::legacy()),
        ("qmm", CudaTuning::default()),
    ] {
        be.set_tuning(CudaTuning {
            graphs: false,
            ..tuning
        });
        be.graph_compute(ts, &nodes).unwrap();
        be.synchronize().unwrap();
        be.set_op_timing(true).unwrap();
        let reps = 3;
        for _ in 0..reps {
            be.graph_compute(ts, &nodes).unwrap();
        }
        let times = be.take_op_times().unwrap();
        be.set_op_timing(false).unwrap();
        let ms: f64 = times.iter().map(|t| t.ms).sum::<f64>() / reps as f64;
        println!(
            "{name}: {:.3} ms per pass ({:.0} tokens/s of products)",
            ms,
            n as f64 / ms * 1e3
        );
    }
    be.free_buffer(buf.id).unwrap();
}
