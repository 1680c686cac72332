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

use ggml_core::{DType, Op, RopeMode, RopeParams, Tensor, MAX_DIMS};
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

/// The order of [`Op::ArgsortTopK`] between two values: descending, every NaN after
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

/// The index of the largest value of `x` as [`Op::Argmax`] defines it: a scan from
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

// ---------------------------------------------------------------------------------------
// Quantised dot products

/// Bytes of a block of the dot type `DType::vec_dot_type` of `w`.
fn dot_block_bytes(w: DType) -> usize {
    w.vec_dot_type().type_size()
}

/// The integer dot of one block and the fixed float formula of the format.
///
/// `x`: one block of weights of dtype `w`; `y`: one block of `w.vec_dot_type()`. With
/// `dx, mx` the weight block's f16 scale and min, `dy, sy` the activation block's scale
/// and `d·Σq`, `sumi` the exact integer dot:
/// - Q4_0, Q5_0, Q8_0: `(dx·dy)·sumi`
/// - Q4_1, Q5_1: `(dx·dy)·sumi + mx·sy`
/// - Q3_K, Q6_K: `(dx·dy)·sumi` where `sumi = Σ_g scale_g · Σ_{16} q·y`
/// - Q2_K, Q4_K, Q5_K: `(dx·dy)·sumi − (dminx·dy)·Σ_g min_g·bsum_g`
#[inline(always)]
pub fn block_value(w: DType, x: &[u8], y: &[u8]) -> f32 {
    match w {
        DType::Q4_0 => {
            let sumi: i32 = (0..16)
                .map(|l| {
                    let q = x[2 + l];
                    (i32::from(q & 15) - 8) * i32::from(y[2 + l] as i8)
                        + (i32::from(q >> 4) - 8) * i32::from(y[2 + l + 16] as i8)
                })
                .sum();
            (rd_f16(x, 0) * rd_f16(y, 0)) * sumi as f32
        }
        DType::Q4_1 => {
            let sumi: i32 = (0..16)
                .map(|l| {
                    let q = x[4 + l];
                    i32::from(q & 15) * i32::from(y[4 + l] as i8)
                        + i32::from(q >> 4) * i32::from(y[4 + l + 16] as i8)
                })
                .sum();
            (rd_f16(x, 0) * rd_f16(y, 0)) * sumi as f32 + rd_f16(x, 2) * rd_f16(y, 2)
        }
        DType::Q5_0 => {
            let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
            let sumi: i32 = (0..16)
                .map(|l| {
                    let q = x[6 + l];
                    let lo = i32::from(q & 15) | (((qh >> l) & 1) << 4) as i32;
                    let hi = i32::from(q >> 4) | (((qh >> (l + 16)) & 1) << 4) as i32;
                    (lo - 16) * i32::from(y[2 + l] as i8)
                        + (hi - 16) * i32::from(y[2 + l + 16] as i8)
                })
                .sum();
            (rd_f16(x, 0) * rd_f16(y, 0)) * sumi as f32
        }
        DType::Q5_1 => {
            let qh = u32::from_le_bytes([x[4], x[5], x[6], x[7]]);
            let sumi: i32 = (0..16)
                .map(|l| {
                    let q = x[8 + l];
                    let lo = i32::from(q & 15) | (((qh >> l) & 1) << 4) as i32;
                    let hi = i32::from(q >> 4) | (((qh >> (l + 16)) & 1) << 4) as i32;
                    lo * i32::from(y[4 + l] as i8) + hi * i32::from(y[4 + l + 16] as i8)
                })
                .sum();
            (rd_f16(x, 0) * rd_f16(y, 0)) * sumi as f32 + rd_f16(x, 2) * rd_f16(y, 2)
        }
        DType::Q8_0 => {
            let sumi: i32 = (0..32)
                .map(|l| i32::from(x[2 + l] as i8) * i32::from(y[2 + l] as i8))
                .sum();
            (rd_f16(x, 0) * rd_f16(y, 0)) * sumi as f32
        }
        DType::Q2K | DType::Q3K | DType::Q4K | DType::Q5K | DType::Q6K => {
            let k = unpack_kquant(w, x);
            let dy = f32::from_le_bytes([y[0], y[1], y[2], y[3]]);
            let qy = &y[4..260];
            let mut sumi = 0i32;
            let mut summins = 0i32;
            for g in 0..16 {
                let s: i32 = (0..16)
                    .map(|l| i32::from(k.q[16 * g + l]) * i32::from(qy[16 * g + l] as i8))
                    .sum();
                sumi += k.scale[g] * s;
                let bsum = i16::from_le_bytes([y[260 + 2 * g], y[261 + 2 * g]]);
                summins += k.min[g] * i32::from(bsum);
            }
            let d = k.d * dy;
            if k.has_min {
                d * sumi as f32 - (k.dmin * dy) * summins as f32
            } else {
                d * sumi as f32
            }
        }
        _ => 0.0,
    }
}

/// A k-quant super-block unpacked to signed 8-bit values and integer scales per group
/// of 16 values (`x_e = d·scale_{e/16}·q_e − dmin·min_{e/16}`).
pub struct KBlock {
    /// The 256 quants with their format's offset applied.
    pub q: [i8; 256],
    /// Integer scale of each group of 16.
    pub scale: [i32; 16],
    /// Integer min of each group of 16 (0 for formats without mins).
    pub min: [i32; 16],
    /// The super-block scale `d`.
    pub d: f32,
    /// The super-block min scale `dmin` (0 without mins).
    pub dmin: f32,
    /// Whether the format has mins (Q2_K, Q4_K, Q5_K).
    pub has_min: bool,
}

/// The 6-bit scale and min of 32-value chunk `j` of a Q4_K/Q5_K super-block's packed
/// `scales` (ggml's `get_scale_min_k4`).
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (i32, i32) {
    if j < 4 {
        (i32::from(q[j] & 63), i32::from(q[j + 4] & 63))
    } else {
        (
            i32::from((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)),
            i32::from((q[j + 4] >> 4) | ((q[j] >> 6) << 4)),
        )
    }
}

/// Unpacks one super-block of a k-quant format (layouts as ggml's `block_q*_K`).
#[inline(always)]
pub fn unpack_kquant(w: DType, x: &[u8]) -> KBlock {
    let mut k = KBlock {
        q: [0; 256],
        scale: [0; 16],
        min: [0; 16],
        d: 0.0,
        dmin: 0.0,
        has_min: false,
    };
    match w {
        DType::Q2K => {
            let (sc, qs) = (&x[0..16], &x[16..80]);
            k.d = rd_f16(x, 80);
            k.dmin = rd_f16(x, 82);
            k.has_min = true;
            for e in 0..256 {
                let (half, j, l) = (e / 128, (e % 128) / 32, e % 32);
                k.q[e] = ((qs[32 * half + l] >> (2 * j)) & 3) as i8;
            }
            for (g, &b) in sc.iter().enumerate() {
                k.scale[g] = i32::from(b & 15);
                k.min[g] = i32::from(b >> 4);
            }
        }
        DType::Q3K => {
            let (hm, qs, sc) = (&x[0..32], &x[32..96], &x[96..108]);
            k.d = rd_f16(x, 108);
            for e in 0..256 {
                let (half, j, l) = (e / 128, (e % 128) / 32, e % 32);
                let q = ((qs[32 * half + l] >> (2 * j)) & 3) as i8;
                let h = hm[l] & (1 << (4 * half + j)) != 0;
                k.q[e] = q - if h { 0 } else { 4 };
            }
            let a = |i: usize| {
                u32::from_le_bytes([sc[4 * i], sc[4 * i + 1], sc[4 * i + 2], sc[4 * i + 3]])
            };
            let (a0, a1, tmp) = (a(0), a(1), a(2));
            const KM1: u32 = 0x0303_0303;
            const KM2: u32 = 0x0f0f_0f0f;
            let aux = [
                (a0 & KM2) | ((tmp & KM1) << 4),
                (a1 & KM2) | (((tmp >> 2) & KM1) << 4),
                ((a0 >> 4) & KM2) | (((tmp >> 4) & KM1) << 4),
                ((a1 >> 4) & KM2) | (((tmp >> 6) & KM1) << 4),
            ];
            for g in 0..16 {
                let b = aux[g / 4].to_le_bytes()[g % 4] as i8;
                k.scale[g] = i32::from(b) - 32;
            }
        }
        DType::Q4K | DType::Q5K => {
            k.d = rd_f16(x, 0);
            k.dmin = rd_f16(x, 2);
            k.has_min = true;
            let sc = &x[4..16];
            let (qh, qs) = if w == DType::Q5K {
                (Some(&x[16..48]), &x[48..176])
            } else {
                (None, &x[16..144])
            };
            for e in 0..256 {
                let (j, l) = (e / 32, e % 32);
                let b = qs[32 * (j / 2) + l];
                let mut q = if j % 2 == 0 { b & 15 } else { b >> 4 };
                if let Some(qh) = qh {
                    q |= ((qh[l] >> j) & 1) << 4;
                }
                k.q[e] = q as i8;
            }
            for j in 0..8 {
                let (s, m) = scale_min_k4(j, sc);
                k.scale[2 * j] = s;
                k.scale[2 * j + 1] = s;
                k.min[2 * j] = m;
                k.min[2 * j + 1] = m;
            }
        }
        DType::Q6K => {
            let (ql, qh, sc) = (&x[0..128], &x[128..192], &x[192..208]);
            k.d = rd_f16(x, 208);
            for e in 0..256 {
                let (half, w2) = (e / 128, e % 128);
                let (kk, l) = (w2 / 32, w2 % 32);
                let b = ql[64 * half + l + 32 * (kk & 1)];
                let nib = if kk < 2 { b & 15 } else { b >> 4 };
                let h = (qh[32 * half + l] >> (2 * kk)) & 3;
                k.q[e] = (nib | (h << 4)) as i8 - 32;
            }
            for (s, &b) in k.scale.iter_mut().zip(sc) {
                *s = i32::from(b as i8);
            }
        }
        _ => {}
    }
    k
}

/// Dot of a weight row `x` (dtype `w`, quantised) with an activation row `y` already
/// quantised to `w.vec_dot_type()`, over `k` values: [`block_value`] per block, block `j`
/// into lane `j % 8`, lanes combined by [`tree8`].
pub fn vec_dot_quant(w: DType, x: &[u8], y: &[u8], k: usize) -> f32 {
    vec_dot_quant_inline(w, x, y, k)
}

/// [`vec_dot_quant`], always inlined (SIMD levels instantiate it with their features).
#[inline(always)]
pub(crate) fn vec_dot_quant_inline(w: DType, x: &[u8], y: &[u8], k: usize) -> f32 {
    let (xb, yb) = (w.type_size(), dot_block_bytes(w));
    let nb = k / w.block_size();
    let mut acc = [0f32; QLANES];
    for j in 0..nb {
        acc[j % QLANES] += block_value(w, &x[j * xb..(j + 1) * xb], &y[j * yb..(j + 1) * yb]);
    }
    tree8(acc)
}

// ---------------------------------------------------------------------------------------
// Op references

/// A tensor's descriptor with its bytes (element `(0,0,0,0)` at byte 0, strides `nb`).
#[derive(Clone, Copy)]
pub struct HostTensor<'a> {
    /// Shape, strides and dtype (the op fields are ignored).
    pub desc: &'a Tensor,
    /// The bytes.
    pub bytes: &'a [u8],
}

impl HostTensor<'_> {
    /// Element `i` as f32 (F32, F16, BF16; I32 converted).
    pub fn get(&self, i: [usize; MAX_DIMS]) -> f32 {
        let o = self.desc.offset_of(i);
        let b = &self.bytes[o..];
        match self.desc.dtype {
            DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            DType::F16 => f16_to_f32(rd_u16(b, 0)),
            DType::BF16 => bf16_to_f32(rd_u16(b, 0)),
            DType::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32,
            _ => f32::NAN,
        }
    }

    /// Element `i` of an I32 tensor.
    pub fn get_i32(&self, i: [usize; MAX_DIMS]) -> i32 {
        let o = self.desc.offset_of(i);
        i32::from_le_bytes([
            self.bytes[o],
            self.bytes[o + 1],
            self.bytes[o + 2],
            self.bytes[o + 3],
        ])
    }

    /// Row `(i1, i2, i3)` as f32 values (dequantised for quantised dtypes).
    pub fn row(&self, i1: usize, i2: usize, i3: usize) -> Vec<f32> {
        let ne0 = self.desc.ne[0];
        if self.desc.dtype.is_quantized() {
            let o = self.desc.offset_of([0, i1, i2, i3]);
            let mut out = vec![0f32; ne0];
            dequantize_row(
                self.desc.dtype,
                &self.bytes[o..o + self.desc.row_size()],
                &mut out,
            );
            out
        } else {
            (0..ne0).map(|i0| self.get([i0, i1, i2, i3])).collect()
        }
    }
}

/// Dequantises a row (quantised dtypes, via ggml-core's reference).
pub fn dequantize_row(dtype: DType, x: &[u8], out: &mut [f32]) {
    crate::quant::dequantize_row(dtype, x, out);
}

/// Stores `v` as element `i` of a contiguous tensor of `dtype` and shape `ne` in `out`.
fn put(out: &mut [u8], dtype: DType, ne: [usize; MAX_DIMS], i: [usize; MAX_DIMS], v: f32) {
    let flat = ((i[3] * ne[2] + i[2]) * ne[1] + i[1]) * ne[0] + i[0];
    let ts = dtype.type_size();
    let o = flat * ts;
    match dtype {
        DType::F32 => out[o..o + 4].copy_from_slice(&v.to_le_bytes()),
        DType::F16 => out[o..o + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes()),
        DType::BF16 => out[o..o + 2].copy_from_slice(&f32_to_bf16(v).to_le_bytes()),
        DType::I32 => out[o..o + 4].copy_from_slice(&(v as i32).to_le_bytes()),
        _ => {}
    }
}

fn rows(ne: [usize; MAX_DIMS]) -> impl Iterator<Item = (usize, usize, usize)> {
    (0..ne[3])
        .flat_map(move |i3| (0..ne[2]).flat_map(move |i2| (0..ne[1]).map(move |i1| (i1, i2, i3))))
}

fn index_of(flat: usize, ne: [usize; MAX_DIMS]) -> [usize; MAX_DIMS] {
    let i0 = flat % ne[0];
    let r = flat / ne[0];
    let i1 = r % ne[1];
    let r = r / ne[1];
    [i0, i1, r % ne[2], r / ne[2]]
}

/// Computes `node` from its operands `src` (in the order of `node.src`) into `out`, the
/// node's bytes laid out contiguously in its dtype and shape (for CPY: the bytes of a
/// contiguous destination `b` of the same shape; for SET_ROWS: the destination's current
/// bytes, of which only the named rows are rewritten). Returns an error string for
/// unsupported combinations or bad data (e.g. a row index out of range).
pub fn compute(node: &Tensor, src: &[HostTensor<'_>], out: &mut [u8]) -> Result<(), &'static str> {
    let ne = node.ne;
    let dt = node.dtype;
    match node.op {
        Op::GetRows => {
            let (a, idx) = (src[0], src[1]);
            for (i1, i2, i3) in rows(ne) {
                let r = idx.get_i32([i1, i2, i3, 0]);
                if r < 0 || r as usize >= a.desc.ne[1] {
                    return Err("row index out of range");
                }
                let row = a.row(r as usize, i2, i3 % a.desc.ne[3]);
                for (i0, &v) in row.iter().enumerate() {
                    put(out, dt, ne, [i0, i1, i2, i3], v);
                }
            }
        }
        Op::Add | Op::Mul | Op::Div => {
            let (a, b) = (src[0], src[1]);
            let bne = b.desc.ne;
            for (i1, i2, i3) in rows(ne) {
                for i0 in 0..ne[0] {
                    let x = a.get([i0, i1, i2, i3]);
                    let y = b.get([i0 % bne[0], i1 % bne[1], i2 % bne[2], i3 % bne[3]]);
                    let v = match node.op {
                        Op::Add => x + y,
                        Op::Mul => x * y,
                        _ => x / y,
                    };
                    put(out, dt, ne, [i0, i1, i2, i3], v);
                }
            }
        }
        Op::Scale { scale } => {
            for (i1, i2, i3) in rows(ne) {
                for i0 in 0..ne[0] {
                    put(
                        out,
                        dt,
                        ne,
                        [i0, i1, i2, i3],
                        src[0].get([i0, i1, i2, i3]) * scale,
                    );
                }
            }
        }
        Op::RmsNorm { eps } => {
            let mut o = vec![0f32; ne[0]];
            for (i1, i2, i3) in rows(ne) {
                rms_norm_row(&src[0].row(i1, i2, i3), eps, &mut o);
                for (i0, &v) in o.iter().enumerate() {
                    put(out, dt, ne, [i0, i1, i2, i3], v);
                }
            }
        }
        Op::Silu | Op::Swiglu => {
            for (i1, i2, i3) in rows(ne) {
                for i0 in 0..ne[0] {
                    let i = [i0, i1, i2, i3];
                    let mut v = silu(src[0].get(i));
                    if node.op == Op::Swiglu {
                        v *= src[1].get(i);
                    }
                    put(out, dt, ne, i, v);
                }
            }
        }
        Op::Gelu | Op::Geglu => {
            for (i1, i2, i3) in rows(ne) {
                for i0 in 0..ne[0] {
                    let i = [i0, i1, i2, i3];
                    let x = src[0].get(i);
                    let v = match node.op {
                        Op::Geglu => geglu(x, src[1].get(i)),
                        _ => gelu(x),
                    };
                    put(out, dt, ne, i, v);
                }
            }
        }
        Op::SoftMax { scale, max_bias } => {
            let mask = src.get(1);
            for (i1, i2, i3) in rows(ne) {
                let mut row = src[0].row(i1, i2, i3);
                let m = mask.map(|m| {
                    let (m2, m3) = (m.desc.ne[2], m.desc.ne[3]);
                    m.row(i1, i2 % m2, i3 % m3)
                });
                let slope = alibi_slope(max_bias, i2, ne[2]);
                soft_max_row(&mut row, scale, m.as_deref().map(|m| (m, slope)));
                for (i0, &v) in row.iter().enumerate() {
                    put(out, dt, ne, [i0, i1, i2, i3], v);
                }
            }
        }
        Op::Rope(p) => {
            let (a, pos) = (src[0], src[1]);
            let mut cache = vec![0f32; ne[0] + 1];
            let mut o = vec![0f32; ne[0]];
            for (i1, i2, i3) in rows(ne) {
                rope_cache(pos.get_i32([i2, 0, 0, 0]) as f32, &p, &mut cache);
                rope_row(
                    &a.row(i1, i2, i3),
                    &cache,
                    p.mode,
                    p.n_dims as usize,
                    &mut o,
                );
                for (i0, &v) in o.iter().enumerate() {
                    put(out, dt, ne, [i0, i1, i2, i3], v);
                }
            }
        }
        Op::Clamp { min, max } => {
            for (i1, i2, i3) in rows(ne) {
                for i0 in 0..ne[0] {
                    let i = [i0, i1, i2, i3];
                    put(out, dt, ne, i, clamp(src[0].get(i), min, max));
                }
            }
        }
        Op::SumRows => {
            for (i1, i2, i3) in rows(ne) {
                put(
                    out,
                    dt,
                    ne,
                    [0, i1, i2, i3],
                    sum_row(&src[0].row(i1, i2, i3)),
                );
            }
        }
        Op::Argmax => {
            for (r, (i1, i2, i3)) in rows(ne).enumerate() {
                let v = argmax_row(&src[0].row(i1, i2, i3));
                out[4 * r..4 * r + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
        Op::ArgsortTopK { k } => {
            let mut top = vec![0i32; k as usize];
            for (r, (i1, i2, i3)) in rows(ne).enumerate() {
                argsort_top_k_row(&src[0].row(i1, i2, i3), &mut top);
                for (j, &v) in top.iter().enumerate() {
                    let o = 4 * (r * ne[0] + j);
                    out[o..o + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        Op::MulMat => mul_mat(node, src[0], src[1], out)?,
        Op::MulMatId => mul_mat_id(node, src[0], src[1], src[2], out)?,
        Op::SetRows => {
            let (a, idx) = (src[0], src[1]);
            // Source rows in order: for repeated indices the last one wins.
            for i in 0..a.desc.ne[1] {
                let r = idx.get_i32([i, 0, 0, 0]);
                if r < 0 || r as usize >= ne[1] {
                    return Err("row index out of range");
                }
                for (i0, &v) in a.row(i, 0, 0).iter().enumerate() {
                    put(out, dt, ne, [i0, r as usize, 0, 0], v);
                }
            }
        }
        Op::Cpy | Op::Cont => {
            let a = src[0];
            let n = a.desc.nelements();
            let vals = || -> Vec<f32> { (0..n).map(|f| a.get(index_of(f, a.desc.ne))).collect() };
            if dt.is_quantized() && !a.desc.dtype.is_quantized() {
                let vals = vals();
                let rs = dt.row_size(ne[0]).ok_or("bad row")?;
                for (r, chunk) in vals.chunks(ne[0]).enumerate() {
                    crate::quant::quantize_row(dt, chunk, &mut out[r * rs..(r + 1) * rs]);
                }
            } else if a.desc.dtype == DType::I32 && dt == DType::I32 {
                for f in 0..n {
                    let v = a.get_i32(index_of(f, a.desc.ne));
                    out[4 * f..4 * f + 4].copy_from_slice(&v.to_le_bytes());
                }
            } else if a.desc.dtype.is_quantized() {
                // CONT of a quantised tensor: rows are copied as bytes.
                let rs = a.desc.row_size();
                for (r, (i1, i2, i3)) in rows(ne).enumerate() {
                    let o = a.desc.offset_of([0, i1, i2, i3]);
                    out[r * rs..(r + 1) * rs].copy_from_slice(&a.bytes[o..o + rs]);
                }
            } else {
                for (f, v) in vals().into_iter().enumerate() {
                    put(out, dt, ne, index_of(f, ne), v);
                }
            }
        }
        Op::Concat { dim } => {
            let (a, b) = (src[0], src[1]);
            let d = dim as usize;
            let ts = dt.type_size();
            for (i1, i2, i3) in rows(ne) {
                for i0 in 0..ne[0] {
                    let mut i = [i0, i1, i2, i3];
                    let t = if i[d] < a.desc.ne[d] {
                        a
                    } else {
                        i[d] -= a.desc.ne[d];
                        b
                    };
                    let o = t.desc.offset_of(i);
                    let flat = ((i3 * ne[2] + i2) * ne[1] + i1) * ne[0] + i0;
                    out[flat * ts..(flat + 1) * ts].copy_from_slice(&t.bytes[o..o + ts]);
                }
            }
        }
        Op::FlashAttnExt {
            scale,
            max_bias,
            softcap,
        } => flash_attn(node, src, scale, max_bias, softcap, out),
        _ => return Err("op has no reference"),
    }
    Ok(())
}

fn mul_mat(
    node: &Tensor,
    a: HostTensor<'_>,
    b: HostTensor<'_>,
    out: &mut [u8],
) -> Result<(), &'static str> {
    let ne = node.ne;
    let k = a.desc.ne[0];
    let (r2, r3) = (b.desc.ne[2] / a.desc.ne[2], b.desc.ne[3] / a.desc.ne[3]);
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for n in 0..ne[1] {
                let yrow: Vec<f32> = (0..k).map(|i| b.get([i, n, i2, i3])).collect();
                let yq = quantize_activations(a.desc.dtype.vec_dot_type(), &yrow)?;
                for m in 0..ne[0] {
                    let v = weight_row_dot(a, [0, m, i2 / r2, i3 / r3], &yrow, &yq);
                    put(out, DType::F32, ne, [m, n, i2, i3], v);
                }
            }
        }
    }
    Ok(())
}

/// Reference of [`Op::MulMatId`]: `out[m, e, t]` is the dot of row `m` of expert
/// `ids[e, t]` with `b[:, e mod B1, t]`, exactly as [`mul_mat`] computes a dot.
fn mul_mat_id(
    node: &Tensor,
    a: HostTensor<'_>,
    b: HostTensor<'_>,
    ids: HostTensor<'_>,
    out: &mut [u8],
) -> Result<(), &'static str> {
    let ne = node.ne;
    let k = a.desc.ne[0];
    let b1 = b.desc.ne[1];
    for t in 0..ne[2] {
        for e in 0..ne[1] {
            let id = ids.get_i32([e, t, 0, 0]);
            if id < 0 || id as usize >= a.desc.ne[2] {
                return Err("expert id out of range");
            }
            let yrow: Vec<f32> = (0..k).map(|i| b.get([i, e % b1, t, 0])).collect();
            let yq = quantize_activations(a.desc.dtype.vec_dot_type(), &yrow)?;
            for m in 0..ne[0] {
                let v = weight_row_dot(a, [0, m, id as usize, 0], &yrow, &yq);
                put(out, DType::F32, ne, [m, e, t, 0], v);
            }
        }
    }
    Ok(())
}

/// The dot of weight row `ai` (`[0, i1, i2, i3]`) of `a` with an activation row: `y` in
/// f32 and `yq` converted to the weights' dot type by [`quantize_activations`].
fn weight_row_dot(a: HostTensor<'_>, ai: [usize; MAX_DIMS], y: &[f32], yq: &[u8]) -> f32 {
    let k = a.desc.ne[0];
    let w = a.desc.dtype;
    match w {
        DType::F32 => {
            let x: Vec<f32> = (0..k).map(|i| a.get([i, ai[1], ai[2], ai[3]])).collect();
            dot_f32(&x, y)
        }
        DType::F16 | DType::BF16 => {
            let conv = if w == DType::F16 {
                f32_to_f16
            } else {
                f32_to_bf16
            };
            let x: Vec<u16> = (0..k)
                .map(|i| conv(a.get([i, ai[1], ai[2], ai[3]])))
                .collect();
            let y: Vec<u16> = yq
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
            if w == DType::F16 {
                dot_f16(&x, &y)
            } else {
                dot_bf16(&x, &y)
            }
        }
        _ => {
            let o = a.desc.offset_of(ai);
            vec_dot_quant(w, &a.bytes[o..o + a.desc.row_size()], yq, k)
        }
    }
}

/// Converts an activation row to the dot type: F32 bytes as they are, F16/BF16 rounded,
/// Q8_0/Q8_1/Q8_K by ggml-core's reference quantisers.
pub fn quantize_activations(vdt: DType, y: &[f32]) -> Result<Vec<u8>, &'static str> {
    Ok(match vdt {
        DType::F32 => y.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F16 => y
            .iter()
            .flat_map(|&v| f32_to_f16(v).to_le_bytes())
            .collect(),
        DType::BF16 => y
            .iter()
            .flat_map(|&v| f32_to_bf16(v).to_le_bytes())
            .collect(),
        DType::Q8_0 | DType::Q8_1 | DType::Q8K => {
            let mut out = vec![
                0u8;
                vdt.row_size(y.len())
                    .ok_or("row not a multiple of the block")?
            ];
            crate::quant::quantize_row(vdt, y, &mut out);
            out
        }
        _ => return Err("no dot type"),
    })
}

/// Reference of [`Op::FlashAttnExt`] (see the module docs for the order).
fn flash_attn(
    node: &Tensor,
    src: &[HostTensor<'_>],
    scale: f32,
    max_bias: f32,
    softcap: f32,
    out: &mut [u8],
) {
    let (q, k, v) = (src[0], src[1], src[2]);
    let mask = src.get(3);
    let (n_q, n_head, ne3) = (q.desc.ne[1], q.desc.ne[2], q.desc.ne[3]);
    let (n_kv, h_kv) = (k.desc.ne[1], k.desc.ne[2]);
    let dv = v.desc.ne[0];
    let group = n_head / h_kv;
    for i3 in 0..ne3 {
        for iq in 0..n_q {
            for h in 0..n_head {
                let hk = h / group;
                let slope = alibi_slope(max_bias, h, n_head);
                let qrow = q.row(iq, h, i3);
                let scores: Vec<Option<f32>> = (0..n_kv)
                    .map(|j| {
                        let mv = mask.map(|m| slope * m.get([j, iq, 0, 0]));
                        if mv == Some(f32::NEG_INFINITY) {
                            return None;
                        }
                        let krow = k.row(j, hk, i3);
                        let dot = if k.desc.dtype == DType::F16 {
                            let qh: Vec<u16> = qrow.iter().map(|&x| f32_to_f16(x)).collect();
                            let kh: Vec<u16> = krow.iter().map(|&x| f32_to_f16(x)).collect();
                            dot_f16(&qh, &kh)
                        } else {
                            dot_f32(&qrow, &krow)
                        };
                        let mut s = dot * scale;
                        if softcap > 0.0 {
                            s = softcap * (s / softcap).tanh();
                        }
                        Some(match mv {
                            Some(m) => s + m,
                            None => s,
                        })
                    })
                    .collect();
                let mut lanes = [f32::NEG_INFINITY; LANES];
                for (j, s) in scores.iter().enumerate() {
                    if let Some(s) = s {
                        lanes[j % LANES] = fmax(*s, lanes[j % LANES]);
                    }
                }
                let mx = tree16_max(lanes);
                let mut sum = [0f32; LANES];
                let mut acc = vec![0f32; dv];
                for (j, s) in scores.iter().enumerate() {
                    let Some(s) = s else { continue };
                    let wgt = exp(s - mx);
                    sum[j % LANES] += wgt;
                    let vrow = v.row(j, hk, i3);
                    for (a, &x) in acc.iter_mut().zip(&vrow) {
                        *a += wgt * x;
                    }
                }
                let s = tree16(sum);
                let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
                for (i0, &a) in acc.iter().enumerate() {
                    put(out, DType::F32, node.ne, [i0, h, iq, i3], a * inv);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The reference against plain f64 arithmetic, with tolerances.
    use super::*;

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
        let g64 =
            |x: f64| 0.5 * x * (1.0 + (0.7978845608028654 * x * (1.0 + 0.044715 * x * x)).tanh());
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

    #[test]
    fn rope_close_to_f64() {
        let p = RopeParams::llama(64, 10000.0);
        let mut cache = vec![0f32; 64];
        rope_cache(37.0, &p, &mut cache);
        let mut r = rng(2);
        let x: Vec<f32> = (0..80).map(|_| r()).collect();
        let mut out = vec![0f32; 80];
        rope_row(&x, &cache, RopeMode::Neox, 64, &mut out);
        for i in 0..32 {
            let th = 37.0f64 * 10000f64.powf(-2.0 * i as f64 / 64.0);
            let (c, s) = (th.cos(), th.sin());
            let (x0, x1) = (x[i] as f64, x[i + 32] as f64);
            assert!((out[i] as f64 - (x0 * c - x1 * s)).abs() < 1e-4, "pair {i}");
            assert!(
                (out[i + 32] as f64 - (x0 * s + x1 * c)).abs() < 1e-4,
                "pair {i}"
            );
        }
        assert_eq!(&out[64..], &x[64..]);
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
        let b32 = |x: &[f32]| x.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
        let b16 = |x: &[f32]| {
            x.iter()
                .flat_map(|&f| f32_to_f16(f).to_le_bytes())
                .collect::<Vec<u8>>()
        };
        let (bq, bk, bv, bm) = (b32(&q), b16(&k), b16(&v), b16(&m));
        let scale = 1.0 / 16.0;
        let mut node = Tensor::contiguous(DType::F32, [d, h, n_q, 1]).unwrap();
        node.op = Op::FlashAttnExt {
            scale,
            max_bias: 0.0,
            softcap: 0.0,
        };
        let host = |desc, bytes| HostTensor { desc, bytes };
        let src = [
            host(&tq, &bq[..]),
            host(&tk, &bk[..]),
            host(&tk, &bv[..]),
            host(&tm, &bm[..]),
        ];
        let mut out = vec![0u8; d * h * n_q * 4];
        compute(&node, &src, &mut out).unwrap();
        for iq in 0..n_q {
            for hh in 0..h {
                // With F16 K, q is rounded to f16 for the dot (ggml's q_to_vec_dot).
                let qr: Vec<f32> = q[(hh * n_q + iq) * d..][..d]
                    .iter()
                    .map(|&x| h16(x))
                    .collect();
                let s: Vec<f64> = (0..n_kv)
                    .filter(|&j| visible(j, iq))
                    .map(|j| {
                        let kr = &k[j * d..][..d];
                        qr.iter()
                            .zip(kr)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            * scale as f64
                    })
                    .collect();
                let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
                for i in 0..d {
                    let want: f64 = s
                        .iter()
                        .enumerate()
                        .map(|(j, sj)| (sj - mx).exp() / z * v[j * d + i] as f64)
                        .sum();
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

    #[test]
    fn flash_attention_close_to_f64() {
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
            scale: 0.25,
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
            let s: Vec<f64> = (0..n_kv)
                .map(|j| {
                    (0..d)
                        .map(|i| q[hh * d + i] as f64 * k[j * d + i] as f64)
                        .sum::<f64>()
                        * 0.25
                })
                .collect();
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
            for i in 0..d {
                let want: f64 = (0..n_kv)
                    .map(|j| (s[j] - mx).exp() / z * v[j * d + i] as f64)
                    .sum();
                let o = hh * d + i;
                let got = f32::from_le_bytes(out[4 * o..4 * o + 4].try_into().unwrap());
                assert!((got as f64 - want).abs() < 1e-5, "head {hh} dim {i}");
            }
        }
    }
}
