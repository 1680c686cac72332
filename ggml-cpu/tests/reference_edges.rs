//! Corners of the scalar reference (`ggml_cpu::reference`) that the op tables do not
//! reach: RoPE with YaRN (`ext_factor != 0`), checked against ggml's formulas evaluated
//! here in f64, and a conversion into an I32 destination, where each element must land
//! at its own flat index.

use std::f64::consts::PI;

use ggml_core::tensor::Tensor;
use ggml_core::{DType, Op, RopeMode, RopeParams};
use ggml_cpu::reference::{compute, rope_cache, HostTensor};
use rstest::rstest;

/// ggml's `ggml_rope_yarn_corr_dims` (ggml.c) and `ggml_rope_cache_init` / `rope_yarn` /
/// `rope_yarn_ramp` (ggml-cpu/ops.cpp), in f64: the `(cos, sin)` pairs for `pos`.
fn yarn_cache_f64(pos: f64, p: &RopeParams) -> Vec<f64> {
    let n_dims = p.n_dims as f64;
    let base = p.freq_base as f64;
    let corr_dim =
        |n_rot: f64| n_dims * (p.n_ctx_orig as f64 / (n_rot * 2.0 * PI)).ln() / (2.0 * base.ln());
    let low = corr_dim(p.beta_fast as f64).floor().max(0.0);
    let high = corr_dim(p.beta_slow as f64).ceil().min(n_dims - 1.0);
    let freq_scale = p.freq_scale as f64;
    let ext_factor = p.ext_factor as f64;
    let mscale = p.attn_factor as f64 * (1.0 + 0.1 * (1.0 / freq_scale).ln());
    let mut out = Vec::new();
    for i in 0..p.n_dims / 2 {
        let theta_extrap = pos * base.powf(-2.0 * i as f64 / n_dims);
        let theta_interp = freq_scale * theta_extrap;
        let y = (i as f64 - low) / (high - low).max(0.001);
        let ramp_mix = (1.0 - y.clamp(0.0, 1.0)) * ext_factor;
        let theta = theta_interp * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
        out.push(theta.cos() * mscale);
        out.push(theta.sin() * mscale);
    }
    out
}

/// YaRN configurations whose correction range `[low, high]` lies inside the rotated
/// pairs (so the ramp takes the values 1, between, and 0): 8 dims give `[1, 3]`
/// (corr dims 1.31 and 2.81), 64 dims `[10, 23]` (10.5 and 22.5). With base 10 and
/// beta_fast 200 the range's end is clamped: corr dims 2.05 and 11.26 give `[2, 7]`
/// (`n_dims - 1`), so pair 3's ramp is 1 - 1/5.
#[rstest]
#[case::small(5.0, 8, 0.25, 1.0, 1.0, 10_000.0, 32.0)]
#[case::half_mix(5.0, 8, 0.25, 0.5, 0.9, 10_000.0, 32.0)]
#[case::llama_like(37.0, 64, 0.125, 1.0, 1.0, 10_000.0, 32.0)]
#[case::end_clamped(5.0, 8, 0.25, 1.0, 1.0, 10.0, 200.0)]
fn rope_cache_with_yarn_follows_ggml(
    #[case] pos: f32,
    #[case] n_dims: u32,
    #[case] freq_scale: f32,
    #[case] ext_factor: f32,
    #[case] attn_factor: f32,
    #[case] freq_base: f32,
    #[case] beta_fast: f32,
) {
    let p = RopeParams {
        mode: RopeMode::Normal,
        n_dims,
        freq_base,
        freq_scale,
        ext_factor,
        attn_factor,
        beta_fast,
        beta_slow: 1.0,
        n_ctx_orig: 4096,
    };
    let mut cache = vec![0f32; n_dims as usize];
    rope_cache(pos, &p, &mut cache);
    let want = yarn_cache_f64(pos as f64, &p);
    for (i, (&got, &want)) in cache.iter().zip(&want).enumerate() {
        // f32 angles of at most ~40 radians, built by repeated products: under 1e-6.
        assert!(
            (got as f64 - want).abs() < 1e-5,
            "entry {i}: {got} vs {want} (ggml's formulas in f64)"
        );
    }
}

/// `rope_cache` fills the pairs of the rotated dimensions only: a cache longer than
/// `n_dims` (a head whose tail is not rotated) keeps its other entries.
#[test]
fn rope_cache_fills_only_the_rotated_pairs() {
    let p = RopeParams {
        mode: RopeMode::Neox,
        n_dims: 8,
        freq_base: 10_000.0,
        freq_scale: 1.0,
        ext_factor: 0.0,
        attn_factor: 1.0,
        beta_fast: 32.0,
        beta_slow: 1.0,
        n_ctx_orig: 4096,
    };
    let mut cache = vec![-7f32; 20];
    rope_cache(3.0, &p, &mut cache);
    assert!(cache[..8].iter().all(|&v| v != -7.0), "{cache:?}");
    assert!(cache[8..].iter().all(|&v| v == -7.0), "{cache:?}");
}

/// MUL_MAT of every weight kind the reference dots differently (f32, f16, Q8_0), with
/// the weights broadcast over both batch dims (each weight matrix serves two of b's in
/// dim 2 and two in dim 3): each output within rounding of the dot, computed here in f64,
/// of what the reference's operands hold (f16-rounded weights and activations; Q8_0
/// weights dequantised and activations quantised to Q8_0 and back).
#[rstest]
fn mul_mat_broadcasts_and_dots_each_weight_kind(
    #[values(DType::F32, DType::F16, DType::Q8_0)] dt: DType,
) {
    use ggml_core::quant::{dequantize_row, quantize_row};
    let (k, m, n) = (64, 3, 2);
    let (a_ne, b_ne) = ([k, m, 1, 2], [k, n, 2, 4]);
    let wv: Vec<f32> = (0..k * m * 2)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 23.0)
        .collect();
    let yv: Vec<f32> = (0..k * n * 8)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 19.0)
        .collect();
    let round = |t: DType, v: &[f32]| -> (Vec<u8>, Vec<f32>) {
        let mut bytes = vec![0u8; t.row_size(k).unwrap() * v.len() / k];
        let mut back = vec![0f32; v.len()];
        for (r, row) in v.chunks(k).enumerate() {
            let rs = t.row_size(k).unwrap();
            quantize_row(t, row, &mut bytes[r * rs..(r + 1) * rs]).unwrap();
            dequantize_row(
                t,
                &bytes[r * rs..(r + 1) * rs],
                &mut back[r * k..(r + 1) * k],
            )
            .unwrap();
        }
        (bytes, back)
    };
    let (wbytes, wseen) = match dt {
        DType::F32 => (
            wv.iter().flat_map(|v| v.to_le_bytes()).collect(),
            wv.clone(),
        ),
        _ => round(dt, &wv),
    };
    let yseen = match dt {
        DType::F32 => yv.clone(),
        DType::F16 => round(DType::F16, &yv).1,
        _ => round(DType::Q8_0, &yv).1,
    };
    let ybytes: Vec<u8> = yv.iter().flat_map(|v| v.to_le_bytes()).collect();
    let a = Tensor::contiguous(dt, a_ne).unwrap();
    let b = Tensor::contiguous(DType::F32, b_ne).unwrap();
    let mut node = Tensor::contiguous(DType::F32, [m, n, 2, 4]).unwrap();
    node.op = Op::MulMat;
    let mut out = vec![0u8; 4 * m * n * 8];
    compute(
        &node,
        &[
            HostTensor {
                desc: &a,
                bytes: &wbytes,
            },
            HostTensor {
                desc: &b,
                bytes: &ybytes,
            },
        ],
        &mut out,
    )
    .unwrap();
    for i3 in 0..4 {
        for i2 in 0..2 {
            for j in 0..n {
                for i in 0..m {
                    let wrow = ((i3 / 2) * m + i) * k;
                    let yrow = ((i3 * 2 + i2) * n + j) * k;
                    let (mut want, mut mag) = (0f64, 0f64);
                    for x in 0..k {
                        let p = wseen[wrow + x] as f64 * yseen[yrow + x] as f64;
                        want += p;
                        mag += p.abs();
                    }
                    let o = 4 * (((i3 * 2 + i2) * n + j) * m + i);
                    let got = f32::from_le_bytes(out[o..o + 4].try_into().unwrap()) as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * mag + 1e-6,
                        "{dt:?} out[{i}, {j}, {i2}, {i3}]: {got} vs {want}"
                    );
                }
            }
        }
    }
}

/// A CONT node of a 3 x 2 matrix of `src_dtype` (its little-endian `bytes`) into I32,
/// through the reference: the values, in flat order.
fn cont_into_i32(src_dtype: DType, bytes: &[u8]) -> Vec<i32> {
    let ne = [3, 2, 1, 1];
    let src = Tensor::contiguous(src_dtype, ne).unwrap();
    let mut node = Tensor::contiguous(DType::I32, ne).unwrap();
    node.op = Op::Cont;
    let mut out = vec![0u8; 4 * 6];
    compute(&node, &[HostTensor { desc: &src, bytes }], &mut out).unwrap();
    out.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// A CONT node from I32 into I32 copies every value exactly, also those an f32 cannot
/// hold (2^24 + 1, the extremes), each at its row-major flat index.
#[test]
fn i32_copy_keeps_every_value_exactly() {
    let values = [16_777_217i32, -16_777_219, i32::MAX, i32::MIN, 5, -1];
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(cont_into_i32(DType::I32, &bytes), values);
}

/// A CONT node from F32 into I32 (C's `(int32_t)` conversion, truncation toward zero, as
/// ggml's f32 to i32 copy) over two rows: every element at its row-major flat index.
#[test]
fn conversion_into_i32_writes_each_element_at_its_index() {
    let values = [1.5f32, -2.7, 3.0, 100.9, -0.2, 7.0];
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(cont_into_i32(DType::F32, &bytes), [1, -2, 3, 100, 0, 7]);
}
