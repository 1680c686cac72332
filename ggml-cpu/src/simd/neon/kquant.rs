//! The exact integers of a K-quant block value ([`r::block_value`]): for one weight
//! super-block (Q2_K, Q3_K, Q4_K, Q5_K or Q6_K) and one Q8_K block, `sumi = Σ_g scale_g·Σ_{16}
//! q·y` and `summins = Σ_g min_g·bsum_g` over the 16 groups of 16 values.
//!
//! Every format is unpacked to the reference's signed quants (offsets applied) four groups
//! at a time; the 16-value dots of four groups land in the four lanes of one register
//! (widening multiplies on NEON, `sdot` with dotprod), which are multiplied by the groups'
//! scales and summed; the mins meet the Q8_K `bsums` in one widening multiply-accumulate.
//! With i8mm, two weight rows meet two activation rows at once: per group two `smmla`
//! leave the 2 × 2 group dots in one register, multiplied by each row's group scale.
//! Integer sums are exact, so their order is free.

use std::arch::aarch64::*;

use super::quant::{sdot, smmla, NEON, Q2K, Q3K, Q4K, Q5K, Q6K};

/// Bytes of a Q8_K activation block: f32 `d`, 256 i8 `qs`, 16 i16 `bsums`.
pub(super) const Q8K_BYTES: usize = 292;

/// Byte offset of the f16 super-block scale `d` of format `F`.
pub(super) const fn d_at(f: u8) -> usize {
    match f {
        Q2K => 80,
        Q3K => 108,
        Q6K => 208,
        _ => 0,
    }
}

/// Byte offset of the f16 min scale `dmin` of a format with mins.
pub(super) const fn dmin_at(f: u8) -> usize {
    match f {
        Q2K => 82,
        _ => 2,
    }
}

/// Whether format `F` has mins (`x = d·scale·q − dmin·min`).
pub(super) const fn has_mins(f: u8) -> bool {
    matches!(f, Q2K | Q4K | Q5K)
}

/// Q4_K/Q5_K's 12 packed 6-bit scales and mins (the reference's `scale_min_k4` for
/// chunks 0..8) as 16 bytes: the 8 chunk scales, then the 8 chunk mins.
#[inline(always)]
fn k4_scales(sc: &[u8; 12]) -> [u8; 16] {
    const KM1: u32 = 0x3f3f_3f3f;
    const KM2: u32 = 0x0f0f_0f0f;
    const KM3: u32 = 0x0303_0303;
    let w = |i: usize| u32::from_le_bytes([sc[4 * i], sc[4 * i + 1], sc[4 * i + 2], sc[4 * i + 3]]);
    let (u0, u1, u2) = (w(0), w(1), w(2));
    words_to_bytes([
        u0 & KM1,
        (u2 & KM2) | (((u0 >> 6) & KM3) << 4),
        u1 & KM1,
        ((u2 >> 4) & KM2) | (((u1 >> 6) & KM3) << 4),
    ])
}

/// Q3_K's 12 packed 6-bit scales as the 16 group scales plus 32 (the reference's
/// unpacking before its `− 32`).
#[inline(always)]
fn k3_scales(sc: &[u8; 12]) -> [u8; 16] {
    const KM1: u32 = 0x0303_0303;
    const KM2: u32 = 0x0f0f_0f0f;
    let w = |i: usize| u32::from_le_bytes([sc[4 * i], sc[4 * i + 1], sc[4 * i + 2], sc[4 * i + 3]]);
    let (a0, a1, tmp) = (w(0), w(1), w(2));
    words_to_bytes([
        (a0 & KM2) | ((tmp & KM1) << 4),
        (a1 & KM2) | (((tmp >> 2) & KM1) << 4),
        ((a0 >> 4) & KM2) | (((tmp >> 4) & KM1) << 4),
        ((a1 >> 4) & KM2) | (((tmp >> 6) & KM1) << 4),
    ])
}

#[inline(always)]
fn words_to_bytes(words: [u32; 4]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// The 12 bytes at `p`.
///
/// # Safety
/// 12 readable bytes at `p`.
#[inline(always)]
unsafe fn bytes12(p: *const u8) -> [u8; 12] {
    // SAFETY: caller's contract; [u8; 12] has alignment 1.
    unsafe { (p as *const [u8; 12]).read() }
}

/// The 16 group scales (i8, group order) and, for formats with mins, the 16 group mins
/// of the super-block at `x` (zero without mins).
///
/// # Safety
/// A super-block of format `F` at `x`.
#[inline(always)]
unsafe fn scales<const F: u8>(x: *const u8) -> (int8x16_t, int8x16_t) {
    // SAFETY: caller's contract (scales at bytes 0..16 for Q2_K, 96..108 for Q3_K, 4..16
    // for Q4_K/Q5_K, 192..208 for Q6_K).
    unsafe {
        match F {
            Q2K => {
                let sc = vld1q_u8(x);
                (
                    vreinterpretq_s8_u8(vandq_u8(sc, vdupq_n_u8(15))),
                    vreinterpretq_s8_u8(vshrq_n_u8::<4>(sc)),
                )
            }
            Q3K => {
                let s = k3_scales(&bytes12(x.add(96)));
                (
                    vsubq_s8(vld1q_s8(s.as_ptr() as *const i8), vdupq_n_s8(32)),
                    vdupq_n_s8(0),
                )
            }
            Q4K | Q5K => {
                // Chunk j's scale and min serve groups 2j and 2j + 1.
                let s = vld1q_s8(k4_scales(&bytes12(x.add(4))).as_ptr() as *const i8);
                (vzip1q_s8(s, s), vzip2q_s8(s, s))
            }
            _ => (vld1q_s8(x.add(192) as *const i8), vdupq_n_s8(0)),
        }
    }
}

/// The quants of groups `4·g4 .. 4·g4 + 4` (16 each) of the super-block at `x`, with
/// the format's offset applied: exactly the reference's `KBlock::q`.
///
/// # Safety
/// A super-block of format `F` at `x`; `g4 < 4`.
#[inline(always)]
unsafe fn quants<const F: u8>(x: *const u8, g4: usize) -> [int8x16_t; 4] {
    // SAFETY: caller's contract; every read lies inside the super-block.
    core::array::from_fn(|i| unsafe {
        let g = 4 * g4 + i;
        let t = g % 2;
        match F {
            Q2K | Q3K => {
                // Group g = 8h + 2j + t: bits 2j of byte 16t + l of half h's 32 bytes.
                let (h, j) = (g / 8, (g % 8) / 2);
                let base = if F == Q2K { 16 } else { 32 };
                let qs = vld1q_u8(x.add(base + 32 * h + 16 * t));
                let q = vandq_u8(shr_2x(qs, j), vdupq_n_u8(3));
                if F == Q2K {
                    vreinterpretq_s8_u8(q)
                } else {
                    // Minus 4 where the high-mask bit 4h + j of byte l is clear.
                    let hm = vld1q_u8(x.add(16 * t));
                    let set = vtstq_u8(hm, vdupq_n_u8(1 << (4 * h + j)));
                    vreinterpretq_s8_u8(vsubq_u8(q, vbicq_u8(vdupq_n_u8(4), set)))
                }
            }
            Q4K | Q5K => {
                // Group g = 2j + t of chunk j: nibble j % 2 of byte 16t + l of pair j / 2.
                let j = g / 2;
                let off = if F == Q4K { 16 } else { 48 };
                let qs = vld1q_u8(x.add(off + 32 * (j / 2) + 16 * t));
                let mut q = if j.is_multiple_of(2) {
                    vandq_u8(qs, vdupq_n_u8(15))
                } else {
                    vshrq_n_u8::<4>(qs)
                };
                if F == Q5K {
                    // Plus 16 where bit j of qh byte l is set.
                    let qh = vld1q_u8(x.add(16 + 16 * t));
                    let set = vtstq_u8(qh, vdupq_n_u8(1 << j));
                    q = vorrq_u8(q, vandq_u8(set, vdupq_n_u8(16)));
                }
                vreinterpretq_s8_u8(q)
            }
            _ => {
                // Q6_K group g = 8h + 2kk + t: nibble kk / 2 of ql byte 32(kk % 2) + 16t + l
                // of half h, high bits 2kk of qh byte 16t + l, minus 32.
                let (h, kk) = (g / 8, (g % 8) / 2);
                let ql = vld1q_u8(x.add(64 * h + 32 * (kk % 2) + 16 * t));
                let nib = if kk < 2 {
                    vandq_u8(ql, vdupq_n_u8(15))
                } else {
                    vshrq_n_u8::<4>(ql)
                };
                let qh = vld1q_u8(x.add(128 + 32 * h + 16 * t));
                let hi = vandq_u8(shr_2x(qh, kk), vdupq_n_u8(3));
                let q = vreinterpretq_s8_u8(vorrq_u8(nib, vshlq_n_u8::<4>(hi)));
                vsubq_s8(q, vdupq_n_s8(32))
            }
        }
    })
}

/// `v >> 2n` per byte (`n < 4`), by an immediate shift.
#[inline]
#[target_feature(enable = "neon")]
fn shr_2x(v: uint8x16_t, n: usize) -> uint8x16_t {
    match n {
        0 => v,
        1 => vshrq_n_u8::<2>(v),
        2 => vshrq_n_u8::<4>(v),
        _ => vshrq_n_u8::<6>(v),
    }
}

/// Partial sums (exact, 4 lanes) of the dot of 16 i8 pairs.
///
/// # Safety
/// With `L` above `NEON`, the CPU has FEAT_DotProd.
#[inline(always)]
unsafe fn dot16_lanes<const L: u8>(x: int8x16_t, y: int8x16_t) -> int32x4_t {
    if L == NEON {
        // i8·i8 fits i16 (|q| <= 128); two of them would not, so widen pairwise at once.
        let a = vpaddlq_s16(vmull_s8(vget_low_s8(x), vget_low_s8(y)));
        vpadalq_s16(a, vmull_high_s8(x, y))
    } else {
        // SAFETY: caller's contract.
        unsafe { sdot(vdupq_n_s32(0), x, y) }
    }
}

/// The four scales of `sc` from lane `4·g4` on, widened to i32.
#[inline]
#[target_feature(enable = "neon")]
fn widen4(sc: int8x16_t, g4: usize) -> int32x4_t {
    let w = match g4 / 2 {
        0 => vmovl_s8(vget_low_s8(sc)),
        _ => vmovl_high_s8(sc),
    };
    match g4 % 2 {
        0 => vmovl_s16(vget_low_s16(w)),
        _ => vmovl_high_s16(w),
    }
}

/// `(sumi, summins)` of [`r::block_value`] for the super-block of format `F` at `x` and
/// the Q8_K block at `y` (`summins` 0 for formats without mins).
///
/// # Safety
/// The blocks at `x` and `y`; with `L` above `NEON`, the CPU has FEAT_DotProd.
#[inline(always)]
pub(super) unsafe fn kquant_ints<const L: u8, const F: u8>(
    x: *const u8,
    y: *const u8,
) -> (i32, i32) {
    // SAFETY: caller's contract (Q8_K quants at bytes 4..260, bsums at 260..292).
    unsafe {
        let (sc, mins) = scales::<F>(x);
        let mut acc = vdupq_n_s32(0);
        for g4 in 0..4 {
            let q = quants::<F>(x, g4);
            let p: [int32x4_t; 4] = core::array::from_fn(|i| {
                let yv = vld1q_s8(y.add(4 + 16 * (4 * g4 + i)) as *const i8);
                dot16_lanes::<L>(q[i], yv)
            });
            // Lane i: group 4·g4 + i's dot.
            let dots = vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
            acc = vmlaq_s32(acc, dots, widen4(sc, g4));
        }
        let sumi = vaddvq_s32(acc);
        if !has_mins(F) {
            return (sumi, 0);
        }
        (sumi, sum_mins(mins, y))
    }
}

/// `Σ_g min_g·bsum_g` for the 16 group mins `mins` and the Q8_K block at `y`.
///
/// # Safety
/// A Q8_K block at `y`.
#[inline(always)]
unsafe fn sum_mins(mins: int8x16_t, y: *const u8) -> i32 {
    // SAFETY: caller's contract (bsums at bytes 260..292).
    let (b0, b1) = unsafe {
        (
            vld1q_s16(y.add(260) as *const i16),
            vld1q_s16(y.add(276) as *const i16),
        )
    };
    // SAFETY: register operations only; NEON is baseline on aarch64.
    unsafe {
        let (m0, m1) = (vmovl_s8(vget_low_s8(mins)), vmovl_high_s8(mins));
        let s = vmull_s16(vget_low_s16(b0), vget_low_s16(m0));
        let s = vmlal_high_s16(s, b0, m0);
        let s = vmlal_s16(s, vget_low_s16(b1), vget_low_s16(m1));
        let s = vmlal_high_s16(s, b1, m1);
        vaddvq_s32(s)
    }
}

/// 8 bytes of `a` beside the same 8 of `b` (low or high halves): one 2 × 8 operand of
/// `smmla`.
#[inline]
#[target_feature(enable = "neon")]
fn rows2(a: int8x16_t, b: int8x16_t, hi: bool) -> int8x16_t {
    let (a, b) = (vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b));
    vreinterpretq_s8_s64(if hi {
        vzip2q_s64(a, b)
    } else {
        vzip1q_s64(a, b)
    })
}

/// `acc + d·s[I]` for lane `i` of `s` (`i < 4`).
#[inline]
#[target_feature(enable = "neon")]
fn mla_lane(acc: int32x4_t, d: int32x4_t, s: int32x4_t, i: usize) -> int32x4_t {
    match i {
        0 => vmlaq_laneq_s32::<0>(acc, d, s),
        1 => vmlaq_laneq_s32::<1>(acc, d, s),
        2 => vmlaq_laneq_s32::<2>(acc, d, s),
        _ => vmlaq_laneq_s32::<3>(acc, d, s),
    }
}

/// [`kquant_ints`] of the super-blocks at `x[0], x[1]` against the Q8_K blocks at `y[0],
/// y[1]`, as `(sumi, summins)` in the lanes `(x0, y0), (x0, y1), (x1, y0), (x1, y1)`.
///
/// # Safety
/// The blocks at `x` and `y`; the CPU has FEAT_I8MM.
#[inline(always)]
pub(super) unsafe fn kquant_ints_i8mm<const F: u8>(
    x: [*const u8; 2],
    y: [*const u8; 2],
) -> (int32x4_t, int32x4_t) {
    // SAFETY: caller's contract (Q8_K quants at bytes 4..260).
    unsafe {
        let (sc0, mn0) = scales::<F>(x[0]);
        let (sc1, mn1) = scales::<F>(x[1]);
        // acc0 for row 0's lanes (0, 1), acc1 for row 1's (2, 3).
        let (mut acc0, mut acc1) = (vdupq_n_s32(0), vdupq_n_s32(0));
        for g4 in 0..4 {
            let (q0, q1) = (quants::<F>(x[0], g4), quants::<F>(x[1], g4));
            let (s0, s1) = (widen4(sc0, g4), widen4(sc1, g4));
            for i in 0..4 {
                let at = 4 + 16 * (4 * g4 + i);
                let (y0, y1) = (
                    vld1q_s8(y[0].add(at) as *const i8),
                    vld1q_s8(y[1].add(at) as *const i8),
                );
                let mut d = vdupq_n_s32(0);
                for hi in [false, true] {
                    d = smmla(d, rows2(q0[i], q1[i], hi), rows2(y0, y1, hi));
                }
                acc0 = mla_lane(acc0, d, s0, i);
                acc1 = mla_lane(acc1, d, s1, i);
            }
        }
        let sumi = vcombine_s32(vget_low_s32(acc0), vget_high_s32(acc1));
        if !has_mins(F) {
            return (sumi, vdupq_n_s32(0));
        }
        let m = [
            sum_mins(mn0, y[0]),
            sum_mins(mn0, y[1]),
            sum_mins(mn1, y[0]),
            sum_mins(mn1, y[1]),
        ];
        (sumi, vld1q_s32(m.as_ptr()))
    }
}
