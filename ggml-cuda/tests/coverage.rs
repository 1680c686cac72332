//! Shapes and dtypes chosen to hit the kernels' tails and edge paths, each compared with
//! the CPU backend at test-backend-ops' NMSE limits (5e-4 for mul_mat and flash
//! attention, 1e-7 for the rest). Runs on cuda-sim, or on the GPU under
//! `GGML_RS_REQUIRE_GPU`.

mod common;

use common::{f32_bytes, gpu, run, to_f32, Rng};
use ggml_core::quant::quantize_row;
use ggml_core::{AttnParams, Backend, Context, DType, RopeMode, RopeParams, Tensor, TensorId};
use ggml_cpu::{CpuBackend, CpuBackendOptions};
use ggml_cuda::reference::nmse;
use rstest::rstest;

/// A graph and its inputs, built the same way for each backend.
struct Case {
    inputs: Vec<(TensorId, Vec<u8>)>,
    out: TensorId,
}

/// `values` stored as `dtype` (f32, f16, bf16 or a quantised type: rows of `row` values).
fn bytes_of(dtype: DType, values: &[f32], row: usize) -> Vec<u8> {
    let per_row = dtype.row_size(row).expect("row fits the dtype's blocks");
    let mut out = vec![0u8; per_row * values.len() / row];
    for (src, dst) in values.chunks(row).zip(out.chunks_mut(per_row)) {
        quantize_row(dtype, src, dst).expect("quantisable row");
    }
    out
}

/// Runs `build` on the CPU backend and on the GPU; returns the NMSE of the GPU's output
/// against the CPU's.
fn gpu_vs_cpu(build: impl Fn(&mut Context<'_>) -> Case) -> f64 {
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
    assert!(
        outs[0].iter().all(|x| x.is_finite()),
        "CPU result not finite"
    );
    nmse(&outs[1], &outs[0])
}

#[rstest]
// Float weights: K = 1000 is not a multiple of the lane loop; M and N odd; N on both
// sides of the matrix-vector / tiled switch (8).
#[case::f32_k1000_n1(DType::F32, 1000, 7, 1)]
#[case::f32_k1000_n9(DType::F32, 1000, 7, 9)]
#[case::f16_k1000_n8(DType::F16, 1000, 13, 8)]
#[case::f16_k1000_n512(DType::F16, 1000, 5, 512)]
// Quantised weights: K = 576 + 32 (one chunk past a multiple of the lane loop).
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
#[case::bf16_k1000_n9(DType::BF16, 1000, 7, 9)]
#[case::bf16_k1000_n1(DType::BF16, 1000, 5, 1)]
#[case::q2_k_n1(DType::Q2K, 512, 7, 1)]
#[case::q2_k_n9(DType::Q2K, 768, 5, 9)]
#[case::q3_k_n8(DType::Q3K, 512, 7, 8)]
#[case::q3_k_n1(DType::Q3K, 768, 3, 1)]
#[case::q5_k_n9(DType::Q5K, 512, 7, 9)]
#[case::q5_k_n1(DType::Q5K, 768, 5, 1)]
fn mul_mat(#[case] dtype: DType, #[case] k: usize, #[case] m: usize, #[case] n: usize) {
    let e = gpu_vs_cpu(|ctx| {
        let mut r = Rng(k as u64 * 31 + m as u64 * 7 + n as u64);
        let w = ctx.new_tensor(dtype, [k, m, 1, 1]).unwrap();
        let x = ctx.new_tensor(DType::F32, [k, n, 1, 1]).unwrap();
        let out = ctx.mul_mat(w, x).unwrap();
        Case {
            inputs: vec![
                (w, bytes_of(dtype, &r.vec(k * m), k)),
                (x, f32_bytes(&r.vec(k * n))),
            ],
            out,
        }
    });
    assert!(e < 5e-4, "{dtype} K {k} M {m} N {n}: NMSE {e:e}");
}

/// Rows whose length leaves a tail after the warp's 32-wide loop.
#[rstest]
fn rms_norm_with_a_tail(#[values(100, 1000, 4097)] n: usize) {
    let e = gpu_vs_cpu(|ctx| {
        let mut r = Rng(n as u64);
        let x = ctx.new_tensor(DType::F32, [n, 3, 1, 1]).unwrap();
        let out = ctx.rms_norm(x, 1e-6).unwrap();
        Case {
            inputs: vec![(x, f32_bytes(&r.vec(n * 3)))],
            out,
        }
    });
    assert!(e < 1e-7, "n {n}: NMSE {e:e}");
}

/// add and mul on f16/bf16 tensors, `b` broadcast along rows or along the third axis.
#[rstest]
fn add_mul_half_precision_with_broadcasting(
    #[values(DType::F16, DType::BF16)] a_dtype: DType,
    #[values(DType::F16, DType::BF16, DType::F32)] b_dtype: DType,
    #[values(true, false)] mul: bool,
    #[values([100, 1, 2, 1], [100, 6, 1, 1])] b_shape: [usize; 4],
) {
    let e = gpu_vs_cpu(|ctx| {
        let mut r = Rng(3);
        let a = ctx.new_tensor(a_dtype, [100, 6, 2, 1]).unwrap();
        let b = ctx.new_tensor(b_dtype, b_shape).unwrap();
        let out = if mul {
            ctx.mul(a, b).unwrap()
        } else {
            ctx.add(a, b).unwrap()
        };
        let nb: usize = b_shape.iter().product();
        Case {
            inputs: vec![
                (a, bytes_of(a_dtype, &r.vec(1200), 100)),
                (b, bytes_of(b_dtype, &r.vec(nb), 100)),
            ],
            out,
        }
    });
    assert!(e < 1e-7, "{a_dtype} x {b_dtype} {b_shape:?}: NMSE {e:e}");
}

/// rope on f32 and f16 rows, both pair layouts, partial rotation, and YaRN.
#[rstest]
fn rope_f16_and_yarn(
    #[values(DType::F32, DType::F16)] dtype: DType,
    #[values(RopeMode::Normal, RopeMode::Neox)] mode: RopeMode,
    #[values(false, true)] yarn: bool,
) {
    let e = gpu_vs_cpu(|ctx| {
        let mut r = Rng(4);
        let x = ctx.new_tensor(dtype, [64, 4, 7, 1]).unwrap();
        let pos = ctx.new_tensor(DType::I32, [7, 1, 1, 1]).unwrap();
        let mut p = RopeParams::llama(48, 10000.0);
        p.mode = mode;
        if yarn {
            p.freq_scale = 0.25;
            p.ext_factor = 1.0;
            p.attn_factor = 1.1;
            p.n_ctx_orig = 4096;
        }
        let out = ctx.rope(x, pos, p).unwrap();
        let positions: Vec<u8> = [0i32, 1, 5, 100, 1000, 7000, 16000]
            .iter()
            .flat_map(|p| p.to_le_bytes())
            .collect();
        Case {
            inputs: vec![
                (x, bytes_of(dtype, &r.vec(64 * 4 * 7), 64)),
                (pos, positions),
            ],
            out,
        }
    });
    assert!(e < 1e-7, "{dtype} {mode:?} yarn {yarn}: NMSE {e:e}");
}

/// soft_max with an f16 or f32 mask (with -inf entries) and ALiBi slopes per head.
#[rstest]
fn soft_max_alibi_and_masks(
    #[values(None, Some(DType::F32), Some(DType::F16))] mask: Option<DType>,
    #[values(0.0, 8.0)] max_bias: f32,
    #[values(100, 1000)] n: usize,
) {
    let e = gpu_vs_cpu(|ctx| {
        let mut r = Rng(5);
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
            inputs.push((m, bytes_of(dt, &v, n)));
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
#[case::d64_gqa1_mask(64, 1, 33, true, 0.0)]
#[case::d64_gqa4_nomask(64, 4, 100, false, 0.0)]
#[case::d128_gqa8_mask(128, 8, 100, true, 0.0)]
#[case::d128_gqa1_softcap(128, 1, 77, true, 50.0)]
#[case::d256_gqa4_mask(256, 4, 33, true, 0.0)]
#[case::d256_gqa8_softcap_nomask(256, 8, 65, false, 30.0)]
fn flash_attn(
    #[case] d: usize,
    #[case] gqa: usize,
    #[case] nkv: usize,
    #[case] with_mask: bool,
    #[case] softcap: f32,
) {
    let (nq, hkv) = (3, 2);
    let h = hkv * gqa;
    let e = gpu_vs_cpu(|ctx| {
        let mut r = Rng(d as u64 + nkv as u64);
        let q = ctx.new_tensor(DType::F32, [d, nq, h, 1]).unwrap();
        let k = ctx.new_tensor(DType::F16, [d, nkv, hkv, 1]).unwrap();
        let v = ctx.new_tensor(DType::F16, [d, nkv, hkv, 1]).unwrap();
        let mut inputs = vec![
            (q, f32_bytes(&r.vec(d * nq * h))),
            (k, bytes_of(DType::F16, &r.vec(d * nkv * hkv), d)),
            (v, bytes_of(DType::F16, &r.vec(d * nkv * hkv), d)),
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
            inputs.push((m, bytes_of(DType::F16, &mv, nkv)));
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
        "d {d} gqa {gqa} nkv {nkv} mask {with_mask} softcap {softcap}: NMSE {e:e}"
    );
}
