//! The 256-value super-block formats: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K.
//!
//! Each `quantize_block_*` is one super-block of ggml's `quantize_row_*_ref` (the
//! reference path without importance weights), each `dequantize_block_*` one super-block
//! of `dequantize_row_*`, with the same float operations in the same order.

use bytemuck::Zeroable;

use super::blocks::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K};
use super::fp::{fabsf, fp16_to_fp32, fp32_to_fp16};
use super::helpers::{
    get_scale_min_k4, make_q3_quants, make_qkx2_quants, make_qx_quants, max_by_magnitude,
    nearest_int, sqrtf, Qkx2Params, GROUP_MAX_EPS,
};
use crate::dtype::QK_K;

/// Quantizes one super-block to Q2_K (ggml's `quantize_row_q2_K_ref`).
pub fn quantize_block_q2_k(x: &[f32; QK_K]) -> BlockQ2K {
    let mut ls = [0u8; QK_K];
    let mut laux = [0u8; 16];
    let mut weights = [0.0f32; 16];
    let mut mins = [0.0f32; QK_K / 16];
    let mut scales = [0.0f32; QK_K / 16];
    let q4scale = 15.0f32;
    let params = Qkx2Params {
        nmax: 3,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };

    let mut y = BlockQ2K::zeroed();
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..QK_K / 16 {
        let xs = &x[16 * j..16 * j + 16];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = fabsf(v);
        }
        let (scale, min) = make_qkx2_quants(
            params,
            xs,
            &weights,
            &mut ls[16 * j..16 * j + 16],
            &mut laux,
        );
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }

    if max_scale > 0.0 {
        let iscale = q4scale / max_scale;
        for (sc, &s) in y.scales.iter_mut().zip(&scales) {
            *sc = nearest_int(iscale * s) as u8;
        }
        y.d = fp32_to_fp16(max_scale / q4scale);
    } else {
        y.scales = [0; 16];
        y.d = fp32_to_fp16(0.0);
    }
    if max_min > 0.0 {
        let iscale = q4scale / max_min;
        for (sc, &m) in y.scales.iter_mut().zip(&mins) {
            let l = nearest_int(iscale * m);
            *sc |= (l << 4) as u8;
        }
        y.dmin = fp32_to_fp16(max_min / q4scale);
    } else {
        y.dmin = fp32_to_fp16(0.0);
    }
    for j in 0..QK_K / 16 {
        let d = fp16_to_fp32(y.d) * (y.scales[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = fp16_to_fp32(y.dmin) * (y.scales[j] >> 4) as f32;
        for ii in 0..16 {
            let l = nearest_int((x[16 * j + ii] + dm) / d);
            ls[16 * j + ii] = l.clamp(0, 3) as u8;
        }
    }

    for j in (0..QK_K).step_by(128) {
        for l in 0..32 {
            y.qs[j / 4 + l] =
                ls[j + l] | (ls[j + l + 32] << 2) | (ls[j + l + 64] << 4) | (ls[j + l + 96] << 6);
        }
    }
    y
}

/// Dequantizes one Q2_K super-block (ggml's `dequantize_row_q2_K`).
pub fn dequantize_block_q2_k(b: &BlockQ2K, y: &mut [f32; QK_K]) {
    let d = fp16_to_fp32(b.d);
    let min = fp16_to_fp32(b.dmin);
    let mut out = 0;
    let mut is = 0;
    for n in 0..QK_K / 128 {
        let q = &b.qs[32 * n..32 * n + 32];
        let mut shift = 0;
        for _j in 0..4 {
            for half in 0..2 {
                let sc = b.scales[is];
                is += 1;
                let dl = d * (sc & 0xF) as f32;
                let ml = min * (sc >> 4) as f32;
                for &qv in &q[16 * half..16 * half + 16] {
                    y[out] = dl * (((qv >> shift) & 3) as i8) as f32 - ml;
                    out += 1;
                }
            }
            shift += 2;
        }
    }
}

/// Quantizes one super-block to Q3_K (ggml's `quantize_row_q3_K_ref`).
pub fn quantize_block_q3_k(x: &[f32; QK_K]) -> BlockQ3K {
    let mut ls = [0i8; QK_K];
    let mut scales = [0.0f32; QK_K / 16];
    let mut y = BlockQ3K::zeroed();

    let mut max_scale = 0.0f32;
    let mut amax = 0.0f32;
    for j in 0..QK_K / 16 {
        scales[j] = make_q3_quants(
            4,
            &x[16 * j..16 * j + 16],
            &mut ls[16 * j..16 * j + 16],
            true,
        );
        let scale = fabsf(scales[j]);
        if scale > amax {
            amax = scale;
            max_scale = scales[j];
        }
    }

    y.scales = [0; 12];
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (j, &s) in scales.iter().enumerate() {
            // `int8_t l = nearest_int(...)`, then clamped and offset in int arithmetic.
            let mut l = (nearest_int(iscale * s) as i8) as i32;
            l = (l.clamp(-32, 31) + 32) as i8 as i32;
            if j < 8 {
                y.scales[j] = (l & 0xF) as u8;
            } else {
                y.scales[j - 8] |= ((l & 0xF) << 4) as u8;
            }
            l >>= 4;
            y.scales[j % 4 + 8] |= (l << (2 * (j / 4))) as u8;
        }
        y.d = fp32_to_fp16(1.0 / iscale);
    } else {
        y.d = fp32_to_fp16(0.0);
    }

    for j in 0..QK_K / 16 {
        let sc = if j < 8 {
            (y.scales[j] & 0xF) as i8
        } else {
            (y.scales[j - 8] >> 4) as i8
        };
        let sc =
            ((sc as i32 | ((((y.scales[8 + j % 4] >> (2 * (j / 4))) & 3) as i32) << 4)) - 32) as i8;
        let d = fp16_to_fp32(y.d) * sc as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(x[16 * j + ii] / d);
            ls[16 * j + ii] = (l.clamp(-4, 3) + 4) as i8;
        }
    }

    y.hmask = [0; QK_K / 8];
    let mut m = 0usize;
    let mut hm = 1u8;
    for l in ls.iter_mut() {
        if *l > 3 {
            y.hmask[m] |= hm;
            *l = l.wrapping_sub(4);
        }
        m += 1;
        if m == QK_K / 8 {
            m = 0;
            hm = hm.wrapping_shl(1);
        }
    }
    for j in (0..QK_K).step_by(128) {
        for l in 0..32 {
            let v = ls[j + l] as i32
                | ((ls[j + l + 32] as i32) << 2)
                | ((ls[j + l + 64] as i32) << 4)
                | ((ls[j + l + 96] as i32) << 6);
            y.qs[j / 4 + l] = v as u8;
        }
    }
    y
}

/// Unpacks the 16 6-bit scales of a Q3_K block, as `dequantize_row_q3_K` does with its
/// `kmask` shuffles (values 0..64, to be offset by -32).
fn q3_k_scales(packed: &[u8; 12]) -> [i8; 16] {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let word = |i: usize| {
        u32::from_ne_bytes([
            packed[4 * i],
            packed[4 * i + 1],
            packed[4 * i + 2],
            packed[4 * i + 3],
        ])
    };
    let mut aux = [word(0), word(1), word(2), 0u32];
    let tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4);
    aux[3] = ((aux[1] >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4);
    aux[0] = (aux[0] & KMASK2) | ((tmp & KMASK1) << 4);
    aux[1] = (aux[1] & KMASK2) | (((tmp >> 2) & KMASK1) << 4);
    let mut out = [0i8; 16];
    for (o, b) in out.chunks_exact_mut(4).zip(aux) {
        for (dst, src) in o.iter_mut().zip(b.to_ne_bytes()) {
            *dst = src as i8;
        }
    }
    out
}

/// Dequantizes one Q3_K super-block (ggml's `dequantize_row_q3_K`).
pub fn dequantize_block_q3_k(b: &BlockQ3K, y: &mut [f32; QK_K]) {
    let d_all = fp16_to_fp32(b.d);
    let scales = q3_k_scales(&b.scales);
    let hm = &b.hmask;
    let mut m = 1u8;
    let mut out = 0;
    let mut is = 0;
    for n in 0..QK_K / 128 {
        let q = &b.qs[32 * n..32 * n + 32];
        let mut shift = 0;
        for _j in 0..4 {
            for half in 0..2 {
                let dl = d_all * (scales[is] as i32 - 32) as f32;
                is += 1;
                for l in 16 * half..16 * half + 16 {
                    let low = ((q[l] >> shift) & 3) as i8 as i32;
                    let high = if hm[l] & m != 0 { 0 } else { 4 };
                    y[out] = dl * (low - high) as f32;
                    out += 1;
                }
            }
            shift += 2;
            m = m.wrapping_shl(1);
        }
    }
}

/// Packs 6-bit sub-block scales `ls` and mins `lm` into the 12 bytes of a Q4_K / Q5_K
/// block, as `quantize_row_q4_K_ref` does.
fn pack_scales_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        let (l, m) = (ls[j], lm[j]);
        if j < 4 {
            s[j] = l;
            s[j + 4] = m;
        } else {
            s[j + 4] = (l & 0xF) | ((m & 0xF) << 4);
            s[j - 4] |= (l >> 4) << 6;
            s[j] |= (m >> 4) << 6;
        }
    }
    s
}

/// The shared first half of Q4_K and Q5_K quantisation: per 32-value sub-block,
/// `make_qkx2_quants` with weights `av_x + |x|`; then the packed 6-bit scales and mins,
/// the super-block `d` and `dmin`, and the final quants `ls` (in `0..=nmax`).
fn quantize_k4_scales(
    x: &[f32; QK_K],
    params: Qkx2Params,
    ls: &mut [u8; QK_K],
) -> (half::f16, half::f16, [u8; 12]) {
    let mut laux = [0u8; 32];
    let mut weights = [0.0f32; 32];
    let mut mins = [0.0f32; QK_K / 32];
    let mut scales = [0.0f32; QK_K / 32];

    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = sqrtf(sum_x2 / 32.0);
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + fabsf(v);
        }
        let (scale, min) = make_qkx2_quants(
            params,
            xs,
            &weights,
            &mut ls[32 * j..32 * j + 32],
            &mut laux,
        );
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }

    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut lsc = [0u8; 8];
    let mut lmn = [0u8; 8];
    for j in 0..QK_K / 32 {
        lsc[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lmn[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    let packed = pack_scales_k4(&lsc, &lmn);
    let d = fp32_to_fp16(max_scale / 63.0);
    let dmin = fp32_to_fp16(max_min / 63.0);

    for j in 0..QK_K / 32 {
        let (sc, m) = get_scale_min_k4(j, &packed);
        let dd = fp16_to_fp32(d) * sc as f32;
        if dd == 0.0 {
            continue;
        }
        let dm = fp16_to_fp32(dmin) * m as f32;
        for ii in 0..32 {
            let l = nearest_int((x[32 * j + ii] + dm) / dd);
            ls[32 * j + ii] = l.min(params.nmax).max(0) as u8;
        }
    }
    (d, dmin, packed)
}

/// Quantizes one super-block to Q4_K (ggml's `quantize_row_q4_K_ref`).
pub fn quantize_block_q4_k(x: &[f32; QK_K]) -> BlockQ4K {
    let mut ls = [0u8; QK_K];
    let params = Qkx2Params {
        nmax: 15,
        rmin: -1.0,
        rdelta: 0.1,
        nstep: 20,
        use_mad: false,
    };
    let (d, dmin, scales) = quantize_k4_scales(x, params, &mut ls);
    let mut y = BlockQ4K {
        d,
        dmin,
        scales,
        qs: [0; QK_K / 2],
    };
    for j in (0..QK_K).step_by(64) {
        for l in 0..32 {
            y.qs[j / 2 + l] = ls[j + l] | (ls[j + l + 32] << 4);
        }
    }
    y
}

/// Dequantizes one Q4_K super-block (ggml's `dequantize_row_q4_K`).
pub fn dequantize_block_q4_k(b: &BlockQ4K, y: &mut [f32; QK_K]) {
    let d = fp16_to_fp32(b.d);
    let min = fp16_to_fp32(b.dmin);
    let mut out = 0;
    for (n, q) in b.qs.chunks_exact(32).enumerate() {
        let (sc, m) = get_scale_min_k4(2 * n, &b.scales);
        let d1 = d * sc as f32;
        let m1 = min * m as f32;
        let (sc, m) = get_scale_min_k4(2 * n + 1, &b.scales);
        let d2 = d * sc as f32;
        let m2 = min * m as f32;
        for &qv in q {
            y[out] = d1 * (qv & 0xF) as f32 - m1;
            out += 1;
        }
        for &qv in q {
            y[out] = d2 * (qv >> 4) as f32 - m2;
            out += 1;
        }
    }
}

/// Quantizes one super-block to Q5_K (ggml's `quantize_row_q5_K_ref`).
pub fn quantize_block_q5_k(x: &[f32; QK_K]) -> BlockQ5K {
    let mut ls = [0u8; QK_K];
    let params = Qkx2Params {
        nmax: 31,
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: false,
    };
    let (d, dmin, scales) = quantize_k4_scales(x, params, &mut ls);
    let mut y = BlockQ5K {
        d,
        dmin,
        scales,
        qh: [0; QK_K / 8],
        qs: [0; QK_K / 2],
    };
    let mut m1 = 1u8;
    let mut m2 = 2u8;
    for n in (0..QK_K).step_by(64) {
        for j in 0..32 {
            let mut l1 = ls[n + j] as i32;
            if l1 > 15 {
                l1 -= 16;
                y.qh[j] |= m1;
            }
            let mut l2 = ls[n + j + 32] as i32;
            if l2 > 15 {
                l2 -= 16;
                y.qh[j] |= m2;
            }
            y.qs[n / 2 + j] = (l1 | (l2 << 4)) as u8;
        }
        m1 = m1.wrapping_shl(2);
        m2 = m2.wrapping_shl(2);
    }
    y
}

/// Dequantizes one Q5_K super-block (ggml's `dequantize_row_q5_K`).
pub fn dequantize_block_q5_k(b: &BlockQ5K, y: &mut [f32; QK_K]) {
    let d = fp16_to_fp32(b.d);
    let min = fp16_to_fp32(b.dmin);
    let qh = &b.qh;
    let mut u1 = 1u8;
    let mut u2 = 2u8;
    let mut out = 0;
    for (n, ql) in b.qs.chunks_exact(32).enumerate() {
        let (sc, m) = get_scale_min_k4(2 * n, &b.scales);
        let d1 = d * sc as f32;
        let m1 = min * m as f32;
        let (sc, m) = get_scale_min_k4(2 * n + 1, &b.scales);
        let d2 = d * sc as f32;
        let m2 = min * m as f32;
        for (&q, &h) in ql.iter().zip(qh) {
            let v = (q & 0xF) as i32 + if h & u1 != 0 { 16 } else { 0 };
            y[out] = d1 * v as f32 - m1;
            out += 1;
        }
        for (&q, &h) in ql.iter().zip(qh) {
            let v = (q >> 4) as i32 + if h & u2 != 0 { 16 } else { 0 };
            y[out] = d2 * v as f32 - m2;
            out += 1;
        }
        u1 = u1.wrapping_shl(2);
        u2 = u2.wrapping_shl(2);
    }
}

/// Quantizes one super-block to Q6_K (ggml's `quantize_row_q6_K_ref`).
pub fn quantize_block_q6_k(x: &[f32; QK_K]) -> BlockQ6K {
    let mut ls = [0i8; QK_K];
    let mut scales = [0.0f32; QK_K / 16];

    let mut max_scale = 0.0f32;
    let mut max_abs_scale = 0.0f32;
    for ib in 0..QK_K / 16 {
        let scale = make_qx_quants(
            32,
            &x[16 * ib..16 * ib + 16],
            &mut ls[16 * ib..16 * ib + 16],
            1,
        );
        scales[ib] = scale;
        let abs_scale = fabsf(scale);
        if abs_scale > max_abs_scale {
            max_abs_scale = abs_scale;
            max_scale = scale;
        }
    }

    let mut y = BlockQ6K::zeroed();
    if max_abs_scale < GROUP_MAX_EPS {
        y.d = fp32_to_fp16(0.0);
        return y;
    }

    let iscale = -128.0 / max_scale;
    y.d = fp32_to_fp16(1.0 / iscale);
    for (sc, &s) in y.scales.iter_mut().zip(&scales) {
        *sc = nearest_int(iscale * s).min(127) as i8;
    }

    for j in 0..QK_K / 16 {
        let d = fp16_to_fp32(y.d) * y.scales[j] as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(x[16 * j + ii] / d);
            ls[16 * j + ii] = (l.clamp(-32, 31) + 32) as i8;
        }
    }

    for j in (0..QK_K).step_by(128) {
        for l in 0..32 {
            let q1 = (ls[j + l] & 0xF) as u8;
            let q2 = (ls[j + l + 32] & 0xF) as u8;
            let q3 = (ls[j + l + 64] & 0xF) as u8;
            let q4 = (ls[j + l + 96] & 0xF) as u8;
            y.ql[j / 2 + l] = q1 | (q3 << 4);
            y.ql[j / 2 + l + 32] = q2 | (q4 << 4);
            let h = (ls[j + l] as i32 >> 4)
                | ((ls[j + l + 32] as i32 >> 4) << 2)
                | ((ls[j + l + 64] as i32 >> 4) << 4)
                | ((ls[j + l + 96] as i32 >> 4) << 6);
            y.qh[j / 4 + l] = h as u8;
        }
    }
    y
}

/// Dequantizes one Q6_K super-block (ggml's `dequantize_row_q6_K`).
pub fn dequantize_block_q6_k(b: &BlockQ6K, y: &mut [f32; QK_K]) {
    let d = fp16_to_fp32(b.d);
    for n in 0..QK_K / 128 {
        let ql = &b.ql[64 * n..64 * n + 64];
        let qh = &b.qh[32 * n..32 * n + 32];
        let sc = &b.scales[8 * n..8 * n + 8];
        let y = &mut y[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 as i32 - 32;
            let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 as i32 - 32;
            y[l] = d * sc[is] as f32 * q1 as f32;
            y[l + 32] = d * sc[is + 2] as f32 * q2 as f32;
            y[l + 64] = d * sc[is + 4] as f32 * q3 as f32;
            y[l + 96] = d * sc[is + 6] as f32 * q4 as f32;
        }
    }
}

/// Quantizes one super-block to Q8_K (ggml's `quantize_row_q8_K_ref`), with `bsums`.
///
/// For an all-zero block ggml sets `d` and `qs` to zero and leaves `bsums` as they were;
/// here they are zero too.
pub fn quantize_block_q8_k(x: &[f32; QK_K]) -> BlockQ8K {
    let mut y = BlockQ8K::zeroed();
    let (max, amax) = max_by_magnitude(x);
    if amax == 0.0 {
        return y;
    }
    let iscale = -127.0 / max;
    for (q, &v) in y.qs.iter_mut().zip(x) {
        let v = nearest_int(iscale * v);
        *q = v.min(127) as i8;
    }
    for (s, qs) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
        let sum: i32 = qs.iter().map(|&q| q as i32).sum();
        *s = sum as i16;
    }
    y.d = 1.0 / iscale;
    y
}

/// Dequantizes one Q8_K super-block (ggml's `dequantize_row_q8_K`).
pub fn dequantize_block_q8_k(b: &BlockQ8K, y: &mut [f32; QK_K]) {
    for (y, &q) in y.iter_mut().zip(&b.qs) {
        *y = b.d * q as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wave() -> [f32; QK_K] {
        core::array::from_fn(|i| {
            let t = i as f32 * 0.173;
            (t * 1.7).sin() * 2.0 + (t * 0.31).cos() - 0.25
        })
    }

    /// Max abs error over the block, relative to the largest magnitude.
    fn rel_err(x: &[f32; QK_K], y: &[f32; QK_K]) -> f32 {
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        x.iter()
            .zip(y)
            .fold(0.0f32, |e, (a, b)| e.max((a - b).abs()))
            / amax
    }

    #[test]
    fn round_trip_error_bounds() {
        let x = wave();
        let mut y = [0.0; QK_K];
        dequantize_block_q2_k(&quantize_block_q2_k(&x), &mut y);
        assert!(rel_err(&x, &y) < 0.35, "q2_K {}", rel_err(&x, &y));
        dequantize_block_q3_k(&quantize_block_q3_k(&x), &mut y);
        assert!(rel_err(&x, &y) < 0.2, "q3_K {}", rel_err(&x, &y));
        dequantize_block_q4_k(&quantize_block_q4_k(&x), &mut y);
        assert!(rel_err(&x, &y) < 0.08, "q4_K {}", rel_err(&x, &y));
        dequantize_block_q5_k(&quantize_block_q5_k(&x), &mut y);
        assert!(rel_err(&x, &y) < 0.04, "q5_K {}", rel_err(&x, &y));
        dequantize_block_q6_k(&quantize_block_q6_k(&x), &mut y);
        assert!(rel_err(&x, &y) < 0.02, "q6_K {}", rel_err(&x, &y));
        dequantize_block_q8_k(&quantize_block_q8_k(&x), &mut y);
        assert!(rel_err(&x, &y) < 0.005, "q8_K {}", rel_err(&x, &y));
    }

    #[test]
    fn q8_k_bsums_and_zero_block() {
        let x = wave();
        let b = quantize_block_q8_k(&x);
        for (j, &s) in b.bsums.iter().enumerate() {
            assert_eq!(
                s as i32,
                b.qs[16 * j..16 * j + 16]
                    .iter()
                    .map(|&q| q as i32)
                    .sum::<i32>()
            );
        }
        assert_eq!(quantize_block_q8_k(&[0.0; QK_K]), BlockQ8K::zeroed());
    }

    #[test]
    fn zero_blocks() {
        let z = [0.0f32; QK_K];
        assert_eq!(quantize_block_q6_k(&z), BlockQ6K::zeroed());
        let mut y = [1.0; QK_K];
        dequantize_block_q2_k(&quantize_block_q2_k(&z), &mut y);
        assert!(y.iter().all(|&v| v == 0.0));
        dequantize_block_q3_k(&quantize_block_q3_k(&z), &mut y);
        assert!(y.iter().all(|&v| v == 0.0));
        dequantize_block_q4_k(&quantize_block_q4_k(&z), &mut y);
        assert!(y.iter().all(|&v| v == 0.0));
        dequantize_block_q5_k(&quantize_block_q5_k(&z), &mut y);
        assert!(y.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn q3_k_scales_round_trip() {
        // Pack 16 arbitrary 6-bit scales the way quantize_row_q3_K_ref does, unpack them.
        let want: [i32; 16] = core::array::from_fn(|j| ((j * 37 + 5) % 64) as i32);
        let mut packed = [0u8; 12];
        for (j, &l) in want.iter().enumerate() {
            if j < 8 {
                packed[j] = (l & 0xF) as u8;
            } else {
                packed[j - 8] |= ((l & 0xF) << 4) as u8;
            }
            packed[j % 4 + 8] |= ((l >> 4) << (2 * (j / 4))) as u8;
        }
        let got = q3_k_scales(&packed);
        for j in 0..16 {
            assert_eq!(got[j] as i32, want[j], "scale {j}");
        }
    }
}
