//! The 32-value block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1.
//!
//! Each `quantize_block_*` is one block of ggml's `quantize_row_*_ref`, each
//! `dequantize_block_*` one block of `dequantize_row_*`, with the same float operations
//! in the same order.

use super::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
use super::fp::{fabsf, fp16_to_fp32, fp32_to_fp16};
use super::helpers::{c_float_to_int, roundf};

/// Largest magnitude of `x` and the value that has it (the first one on ties), as the
/// `amax < fabsf(v)` loops of Q4_0 and Q5_0 find them.
#[inline]
fn signed_absmax(x: &[f32; 32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < fabsf(v) {
            amax = fabsf(v);
            max = v;
        }
    }
    max
}

/// Minimum and maximum of `x`, as the Q4_1 and Q5_1 loops find them.
#[inline]
fn min_max(x: &[f32; 32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// `amax = MAX(amax, fabsf(v))` over `x` (Q8_0, Q8_1).
#[inline]
fn absmax(x: &[f32; 32]) -> f32 {
    let mut amax = 0.0f32;
    for &v in x {
        let a = fabsf(v);
        amax = if amax > a { amax } else { a };
    }
    amax
}

/// Quantizes one block to Q4_0 (ggml's `quantize_row_q4_0_ref`).
pub fn quantize_block_q4_0(x: &[f32; 32]) -> BlockQ4_0 {
    let max = signed_absmax(x);
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; 16];
    for (j, q) in qs.iter_mut().enumerate() {
        let x0 = x[j] * id;
        let x1 = x[16 + j] * id;
        let xi0 = (c_float_to_int(x0 + 8.5) as i8).min(15) as u8;
        let xi1 = (c_float_to_int(x1 + 8.5) as i8).min(15) as u8;
        *q = xi0 | (xi1 << 4);
    }
    BlockQ4_0 {
        d: fp32_to_fp16(d),
        qs,
    }
}

/// Dequantizes one Q4_0 block (ggml's `dequantize_row_q4_0`).
pub fn dequantize_block_q4_0(b: &BlockQ4_0, y: &mut [f32; 32]) {
    let d = fp16_to_fp32(b.d);
    for (j, &q) in b.qs.iter().enumerate() {
        let x0 = (q & 0x0F) as i32 - 8;
        let x1 = (q >> 4) as i32 - 8;
        y[j] = x0 as f32 * d;
        y[j + 16] = x1 as f32 * d;
    }
}

/// Quantizes one block to Q4_1 (ggml's `quantize_row_q4_1_ref`).
pub fn quantize_block_q4_1(x: &[f32; 32]) -> BlockQ4_1 {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; 16];
    for (j, q) in qs.iter_mut().enumerate() {
        let x0 = (x[j] - min) * id;
        let x1 = (x[16 + j] - min) * id;
        let xi0 = (c_float_to_int(x0 + 0.5) as i8).min(15) as u8;
        let xi1 = (c_float_to_int(x1 + 0.5) as i8).min(15) as u8;
        *q = xi0 | (xi1 << 4);
    }
    BlockQ4_1 {
        d: fp32_to_fp16(d),
        m: fp32_to_fp16(min),
        qs,
    }
}

/// Dequantizes one Q4_1 block (ggml's `dequantize_row_q4_1`).
pub fn dequantize_block_q4_1(b: &BlockQ4_1, y: &mut [f32; 32]) {
    let d = fp16_to_fp32(b.d);
    let m = fp16_to_fp32(b.m);
    for (j, &q) in b.qs.iter().enumerate() {
        let x0 = (q & 0x0F) as i32;
        let x1 = (q >> 4) as i32;
        y[j] = x0 as f32 * d + m;
        y[j + 16] = x1 as f32 * d + m;
    }
}

/// Quantizes one block to Q5_0 (ggml's `quantize_row_q5_0_ref`).
pub fn quantize_block_q5_0(x: &[f32; 32]) -> BlockQ5_0 {
    let max = signed_absmax(x);
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; 16];
    let mut qh = 0u32;
    for (j, q) in qs.iter_mut().enumerate() {
        let x0 = x[j] * id;
        let x1 = x[16 + j] * id;
        let xi0 = (c_float_to_int(x0 + 16.5) as i8).min(31) as u8;
        let xi1 = (c_float_to_int(x1 + 16.5) as i8).min(31) as u8;
        *q = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
        qh |= ((xi0 as u32 & 0x10) >> 4) << j;
        qh |= ((xi1 as u32 & 0x10) >> 4) << (j + 16);
    }
    BlockQ5_0 {
        d: fp32_to_fp16(d),
        qh: qh.to_ne_bytes(),
        qs,
    }
}

/// Dequantizes one Q5_0 block (ggml's `dequantize_row_q5_0`).
pub fn dequantize_block_q5_0(b: &BlockQ5_0, y: &mut [f32; 32]) {
    let d = fp16_to_fp32(b.d);
    let qh = u32::from_ne_bytes(b.qh);
    for (j, &q) in b.qs.iter().enumerate() {
        let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
        let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
        let x0 = ((q & 0x0F) | xh_0) as i32 - 16;
        let x1 = ((q >> 4) | xh_1) as i32 - 16;
        y[j] = x0 as f32 * d;
        y[j + 16] = x1 as f32 * d;
    }
}

/// Quantizes one block to Q5_1 (ggml's `quantize_row_q5_1_ref`).
pub fn quantize_block_q5_1(x: &[f32; 32]) -> BlockQ5_1 {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0u8; 16];
    let mut qh = 0u32;
    for (j, q) in qs.iter_mut().enumerate() {
        let x0 = (x[j] - min) * id;
        let x1 = (x[16 + j] - min) * id;
        let xi0 = c_float_to_int(x0 + 0.5) as u8;
        let xi1 = c_float_to_int(x1 + 0.5) as u8;
        *q = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
        qh |= ((xi0 as u32 & 0x10) >> 4) << j;
        qh |= ((xi1 as u32 & 0x10) >> 4) << (j + 16);
    }
    BlockQ5_1 {
        d: fp32_to_fp16(d),
        m: fp32_to_fp16(min),
        qh: qh.to_ne_bytes(),
        qs,
    }
}

/// Dequantizes one Q5_1 block (ggml's `dequantize_row_q5_1`).
pub fn dequantize_block_q5_1(b: &BlockQ5_1, y: &mut [f32; 32]) {
    let d = fp16_to_fp32(b.d);
    let m = fp16_to_fp32(b.m);
    let qh = u32::from_ne_bytes(b.qh);
    for (j, &q) in b.qs.iter().enumerate() {
        let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
        let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
        let x0 = ((q & 0x0F) | xh_0) as i32;
        let x1 = ((q >> 4) | xh_1) as i32;
        y[j] = x0 as f32 * d + m;
        y[j + 16] = x1 as f32 * d + m;
    }
}

/// Quantizes one block to Q8_0 (ggml's `quantize_row_q8_0_ref`).
pub fn quantize_block_q8_0(x: &[f32; 32]) -> BlockQ8_0 {
    let amax = absmax(x);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; 32];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = c_float_to_int(roundf(v * id)) as i8;
    }
    BlockQ8_0 {
        d: fp32_to_fp16(d),
        qs,
    }
}

/// Dequantizes one Q8_0 block (ggml's `dequantize_row_q8_0`).
pub fn dequantize_block_q8_0(b: &BlockQ8_0, y: &mut [f32; 32]) {
    let d = fp16_to_fp32(b.d);
    for (y, &q) in y.iter_mut().zip(&b.qs) {
        *y = q as f32 * d;
    }
}

/// Quantizes one block to Q8_1 (ggml's `quantize_row_q8_1_ref`), including
/// `s = d * sum(qs)`.
pub fn quantize_block_q8_1(x: &[f32; 32]) -> BlockQ8_1 {
    let amax = absmax(x);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; 32];
    let mut sum = 0i32;
    for j in 0..16 {
        let v0 = x[j] * id;
        let v1 = x[16 + j] * id;
        qs[j] = c_float_to_int(roundf(v0)) as i8;
        qs[16 + j] = c_float_to_int(roundf(v1)) as i8;
        sum += qs[j] as i32;
        sum += qs[16 + j] as i32;
    }
    BlockQ8_1 {
        d: fp32_to_fp16(d),
        s: fp32_to_fp16(sum as f32 * d),
        qs,
    }
}

/// Dequantizes one Q8_1 block: `y = d * q` (ggml has no Q8_1 dequantizer; `s` is unused).
pub fn dequantize_block_q8_1(b: &BlockQ8_1, y: &mut [f32; 32]) {
    let d = fp16_to_fp32(b.d);
    for (y, &q) in y.iter_mut().zip(&b.qs) {
        *y = q as f32 * d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16v(h: half::f16) -> f32 {
        fp16_to_fp32(h)
    }

    /// -6.66 ..= 4.81: the largest magnitude is the first value, and it is negative.
    fn ramp() -> [f32; 32] {
        core::array::from_fn(|i| (i as f32 - 18.0) * 0.37)
    }

    fn max_err(x: &[f32; 32], y: &[f32; 32]) -> f32 {
        x.iter()
            .zip(y)
            .fold(0.0f32, |e, (a, b)| e.max((a - b).abs()))
    }

    #[test]
    fn q4_0_known_block() {
        let x = ramp();
        let b = quantize_block_q4_0(&x);
        // d = max / -8 with max = x[0] = -6.66, and x[0] -> q = 0 (-8 after the offset).
        let d = f16v(fp32_to_fp16(x[0] / -8.0));
        assert_eq!(f16v(b.d), d);
        assert_eq!(b.qs[0] & 0x0F, 0);
        let mut y = [0.0; 32];
        dequantize_block_q4_0(&b, &mut y);
        assert_eq!(y[0], -8.0 * d);
        assert!(max_err(&x, &y) <= 0.5 * d + 1e-3, "{}", max_err(&x, &y));
    }

    #[test]
    fn zero_blocks_are_zero() {
        let x = [0.0f32; 32];
        assert_eq!(bytemuck::bytes_of(&quantize_block_q8_0(&x))[..2], [0, 0]);
        let b = quantize_block_q4_0(&x);
        assert_eq!(b.qs, [0x88; 16]);
        let b = quantize_block_q4_1(&x);
        assert_eq!(b.qs, [0; 16]);
        let b = quantize_block_q8_1(&x);
        assert_eq!(b.qs, [0; 32]);
        assert_eq!(f16v(b.s), 0.0);
    }

    #[test]
    fn q5_and_q4_1_round_trip() {
        let x = ramp();
        let mut y = [0.0; 32];
        let b = quantize_block_q5_0(&x);
        dequantize_block_q5_0(&b, &mut y);
        assert_eq!(y[0], -16.0 * f16v(b.d));
        assert!(
            max_err(&x, &y) <= 0.5 * f16v(b.d) + 1e-3,
            "q5_0 {}",
            max_err(&x, &y)
        );
        let b = quantize_block_q5_1(&x);
        dequantize_block_q5_1(&b, &mut y);
        assert!(
            max_err(&x, &y) <= 0.5 * f16v(b.d) + 1e-2,
            "q5_1 {}",
            max_err(&x, &y)
        );
        // the largest value uses the fifth bit: q = 31
        assert_ne!(u32::from_ne_bytes(b.qh) & (1 << 31), 0);
        let b = quantize_block_q4_1(&x);
        dequantize_block_q4_1(&b, &mut y);
        assert!(
            max_err(&x, &y) <= 0.5 * f16v(b.d) + 1e-2,
            "q4_1 {}",
            max_err(&x, &y)
        );
    }

    #[test]
    fn q8_1_sum() {
        let x = ramp();
        let b = quantize_block_q8_1(&x);
        let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
        assert_eq!(b.s, fp32_to_fp16(sum as f32 * (absmax(&x) / 127.0)));
        assert_eq!(b.qs, quantize_block_q8_0(&x).qs);
    }
}
