//! Scalar reference kernels: the executable definition of every op and of its
//! reduction order (invariant 2 of DESIGN.md).
//!
//! Every SIMD kernel of this crate is bit-identical to the functions here; the tests check
//! that for every ISA level, thread count and tiling. The functions come in two layers:
//!
//! - **Row primitives** (`dot_f32`, `sum_sq`, `exp`, `vec_dot_quant`, ...) define the
//!   arithmetic, operation by operation. The [`Isa::Scalar`](crate::Isa::Scalar) kernels
//!   call them directly.
//! - **Op references** ([`compute`]) define what each op computes from its operands
//!   (indexing, broadcasting, dtype conversion) with plain loops over element indices.
//!
//! # Reduction order
//!
//! - f32 dot products, sums of squares, softmax sums: element `i` feeds lane `i % 16`;
//!   each lane is updated `acc = acc + x * y` with a separate multiply and add (never a
//!   fused multiply-add, so machines without FMA give the same bits); the 16 lanes combine
//!   by [`tree16`]. Maxima use the same 16 lanes with `if x > m { x } else { m }`.
//! - F16 and BF16 dots convert both operands to f32 (exact) and multiply in f32 (exact,
//!   as the mantissas are short), then proceed as f32 dots.
//! - Quantised dots: block `j`'s integer dot is exact (i32); its float value comes from
//!   a fixed formula per format ([`block_value`]); block `j` feeds lane `j % 8`; the 8
//!   lanes combine by [`tree8`].
//! - exp: one polynomial ([`exp`]) of plain f32 multiplies and adds, shared by softmax,
//!   silu, swiglu and flash attention; sin/cos for rope come from `f32::sin`/`f32::cos`
//!   in one scalar routine ([`rope_cache`]); gelu and geglu use `f32::tanh` through
//!   ggml's f16 table ([`gelu_f16`]).
//! - Flash attention: scores per KV position; masked (−∞) positions are skipped
//!   entirely; max over the rest; weights `exp(s − max)` summed in 16 lanes by position
//!   (`j % 16`); `Σ w_j·v_j` accumulated per output element in position order.
//! - Row sums ([`sum_row`]): ggml's order, not the 16 lanes: one f64 accumulator from
//!   the first element to the last, rounded to f32 once.
//! - Mixture-of-experts products (`MUL_MAT_ID`): each `(expert slot, token)` output
//!   column is one mul_mat dot product per weight row, so it is independent of how the
//!   tokens are routed.
//!
//! Nothing depends on the thread count, the number of rows or tokens in a call, or the
//! tiling of the output: every output element is its own independent reduction.

use ggml_core::{RopeMode, RopeParams};
use half::{bf16, f16};

/// Lanes of f32 reductions.
pub const LANES: usize = 16;
/// Lanes of quantised dot products (blocks).
pub const QLANES: usize = 8;

// ---------------------------------------------------------------------------------------
// Conversions

/// f16 bits to f32 (exact).
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    f16::from_bits(h).to_f32()
}

/// f32 to f16 bits, rounding to nearest even.
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    f16::from_f32(x).to_bits()
}

/// bf16 bits to f32 (exact).
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    bf16::from_bits(h).to_f32()
}

/// f32 to bf16 bits, rounding to nearest even.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

#[inline]
fn rd_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline]
fn rd_f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(rd_u16(b, at))
}

// ---------------------------------------------------------------------------------------
// Lane trees

/// Combines 16 lanes: `l += l+8`, `l += l+4`, `l += l+2`, `l0 + l1`.
#[inline]
pub fn tree16(mut a: [f32; LANES]) -> f32 {
    for l in 0..8 {
        a[l] += a[l + 8];
    }
    tree8([a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]])
}

/// Combines 8 lanes: `l += l+4`, `l += l+2`, `l0 + l1`.
#[inline]
pub fn tree8(mut a: [f32; QLANES]) -> f32 {
    for l in 0..4 {
        a[l] += a[l + 4];
    }
    for l in 0..2 {
        a[l] += a[l + 2];
    }
    a[0] + a[1]
}

/// `if x > m { x } else { m }` (the operand order of x86 `maxps x, m`).
#[inline]
pub fn fmax(x: f32, m: f32) -> f32 {
    if x > m {
        x
    } else {
        m
    }
}

/// Combines 16 max lanes with [`fmax`]`(l+8, l)`, `(l+4, l)`, `(l+2, l)`, `(l+1, l)`.
#[inline]
pub fn tree16_max(mut a: [f32; LANES]) -> f32 {
    let mut w = 8;
    while w > 0 {
        for l in 0..w {
            a[l] = fmax(a[l + w], a[l]);
        }
        w /= 2;
    }
    a[0]
}

// ---------------------------------------------------------------------------------------
// Row primitives

/// `Σ x_i·y_i`: element `i` feeds lane `i % 16`, lanes combine by [`tree16`].
pub fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    for (i, (&a, &b)) in x.iter().zip(y).enumerate() {
        acc[i % LANES] += a * b;
    }
    tree16(acc)
}

/// Dot of two f16 rows (bits): products of the exact f32 values, then as [`dot_f32`].
pub fn dot_f16(x: &[u16], y: &[u16]) -> f32 {
    let mut acc = [0f32; LANES];
    for (i, (&a, &b)) in x.iter().zip(y).enumerate() {
        acc[i % LANES] += f16_to_f32(a) * f16_to_f32(b);
    }
    tree16(acc)
}

/// Dot of two bf16 rows (bits), as [`dot_f16`].
pub fn dot_bf16(x: &[u16], y: &[u16]) -> f32 {
    let mut acc = [0f32; LANES];
    for (i, (&a, &b)) in x.iter().zip(y).enumerate() {
        acc[i % LANES] += bf16_to_f32(a) * bf16_to_f32(b);
    }
    tree16(acc)
}

/// `Σ x_i²` in 16 lanes.
pub fn sum_sq(x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    for (i, &a) in x.iter().enumerate() {
        acc[i % LANES] += a * a;
    }
    tree16(acc)
}

/// `max x_i` in 16 lanes (−∞ for an empty row).
pub fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    for (i, &a) in x.iter().enumerate() {
        acc[i % LANES] = fmax(a, acc[i % LANES]);
    }
    tree16_max(acc)
}

pub(crate) const EXP_LO: f32 = -104.0;
pub(crate) const EXP_HI: f32 = 89.0;
pub(crate) const LOG2E: f32 = core::f32::consts::LOG2_E;
pub(crate) const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
pub(crate) const LN2_HI: f32 = 0.693_359_4; // 0.693359375, exact in few bits
pub(crate) const LN2_LO: f32 = -2.121_944_4e-4;
pub(crate) const P0: f32 = 1.987_569_1e-4;
pub(crate) const P1: f32 = 1.398_199_9e-3;
pub(crate) const P2: f32 = 8.333_452e-3;
pub(crate) const P3: f32 = 4.166_579_6e-2;
pub(crate) const P4: f32 = 1.666_666_5e-1;
pub(crate) const P5: f32 = 0.5; // Cephes: 5.0000001201e-1, which rounds to 0.5 in f32

/// The exponential used by every kernel: Cody–Waite reduction `x = n·ln2 + r` (n rounded
/// to nearest by the 1.5·2²³ trick), Cephes' degree-6 polynomial for `e^r` in plain
/// multiplies and adds, and scaling by `2^n` as two exact power-of-two factors (so
/// subnormal results round once). Input is clamped to [−104, 89] (so −∞ gives +0 and
/// large inputs +∞); NaN propagates. Within 2 ulp of `exp` on normal results. The SIMD
/// versions execute exactly these operations.
#[inline]
pub fn exp(x: f32) -> f32 {
    let x = if EXP_LO > x { EXP_LO } else { x };
    let x = if EXP_HI < x { EXP_HI } else { x };
    let k = x * LOG2E + MAGIC;
    let n = k - MAGIC;
    let ni = (k.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let r = x - n * LN2_HI;
    let r = r - n * LN2_LO;
    let z = r * r;
    let p = (((((P0 * r + P1) * r + P2) * r + P3) * r + P4) * r + P5) * z + r + 1.0;
    let n1 = ni >> 1;
    let n2 = ni.wrapping_sub(n1);
    let s1 = f32::from_bits((n1.wrapping_add(127) as u32) << 23);
    let s2 = f32::from_bits((n2.wrapping_add(127) as u32) << 23);
    p * s1 * s2
}

/// `x / (1 + exp(−x))`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// ggml's `SQRT_2_OVER_PI`: the f32 nearest to 0.79788456080286535587989211986876.
pub const GELU_SQRT_2_OVER_PI: f32 = f32::from_bits(0x3f4c_422a);
/// ggml's `GELU_COEF_A`: the f32 nearest to 0.044715.
pub const GELU_COEF_A: f32 = f32::from_bits(0x3d37_2713);

/// ggml's `ggml_gelu_f32`: `0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x·x)))` in f32, left
/// to right, `tanh` from the C library (`f32::tanh`), with `1 + 0.044715·x·x` as one fused
/// multiply-add `fma(0.044715·x, x, 1)`, every other step rounded on its own.
///
/// The fused step is what llama.cpp's builds compute: ggml-cpu is C compiled as
/// `-std=gnu11`, where GCC contracts `1.0f + GELU_COEF_A*x*x` into an FMA on every target
/// that has one (x86-64 from Haswell on, as `-march=native` and the `GGML_CPU_ALL_VARIANTS`
/// builds select, and aarch64). Checked against llama.cpp's table (llama-cpp-python
/// 0.3.36, x86-64 AVX2+FMA): all 65536 entries equal; with the multiply and add rounded
/// separately, entry 0xBFFF (x = −1.9990234375) is one f16 place lower. `f32::mul_add`
/// is exact on every host (software where the CPU has no FMA), so the table is the same
/// everywhere. Only [`gelu_f16`] (the table) calls this in ggml.
#[inline]
pub fn gelu_f32(x: f32) -> f32 {
    let z = GELU_SQRT_2_OVER_PI * x * (GELU_COEF_A * x).mul_add(x, 1.0);
    0.5 * x * (1.0 + z.tanh())
}

/// Entry `h` of ggml's `ggml_table_gelu_f16`: f16 bits of [`gelu_f32`] of the f16 value
/// with bits `h`. NaN entries hold a NaN.
#[inline]
pub fn gelu_f16(h: u16) -> u16 {
    f32_to_f16(gelu_f32(f16_to_f32(h)))
}

/// GELU (tanh approximation) as ggml's CPU computes f32 GELU (`ggml_vec_gelu_f32` with
/// `GGML_GELU_FP16`): `x <= -10` gives 0, `x >= 10` gives `x`, anything else (NaN too)
/// goes through the f16 table: `f16_to_f32(gelu_f16(f32_to_f16(x)))`. So NaN gives NaN,
/// `+∞` gives `+∞`, `−∞` gives `+0`. This computes the table entry directly; the
/// backend's kernel looks it up in a table built from [`gelu_f16`] (same bits).
#[inline]
pub fn gelu(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        f16_to_f32(gelu_f16(f32_to_f16(x)))
    }
}

/// GEGLU of one element as ggml's `ggml_vec_geglu_f32` (`GGML_GELU_FP16`): `x <= -10`
/// gives exactly 0 (whatever `g` is), `x >= 10` gives `x·g`, otherwise
/// `f16_to_f32(gelu_f16(f32_to_f16(x)))·g`.
#[inline]
pub fn geglu(x: f32, g: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x * g
    } else {
        f16_to_f32(gelu_f16(f32_to_f16(x))) * g
    }
}

/// Replaces `x_i` by `exp(x_i − max)` and returns their sum in 16 lanes.
pub fn exp_shift_sum(x: &mut [f32], max: f32) -> f32 {
    let mut acc = [0f32; LANES];
    for (i, v) in x.iter_mut().enumerate() {
        *v = exp(*v - max);
        acc[i % LANES] += *v;
    }
    tree16(acc)
}

/// `out = x · (1 / sqrt(Σx²/n + eps))`.
pub fn rms_norm_row(x: &[f32], eps: f32, out: &mut [f32]) {
    let mean = sum_sq(x) / x.len() as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * scale;
    }
}

/// Softmax of a row in place: `w = x·scale (+ slope·mask)`, `e = exp(w − max w)`,
/// `out = e · (1 / Σe)`. `mask` entries of −∞ give exactly 0.
pub fn soft_max_row(x: &mut [f32], scale: f32, mask: Option<(&[f32], f32)>) {
    for v in x.iter_mut() {
        *v *= scale;
    }
    if let Some((m, slope)) = mask {
        for (v, &mv) in x.iter_mut().zip(m) {
            *v += slope * mv;
        }
    }
    let mx = max(x);
    let sum = exp_shift_sum(x, mx);
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// ALiBi slope of head `h` of `n_head` (1 when `max_bias` is 0), as ggml.
pub fn alibi_slope(max_bias: f32, h: usize, n_head: usize) -> f32 {
    if max_bias <= 0.0 {
        return 1.0;
    }
    let n_head_log2 = 1u32 << (n_head as f32).log2().floor() as u32;
    let m0 = 2f32.powf(-max_bias / n_head_log2 as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
    if (h as u32) < n_head_log2 {
        m0.powf((h + 1) as f32)
    } else {
        m1.powf((2 * (h as u32 - n_head_log2) + 1) as f32)
    }
}

fn yarn_corr_dim(n_dims: u32, n_ctx_orig: u32, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * core::f32::consts::PI)).ln()
        / (2.0 * base.ln())
}

/// `(cos θ_i, sin θ_i)` pairs for position `pos`, pair index `i < n_dims/2`, as ggml's
/// `ggml_rope_cache_init` with YaRN: `cache[2i] = cos`, `cache[2i+1] = sin`.
pub fn rope_cache(pos: f32, p: &RopeParams, cache: &mut [f32]) {
    let n_dims = p.n_dims;
    let theta_scale = p.freq_base.powf(-2.0 / n_dims as f32);
    let corr = if p.ext_factor != 0.0 {
        let start = yarn_corr_dim(n_dims, p.n_ctx_orig, p.beta_fast, p.freq_base).floor();
        let end = yarn_corr_dim(n_dims, p.n_ctx_orig, p.beta_slow, p.freq_base).ceil();
        [start.max(0.0), end.min(n_dims as f32 - 1.0)]
    } else {
        [0.0, 0.0]
    };
    let mut theta = pos;
    for (i, pair) in cache
        .chunks_exact_mut(2)
        .take(n_dims as usize / 2)
        .enumerate()
    {
        let theta_extrap = theta;
        let theta_interp = p.freq_scale * theta_extrap;
        let mut th = theta_interp;
        let mut mscale = p.attn_factor;
        if p.ext_factor != 0.0 {
            let y = (i as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
            let ramp = 1.0 - y.clamp(0.0, 1.0);
            let mix = ramp * p.ext_factor;
            th = theta_interp * (1.0 - mix) + theta_extrap * mix;
            mscale *= 1.0 + 0.1 * (1.0 / p.freq_scale).ln();
        }
        pair[0] = th.cos() * mscale;
        pair[1] = th.sin() * mscale;
        theta *= theta_scale;
    }
}

/// Rotates one row (`x` and `out` of `ne0` values) with a [`rope_cache`].
pub fn rope_row(x: &[f32], cache: &[f32], mode: RopeMode, n_dims: usize, out: &mut [f32]) {
    let half = n_dims / 2;
    for i in 0..half {
        let (c, s) = (cache[2 * i], cache[2 * i + 1]);
        let (a, b) = match mode {
            RopeMode::Normal => (2 * i, 2 * i + 1),
            RopeMode::Neox => (i, i + half),
        };
        let (x0, x1) = (x[a], x[b]);
        out[a] = x0 * c - x1 * s;
        out[b] = x0 * s + x1 * c;
    }
    out[n_dims..].copy_from_slice(&x[n_dims..]);
}

/// A row's sum as ggml's `ggml_vec_sum_f32` (without Accelerate): each value widened to
/// f64 and added from the first to the last, the f64 total rounded to f32 once.
pub fn sum_row(x: &[f32]) -> f32 {
    let mut s = 0f64;
    for &v in x {
        s += f64::from(v);
    }
    s as f32
}

/// `max(min(x, hi), lo)` with ggml's `MIN`/`MAX` macros (`a < b ? a : b`,
/// `a > b ? a : b`), except that NaN stays NaN (the macros would give `hi`).
#[inline]
pub fn clamp(x: f32, lo: f32, hi: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let m = if x < hi { x } else { hi };
    if m > lo {
        m
    } else {
        lo
    }
}

/// The order of [`Op::ArgsortTopK`](ggml_core::Op::ArgsortTopK) between two values: descending, every NaN after
/// every number, NaNs (and equal numbers, `-0 == +0` included) equal. A sort that is
/// stable under it puts ties in index order.
pub fn top_k_order(a: f32, b: f32) -> core::cmp::Ordering {
    use core::cmp::Ordering;
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => b.partial_cmp(&a).unwrap_or(Ordering::Equal),
    }
}

/// The indices of the `out.len()` largest values of `x` in [`top_k_order`], ties in
/// index order: a stable sort of all indices, then its first entries.
pub fn argsort_top_k_row(x: &[f32], out: &mut [i32]) {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&i, &j| top_k_order(x[i], x[j]));
    for (o, &i) in out.iter_mut().zip(&idx) {
        *o = i as i32;
    }
}

/// The index of the largest value of `x` as [`Op::Argmax`](ggml_core::Op::Argmax) defines it: a scan from
/// element 0 that moves to `i` only when `x[i] > x[best]`, so ties keep the lowest index,
/// a NaN never wins and a NaN first element gives 0 (greedy sampling's `argmax`).
pub fn argmax_row(x: &[f32]) -> i32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best as i32
}

mod ops;
mod quant_dot;

pub use ops::{compute, dequantize_row, quantize_activations, HostTensor};
pub(crate) use quant_dot::vec_dot_quant_inline;
pub use quant_dot::{block_value, unpack_kquant, vec_dot_quant, KBlock};

#[cfg(test)]
mod tests;
