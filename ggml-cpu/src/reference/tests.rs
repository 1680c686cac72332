//! The reference against plain f64 arithmetic, with tolerances.
use super::*;
use ggml_core::{DType, Op, Tensor};

fn rng(seed: u64) -> impl FnMut() -> f32 {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

#[test]
fn rms_norm_soft_max_silu_close_to_f64() {
    let mut r = rng(1);
    let x: Vec<f32> = (0..577).map(|_| r() * 3.0).collect();
    let mut out = vec![0f32; x.len()];
    rms_norm_row(&x, 1e-5, &mut out);
    let ms = x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / x.len() as f64;
    let sc = 1.0 / (ms + 1e-5).sqrt();
    for (o, &v) in out.iter().zip(&x) {
        assert!((*o as f64 - v as f64 * sc).abs() < 1e-5);
    }
    let mut s = x.clone();
    let mask: Vec<f32> = (0..x.len())
        .map(|i| if i % 7 == 0 { f32::NEG_INFINITY } else { 0.5 })
        .collect();
    soft_max_row(&mut s, 0.8, Some((&mask, 1.0)));
    let w: Vec<f64> = x
        .iter()
        .zip(&mask)
        .map(|(&v, &m)| v as f64 * 0.8 + m as f64)
        .collect();
    let mx = w.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = w.iter().map(|v| (v - mx).exp()).sum();
    for (i, (&o, v)) in s.iter().zip(&w).enumerate() {
        let want = (v - mx).exp() / z;
        assert!((o as f64 - want).abs() < 1e-6, "softmax {i}");
        if i % 7 == 0 {
            assert_eq!(o, 0.0);
        }
    }
    for &v in &x {
        let want = v as f64 / (1.0 + (-(v as f64)).exp());
        assert!((silu(v) as f64 - want).abs() < 1e-6);
    }
}

#[test]
fn gelu_close_to_f64_with_ggml_rules() {
    assert_eq!(
        GELU_SQRT_2_OVER_PI,
        (2.0 / core::f64::consts::PI).sqrt() as f32
    );
    assert_eq!(GELU_COEF_A, 0.044715f64 as f32);
    let g64 = |x: f64| 0.5 * x * (1.0 + (0.7978845608028654 * x * (1.0 + 0.044715 * x * x)).tanh());
    let mut r = rng(4);
    for i in 0..20000 {
        let x = if i < 10000 { r() * 10.0 } else { r() * 3.0 };
        let (got, want) = (gelu(x) as f64, g64(x as f64));
        // Rounding x to f16 (slope of gelu <= 1.13), the result to f16, and the f32
        // quantisation of 1 + tanh near -1.
        let tol = 2f64.powi(-11) * (1.2 * x.abs() as f64 + want.abs()) + 1e-6;
        assert!((got - want).abs() <= tol, "gelu({x}) = {got}, f64 {want}");
        let g = r() * 4.0;
        let gg = geglu(x, g);
        assert_eq!(gg.to_bits(), (gelu(x) * g).to_bits(), "geglu({x}, {g})");
    }
    // The +-10 rules, then infinities and NaN as they fall out.
    assert_eq!(gelu(-10.0).to_bits(), 0f32.to_bits());
    assert_eq!(gelu(-1e30).to_bits(), 0f32.to_bits());
    assert_eq!(gelu(f32::NEG_INFINITY).to_bits(), 0f32.to_bits());
    assert_eq!(gelu(10.0), 10.0);
    assert_eq!(gelu(1e30), 1e30);
    assert_eq!(gelu(f32::INFINITY), f32::INFINITY);
    assert!(gelu(f32::NAN).is_nan());
    // Just inside the bounds the table applies: 9.999 rounds to f16 10 (gelu 10).
    assert_eq!(gelu(9.999), 10.0);
    assert_eq!(gelu(-9.999), 0.0);
    assert_eq!(geglu(-10.0, f32::NAN).to_bits(), 0f32.to_bits());
    assert_eq!(geglu(f32::NEG_INFINITY, 3.0).to_bits(), 0f32.to_bits());
    assert_eq!(geglu(10.0, -2.5), -25.0);
    assert_eq!(geglu(f32::INFINITY, 2.0), f32::INFINITY);
    assert!(geglu(f32::NAN, 1.0).is_nan());
    assert!(geglu(1.0, f32::NAN).is_nan());
    // Entry 0xBFFF, the one that tells the fused 1 + 0.044715·x·x of llama.cpp's
    // builds (ggml: -0.04550171, 1491·2^-15) from a separately rounded one (1490·2^-15).
    assert_eq!(f16_to_f32(0xbfff), -1.999_023_4);
    assert_eq!(gelu(-1.999_023_4), -1491.0 * 2f32.powi(-15));
    // A few values of ggml's table (f16 in, f16 out).
    assert_eq!(gelu(0.0).to_bits(), 0f32.to_bits());
    assert_eq!(gelu(1.0), f16_to_f32(f32_to_f16(0.841_192)));
    assert_eq!(gelu(-1.0), f16_to_f32(f32_to_f16(-0.158_808)));
}

/// RoPE of one row of `ne0` values at position `pos` (base 1e4, `n_dims` rotated) against
/// f64 angles: each pair `pair(i)` rotated, the values past `n_dims` copied.
fn assert_rope_close(mode: RopeMode, pos: f32, n_dims: usize, ne0: usize, seed: u64) {
    let p = RopeParams::llama(n_dims as u32, 10000.0);
    let mut cache = vec![0f32; n_dims];
    rope_cache(pos, &p, &mut cache);
    let mut r = rng(seed);
    let x: Vec<f32> = (0..ne0).map(|_| r()).collect();
    let mut out = vec![0f32; ne0];
    rope_row(&x, &cache, mode, n_dims, &mut out);
    for i in 0..n_dims / 2 {
        let (a, b) = match mode {
            RopeMode::Normal => (2 * i, 2 * i + 1),
            RopeMode::Neox => (i, i + n_dims / 2),
        };
        let th = pos as f64 * 10000f64.powf(-2.0 * i as f64 / n_dims as f64);
        let (c, s) = (th.cos(), th.sin());
        let (x0, x1) = (x[a] as f64, x[b] as f64);
        assert!(
            (out[a] as f64 - (x0 * c - x1 * s)).abs() < 1e-4,
            "{mode:?} pair {i}"
        );
        assert!(
            (out[b] as f64 - (x0 * s + x1 * c)).abs() < 1e-4,
            "{mode:?} pair {i}"
        );
    }
    assert_eq!(&out[n_dims..], &x[n_dims..]);
}

#[test]
fn rope_close_to_f64() {
    assert_rope_close(RopeMode::Neox, 37.0, 64, 80, 2);
}

/// Gemma 3's rope: NeoX pairs over a whole head of 256, bases 1e4 and 1e6. The
/// angles come from ggml's running product `theta *= theta_scale` in f32, whose
/// relative error grows with the pair index (largest seen: 1.1e-4, base 1e4, position
/// 1000): 3e-4 absolute covers it, and a wrong pairing, base or direction is off by O(1).
#[test]
fn rope_neox_head_256_close_to_f64() {
    let mut r = rng(5);
    let x: Vec<f32> = (0..256).map(|_| r()).collect();
    let mut cache = vec![0f32; 256];
    let mut out = vec![0f32; 256];
    for base in [10000f32, 1e6] {
        let mut p = RopeParams::llama(256, base);
        p.mode = RopeMode::Neox;
        for pos in [1i32, 37, 1000] {
            rope_cache(pos as f32, &p, &mut cache);
            rope_row(&x, &cache, RopeMode::Neox, 256, &mut out);
            for i in 0..128 {
                let th = pos as f64 * (base as f64).powf(-2.0 * i as f64 / 256.0);
                let (c, s) = (th.cos(), th.sin());
                let (x0, x1) = (x[i] as f64, x[i + 128] as f64);
                let e0 = (out[i] as f64 - (x0 * c - x1 * s)).abs();
                let e1 = (out[i + 128] as f64 - (x0 * s + x1 * c)).abs();
                assert!(e0.max(e1) < 3e-4, "base {base} pos {pos} pair {i}");
            }
        }
    }
}

#[test]
fn sum_row_is_an_f64_running_sum() {
    // An f32 running sum gives 0 and 1e8 here.
    assert_eq!(sum_row(&[1e8, 1.0, -1e8]), 1.0);
    assert_eq!(sum_row(&[1.0, 2f32.powi(-30)]), 1.0);
    assert_eq!(sum_row(&[]), 0.0);
    assert!(sum_row(&[1.0, f32::NAN]).is_nan());
    assert_eq!(sum_row(&[f32::MAX, f32::MAX]), f32::INFINITY);
    let mut r = rng(7);
    let x: Vec<f32> = (0..1000).map(|_| r() * 1e3).collect();
    let mut s = 0f64;
    for &v in &x {
        s += v as f64;
    }
    assert_eq!(sum_row(&x), s as f32);
}

#[test]
fn clamp_as_ggml_but_nan_stays() {
    assert_eq!(clamp(2.0, -1.0, 1.0), 1.0);
    assert_eq!(clamp(-2.0, -1.0, 1.0), -1.0);
    assert_eq!(clamp(0.5, -1.0, 1.0), 0.5);
    assert_eq!(clamp(f32::NEG_INFINITY, 0.0, f32::INFINITY), 0.0);
    assert_eq!(clamp(f32::INFINITY, 0.0, f32::INFINITY), f32::INFINITY);
    let nan = f32::from_bits(0x7fc0_1234);
    assert_eq!(clamp(nan, 0.0, 1.0).to_bits(), nan.to_bits());
    // ggml's MIN/MAX macros pick the second operand on equal zeros.
    assert_eq!(clamp(-0.0, -1.0, 0.0).to_bits(), 0f32.to_bits());
    assert_eq!(clamp(-0.0, 0.0, 1.0).to_bits(), 0f32.to_bits());
    assert_eq!(clamp(0.0, -0.0, 1.0).to_bits(), (-0f32).to_bits());
}

#[test]
fn argsort_top_k_ties_in_index_order_nan_last() {
    let top = |x: &[f32], k: usize| {
        let mut o = vec![0i32; k];
        argsort_top_k_row(x, &mut o);
        o
    };
    assert_eq!(top(&[1.0, 3.0, 3.0, 2.0, 3.0], 4), [1, 2, 4, 3]);
    assert_eq!(top(&[f32::NAN, 1.0, -f32::NAN, -5.0], 4), [1, 3, 0, 2]);
    assert_eq!(top(&[-0.0, 0.0, -0.0, -1.0], 4), [0, 1, 2, 3]);
    assert_eq!(
        top(&[f32::NEG_INFINITY, f32::NAN, f32::INFINITY, 2.0], 4),
        [2, 3, 0, 1]
    );
    assert_eq!(top(&[7.0], 1), [0]);
    // Against the definition: i comes before j iff x_i is larger, or they tie and
    // i < j.
    let mut r = rng(8);
    let x: Vec<f32> = (0..200)
        .map(|i| match i % 11 {
            0 => f32::NAN,
            _ => (r() * 4.0).round(),
        })
        .collect();
    let o = top(&x, 200);
    for w in o.windows(2) {
        let (i, j) = (w[0] as usize, w[1] as usize);
        let before = match (x[i].is_nan(), x[j].is_nan()) {
            (false, true) => true,
            (true, false) => false,
            (true, true) => i < j,
            _ => x[i] > x[j] || (x[i] == x[j] && i < j),
        };
        assert!(before, "{i} ({}) before {j} ({})", x[i], x[j]);
    }
}

/// Each (slot, token) column of MUL_MAT_ID is the reference mul_mat of its expert's
/// matrix with that token's row of b, bit for bit.
#[test]
fn mul_mat_id_is_mul_mat_of_the_chosen_expert() {
    let (k, m, n_as, n_used, b1, n_tok) = (64usize, 5usize, 3usize, 2usize, 2usize, 4usize);
    let mut r = rng(9);
    for w in [DType::F16, DType::Q4_1, DType::Q8_0] {
        let ta = Tensor::contiguous(w, [k, m, n_as, 1]).unwrap();
        let vals: Vec<f32> = (0..k * m * n_as).map(|_| r()).collect();
        let mut a = vec![0u8; ta.nbytes()];
        if w == DType::F16 {
            for (o, &v) in a.chunks_exact_mut(2).zip(&vals) {
                o.copy_from_slice(&f32_to_f16(v).to_le_bytes());
            }
        } else {
            let rs = ta.row_size();
            for (o, row) in a.chunks_exact_mut(rs).zip(vals.chunks_exact(k)) {
                crate::quant::quantize_row(w, row, o);
            }
        }
        let tb = Tensor::contiguous(DType::F32, [k, b1, n_tok, 1]).unwrap();
        let b: Vec<u8> = (0..k * b1 * n_tok)
            .flat_map(|_| r().to_le_bytes())
            .collect();
        let ti = Tensor::contiguous(DType::I32, [n_used, n_tok, 1, 1]).unwrap();
        let ids = [2i32, 0, 1, 1, 0, 2, 2, 2];
        let ib: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut node = Tensor::contiguous(DType::F32, [m, n_used, n_tok, 1]).unwrap();
        node.op = Op::MulMatId;
        let host = |desc, bytes| HostTensor { desc, bytes };
        let mut out = vec![0u8; node.nbytes()];
        compute(
            &node,
            &[host(&ta, &a[..]), host(&tb, &b[..]), host(&ti, &ib[..])],
            &mut out,
        )
        .unwrap();
        let te = Tensor::contiguous(w, [k, m, 1, 1]).unwrap();
        let ty = Tensor::contiguous(DType::F32, [k, 1, 1, 1]).unwrap();
        let mut mm = Tensor::contiguous(DType::F32, [m, 1, 1, 1]).unwrap();
        mm.op = Op::MulMat;
        for t in 0..n_tok {
            for e in 0..n_used {
                let x = ids[t * n_used + e] as usize;
                let ab = &a[x * te.nbytes()..(x + 1) * te.nbytes()];
                let yb = &b[(t * b1 + e % b1) * 4 * k..][..4 * k];
                let mut want = vec![0u8; 4 * m];
                compute(&mm, &[host(&te, ab), host(&ty, yb)], &mut want).unwrap();
                let o = (t * n_used + e) * 4 * m;
                assert_eq!(&out[o..o + 4 * m], &want[..], "{w} slot {e} token {t}");
            }
        }
        // An id out of range is an error.
        let bad: Vec<u8> = [0i32, 1, 3, 0, 0, 0, 0, 0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let src = [host(&ta, &a[..]), host(&tb, &b[..]), host(&ti, &bad[..])];
        assert_eq!(
            compute(&node, &src, &mut out),
            Err("expert id out of range")
        );
    }
}

#[test]
fn alibi_slopes_as_ggml() {
    assert_eq!(alibi_slope(0.0, 3, 8), 1.0);
    // 8 heads, max_bias 8: slopes 2^-1 .. 2^-8.
    for h in 0..8 {
        let want = 2f32.powi(-(h as i32 + 1));
        assert!((alibi_slope(8.0, h, 8) - want).abs() < 1e-7);
    }
    // Head counts that are not powers of two (ggml, after the ALiBi paper): the first
    // 2^floor(log2 n) heads as above, the others the odd powers of m1 = 2^(-max_bias / 2 /
    // 2^floor(log2 n)). 12 heads, max_bias 8: heads 8..11 take 2^-0.5, 2^-1.5, 2^-2.5,
    // 2^-3.5. 6 heads, max_bias 8: 2^-2, 2^-4, 2^-6, 2^-8, then 2^-1, 2^-3.
    let cases: [(usize, f64, &[f64]); 2] = [
        (
            12,
            8.0,
            &[
                -1.0, -2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0, -0.5, -1.5, -2.5, -3.5,
            ],
        ),
        (6, 8.0, &[-2.0, -4.0, -6.0, -8.0, -1.0, -3.0]),
    ];
    for (n, bias, exps) in cases {
        for (h, e) in exps.iter().enumerate() {
            let want = 2f64.powf(*e);
            let got = alibi_slope(bias as f32, h, n) as f64;
            assert!(
                ((got - want) / want).abs() < 1e-6,
                "head {h} of {n}: {got} vs {want}"
            );
        }
    }
}

/// Gemma 3's attention shape: head size 256, 4 query heads on 1 KV head, F16 K and V,
/// an F16 causal mask, 3 queries over 20 positions; against f64 on the f16 values
/// (q rounded to f16 too, as ggml converts q to K's dot type).
#[test]
fn flash_attention_head_256_gqa4_f16_close_to_f64() {
    let (d, n_kv, n_q, h) = (256usize, 20usize, 3usize, 4usize);
    let mut r = rng(6);
    let tq = Tensor::contiguous(DType::F32, [d, n_q, h, 1]).unwrap();
    let tk = Tensor::contiguous(DType::F16, [d, n_kv, 1, 1]).unwrap();
    let tm = Tensor::contiguous(DType::F16, [n_kv, n_q, 1, 1]).unwrap();
    let q: Vec<f32> = (0..d * n_q * h).map(|_| r()).collect();
    let h16 = |v: f32| f16_to_f32(f32_to_f16(v));
    let k: Vec<f32> = (0..d * n_kv).map(|_| h16(r())).collect();
    let v: Vec<f32> = (0..d * n_kv).map(|_| h16(r())).collect();
    // Query iq sees positions 0 ..= n_kv - n_q + iq.
    let visible = |j: usize, iq: usize| j <= n_kv - n_q + iq;
    let m: Vec<f32> = (0..n_kv * n_q)
        .map(|i| match visible(i % n_kv, i / n_kv) {
            true => 0.0,
            false => f32::NEG_INFINITY,
        })
        .collect();
    let scale = 1.0 / 16.0;
    let out = flash_attn_with_f16_mask([&tq, &tk, &tm], [&q, &k, &v, &m], scale, 0.0);
    for iq in 0..n_q {
        for hh in 0..h {
            // With F16 K, q is rounded to f16 for the dot (ggml's q_to_vec_dot).
            let qr: Vec<f32> = q[(hh * n_q + iq) * d..][..d]
                .iter()
                .map(|&x| h16(x))
                .collect();
            let s: Vec<(usize, f64)> = (0..n_kv)
                .filter(|&j| visible(j, iq))
                .map(|j| {
                    let kr = &k[j * d..][..d];
                    let dot: f64 = qr.iter().zip(kr).map(|(&a, &b)| a as f64 * b as f64).sum();
                    (j, dot * scale as f64)
                })
                .collect();
            let wants = attention_f64(&s, &v, d);
            for (i, &want) in wants.iter().enumerate() {
                let o = (iq * h + hh) * d + i;
                let got = f32::from_le_bytes(out[4 * o..4 * o + 4].try_into().unwrap());
                assert!(
                    (got as f64 - want).abs() < 1e-5,
                    "query {iq} head {hh} dim {i}: {got} vs {want}"
                );
            }
        }
    }
}

/// Also with scores in the thousands (scale 200), where a wrong running maximum would
/// overflow `exp`.
#[test]
fn flash_attention_close_to_f64() {
    for scale in [0.25f32, 200.0] {
        flash_attention_close_to_f64_at(scale);
    }
}

fn flash_attention_close_to_f64_at(scale: f32) {
    let (d, n_kv, h) = (16usize, 9usize, 2usize);
    let mut r = rng(3);
    let mk = |ne: [usize; 4]| Tensor::contiguous(DType::F32, ne).unwrap();
    let (tq, tk, tv) = (mk([d, 1, h, 1]), mk([d, n_kv, 1, 1]), mk([d, n_kv, 1, 1]));
    let q: Vec<f32> = (0..d * h).map(|_| r()).collect();
    let k: Vec<f32> = (0..d * n_kv).map(|_| r()).collect();
    let v: Vec<f32> = (0..d * n_kv).map(|_| r()).collect();
    let b = |x: &[f32]| x.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    let (bq, bk, bv) = (b(&q), b(&k), b(&v));
    let mut node = mk([d, h, 1, 1]);
    node.op = Op::FlashAttnExt {
        scale,
        max_bias: 0.0,
        softcap: 0.0,
    };
    let src = [
        HostTensor {
            desc: &tq,
            bytes: &bq,
        },
        HostTensor {
            desc: &tk,
            bytes: &bk,
        },
        HostTensor {
            desc: &tv,
            bytes: &bv,
        },
    ];
    let mut out = vec![0u8; d * h * 4];
    compute(&node, &src, &mut out).unwrap();
    for hh in 0..h {
        let s: Vec<(usize, f64)> = (0..n_kv)
            .map(|j| {
                let dot: f64 = (0..d)
                    .map(|i| q[hh * d + i] as f64 * k[j * d + i] as f64)
                    .sum();
                (j, dot * scale as f64)
            })
            .collect();
        let wants = attention_f64(&s, &v, d);
        for (i, &want) in wants.iter().enumerate() {
            let o = hh * d + i;
            let got = f32::from_le_bytes(out[4 * o..4 * o + 4].try_into().unwrap());
            assert!(
                (got as f64 - want).abs() < 1e-5,
                "scale {scale} head {hh} dim {i}: {got} vs {want}"
            );
        }
    }
}

/// bf16 is the top half of an f32: widening is a shift (every non-NaN pattern, NaN stays
/// NaN), narrowing rounds to nearest with ties to even, computed here on the bits.
#[test]
fn bf16_conversions_follow_the_bit_layout() {
    for h in 0..=u16::MAX {
        let want = f32::from_bits(u32::from(h) << 16);
        let got = bf16_to_f32(h);
        if want.is_nan() {
            assert!(got.is_nan(), "{h:#06x}");
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
        }
    }
    let round = |bits: u32| ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) as u16;
    for bits in [
        0x3F80_0000u32, // 1.0
        0x3F80_8000,    // a tie, to the even 0x3F80
        0x3F81_8000,    // a tie, to the even 0x3F82
        0x3F80_8001,    // above the tie
        0x3F80_7FFF,    // below it
        0xC2F7_1234,    // negative
        0x0000_0001,    // the smallest subnormal rounds to 0
        0x7F7F_FFFF,    // the largest finite rounds to infinity
        0x0000_0000,
        0x8000_0000,
    ] {
        let x = f32::from_bits(bits);
        assert_eq!(f32_to_bf16(x), round(bits), "{bits:#010x}");
    }
    assert_eq!(f32_to_bf16(f32::INFINITY), 0x7F80);
    assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
}

/// `fmax(x, m)` is `x > m ? x : m` (x86 `maxps x, m`): a NaN `x` loses, a NaN `m` stays,
/// and of two zeros the second operand is kept; `tree16_max` folds lane `l + w` into lane
/// `l` for w = 8, 4, 2, 1, so where a NaN sits decides whether it survives.
#[test]
fn fmax_and_its_tree_keep_x86_operand_order() {
    let nan = f32::NAN;
    for (x, m, want) in [
        (1.0f32, 2.0f32, 2.0f32),
        (3.0, 2.0, 3.0),
        (-1.0, -2.0, -1.0),
        (nan, 2.0, 2.0),
        (0.0, -0.0, -0.0),
        (-0.0, 0.0, 0.0),
        (f32::NEG_INFINITY, -1e30, -1e30),
    ] {
        assert_eq!(fmax(x, m).to_bits(), want.to_bits(), "fmax({x}, {m})");
    }
    assert!(fmax(2.0, nan).is_nan());
    let mut lanes = [0f32; LANES];
    for (l, v) in lanes.iter_mut().enumerate() {
        *v = (l as f32 - 7.5) * (l as f32 - 3.0);
    }
    let want = lanes.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    assert_eq!(tree16_max(lanes), want);
    // A NaN in lane 8 meets lane 0 as x and loses; in lane 0 it is m and stays.
    let mut hi = lanes;
    hi[8] = nan;
    assert!(!tree16_max(hi).is_nan());
    let mut lo = lanes;
    lo[0] = nan;
    assert!(tree16_max(lo).is_nan());
    // Signed zeros: lane 1's +0 meets lane 0's -0 as x, and fmax keeps m, the -0.
    let mut z = [f32::NEG_INFINITY; LANES];
    z[0] = -0.0;
    z[1] = 0.0;
    assert_eq!(tree16_max(z).to_bits(), (-0.0f32).to_bits());
}

/// The half-precision dots against sums computed here: small integers (every product and
/// partial sum exact, so any order gives the integer sum), then one lane whose running
/// sum rounds (2^24 + 1 + 1 in lane 0 stays 2^24 twice, ties to even, while the other
/// lanes add 1 each and meet it only in the tree). On x86 the bf16 tiles run the scalar
/// kernel, which calls `dot_bf16` itself: only values like these pin it.
#[test]
fn half_dots_sum_exact_products_in_sixteen_lanes() {
    let xs: Vec<f32> = (0..40).map(|i| (i % 13) as f32 - 6.0).collect();
    let ys: Vec<f32> = (0..40).map(|i| (i % 7) as f32 + 1.0).collect();
    let exact: i64 = (0..40i64).map(|i| (i % 13 - 6) * (i % 7 + 1)).sum();
    let exact = exact as f32;
    assert_ne!(exact, 0.0);
    let bf = |v: &[f32]| v.iter().map(|&x| f32_to_bf16(x)).collect::<Vec<u16>>();
    let hf = |v: &[f32]| v.iter().map(|&x| f32_to_f16(x)).collect::<Vec<u16>>();
    assert_eq!(dot_bf16(&bf(&xs), &bf(&ys)), exact);
    assert_eq!(dot_f16(&hf(&xs), &hf(&ys)), exact);
    // Lane 0 holds 2^24 (index 0), and its +1 at 16 and at 32 each round back to 2^24
    // (ties to even); lanes 1..15 get 1 + 1 (indices l and 16 + l). The tree's pairs
    // (2^24 + 2, + 4, + 8, + 16) are all exact: 2^24 + 30, not the exact sum's 2^24 + 32
    // nor a sequential sum's 2^24.
    let mut x = vec![1f32; 33];
    x[0] = 16_777_216.0;
    let y = vec![1f32; 33];
    let want = 16_777_216.0 + 30.0;
    assert_eq!(dot_bf16(&bf(&x), &bf(&y)), want);
    assert_eq!(dot_f32(&x, &y), want);
}

/// Normal (GPT-J style) RoPE rotates adjacent pairs (2i, 2i + 1); with partial rotation the
/// values past `n_dims` are copied. Against f64, so a wrong pairing is off by O(1).
#[test]
fn rope_normal_pairs_adjacent_values_close_to_f64() {
    assert_rope_close(RopeMode::Normal, 11.0, 32, 48, 4);
}

/// `HostTensor::get` reads I32 elements as their value in f32 (and F16, BF16 widened).
#[test]
fn host_tensor_get_converts_each_dtype() {
    let ti = Tensor::contiguous(DType::I32, [3, 1, 1, 1]).unwrap();
    let bi: Vec<u8> = [-7i32, 0, 1 << 20]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let h = HostTensor {
        desc: &ti,
        bytes: &bi,
    };
    let got: Vec<f32> = (0..3).map(|i| h.get([i, 0, 0, 0])).collect();
    assert_eq!(got, [-7.0, 0.0, 1048576.0]);
    let th = Tensor::contiguous(DType::F16, [1, 1, 1, 1]).unwrap();
    let bh = f32_to_f16(-2.5).to_le_bytes();
    assert_eq!(
        HostTensor {
            desc: &th,
            bytes: &bh
        }
        .get([0; 4]),
        -2.5
    );
}

/// GET_ROWS takes row `idx[i1, i2, i3]` of matrix (i2, i3) of the source (each i3 its
/// own), and refuses an index below 0 or past the rows.
#[test]
fn get_rows_per_matrix_and_bad_indices() {
    let (k, rows, ne2, ne3, n) = (4usize, 3usize, 2usize, 2usize, 2usize);
    let ta = Tensor::contiguous(DType::F32, [k, rows, ne2, ne3]).unwrap();
    let a: Vec<u8> = (0..k * rows * ne2 * ne3)
        .flat_map(|v| (v as f32).to_le_bytes())
        .collect();
    let ti = Tensor::contiguous(DType::I32, [n, ne2, ne3, 1]).unwrap();
    let ids = [2i32, 0, 1, 1, 0, 2, 2, 1];
    let ib: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut node = Tensor::contiguous(DType::F32, [k, n, ne2, ne3]).unwrap();
    node.op = Op::GetRows;
    let host = |desc, bytes| HostTensor { desc, bytes };
    let mut out = vec![0u8; node.nbytes()];
    compute(&node, &[host(&ta, &a[..]), host(&ti, &ib[..])], &mut out).unwrap();
    let got: Vec<f32> = out
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    for i3 in 0..ne3 {
        for i2 in 0..ne2 {
            for i1 in 0..n {
                let r = ids[(i3 * ne2 + i2) * n + i1] as usize;
                let from = ((i3 * ne2 + i2) * rows + r) * k;
                let to = ((i3 * ne2 + i2) * n + i1) * k;
                let want: Vec<f32> = (from..from + k).map(|v| v as f32).collect();
                assert_eq!(
                    &got[to..to + k],
                    &want[..],
                    "row {i1} of matrix ({i2}, {i3})"
                );
            }
        }
    }
    for bad in [-1i32, 3] {
        let mut b = ids;
        b[5] = bad;
        let bb: Vec<u8> = b.iter().flat_map(|v| v.to_le_bytes()).collect();
        let src = [
            HostTensor {
                desc: &ta,
                bytes: &a,
            },
            HostTensor {
                desc: &ti,
                bytes: &bb,
            },
        ];
        assert_eq!(
            compute(&node, &src, &mut out),
            Err("row index out of range"),
            "index {bad}"
        );
    }
}

/// SET_ROWS writes source row i into row idx[i] (the last of repeated indices wins) and
/// refuses an index below 0 or past the destination's rows.
#[test]
fn set_rows_places_rows_and_refuses_bad_indices() {
    let (k, n, rows) = (3usize, 3usize, 4usize);
    let ta = Tensor::contiguous(DType::F32, [k, n, 1, 1]).unwrap();
    let a: Vec<u8> = (0..k * n).flat_map(|v| (v as f32).to_le_bytes()).collect();
    let ti = Tensor::contiguous(DType::I32, [n, 1, 1, 1]).unwrap();
    let mut node = Tensor::contiguous(DType::F32, [k, rows, 1, 1]).unwrap();
    node.op = Op::SetRows;
    let run = |ids: [i32; 3], out: &mut [u8]| {
        let ib: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
        let src = [
            HostTensor {
                desc: &ta,
                bytes: &a,
            },
            HostTensor {
                desc: &ti,
                bytes: &ib,
            },
        ];
        compute(&node, &src, out)
    };
    let mut out = vec![0u8; node.nbytes()];
    run([3, 0, 3], &mut out).unwrap();
    let got: Vec<f32> = out
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(
        got,
        [3.0, 4.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 6.0, 7.0, 8.0]
    );
    for bad in [-1i32, 4] {
        assert_eq!(
            run([0, bad, 1], &mut out),
            Err("row index out of range"),
            "index {bad}"
        );
    }
}

/// ALiBi as llama.cpp feeds it: a mask of finite distances `-|i - j|` (and `-inf` for the
/// future), scaled by each head's slope and added to the score; against f64 with the slopes
/// computed here (4 heads, max_bias 8: slope 2^(-2(h + 1))).
#[test]
fn flash_attention_with_alibi_distances_close_to_f64() {
    let (d, n_kv, n_q, h) = (16usize, 9usize, 2usize, 4usize);
    let mut r = rng(11);
    let mk = |ne: [usize; 4]| Tensor::contiguous(DType::F32, ne).unwrap();
    let (tq, tk) = (mk([d, n_q, h, 1]), mk([d, n_kv, 1, 1]));
    let tm = Tensor::contiguous(DType::F16, [n_kv, n_q, 1, 1]).unwrap();
    let q: Vec<f32> = (0..d * n_q * h).map(|_| r()).collect();
    let k: Vec<f32> = (0..d * n_kv).map(|_| r()).collect();
    let v: Vec<f32> = (0..d * n_kv).map(|_| r()).collect();
    // Query iq sits at position n_kv - n_q + iq.
    let pos = |iq: usize| (n_kv - n_q + iq) as f64;
    let dist = |j: usize, iq: usize| match j as f64 <= pos(iq) {
        true => Some(-(pos(iq) - j as f64)),
        false => None,
    };
    let m: Vec<f32> = (0..n_kv * n_q)
        .map(|i| dist(i % n_kv, i / n_kv).map_or(f32::NEG_INFINITY, |x| x as f32))
        .collect();
    let scale = 0.5f32;
    let out = flash_attn_with_f16_mask([&tq, &tk, &tm], [&q, &k, &v, &m], scale, 8.0);
    for iq in 0..n_q {
        for hh in 0..h {
            let slope = 2f64.powi(-2 * (hh as i32 + 1));
            let qr = &q[(hh * n_q + iq) * d..][..d];
            let s: Vec<(usize, f64)> = (0..n_kv)
                .filter_map(|j| {
                    let dot: f64 = qr
                        .iter()
                        .zip(&k[j * d..][..d])
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum();
                    dist(j, iq).map(|x| (j, dot * scale as f64 + slope * x))
                })
                .collect();
            let wants = attention_f64(&s, &v, d);
            for (i, &want) in wants.iter().enumerate() {
                let o = (iq * h + hh) * d + i;
                let got = f32::from_le_bytes(out[4 * o..4 * o + 4].try_into().unwrap());
                assert!(
                    (got as f64 - want).abs() < 1e-5,
                    "query {iq} head {hh} dim {i}: {got} vs {want}"
                );
            }
        }
    }
}

/// Runs the reference FLASH_ATTN_EXT on f32 queries `q` ([D, n_q, H]), keys and values of
/// `tk`'s dtype (F32 or F16, one KV head) and an F16 mask, into an f32 output [D, H, n_q];
/// the values are given as f32 and converted to each tensor's dtype here.
fn flash_attn_with_f16_mask(
    [tq, tk, tm]: [&Tensor; 3],
    [q, k, v, m]: [&[f32]; 4],
    scale: f32,
    max_bias: f32,
) -> Vec<u8> {
    let bytes = |dt: DType, x: &[f32]| -> Vec<u8> {
        match dt {
            DType::F16 => x
                .iter()
                .flat_map(|&f| f32_to_f16(f).to_le_bytes())
                .collect(),
            _ => x.iter().flat_map(|f| f.to_le_bytes()).collect(),
        }
    };
    let (bq, bk, bv, bm) = (
        bytes(DType::F32, q),
        bytes(tk.dtype, k),
        bytes(tk.dtype, v),
        bytes(DType::F16, m),
    );
    let [d, n_q, h, _] = tq.ne;
    let mut node = Tensor::contiguous(DType::F32, [d, h, n_q, 1]).unwrap();
    node.op = Op::FlashAttnExt {
        scale,
        max_bias,
        softcap: 0.0,
    };
    let host = |desc, bytes| HostTensor { desc, bytes };
    let src = [
        host(tq, &bq[..]),
        host(tk, &bk[..]),
        host(tk, &bv[..]),
        host(tm, &bm[..]),
    ];
    let mut out = vec![0u8; d * h * n_q * 4];
    compute(&node, &src, &mut out).unwrap();
    out
}

/// Softmax attention in f64: the scores `(j, s_j)` of the positions a query sees, and the
/// output's `d` values, each the softmax-weighted sum of value rows `j` of `v` ([d, n_kv]).
fn attention_f64(scores: &[(usize, f64)], v: &[f32], d: usize) -> Vec<f64> {
    let mx = scores.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = scores.iter().map(|p| (p.1 - mx).exp()).sum();
    (0..d)
        .map(|i| {
            scores
                .iter()
                .map(|&(j, sj)| (sj - mx).exp() / z * v[j * d + i] as f64)
                .sum()
        })
        .collect()
}
