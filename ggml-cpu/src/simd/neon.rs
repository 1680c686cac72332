//! AArch64 levels: NEON (baseline), NEON with the dot-product extension (`sdot`), and
//! NEON with the 8-bit integer matrix multiply (`smmla`).
//!
//! Float kernels (shared by the three levels; F32, F16 and BF16 dots) keep the
//! reference's 16 lanes of f32 reductions in four 4-lane registers (lanes 0-3, 4-7, 8-11,
//! 12-15) with separate multiplies and adds, and combine them by [`r::tree16`];
//! elementwise kernels run the reference's operations 4 elements at a time.
//!
//! Quantised tiles (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to Q6_K) put up to 4 outputs (pairs
//! of a weight row and an activation row) in the 4 lanes of a register: per block, each
//! lane's exact integer dot (widening multiplies on NEON, `sdot` with dotprod, one
//! `smmla` per 8 bytes for a 2 × 2 pair of rows and columns with i8mm), then the format's
//! float formula of [`r::block_value`] lane-wise; block `j` feeds accumulator `j % 8`,
//! and the 8 accumulators combine lane-wise as [`r::tree8`]. The activations are the standard
//! Q8_0/Q8_1/Q8_K rows, quantised by this level (Q8_0, Q8_1, Q8_K) exactly as ggml-core.
//! The K-quants' integers are in [`kquant`] (with i8mm, the 2 × 2 group sums of `smmla`
//! times each row's group scales).
//!
//! A single activation column (generation) runs the matrix × vector kernels (`gemv`): the
//! same lanes as the tiles with up to 4 weight rows against the one activation row (the
//! tile's own path for one column at every level), called without the tile's pairing of
//! rows and columns.
//!
//! `sdot` and `smmla` are emitted with `asm!` (their intrinsics are not stable Rust);
//! the tables that use them are installed only where the CPU reports the extension.

use std::arch::aarch64::*;

use ggml_core::DType;

use super::{as_f32, as_u16, Kernels, MmTile};
use crate::isa::Isa;
use crate::reference as r;
use quant::{gemv_dotprod, gemv_neon, tile_quant_dotprod, tile_quant_i8mm, tile_quant_neon};

mod kquant;
mod quant;
#[cfg(test)]
mod tests;

/// NEON (baseline on aarch64).
pub(crate) static KERNELS: Kernels = Kernels {
    gemv: gemv_neon,
    ..kernels_table!(
        Isa::Neon,
        heads: Some(dots_f16_heads),
        quantize: quantize,
        mm: mm_neon,
        pack: super::scalar::pack,
        unpacked: super::no_unpacked,
    )
};

/// NEON with FEAT_DotProd: the quantised tiles' integer dots by `sdot`.
pub(crate) static KERNELS_DOTPROD: Kernels = Kernels {
    isa: Isa::NeonDotprod,
    mm: mm_dotprod,
    gemv: gemv_dotprod,
    ..KERNELS
};

/// NEON with FEAT_DotProd and FEAT_I8MM: tiles of 2 or more rows and columns by `smmla`
/// (a single column has no pair of columns for `smmla`: its gemv is dotprod's).
pub(crate) static KERNELS_I8MM: Kernels = Kernels {
    isa: Isa::NeonI8mm,
    mm: mm_i8mm,
    gemv: gemv_dotprod,
    ..KERNELS
};

// Table entries over the kernels below. NEON is baseline on aarch64.
safe_common!();
safe! {
    fn dots_f16_heads(qs: &[&[u16]], k: &[u16], stride: usize, outs: &mut [&mut [f32]]) = dots_f16_heads_imp;
    fn tile_bf16(w: DType, k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) = tile_bf16_imp;
}

// ---------------------------------------------------------------------------------------
// f32 reductions

#[inline]
#[target_feature(enable = "neon")]
fn lanes(a: [float32x4_t; 4]) -> [f32; 16] {
    let mut l = [0f32; 16];
    for (i, v) in a.iter().enumerate() {
        // SAFETY: 4 floats of room at 4i.
        unsafe { vst1q_f32(l.as_mut_ptr().add(4 * i), *v) };
    }
    l
}

/// [`r::tree16`] of the 16 lanes held in `a` (lanes 0-3, 4-7, 8-11, 12-15), in vector
/// registers: `l += l+8`, `l += l+4`, `l += l+2`, `l0 + l1`, each add with the same
/// operands in the same order as the reference's.
#[inline]
#[target_feature(enable = "neon")]
fn tree16_lanes(a: [float32x4_t; 4]) -> f32 {
    let b0 = vaddq_f32(a[0], a[2]);
    let b1 = vaddq_f32(a[1], a[3]);
    let c = vaddq_f32(b0, b1);
    let d = vadd_f32(vget_low_f32(c), vget_high_f32(c));
    vpadds_f32(d)
}

/// 4 f16 values (bits) at `p` as f32 (exact), by `fcvtl` (in `asm!`: the f16 vector
/// intrinsics need Rust 1.94, above this crate's minimum).
///
/// # Safety
/// 4 readable u16 at `p`.
#[inline(always)]
unsafe fn ld_f16(p: *const u16) -> float32x4_t {
    // SAFETY: caller's contract.
    let h = unsafe { vld1_u16(p) };
    let out: float32x4_t;
    // SAFETY: register operands only; fcvtl is base AArch64 SIMD.
    unsafe {
        core::arch::asm!(
            "fcvtl {o:v}.4s, {h:v}.4h",
            o = lateout(vreg) out,
            h = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    out
}

/// 4 bf16 values (bits) at `p` as f32 (exact: the bits shifted into the high half).
///
/// # Safety
/// 4 readable u16 at `p`.
#[inline(always)]
unsafe fn ld_bf16(p: *const u16) -> float32x4_t {
    // SAFETY: caller's contract.
    vreinterpretq_f32_u32(vshll_n_u16::<16>(unsafe { vld1_u16(p) }))
}

/// 4 f32 values as f16 bits by `fcvtn`, rounding to nearest even (the FPCR mode Linux
/// runs programs with), as the reference.
#[inline]
#[target_feature(enable = "neon")]
fn to_f16(x: float32x4_t) -> uint16x4_t {
    let out: uint16x4_t;
    // SAFETY: register operands only; fcvtn is base AArch64 SIMD.
    unsafe {
        core::arch::asm!(
            "fcvtn {o:v}.4h, {x:v}.4s",
            o = lateout(vreg) out,
            x = in(vreg) x,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    out
}

/// 4 f32 values at `p`.
///
/// # Safety
/// 4 readable f32 at `p`.
#[inline(always)]
unsafe fn ld_f32(p: *const f32) -> float32x4_t {
    // SAFETY: caller's contract.
    unsafe { vld1q_f32(p) }
}

macro_rules! dot_impl {
    ($name:ident, $t:ty, $ld:ident, $conv:expr) => {
        /// Dot in 16 lanes (element `i` in lane `i % 16`), then [`r::tree16`].
        #[target_feature(enable = "neon")]
        fn $name(x: &[$t], y: &[$t]) -> f32 {
            let n = x.len().min(y.len());
            let mut a = [vdupq_n_f32(0.0); 4];
            let mut i = 0;
            while i + 16 <= n {
                for (k, acc) in a.iter_mut().enumerate() {
                    // SAFETY: 4 values at i + 4k in both rows; separate multiply and add.
                    let p = unsafe {
                        vmulq_f32(
                            $ld(x.as_ptr().add(i + 4 * k)),
                            $ld(y.as_ptr().add(i + 4 * k)),
                        )
                    };
                    *acc = vaddq_f32(*acc, p);
                }
                i += 16;
            }
            if i == n {
                return tree16_lanes(a);
            }
            let mut l = lanes(a);
            for j in i..n {
                l[j - i] += $conv(x[j]) * $conv(y[j]);
            }
            r::tree16(l)
        }
    };
}

dot_impl!(dot_f32_imp, f32, ld_f32, |v: f32| v);
dot_impl!(dot_f16_imp, u16, ld_f16, r::f16_to_f32);
dot_impl!(dot_bf16_imp, u16, ld_bf16, r::bf16_to_f32);

#[target_feature(enable = "neon")]
fn sum_sq_imp(x: &[f32]) -> f32 {
    let n = x.len();
    let mut a = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        for (k, acc) in a.iter_mut().enumerate() {
            // SAFETY: 4 floats at i + 4k.
            let v = unsafe { ld_f32(x.as_ptr().add(i + 4 * k)) };
            *acc = vaddq_f32(*acc, vmulq_f32(v, v));
        }
        i += 16;
    }
    let mut l = lanes(a);
    for j in i..n {
        l[j - i] += x[j] * x[j];
    }
    r::tree16(l)
}

/// [`r::fmax`] lane-wise: `x > m ? x : m` (NEON's `fmax` differs on NaN and ±0).
#[inline]
#[target_feature(enable = "neon")]
fn fmax4(x: float32x4_t, m: float32x4_t) -> float32x4_t {
    vbslq_f32(vcgtq_f32(x, m), x, m)
}

#[target_feature(enable = "neon")]
fn max_imp(x: &[f32]) -> f32 {
    let n = x.len();
    let mut a = [vdupq_n_f32(f32::NEG_INFINITY); 4];
    let mut i = 0;
    while i + 16 <= n {
        for (k, acc) in a.iter_mut().enumerate() {
            // SAFETY: 4 floats at i + 4k.
            *acc = fmax4(unsafe { ld_f32(x.as_ptr().add(i + 4 * k)) }, *acc);
        }
        i += 16;
    }
    let mut l = lanes(a);
    for j in i..n {
        l[j - i] = r::fmax(x[j], l[j - i]);
    }
    r::tree16_max(l)
}

// ---------------------------------------------------------------------------------------
// exp and the elementwise kernels

/// [`r::exp`] on 4 lanes: the same operations in the same order.
#[inline]
#[target_feature(enable = "neon")]
fn exp4(x: float32x4_t) -> float32x4_t {
    let s = vdupq_n_f32;
    // fmax/fmin propagate NaN, as the reference's comparisons keep a NaN x; the bounds
    // are nonzero, so ±0 never decides.
    let x = vmaxq_f32(s(r::EXP_LO), x);
    let x = vminq_f32(s(r::EXP_HI), x);
    let magic = s(r::MAGIC);
    let k = vaddq_f32(vmulq_f32(x, s(r::LOG2E)), magic);
    let n = vsubq_f32(k, magic);
    let ni = vsubq_s32(
        vreinterpretq_s32_f32(k),
        vdupq_n_s32(r::MAGIC.to_bits() as i32),
    );
    let rr = vsubq_f32(x, vmulq_f32(n, s(r::LN2_HI)));
    let rr = vsubq_f32(rr, vmulq_f32(n, s(r::LN2_LO)));
    let z = vmulq_f32(rr, rr);
    let mut p = vaddq_f32(vmulq_f32(s(r::P0), rr), s(r::P1));
    p = vaddq_f32(vmulq_f32(p, rr), s(r::P2));
    p = vaddq_f32(vmulq_f32(p, rr), s(r::P3));
    p = vaddq_f32(vmulq_f32(p, rr), s(r::P4));
    p = vaddq_f32(vmulq_f32(p, rr), s(r::P5));
    p = vaddq_f32(vaddq_f32(vmulq_f32(p, z), rr), s(1.0));
    let n1 = vshrq_n_s32::<1>(ni);
    let n2 = vsubq_s32(ni, n1);
    let bias = vdupq_n_s32(127);
    let s1 = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(n1, bias)));
    let s2 = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(n2, bias)));
    vmulq_f32(vmulq_f32(p, s1), s2)
}

/// [`r::silu`] on 4 lanes.
#[inline]
#[target_feature(enable = "neon")]
fn silu4(x: float32x4_t) -> float32x4_t {
    vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0), exp4(vnegq_f32(x))))
}

#[target_feature(enable = "neon")]
fn exp_shift_sum_imp(x: &mut [f32], m: f32) -> f32 {
    let n = x.len();
    let mv = vdupq_n_f32(m);
    let mut a = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        for (k, acc) in a.iter_mut().enumerate() {
            // SAFETY: 4 floats at i + 4k.
            unsafe {
                let p = x.as_mut_ptr().add(i + 4 * k);
                let e = exp4(vsubq_f32(ld_f32(p), mv));
                vst1q_f32(p, e);
                *acc = vaddq_f32(*acc, e);
            }
        }
        i += 16;
    }
    let mut l = lanes(a);
    for j in i..n {
        x[j] = r::exp(x[j] - m);
        l[j - i] += x[j];
    }
    r::tree16(l)
}

#[target_feature(enable = "neon")]
fn silu_imp(x: &[f32], out: &mut [f32]) {
    let n = x.len().min(out.len());
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: 4 floats at i in both.
        unsafe { vst1q_f32(out.as_mut_ptr().add(i), silu4(ld_f32(x.as_ptr().add(i)))) };
        i += 4;
    }
    for j in i..n {
        out[j] = r::silu(x[j]);
    }
}

#[target_feature(enable = "neon")]
fn swiglu_imp(a: &[f32], b: &[f32], out: &mut [f32]) {
    let n = a.len().min(b.len()).min(out.len());
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: 4 floats at i in all three.
        unsafe {
            let s = silu4(ld_f32(a.as_ptr().add(i)));
            vst1q_f32(
                out.as_mut_ptr().add(i),
                vmulq_f32(s, ld_f32(b.as_ptr().add(i))),
            );
        }
        i += 4;
    }
    for j in i..n {
        out[j] = r::silu(a[j]) * b[j];
    }
}

#[target_feature(enable = "neon")]
fn f32_to_f16_imp(x: &[f32], out: &mut [u16]) {
    let n = x.len().min(out.len());
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: 4 values at i in both.
        unsafe { vst1_u16(out.as_mut_ptr().add(i), to_f16(ld_f32(x.as_ptr().add(i)))) };
        i += 4;
    }
    for j in i..n {
        out[j] = r::f32_to_f16(x[j]);
    }
}

#[target_feature(enable = "neon")]
fn axpy_f32_imp(acc: &mut [f32], w: f32, v: &[f32]) {
    let n = acc.len().min(v.len());
    let wv = vdupq_n_f32(w);
    let mut i = 0;
    while i + 4 <= n {
        // SAFETY: 4 floats at i in both.
        unsafe {
            let p = acc.as_mut_ptr().add(i);
            vst1q_f32(
                p,
                vaddq_f32(ld_f32(p), vmulq_f32(wv, ld_f32(v.as_ptr().add(i)))),
            );
        }
        i += 4;
    }
    for j in i..n {
        acc[j] += w * v[j];
    }
}

// ---------------------------------------------------------------------------------------
// Attention rows

#[target_feature(enable = "neon")]
fn dots_f16_imp(q: &[u16], k: &[u16], stride: usize, out: &mut [f32]) {
    let d = q.len();
    assert!(
        k.len() >= super::rows_span(out.len(), stride, d),
        "key rows out of bounds"
    );
    for (j, o) in out.iter_mut().enumerate() {
        *o = dot_f16_imp(q, &k[j * stride..j * stride + d]);
    }
}

/// Several queries against the same key rows, up to 4 at a time, each row converted once
/// for them: per query and row, [`dot_f16_imp`]'s 16 lanes and tree (rows whose length is not
/// a multiple of 16 take [`dots_f16`] per query). Queries of at most [`HEADS_D`] values are
/// converted to f32 once, not once per key row.
#[target_feature(enable = "neon")]
fn dots_f16_heads_imp(qs: &[&[u16]], k: &[u16], stride: usize, outs: &mut [&mut [f32]]) {
    let d = qs.first().map_or(0, |q| q.len());
    let n = outs.first().map_or(0, |o| o.len());
    assert!(
        qs.len() == outs.len()
            && qs.iter().all(|q| q.len() == d)
            && outs.iter().all(|o| o.len() == n),
        "queries or outputs of different lengths"
    );
    assert!(
        k.len() >= super::rows_span(n, stride, d),
        "key rows out of bounds"
    );
    if !d.is_multiple_of(16) || d > HEADS_D {
        for (q, o) in qs.iter().zip(outs.iter_mut()) {
            dots_f16_imp(q, k, stride, o);
        }
        return;
    }
    for (qg, og) in qs.chunks(4).zip(outs.chunks_mut(4)) {
        // SAFETY (each arm): rows of d values, a multiple of 16 and at most HEADS_D, and n
        // key rows `stride` apart (asserted); NEON is baseline.
        unsafe {
            match qg.len() {
                1 => dots_heads::<1>(qg, k, stride, og),
                2 => dots_heads::<2>(qg, k, stride, og),
                3 => dots_heads::<3>(qg, k, stride, og),
                _ => dots_heads::<4>(qg, k, stride, og),
            }
        }
    }
}

/// Longest query row whose f32 copy [`dots_f16_heads`] keeps on the stack.
const HEADS_D: usize = 256;

/// [`dots_f16_heads`] for `NQ` queries: the queries converted once into f32, then per key
/// row the 16 lanes of each query in registers, combined by [`tree16_lanes`].
///
/// # Safety
/// `NQ` queries and outputs; query length a multiple of 16 and at most [`HEADS_D`]; the
/// outputs' number of key rows, `stride` apart, in `k`.
#[inline(always)]
unsafe fn dots_heads<const NQ: usize>(
    qs: &[&[u16]],
    k: &[u16],
    stride: usize,
    outs: &mut [&mut [f32]],
) {
    let d = qs[0].len();
    let n = outs[0].len();
    let mut qf = [[0f32; HEADS_D]; NQ];
    for (f, q) in qf.iter_mut().zip(qs) {
        for (x, &h) in f.iter_mut().zip(q.iter()) {
            *x = r::f16_to_f32(h);
        }
    }
    for j in 0..n {
        let row = k[j * stride..j * stride + d].as_ptr();
        let mut acc = [[vdupq_n_f32(0.0); 4]; NQ];
        let mut i = 0;
        while i < d {
            // SAFETY: 16 values at i in the row and in every query (caller's contract).
            unsafe {
                let rv = [
                    ld_f16(row.add(i)),
                    ld_f16(row.add(i + 4)),
                    ld_f16(row.add(i + 8)),
                    ld_f16(row.add(i + 12)),
                ];
                for (q, ah) in qf.iter().zip(acc.iter_mut()) {
                    for (g, a) in ah.iter_mut().enumerate() {
                        *a = vaddq_f32(*a, vmulq_f32(ld_f32(q.as_ptr().add(i + 4 * g)), rv[g]));
                    }
                }
            }
            i += 16;
        }
        for (o, ah) in outs.iter_mut().zip(acc) {
            o[j] = tree16_lanes(ah);
        }
    }
}

/// Per head, `acc += w[j] · v_j` for the rows `j` in order (the reference's order per
/// element, separate multiply and add). Up to 4 heads at a time, 16 elements at a time:
/// their accumulators stay in registers over all the rows, and each row's 16 values are
/// converted once for the heads.
#[target_feature(enable = "neon")]
fn axpy_f16_rows_imp(accs: &mut [&mut [f32]], ws: &[&[f32]], v: &[u16], stride: usize) {
    let d = accs.first().map_or(0, |a| a.len());
    let n = ws.first().map_or(0, |w| w.len());
    assert!(
        accs.len() == ws.len()
            && accs.iter().all(|a| a.len() == d)
            && ws.iter().all(|w| w.len() == n),
        "accumulators or weights of different lengths"
    );
    assert!(
        v.len() >= super::rows_span(n, stride, d),
        "value rows out of bounds"
    );
    for (ag, wg) in accs.chunks_mut(4).zip(ws.chunks(4)) {
        // SAFETY (each arm): accumulators of d values, n weights, n value rows of d values
        // `stride` apart (asserted); NEON is baseline.
        unsafe {
            match ag.len() {
                1 => axpy_heads::<1>(ag, wg, v, stride),
                2 => axpy_heads::<2>(ag, wg, v, stride),
                3 => axpy_heads::<3>(ag, wg, v, stride),
                _ => axpy_heads::<4>(ag, wg, v, stride),
            }
        }
    }
}

/// [`axpy_f16_rows`] for `NH` heads: elements 16 at a time over every row, then the
/// remaining elements 4 and 1 at a time per head and row.
///
/// # Safety
/// `NH` accumulators of `d` values and `NH` weight rows of `n` values; `n` value rows of `d`
/// values, `stride` apart, in `v`.
#[inline(always)]
unsafe fn axpy_heads<const NH: usize>(
    accs: &mut [&mut [f32]],
    ws: &[&[f32]],
    v: &[u16],
    stride: usize,
) {
    let (d, n) = (accs[0].len(), ws[0].len());
    let mut c = 0;
    while c + 16 <= d {
        let mut acc = [[vdupq_n_f32(0.0); 4]; NH];
        for (ah, a) in acc.iter_mut().zip(accs.iter()) {
            for (g, x) in ah.iter_mut().enumerate() {
                // SAFETY: 4 values at c + 4g < d in the accumulator.
                *x = unsafe { ld_f32(a.as_ptr().add(c + 4 * g)) };
            }
        }
        for j in 0..n {
            // SAFETY: 16 values at c of row j (caller's contract).
            let x = unsafe {
                let row = v.as_ptr().add(j * stride + c);
                [
                    ld_f16(row),
                    ld_f16(row.add(4)),
                    ld_f16(row.add(8)),
                    ld_f16(row.add(12)),
                ]
            };
            for (ah, w) in acc.iter_mut().zip(ws) {
                let wv = vdupq_n_f32(w[j]);
                for (a, &xg) in ah.iter_mut().zip(&x) {
                    *a = vaddq_f32(*a, vmulq_f32(wv, xg));
                }
            }
        }
        for (ah, a) in acc.iter().zip(accs.iter_mut()) {
            for (g, &x) in ah.iter().enumerate() {
                // SAFETY: as the loads above.
                unsafe { vst1q_f32(a.as_mut_ptr().add(c + 4 * g), x) };
            }
        }
        c += 16;
    }
    if c == d {
        return;
    }
    for (acc, w) in accs.iter_mut().zip(ws) {
        for (j, &wj) in w.iter().enumerate() {
            let row = &v[j * stride..j * stride + d];
            let wv = vdupq_n_f32(wj);
            let mut e = c;
            while e + 4 <= d {
                // SAFETY: 4 values at e in the accumulator and the row (both d long).
                unsafe {
                    let p = acc.as_mut_ptr().add(e);
                    let x = ld_f16(row.as_ptr().add(e));
                    vst1q_f32(p, vaddq_f32(ld_f32(p), vmulq_f32(wv, x)));
                }
                e += 4;
            }
            for (a, &h) in acc[e..].iter_mut().zip(&row[e..]) {
                *a += wj * r::f16_to_f32(h);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Activation quantisers

/// A NEON activation quantiser.
type Quantiser = fn(&[f32], &mut [u8]);

/// The NEON quantiser of an activation dtype, if this level has one.
fn quantiser(d: DType) -> Option<Quantiser> {
    Some(match d {
        DType::Q8_0 => q8_0,
        DType::Q8_1 => q8_1,
        DType::Q8K => q8_k,
        _ => return None,
    })
}

safe! {
    fn q8_0(x: &[f32], out: &mut [u8]) = quantize_q8_0_imp;
    fn q8_1(x: &[f32], out: &mut [u8]) = quantize_q8_1_imp;
    fn q8_k(x: &[f32], out: &mut [u8]) = quantize_q8k_imp;
}

/// [`quantiser`]'s kernel, or the portable code for a dtype that is no activation type
/// of a quantised product.
fn quantize(d: DType, x: &[f32], out: &mut [u8]) {
    match quantiser(d) {
        Some(q) => q(x, out),
        None => super::scalar::quantize(d, x, out),
    }
}

#[target_feature(enable = "neon")]
fn quantize_q8_0_imp(x: &[f32], out: &mut [u8]) {
    quantize_q8_imp(x, out, false)
}

#[target_feature(enable = "neon")]
fn quantize_q8_1_imp(x: &[f32], out: &mut [u8]) {
    quantize_q8_imp(x, out, true)
}

/// Q8_0 (`with_sum` false) or Q8_1 blocks as ggml's reference quantisers:
/// `q = (int)roundf(x·id)` truncated to i8, where out-of-range and NaN products give
/// C's `INT_MIN` as the reference's conversion does (`fcvtas` alone would saturate).
#[target_feature(enable = "neon")]
fn quantize_q8_imp(x: &[f32], out: &mut [u8], with_sum: bool) {
    let (bs, qoff) = if with_sum { (36, 4) } else { (34, 2) };
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(bs)) {
        // SAFETY: 32 floats in xb.
        let v: [float32x4_t; 8] =
            core::array::from_fn(|i| unsafe { ld_f32(xb.as_ptr().add(4 * i)) });
        let mut m = vabsq_f32(v[0]);
        for vi in &v[1..] {
            m = vmaxq_f32(m, vabsq_f32(*vi));
        }
        // The maximum of the magnitudes (order-free for non-NaN values).
        let amax = vmaxvq_f32(m);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let (idv, lim, min) = (
            vdupq_n_f32(id),
            vdupq_n_f32(2_147_483_648.0),
            vdupq_n_s32(i32::MIN),
        );
        let q32: [int32x4_t; 8] = core::array::from_fn(|i| {
            let t = vmulq_f32(v[i], idv);
            vbslq_s32(vcaltq_f32(t, lim), vcvtaq_s32_f32(t), min)
        });
        // Truncating narrows: `as i8`.
        let q16: [int16x8_t; 4] = core::array::from_fn(|i| {
            vcombine_s16(vmovn_s32(q32[2 * i]), vmovn_s32(q32[2 * i + 1]))
        });
        let q8 = [
            vcombine_s8(vmovn_s16(q16[0]), vmovn_s16(q16[1])),
            vcombine_s8(vmovn_s16(q16[2]), vmovn_s16(q16[3])),
        ];
        assert!(ob.len() >= qoff + 32);
        // SAFETY: 32 bytes of room at qoff (asserted).
        unsafe {
            vst1q_s8(ob.as_mut_ptr().add(qoff) as *mut i8, q8[0]);
            vst1q_s8(ob.as_mut_ptr().add(qoff + 16) as *mut i8, q8[1]);
        }
        ob[0..2].copy_from_slice(&r::f32_to_f16(d).to_le_bytes());
        if with_sum {
            let sum = i32::from(vaddlvq_s8(q8[0])) + i32::from(vaddlvq_s8(q8[1]));
            ob[2..4].copy_from_slice(&r::f32_to_f16(sum as f32 * d).to_le_bytes());
        }
    }
}

/// Q8_K blocks as ggml-core's `quantize_block_q8_k` (ggml's `quantize_row_q8_K_ref`):
/// the first value of the largest magnitude (NaN never wins) sets `iscale = −127/max`;
/// `q = min(nearest_int(iscale·x), 127)` truncated to i8, with `nearest_int`'s
/// magic-number rounding done on the bits as the reference does; `bsums` the group sums
/// of `q`; an all-zero block is all zero bytes.
#[target_feature(enable = "neon")]
fn quantize_q8k_imp(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(292)) {
        let mut m = vdupq_n_f32(0.0);
        for c in 0..64 {
            // SAFETY: 4 floats at 4c < 256.
            let a = vabsq_f32(unsafe { ld_f32(xb.as_ptr().add(4 * c)) });
            // `a > m`: NaN never replaces the running maximum, as in the reference.
            m = vbslq_f32(vcgtq_f32(a, m), a, m);
        }
        // Lanes hold no NaN, so their maximum is order-free.
        let amax = vmaxvq_f32(m);
        if amax == 0.0 {
            ob.fill(0);
            continue;
        }
        // The reference keeps the first value whose magnitude is the final maximum.
        let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = -127.0 / max;
        let (iv, magic) = (vdupq_n_f32(iscale), vdupq_n_f32(12_582_912.0));
        let (mant, half, cap) = (
            vdupq_n_s32(0x007F_FFFF),
            vdupq_n_s32(0x0040_0000),
            vdupq_n_s32(127),
        );
        for g in 0..16 {
            let q32: [int32x4_t; 4] = core::array::from_fn(|i| {
                // SAFETY: 4 floats at 16g + 4i < 256.
                let v = unsafe { ld_f32(xb.as_ptr().add(16 * g + 4 * i)) };
                let bits = vreinterpretq_s32_f32(vaddq_f32(vmulq_f32(iv, v), magic));
                vminq_s32(vsubq_s32(vandq_s32(bits, mant), half), cap)
            });
            // Truncating narrows: `as i8`.
            let q8 = vcombine_s8(
                vmovn_s16(vcombine_s16(vmovn_s32(q32[0]), vmovn_s32(q32[1]))),
                vmovn_s16(vcombine_s16(vmovn_s32(q32[2]), vmovn_s32(q32[3]))),
            );
            // SAFETY: 16 bytes of room at 4 + 16g < 260 (ob is 292 bytes).
            unsafe { vst1q_s8(ob.as_mut_ptr().add(4 + 16 * g) as *mut i8, q8) };
            let bsum = vaddlvq_s8(q8);
            ob[260 + 2 * g..262 + 2 * g].copy_from_slice(&bsum.to_le_bytes());
        }
        ob[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
}

// ---------------------------------------------------------------------------------------
// mul_mat tiles

fn mm_neon(w: DType) -> Option<MmTile> {
    mm_with(w, tile_quant_neon)
}

fn mm_dotprod(w: DType) -> Option<MmTile> {
    mm_with(w, tile_quant_dotprod)
}

fn mm_i8mm(w: DType) -> Option<MmTile> {
    mm_with(w, tile_quant_i8mm)
}

/// The kinds of NEON tile.
#[derive(Clone, Copy, Debug, PartialEq)]
enum TileKind {
    F32,
    F16,
    Bf16,
    /// The quantised tile of the table's level (`quant::tile_quant_*`).
    Quant,
}

/// The NEON tile for weights of dtype `w`, if mul_mat takes them (none of the tables
/// falls back to the portable tiles).
fn tile_kind(w: DType) -> Option<TileKind> {
    Some(match w {
        DType::F32 => TileKind::F32,
        DType::F16 => TileKind::F16,
        DType::BF16 => TileKind::Bf16,
        d if d.is_weight_quant() => TileKind::Quant,
        _ => return None,
    })
}

/// The float tiles, and `quant` for the quantised formats.
fn mm_with(w: DType, quant: MmTile) -> Option<MmTile> {
    Some(match tile_kind(w)? {
        TileKind::F32 => tile_f32,
        TileKind::F16 => tile_f16,
        TileKind::Bf16 => tile_bf16,
        TileKind::Quant => quant,
    })
}

#[target_feature(enable = "neon")]
fn tile_f32_imp(_w: DType, k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) {
    for (ri, ar) in a.iter().enumerate() {
        for (ci, br) in b.iter().enumerate() {
            out[ri * 4 + ci] = dot_f32_imp(&as_f32(ar)[..k], &as_f32(br)[..k]);
        }
    }
}

#[target_feature(enable = "neon")]
fn tile_f16_imp(_w: DType, k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) {
    for (ri, ar) in a.iter().enumerate() {
        for (ci, br) in b.iter().enumerate() {
            out[ri * 4 + ci] = dot_f16_imp(&as_u16(ar)[..k], &as_u16(br)[..k]);
        }
    }
}

#[target_feature(enable = "neon")]
fn tile_bf16_imp(_w: DType, k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) {
    for (ri, ar) in a.iter().enumerate() {
        for (ci, br) in b.iter().enumerate() {
            out[ri * 4 + ci] = dot_bf16_imp(&as_u16(ar)[..k], &as_u16(br)[..k]);
        }
    }
}
