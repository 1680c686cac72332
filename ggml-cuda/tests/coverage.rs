//! Shapes and dtypes chosen to hit the kernels' tails and edge paths, each compared with
//! the CPU backend at test-backend-ops' NMSE limits (5e-4 for mul_mat and flash
//! attention, 1e-7 for the rest), the quantised products with the host's order bit for
//! bit, and the kernels without `.approx` instructions also bit for bit with their host
//! mirrors (`ggml_cuda::reference`). Runs on cuda-sim, or on the GPU under
//! `GGML_RS_REQUIRE_GPU`.

mod common;

use common::{assert_bits, f32_bytes, gpu, run, to_f32, Lcg};
use ggml_core::{AttnParams, Backend, Context, DType, RopeMode, RopeParams, Tensor, TensorId};
use ggml_cpu::{CpuBackend, CpuBackendOptions};
use ggml_cuda::reference::{self, nmse, BinaryOp, RopeConsts};
use ggml_test_kit::quantize_rows;
use rstest::rstest;

/// A graph and its inputs, built the same way for each backend.
struct Case {
    inputs: Vec<(TensorId, Vec<u8>)>,
    out: TensorId,
}

/// Runs `build` on the CPU backend and on the GPU; returns both outputs, CPU first.
fn cpu_and_gpu(build: impl Fn(&mut Context<'_>) -> Case) -> [Vec<f32>; 2] {
    let cpu = CpuBackend::new(CpuBackendOptions::with_threads(2)).unwrap();
    let cuda = gpu();
    let mut outs = Vec::new();
    for be in [&cpu as &dyn Backend, &cuda] {
        let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 32];
        let mut ctx = Context::new(&mut s);
        let c = build(&mut ctx);
        let dtype = ctx.tensors()[c.out.index()].dtype;
        outs.push(to_f32(dtype, &run(be, &mut ctx, &c.inputs, c.out)));
    }
    let gpu = outs.pop().expect("two outputs");
    [outs.pop().expect("two outputs"), gpu]
}

/// Runs `build` on the CPU backend and on the GPU; returns the NMSE of the GPU's output
/// against the CPU's.
fn gpu_vs_cpu(build: impl Fn(&mut Context<'_>) -> Case) -> f64 {
    let [cpu, gpu] = cpu_and_gpu(build);
    assert!(cpu.iter().all(|x| x.is_finite()), "CPU result not finite");
    nmse(&gpu, &cpu)
}

#[rstest]
// Float weights: K = 1000 is not a multiple of the lane loop; M and N odd; N on both
// sides of the matrix-vector / tiled switch (8).
#[case::f32_k1000_n1(DType::F32, 1000, 7, 1)]
#[case::f32_k1000_n9(DType::F32, 1000, 7, 9)]
#[case::f16_k1000_n8(DType::F16, 1000, 13, 8)]
#[case::f16_k1000_n512(DType::F16, 1000, 5, 512)]
#[case::bf16_k1000_n9(DType::BF16, 1000, 7, 9)]
#[case::bf16_k1000_n1(DType::BF16, 1000, 5, 1)]
// Quantised weights against the CPU's own dot types (the GPU quantises activations to
// Q8_1): the tolerance covers that difference, `mul_mat_quantised` the exact order.
#[case::q4_0_k608_n9(DType::Q4_0, 608, 9, 9)]
#[case::q8_0_k608_n1(DType::Q8_0, 608, 7, 1)]
#[case::q4_k_k512_n9(DType::Q4K, 512, 7, 9)]
#[case::q6_k_k512_n8(DType::Q6K, 512, 5, 8)]
fn mul_mat(#[case] dtype: DType, #[case] k: usize, #[case] m: usize, #[case] n: usize) {
    let e = gpu_vs_cpu(|ctx| {
        let mut r = Lcg(k as u64 * 31 + m as u64 * 7 + n as u64);
        let w = ctx.new_tensor(dtype, [k, m, 1, 1]).unwrap();
        let x = ctx.new_tensor(DType::F32, [k, n, 1, 1]).unwrap();
        let out = ctx.mul_mat(w, x).unwrap();
        Case {
            inputs: vec![
                (w, quantize_rows(dtype, &r.vec(k * m), k)),
                (x, f32_bytes(&r.vec(k * n))),
            ],
            out,
        }
    });
    assert!(e < 5e-4, "{dtype} K {k} M {m} N {n}: NMSE {e:e}");
}

#[rstest]
// Quantised weights (quantised by ggml's own routines): K = 576 + 32 (one chunk past a
// K-tile boundary of none, 19 chunks), 512 and 768 (two and three super-blocks), N on
// both sides of the matrix-vector / tiled switch, and 512 columns (64 column tiles).
#[case::q4_0_n1(DType::Q4_0, 608, 7, 1)]
#[case::q4_0_n7(DType::Q4_0, 608, 7, 7)]
#[case::q4_0_n8(DType::Q4_0, 608, 7, 8)]
#[case::q4_0_n9(DType::Q4_0, 608, 9, 9)]
#[case::q4_0_n512(DType::Q4_0, 608, 3, 512)]
#[case::q4_1_n9(DType::Q4_1, 608, 13, 9)]
#[case::q5_0_n8(DType::Q5_0, 608, 5, 8)]
#[case::q5_1_n1(DType::Q5_1, 608, 5, 1)]
#[case::q8_0_n9(DType::Q8_0, 608, 7, 9)]
#[case::q4_k_n9(DType::Q4K, 512, 7, 9)]
#[case::q4_k_n1(DType::Q4K, 768, 3, 1)]
#[case::q6_k_n8(DType::Q6K, 512, 5, 8)]
#[case::q2_k_n1(DType::Q2K, 512, 7, 1)]
#[case::q2_k_n9(DType::Q2K, 768, 5, 9)]
#[case::q3_k_n8(DType::Q3K, 512, 7, 8)]
#[case::q3_k_n1(DType::Q3K, 768, 3, 1)]
#[case::q5_k_n9(DType::Q5K, 512, 7, 9)]
#[case::q5_k_n1(DType::Q5K, 768, 5, 1)]
fn mul_mat_quantised(#[case] dtype: DType, #[case] k: usize, #[case] m: usize, #[case] n: usize) {
    let mut r = Lcg(k as u64 * 31 + m as u64 * 7 + n as u64);
    let w = quantize_rows(dtype, &r.vec(k * m), k);
    let x = r.vec(k * n);
    let be = gpu();
    let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 8];
    let mut ctx = Context::new(&mut s);
    let tw = ctx.new_tensor(dtype, [k, m, 1, 1]).unwrap();
    let tx = ctx.new_tensor(DType::F32, [k, n, 1, 1]).unwrap();
    let out = ctx.mul_mat(tw, tx).unwrap();
    let got = to_f32(
        DType::F32,
        &run(&be, &mut ctx, &[(tw, w.clone()), (tx, f32_bytes(&x))], out),
    );
    let rs = dtype.row_size(k).unwrap();
    let mut q = vec![0u8; k / 32 * reference::Q8_1_BLOCK];
    for col in 0..n {
        reference::quantize_q8_1(&x[col * k..(col + 1) * k], &mut q);
        for row in 0..m {
            let want =
                reference::mul_mat_q_dot_class(n, dtype, &w[row * rs..(row + 1) * rs], &q, k / 32);
            assert_eq!(
                got[col * m + row].to_bits(),
                want.unwrap().to_bits(),
                "{dtype} K {k} M {m} N {n}: row {row} column {col}"
            );
        }
    }
}

/// Float weights (`mul_mat_f`) with K = 1000 (a tail after the lane loop), odd M, N on
/// both sides of the class switch, bit for bit against `reference::mul_mat_f_dot` (lane
/// partials with fma in index order, then the butterfly).
#[rstest]
#[case::f32_n1(DType::F32, 7, 1)]
#[case::f32_n9(DType::F32, 7, 9)]
#[case::f16_n8(DType::F16, 13, 8)]
#[case::bf16_n9(DType::BF16, 7, 9)]
#[case::bf16_n1(DType::BF16, 5, 1)]
fn mul_mat_float_bit_for_bit(#[case] dtype: DType, #[case] m: usize, #[case] n: usize) {
    let k = 1000;
    let mut r = Lcg(k as u64 + m as u64 * 7 + n as u64);
    let w = quantize_rows(dtype, &r.vec(k * m), k);
    let x = r.vec(k * n);
    let mut s = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 8];
    let mut ctx = Context::new(&mut s);
    let tw = ctx.new_tensor(dtype, [k, m, 1, 1]).unwrap();
    let tx = ctx.new_tensor(DType::F32, [k, n, 1, 1]).unwrap();
    let out = ctx.mul_mat(tw, tx).unwrap();
    let got = to_f32(
        DType::F32,
        &run(
            &gpu(),
            &mut ctx,
            &[(tw, w.clone()), (tx, f32_bytes(&x))],
            out,
        ),
    );
    let wv = to_f32(dtype, &w);
    let mut want = vec![0f32; m * n];
    for col in 0..n {
        for row in 0..m {
            let (a, b) = (&wv[row * k..][..k], &x[col * k..][..k]);
            want[col * m + row] = reference::mul_mat_f_dot(dtype, a, b);
        }
    }
    assert_bits(&got, &want, &format!("{dtype} M {m} N {n}"));
}

/// `rms_norm_row` of each row of `x` (rows of `n`).
fn rms_norm_rows(x: &[f32], n: usize, eps: f32) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for (row, o) in x.chunks(n).zip(out.chunks_mut(n)) {
        reference::rms_norm_row(row, eps, o);
    }
    out
}

/// Rows whose length leaves a tail after the warp's 32-wide loop.
#[rstest]
fn rms_norm_with_a_tail(#[values(100, 1000, 4097)] n: usize) {
    let xv = Lcg(n as u64).vec(n * 3);
    let [cpu, gpu] = cpu_and_gpu(|ctx| {
        let x = ctx.new_tensor(DType::F32, [n, 3, 1, 1]).unwrap();
        let out = ctx.rms_norm(x, 1e-6).unwrap();
        Case {
            inputs: vec![(x, f32_bytes(&xv))],
            out,
        }
    });
    let e = nmse(&gpu, &cpu);
    assert!(e < 1e-7, "n {n}: NMSE {e:e}");
    assert_bits(&gpu, &rms_norm_rows(&xv, n, 1e-6), &format!("n {n}"));
}

/// add and mul on f16/bf16 tensors, `b` broadcast along rows or along the third axis.
#[rstest]
fn add_mul_half_precision_with_broadcasting(
    #[values(DType::F16, DType::BF16)] a_dtype: DType,
    #[values(DType::F16, DType::BF16, DType::F32)] b_dtype: DType,
    #[values(true, false)] mul: bool,
    #[values([100, 1, 2, 1], [100, 6, 1, 1])] b_shape: [usize; 4],
) {
    let mut r = Lcg(3);
    let nb: usize = b_shape.iter().product();
    let (ab, bb) = (
        quantize_rows(a_dtype, &r.vec(1200), 100),
        quantize_rows(b_dtype, &r.vec(nb), 100),
    );
    let [cpu, gpu] = cpu_and_gpu(|ctx| {
        let a = ctx.new_tensor(a_dtype, [100, 6, 2, 1]).unwrap();
        let b = ctx.new_tensor(b_dtype, b_shape).unwrap();
        let out = if mul {
            ctx.mul(a, b).unwrap()
        } else {
            ctx.add(a, b).unwrap()
        };
        Case {
            inputs: vec![(a, ab.clone()), (b, bb.clone())],
            out,
        }
    });
    let what = format!("{a_dtype} x {b_dtype} {b_shape:?}");
    let e = nmse(&gpu, &cpu);
    assert!(e < 1e-7, "{what}: NMSE {e:e}");
    // One f32 operation on the stored values, rounded to a's type.
    let (av, bv) = (to_f32(a_dtype, &ab), to_f32(b_dtype, &bb));
    let op = if mul { BinaryOp::Mul } else { BinaryOp::Add };
    let want: Vec<f32> = (0..1200)
        .map(|i| {
            let (i0, i1, i2) = (i % 100, i / 100 % 6, i / 600);
            let j = i0 % b_shape[0] + 100 * (i1 % b_shape[1] + b_shape[1] * (i2 % b_shape[2]));
            round_to(a_dtype, reference::binary(op, av[i], bv[j]))
        })
        .collect();
    assert_bits(&gpu, &want, &what);
}

/// `x` stored as `dtype` (f32, f16 or bf16, rounding to nearest even) and read back.
fn round_to(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F16 => reference::f16_to_f32(reference::f32_to_f16(x)),
        DType::BF16 => reference::bf16_to_f32(reference::f32_to_bf16(x)),
        _ => x,
    }
}

/// The rope mirror over rows of `ne0` (`rows_per_pos` rows per position), rounded to
/// `dtype`.
fn rope_rows(
    x: &[f32],
    ne0: usize,
    rows_per_pos: usize,
    pos: &[i32],
    p: &RopeParams,
    dtype: DType,
) -> Vec<f32> {
    let c = RopeConsts::new(p);
    let mut out = vec![0f32; x.len()];
    for (r, (row, o)) in x.chunks(ne0).zip(out.chunks_mut(ne0)).enumerate() {
        reference::rope_row(row, pos[r / rows_per_pos], &c, o);
    }
    out.iter().map(|&v| round_to(dtype, v)).collect()
}

/// rope on f32 and f16 rows, both pair layouts, partial rotation, and YaRN.
#[rstest]
fn rope_f16_and_yarn(
    #[values(DType::F32, DType::F16)] dtype: DType,
    #[values(RopeMode::Normal, RopeMode::Neox)] mode: RopeMode,
    #[values(false, true)] yarn: bool,
) {
    let mut p = RopeParams::llama(48, 10000.0);
    p.mode = mode;
    if yarn {
        p.freq_scale = 0.25;
        p.ext_factor = 1.0;
        p.attn_factor = 1.1;
        p.n_ctx_orig = 4096;
    }
    let pos = [0i32, 1, 5, 100, 1000, 7000, 16000];
    let xb = quantize_rows(dtype, &Lcg(4).vec(64 * 4 * 7), 64);
    let [cpu, gpu] = cpu_and_gpu(|ctx| {
        let x = ctx.new_tensor(dtype, [64, 4, 7, 1]).unwrap();
        let tp = ctx.new_tensor(DType::I32, [7, 1, 1, 1]).unwrap();
        let out = ctx.rope(x, tp, p).unwrap();
        let positions: Vec<u8> = pos.iter().flat_map(|p| p.to_le_bytes()).collect();
        Case {
            inputs: vec![(x, xb.clone()), (tp, positions)],
            out,
        }
    });
    let what = format!("{dtype} {mode:?} yarn {yarn}");
    let e = nmse(&gpu, &cpu);
    assert!(e < 1e-7, "{what}: NMSE {e:e}");
    let want = rope_rows(&to_f32(dtype, &xb), 64, 4, &pos, &p, dtype);
    assert_bits(&gpu, &want, &what);
}

/// soft_max with an f16 or f32 mask (with -inf entries) and ALiBi slopes per head.
#[rstest]
fn soft_max_alibi_and_masks(
    #[values(None, Some(DType::F32), Some(DType::F16))] mask: Option<DType>,
    #[values(0.0, 8.0)] max_bias: f32,
    #[values(100, 1000)] n: usize,
) {
    let e = gpu_vs_cpu(|ctx| {
        let mut r = Lcg(5);
        let x = ctx.new_tensor(DType::F32, [n, 6, 4, 1]).unwrap();
        let mut inputs = vec![(x, f32_bytes(&r.vec(n * 24)))];
        let m = mask.map(|dt| {
            let m = ctx.new_tensor(dt, [n, 6, 1, 1]).unwrap();
            let v: Vec<f32> = (0..n * 6)
                .map(|i| {
                    if i % n > n / 2 + i / n {
                        f32::NEG_INFINITY
                    } else {
                        0.5 * r.f()
                    }
                })
                .collect();
            inputs.push((m, quantize_rows(dt, &v, n)));
            m
        });
        let out = ctx.soft_max(x, m, 0.7, max_bias).unwrap();
        Case { inputs, out }
    });
    assert!(
        e < 1e-7,
        "mask {mask:?} max_bias {max_bias} n {n}: NMSE {e:e}"
    );
}

/// flash attention: head sizes 64, 128 and 256, GQA ratios 1, 4 and 8, KV lengths that
/// are not a multiple of the 32-wide tile, with and without mask and soft-cap.
#[rstest]
#[case::d64_gqa1_mask(64, 1, 2, 33, true, 0.0)]
#[case::d64_gqa4_nomask(64, 4, 2, 100, false, 0.0)]
#[case::d128_gqa8_mask(128, 8, 2, 100, true, 0.0)]
#[case::d128_gqa1_softcap(128, 1, 2, 77, true, 50.0)]
#[case::d256_gqa4_mask(256, 4, 2, 33, true, 0.0)]
#[case::d256_gqa8_softcap_nomask(256, 8, 2, 65, false, 30.0)]
// Gemma 3 (1B): 4 query heads on a single KV head.
#[case::d256_gqa4_one_kv_head_mask(256, 4, 1, 100, true, 0.0)]
fn flash_attn(
    #[case] d: usize,
    #[case] gqa: usize,
    #[case] hkv: usize,
    #[case] nkv: usize,
    #[case] with_mask: bool,
    #[case] softcap: f32,
) {
    let nq = 3;
    let h = hkv * gqa;
    let e = gpu_vs_cpu(|ctx| {
        let mut r = Lcg(d as u64 + nkv as u64);
        let q = ctx.new_tensor(DType::F32, [d, nq, h, 1]).unwrap();
        let k = ctx.new_tensor(DType::F16, [d, nkv, hkv, 1]).unwrap();
        let v = ctx.new_tensor(DType::F16, [d, nkv, hkv, 1]).unwrap();
        let mut inputs = vec![
            (q, f32_bytes(&r.vec(d * nq * h))),
            (k, quantize_rows(DType::F16, &r.vec(d * nkv * hkv), d)),
            (v, quantize_rows(DType::F16, &r.vec(d * nkv * hkv), d)),
        ];
        let mask = with_mask.then(|| {
            let m = ctx.new_tensor(DType::F16, [nkv, nq, 1, 1]).unwrap();
            let mv: Vec<f32> = (0..nkv * nq)
                .map(|i| {
                    if i % nkv > nkv - nq + i / nkv {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
                .collect();
            inputs.push((m, quantize_rows(DType::F16, &mv, nkv)));
            m
        });
        let p = AttnParams {
            softcap,
            ..AttnParams::scaled(1.0 / (d as f32).sqrt())
        };
        let out = ctx.flash_attn_ext(q, k, v, mask, p).unwrap();
        Case { inputs, out }
    });
    assert!(
        e < 5e-4,
        "d {d} gqa {gqa} hkv {hkv} nkv {nkv} mask {with_mask} softcap {softcap}: NMSE {e:e}"
    );
}

/// Gemma 3's attention as llama.cpp's graph lays it out: q a permuted view of
/// `[256, 4 heads, tokens]`, K and V the first 37 positions of F16 caches of 64, one KV
/// head (GQA 4), an F16 causal mask, scale 1/16.
#[rstest]
fn flash_attn_gemma3_layout(#[values(1, 5)] n_tok: usize) {
    let (d, h, cache, nkv) = (256, 4, 64, 37);
    let e = gpu_vs_cpu(|ctx| {
        let mut r = Lcg(11 + n_tok as u64);
        let q0 = ctx.new_tensor(DType::F32, [d, h, n_tok, 1]).unwrap();
        let q = ctx.permute(q0, [0, 2, 1, 3]).unwrap();
        let kc = ctx.new_tensor(DType::F16, [d, cache, 1, 1]).unwrap();
        let vc = ctx.new_tensor(DType::F16, [d, cache, 1, 1]).unwrap();
        let nb = [2, 2 * d, 2 * d * nkv, 2 * d * nkv];
        let k = ctx.view(kc, [d, nkv, 1, 1], nb, 0).unwrap();
        let v = ctx.view(vc, [d, nkv, 1, 1], nb, 0).unwrap();
        let m = ctx.new_tensor(DType::F16, [nkv, n_tok, 1, 1]).unwrap();
        let mv: Vec<f32> = (0..nkv * n_tok)
            .map(|i| match i % nkv <= nkv - n_tok + i / nkv {
                true => 0.0,
                false => f32::NEG_INFINITY,
            })
            .collect();
        let out = ctx
            .flash_attn_ext(q, k, v, Some(m), AttnParams::scaled(1.0 / 16.0))
            .unwrap();
        Case {
            inputs: vec![
                (q0, f32_bytes(&r.vec(d * h * n_tok))),
                (kc, quantize_rows(DType::F16, &r.vec(d * cache), d)),
                (vc, quantize_rows(DType::F16, &r.vec(d * cache), d)),
                (m, quantize_rows(DType::F16, &mv, nkv)),
            ],
            out,
        }
    });
    assert!(e < 5e-4, "tokens {n_tok}: NMSE {e:e}");
}

/// Gemma 3's q/k norm: rms_norm over rows of 256 of `[256, heads, tokens]`, then mul by a
/// `[256]` weight broadcast over heads and tokens.
#[rstest]
fn rms_norm_then_row_weight(#[values(1, 7)] n_tok: usize) {
    let mut r = Lcg(12 + n_tok as u64);
    let (xv, wv) = (r.vec(256 * 4 * n_tok), r.vec(256));
    let [cpu, gpu] = cpu_and_gpu(|ctx| {
        let x = ctx.new_tensor(DType::F32, [256, 4, n_tok, 1]).unwrap();
        let w = ctx.new_tensor(DType::F32, [256, 1, 1, 1]).unwrap();
        let nx = ctx.rms_norm(x, 1e-6).unwrap();
        let out = ctx.mul(nx, w).unwrap();
        Case {
            inputs: vec![(x, f32_bytes(&xv)), (w, f32_bytes(&wv))],
            out,
        }
    });
    let e = nmse(&gpu, &cpu);
    assert!(e < 1e-7, "tokens {n_tok}: NMSE {e:e}");
    let want: Vec<f32> = rms_norm_rows(&xv, 256, 1e-6)
        .iter()
        .enumerate()
        .map(|(i, &v)| reference::binary(BinaryOp::Mul, v, wv[i % 256]))
        .collect();
    assert_bits(&gpu, &want, &format!("tokens {n_tok}"));
}

/// NeoX rope over whole heads of 256 (Gemma 3: base 1e4 for local layers, 1e6 for global
/// ones), positions up to 32767.
#[rstest]
fn rope_neox_head_256(
    #[values(10000.0, 1e6)] base: f32,
    #[values(DType::F32, DType::F16)] dtype: DType,
) {
    let mut p = RopeParams::llama(256, base);
    p.mode = RopeMode::Neox;
    let pos = [0i32, 1, 7, 100, 4095, 32767];
    let xb = quantize_rows(dtype, &Lcg(13).vec(256 * 4 * 6), 256);
    let [cpu, gpu] = cpu_and_gpu(|ctx| {
        let x = ctx.new_tensor(dtype, [256, 4, 6, 1]).unwrap();
        let tp = ctx.new_tensor(DType::I32, [6, 1, 1, 1]).unwrap();
        let out = ctx.rope(x, tp, p).unwrap();
        let positions: Vec<u8> = pos.iter().flat_map(|p| p.to_le_bytes()).collect();
        Case {
            inputs: vec![(x, xb.clone()), (tp, positions)],
            out,
        }
    });
    let e = nmse(&gpu, &cpu);
    assert!(e < 1e-7, "{dtype} base {base}: NMSE {e:e}");
    let want = rope_rows(&to_f32(dtype, &xb), 256, 4, &pos, &p, dtype);
    assert_bits(&gpu, &want, &format!("{dtype} base {base}"));
}

/// Inputs of the gelu / geglu cases.
#[derive(Clone, Copy, Debug)]
enum GeluInput {
    /// Every f16 value but NaN, the ±10 bounds with their f32 neighbours, values that
    /// round to f16 ±10, infinities and a NaN: `[256, 249]`, contiguous.
    AllF16,
    /// An odd row length, three dimensions, gates across (−12, 12).
    Odd,
    /// Gate a permuted view and up a transposed view (`[17, 6, 3]` of `[6, 17, 3]`
    /// storage), gates across (−12, 12).
    Strided,
}

/// Gates for [`GeluInput::AllF16`]: all f16 values but NaN, then the edges, padded with
/// small values to `256 · 249`.
fn all_f16_gates() -> Vec<f32> {
    let mut v: Vec<f32> = (0..=u16::MAX)
        .map(ggml_cuda::reference::f16_to_f32)
        .filter(|x| !x.is_nan())
        .collect();
    for b in [10f32, -10.0] {
        v.extend([
            b,
            f32::from_bits(b.to_bits() - 1),
            f32::from_bits(b.to_bits() + 1),
        ]);
    }
    v.extend([
        9.999,
        -9.999,
        9.998,
        -9.998,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ]);
    v.extend([f32::NAN, 1e30, -1e30]);
    let n = 256 * 249;
    let mut i = 0u32;
    while v.len() < n {
        v.push((i % 4001) as f32 / 1000.0 - 2.0);
        i += 1;
    }
    v
}

/// The f16 value `v` (exactly representable) as an integer in f16 order: neighbouring
/// f16 values differ by 1, and ±0 are both 0.
fn f16_order(v: f32) -> i32 {
    let b = ggml_cuda::reference::f32_to_f16(v) as i32;
    if b & 0x8000 != 0 {
        -(b & 0x7fff)
    } else {
        b
    }
}

/// The spacing of f16 values at `|v|` (the larger one at a power of two).
fn f16_ulp(v: f32) -> f32 {
    let a = v.abs();
    if a < 2f32.powi(-14) {
        2f32.powi(-24)
    } else {
        2f32.powi(a.log2().floor() as i32 - 10)
    }
}

/// gelu and geglu (gate, up) on the GPU against the CPU backend (ggml's table, which
/// the GPU computes instead of looking up). An element may differ only inside the
/// table's range (−10 < gate < 10), by at most one f16 place of gelu(gate) (times |up|
/// for geglu, plus the f32 rounding of that product), and only rarely: where tanh(z)
/// on the two sides lands on different sides of an f16 rounding boundary. Outside the
/// range (0, gate, gate · up) and for NaN the results are the same. A wrong constant,
/// a tanh.approx, a missing f16 rounding of the input or of the result, or a wrong
/// bound each move thousands of elements by more.
#[rstest]
fn gelu_geglu_within_an_f16_place_of_the_cpu(
    #[values(GeluInput::AllF16, GeluInput::Odd, GeluInput::Strided)] input: GeluInput,
    #[values(false, true)] gated: bool,
) {
    let (storage_ne, ne) = match input {
        GeluInput::AllF16 => ([256, 249, 1, 1], [256, 249, 1, 1]),
        GeluInput::Odd => ([577, 3, 2, 1], [577, 3, 2, 1]),
        GeluInput::Strided => ([6, 17, 3, 1], [17, 6, 3, 1]),
    };
    let n: usize = ne.iter().product();
    let mut r = Lcg(7 + n as u64);
    let gate_storage = match input {
        GeluInput::AllF16 => all_f16_gates(),
        _ => r.vec(n).iter().map(|v| v * 12.0).collect(),
    };
    let mut up_storage: Vec<f32> = r.vec(n).iter().map(|v| v * 2.0).collect();
    if let GeluInput::AllF16 = input {
        // up = NaN or ∞ where the gate is <= -10: ggml gives 0 there all the same.
        for (u, &g) in up_storage.iter_mut().zip(&gate_storage) {
            if g <= -10.0 {
                *u = if g.to_bits() % 2 == 0 {
                    f32::NAN
                } else {
                    f32::INFINITY
                };
            }
        }
    }
    // Storage index of output element i (the views' element order).
    let at = |i: usize| match input {
        GeluInput::Strided => {
            let (i0, i1, i2) = (i % 17, i / 17 % 6, i / 102);
            i1 + 6 * i0 + 102 * i2
        }
        _ => i,
    };
    let [cpu, gpu] = cpu_and_gpu(|ctx| {
        let g0 = ctx.new_tensor(DType::F32, storage_ne).unwrap();
        let u0 = ctx.new_tensor(DType::F32, storage_ne).unwrap();
        let (g, u) = match input {
            GeluInput::Strided => (
                ctx.permute(g0, [1, 0, 2, 3]).unwrap(),
                ctx.transpose(u0).unwrap(),
            ),
            _ => (g0, u0),
        };
        assert_eq!(ctx.tensors()[g.index()].ne, ne);
        let out = if gated {
            ctx.geglu(g, u).unwrap()
        } else {
            ctx.gelu(g).unwrap()
        };
        Case {
            inputs: vec![(g0, f32_bytes(&gate_storage)), (u0, f32_bytes(&up_storage))],
            out,
        }
    });
    let (mut differ, mut in_table) = (0usize, 0usize);
    for i in 0..n {
        let (x, y) = (gate_storage[at(i)], up_storage[at(i)]);
        let (want, got) = (cpu[i], gpu[i]);
        let what = || {
            format!("{input:?} gated {gated} #{i}: gate {x:e} up {y:e}: CPU {want:e}, GPU {got:e}")
        };
        if x.is_nan() {
            assert!(want.is_nan() && got.is_nan(), "{}", what());
            continue;
        }
        let table = x > -10.0 && x < 10.0;
        in_table += table as usize;
        if got == want || (want.is_nan() && got.is_nan()) {
            continue;
        }
        differ += 1;
        assert!(table, "outside the table's range: {}", what());
        if gated {
            let g = ggml_cpu::reference::gelu(x);
            let tol = f16_ulp(g) * y.abs() + (want.abs() + got.abs()) * 2f32.powi(-24);
            assert!((got - want).abs() <= tol, "{} (tolerance {tol:e})", what());
        } else {
            let places = (f16_order(got) - f16_order(want)).abs();
            assert!(places <= 1, "{} ({places} f16 places)", what());
        }
    }
    eprintln!("{input:?} gated {gated}: {differ} of {in_table} table-range elements differ");
    assert!(
        differ * 1000 <= in_table.max(1000),
        "{input:?} gated {gated}: {differ} of {in_table} elements differ"
    );
}
