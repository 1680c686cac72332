//! The quantised products of the aarch64 levels: the mul_mat tiles (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! Q2_K to Q6_K) and the matrix × vector kernels (`gemv`), in the lanes described in [`super`]'s
//! header: per block each lane's exact integer dot (widening multiplies on NEON, `sdot` with
//! dotprod, `smmla` 2 × 2 blocks with i8mm), then the format's float formula of
//! [`r::block_value`](crate::reference::block_value) lane-wise, block `j` into accumulator `j % 8`,
//! combined as [`r::tree8`](crate::reference::tree8). Tiles of three or four columns take two rows
//! per pass so that a row's unpacking (i8mm) or a column's quants and scales (neon, dotprod) serve
//! both.

use std::arch::aarch64::*;

use ggml_core::DType;

use super::kquant;
use super::{ld_f16, q8_0, q8_1, q8_k};
use crate::simd::{Gemv, GemvRows, Packer};

/// How a tile computes its integer block dots.
pub(super) const NEON: u8 = 0;
const DOTPROD: u8 = 1;
/// Lanes `(r0, c0), (r0, c1), (r1, c0), (r1, c1)` by `smmla`.
const I8MM: u8 = 2;

/// Formats as const parameters.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;
pub(super) const Q4K: u8 = 5;
pub(super) const Q6K: u8 = 6;
pub(super) const Q2K: u8 = 7;
pub(super) const Q3K: u8 = 8;
pub(super) const Q5K: u8 = 9;

/// Whether format `F` is a K-quant (super-blocks of 256 against Q8_K activations).
const fn is_k(f: u8) -> bool {
    matches!(f, Q2K | Q3K | Q4K | Q5K | Q6K)
}

/// Values per weight block of format `F`.
const fn block_len(f: u8) -> usize {
    if is_k(f) {
        256
    } else {
        32
    }
}

/// Bytes of a weight block of format `F`.
const fn x_bytes(f: u8) -> usize {
    match f {
        Q4_0 => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        Q2K => 84,
        Q3K => 110,
        Q4K => 144,
        Q5K => 176,
        Q6K => 210,
        _ => 34,
    }
}

/// Bytes of an activation block for format `F` (Q8_K, Q8_1 or Q8_0).
const fn y_bytes(f: u8) -> usize {
    if is_k(f) {
        292
    } else if has_min(f) {
        36
    } else {
        34
    }
}

/// Whether format `F` has a min (`m·s` term) and Q8_1 activations.
const fn has_min(f: u8) -> bool {
    matches!(f, Q4_1 | Q5_1)
}

/// An integer-dot instruction `$ins` of the architecture extension `$ext` as a function
/// `$name(acc, a, b)`: `$ins acc.4s, a.16b, b.16b`.
macro_rules! int8_dot_instruction {
    ($(#[$doc:meta])* $name:ident = $ext:literal $ins:literal) => {
        $(#[$doc])*
        #[inline(always)]
        pub(super) unsafe fn $name(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
            let mut acc = acc;
            // SAFETY: caller's contract; register operands only.
            unsafe {
                core::arch::asm!(
                    concat!(".arch_extension ", $ext),
                    concat!($ins, " {acc:v}.4s, {a:v}.16b, {b:v}.16b"),
                    acc = inout(vreg) acc,
                    a = in(vreg) a,
                    b = in(vreg) b,
                    options(pure, nomem, nostack, preserves_flags),
                )
            };
            acc
        }
    };
}

int8_dot_instruction! {
    /// `sdot`: `acc` plus, per 32-bit lane, the dot of its 4 i8 of `a` and of `b`.
    ///
    /// # Safety
    /// The CPU has FEAT_DotProd.
    sdot = "dotprod" "sdot"
}

int8_dot_instruction! {
    /// `smmla`: `acc` plus the 2 × 2 dots of `a`'s two 8-byte rows with `b`'s two 8-byte
    /// rows (lane `2i + j`: row i of `a` with row j of `b`).
    ///
    /// # Safety
    /// The CPU has FEAT_I8MM.
    smmla = "i8mm" "smmla"
}

/// The 32 quants of the weight block at `p` as i8 with the format's offset applied
/// (values 0-15 and 16-31), exactly the reference's integers.
///
/// # Safety
/// A block of format `F` at `p`.
#[inline(always)]
unsafe fn unpack<const F: u8>(p: *const u8) -> (int8x16_t, int8x16_t) {
    // SAFETY: caller's contract (every read is inside the block).
    unsafe {
        match F {
            Q8_0 => (
                vld1q_s8(p.add(2) as *const i8),
                vld1q_s8(p.add(18) as *const i8),
            ),
            _ => {
                let qs = p.add(match F {
                    Q4_0 => 2,
                    Q4_1 => 4,
                    Q5_0 => 6,
                    _ => 8,
                });
                let q = vld1q_u8(qs);
                let mut lo = vandq_u8(q, vdupq_n_u8(15));
                let mut hi = vshrq_n_u8::<4>(q);
                if matches!(F, Q5_0 | Q5_1) {
                    // Bit l of qh is value l's fifth bit (bit 16 + l: value 16 + l's).
                    let qh = (p.add(if F == Q5_0 { 2 } else { 4 }) as *const u32).read_unaligned();
                    let bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
                    let fifth = |h: u32| {
                        let b = vcombine_u8(vdup_n_u8(h as u8), vdup_n_u8((h >> 8) as u8));
                        vandq_u8(vtstq_u8(b, bit), vdupq_n_u8(16))
                    };
                    lo = vorrq_u8(lo, fifth(qh));
                    hi = vorrq_u8(hi, fifth(qh >> 16));
                }
                let (lo, hi) = (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi));
                match F {
                    Q4_0 => (vsubq_s8(lo, vdupq_n_s8(8)), vsubq_s8(hi, vdupq_n_s8(8))),
                    Q5_0 => (vsubq_s8(lo, vdupq_n_s8(16)), vsubq_s8(hi, vdupq_n_s8(16))),
                    _ => (lo, hi),
                }
            }
        }
    }
}

/// The 32 quants of the activation block at `p` (Q8_1 for formats with a min, else
/// Q8_0).
///
/// # Safety
/// An activation block at `p`.
#[inline(always)]
unsafe fn act<const F: u8>(p: *const u8) -> (int8x16_t, int8x16_t) {
    let o = if has_min(F) { 4 } else { 2 };
    // SAFETY: caller's contract.
    unsafe {
        (
            vld1q_s8(p.add(o) as *const i8),
            vld1q_s8(p.add(o + 16) as *const i8),
        )
    }
}

/// Partial sums (exact, 4 lanes) of the dot of 32 i8 pairs.
///
/// # Safety
/// With `L == DOTPROD`, the CPU has FEAT_DotProd.
#[inline(always)]
unsafe fn dot32<const L: u8>(x: (int8x16_t, int8x16_t), y: (int8x16_t, int8x16_t)) -> int32x4_t {
    if L == NEON {
        // i8·i8 fits i16 (|q| <= 128); two of them would not, so widen pairwise at once.
        let a = vpaddlq_s16(vmull_s8(vget_low_s8(x.0), vget_low_s8(y.0)));
        let a = vpadalq_s16(a, vmull_high_s8(x.0, y.0));
        let a = vpadalq_s16(a, vmull_s8(vget_low_s8(x.1), vget_low_s8(y.1)));
        vpadalq_s16(a, vmull_high_s8(x.1, y.1))
    } else {
        // SAFETY: caller's contract.
        unsafe { sdot(sdot(vdupq_n_s32(0), x.0, y.0), x.1, y.1) }
    }
}

/// The f16 words at byte `at` of the blocks at the 4 lanes' pointers, as f32.
///
/// # Safety
/// 2 readable bytes at `p[t] + at` for every lane.
#[inline(always)]
unsafe fn words(p: &[*const u8; 4], at: usize) -> float32x4_t {
    // SAFETY: caller's contract.
    let w = p.map(|q| unsafe { (q.add(at) as *const u16).read_unaligned() });
    // SAFETY: 4 u16 in `w`.
    unsafe { ld_f16(w.as_ptr()) }
}

/// The two f16 words at byte 0 of the blocks at the 4 lanes' pointers (`d`, then `m` or
/// `s` in the formats with one; for the others the second word is the block's next two
/// bytes, unused), as f32: lane `t` of each vector from `p[t]`. One 32-bit load per lane,
/// `fcvtl`/`fcvtl2` and two unzips, instead of [`words`]' 16-bit loads twice over.
///
/// # Safety
/// 4 readable bytes at every `p[t]`.
#[inline(always)]
unsafe fn word_pairs(p: &[*const u8; 4]) -> (float32x4_t, float32x4_t) {
    // SAFETY: caller's contract (unaligned reads: blocks are 2-byte aligned).
    let w = unsafe {
        [
            (p[0] as *const u32).read_unaligned(),
            (p[1] as *const u32).read_unaligned(),
            (p[2] as *const u32).read_unaligned(),
            (p[3] as *const u32).read_unaligned(),
        ]
    };
    // SAFETY: 4 u32 in `w`.
    let h = unsafe { vld1q_u32(w.as_ptr()) };
    let (lo, hi): (float32x4_t, float32x4_t);
    // SAFETY: register operands only; fcvtl and fcvtl2 are base AArch64 SIMD. `lo` is an
    // early output (written before `h` is read again).
    unsafe {
        core::arch::asm!(
            "fcvtl {lo:v}.4s, {h:v}.4h",
            "fcvtl2 {hi:v}.4s, {h:v}.8h",
            lo = out(vreg) lo,
            hi = lateout(vreg) hi,
            h = in(vreg) h,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    // lo = [w0, w0', w1, w1'], hi = [w2, w2', w3, w3'].
    (vuzp1q_f32(lo, hi), vuzp2q_f32(lo, hi))
}

/// Block `j` of [`quant_lanes`]: per lane the exact integer dot, then
/// `(dx·dy)·sumi (+ mx·sy)` as [`r::block_value`](crate::reference::block_value).
///
/// # Safety
/// As [`quant_lanes`], with `j < nb`.
#[inline(always)]
unsafe fn quant_block<const L: u8, const F: u8>(
    j: usize,
    xp: &[*const u8; 4],
    yp: &[*const u8; 4],
) -> float32x4_t {
    let (xb, yb) = (x_bytes(F), y_bytes(F));
    let xj = [
        xp[0].wrapping_add(j * xb),
        xp[1].wrapping_add(j * xb),
        xp[2].wrapping_add(j * xb),
        xp[3].wrapping_add(j * xb),
    ];
    let yj = [
        yp[0].wrapping_add(j * yb),
        yp[1].wrapping_add(j * yb),
        yp[2].wrapping_add(j * yb),
        yp[3].wrapping_add(j * yb),
    ];
    // SAFETY (unpacking, loads, words): block j < nb at every pointer (caller).
    let sumi = unsafe {
        if L == I8MM {
            let (x0, x1) = (unpack::<F>(xj[0]), unpack::<F>(xj[2]));
            let (y0, y1) = (act::<F>(yj[0]), act::<F>(yj[1]));
            // 8 bytes of row 0 beside the same 8 of row 1: one 2 × 8 operand.
            let rows = |a: int8x16_t, b: int8x16_t, hi: bool| {
                let (a, b) = (vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b));
                vreinterpretq_s8_s64(if hi {
                    vzip2q_s64(a, b)
                } else {
                    vzip1q_s64(a, b)
                })
            };
            let mut s = vdupq_n_s32(0);
            for (xa, xb2, ya, yb2) in [(x0.0, x1.0, y0.0, y1.0), (x0.1, x1.1, y0.1, y1.1)] {
                for hi in [false, true] {
                    s = smmla(s, rows(xa, xb2, hi), rows(ya, yb2, hi));
                }
            }
            s
        } else {
            let p0 = dot32::<L>(unpack::<F>(xj[0]), act::<F>(yj[0]));
            let p1 = dot32::<L>(unpack::<F>(xj[1]), act::<F>(yj[1]));
            let p2 = dot32::<L>(unpack::<F>(xj[2]), act::<F>(yj[2]));
            let p3 = dot32::<L>(unpack::<F>(xj[3]), act::<F>(yj[3]));
            vpaddq_s32(vpaddq_s32(p0, p1), vpaddq_s32(p2, p3))
        }
    };
    // SAFETY: the blocks' f16 words (as above; every block has 4 bytes at its start).
    let ((dx, mx), (dy, sy)) = unsafe { (word_pairs(&xj), word_pairs(&yj)) };
    let v = vmulq_f32(vmulq_f32(dx, dy), vcvtq_f32_s32(sumi));
    if has_min(F) {
        vaddq_f32(v, vmulq_f32(mx, sy))
    } else {
        v
    }
}

/// 4 outputs at once, lane `t` the dot of the weight row at `xp[t]` with the activation row at
/// `yp[t]` over `nb` blocks (with `L == I8MM`, the lanes are `(r0, c0), (r0, c1), (r1, c0), (r1,
/// c1)`: `xp = [r0, r0, r1, r1]`, `yp = [c0, c1, c0, c1]`). Per block, the exact integer dot, then
/// lane-wise `(dx·dy)·sumi (+ mx·sy)` as [`r::block_value`](crate::reference::block_value), into
/// accumulator `j % 8`; the accumulators combine as [`r::tree8`](crate::reference::tree8). Blocks
/// go 8 at a time (block `8g + u` into accumulator `u`), so the accumulators stay in registers.
///
/// # Safety `nb` blocks at every pointer; the CPU has the extension `L` needs.
#[inline(always)]
unsafe fn quant_lanes<const L: u8, const F: u8>(
    nb: usize,
    xp: [*const u8; 4],
    yp: [*const u8; 4],
) -> [f32; 4] {
    let mut acc = [vdupq_n_f32(0.0); 8];
    let mut j = 0;
    while j + 8 <= nb {
        // Written out (not a loop over `acc`) so that the accumulators stay in registers.
        let [a0, a1, a2, a3, a4, a5, a6, a7] = &mut acc;
        // SAFETY: blocks j .. j + 8 <= nb (caller's contract for the rest).
        unsafe {
            *a0 = vaddq_f32(*a0, quant_block::<L, F>(j, &xp, &yp));
            *a1 = vaddq_f32(*a1, quant_block::<L, F>(j + 1, &xp, &yp));
            *a2 = vaddq_f32(*a2, quant_block::<L, F>(j + 2, &xp, &yp));
            *a3 = vaddq_f32(*a3, quant_block::<L, F>(j + 3, &xp, &yp));
            *a4 = vaddq_f32(*a4, quant_block::<L, F>(j + 4, &xp, &yp));
            *a5 = vaddq_f32(*a5, quant_block::<L, F>(j + 5, &xp, &yp));
            *a6 = vaddq_f32(*a6, quant_block::<L, F>(j + 6, &xp, &yp));
            *a7 = vaddq_f32(*a7, quant_block::<L, F>(j + 7, &xp, &yp));
        }
        j += 8;
    }
    for (u, a) in acc.iter_mut().enumerate().take(nb - j) {
        // SAFETY: as above.
        *a = vaddq_f32(*a, unsafe { quant_block::<L, F>(j + u, &xp, &yp) });
    }
    tree8_lanes(acc)
}

/// `[tree8(Σ first), tree8(Σ second)]` lane-wise over the blocks `j < nb` of `block`, block
/// `j` into accumulator `j % 8` of each ([`r::tree8`](crate::reference::tree8)'s order); blocks
/// 8 at a time with the accumulators written out, so they stay in registers.
///
/// # Safety
/// None beyond NEON, which is baseline on aarch64 (an `unsafe fn` so that it inlines into the
/// kernels' unsafe bodies).
#[inline(always)]
unsafe fn sum_block_pairs(
    nb: usize,
    mut block: impl FnMut(usize) -> (float32x4_t, float32x4_t),
) -> [[f32; 4]; 2] {
    let mut acc = [[vdupq_n_f32(0.0); 8]; 2];
    let mut j = 0;
    while j + 8 <= nb {
        let [[a0, a1, a2, a3, a4, a5, a6, a7], [b0, b1, b2, b3, b4, b5, b6, b7]] = &mut acc;
        macro_rules! add_block {
            ($u:expr, $a:ident, $b:ident) => {
                let (v, w) = block(j + $u);
                *$a = vaddq_f32(*$a, v);
                *$b = vaddq_f32(*$b, w);
            };
        }
        add_block!(0, a0, b0);
        add_block!(1, a1, b1);
        add_block!(2, a2, b2);
        add_block!(3, a3, b3);
        add_block!(4, a4, b4);
        add_block!(5, a5, b5);
        add_block!(6, a6, b6);
        add_block!(7, a7, b7);
        j += 8;
    }
    let [acc_a, acc_b] = &mut acc;
    for (u, (a, b)) in acc_a
        .iter_mut()
        .zip(acc_b.iter_mut())
        .enumerate()
        .take(nb - j)
    {
        let (v, w) = block(j + u);
        *a = vaddq_f32(*a, v);
        *b = vaddq_f32(*b, w);
    }
    [tree8_lanes(acc[0]), tree8_lanes(acc[1])]
}

/// Block `j` of [`quant_lanes_2x4`]: the two 2 × 2 blocks of lanes of [`quant_block`] with
/// `L == I8MM` for rows `x` and columns `(y0, y1)`, `(y2, y3)`, the rows unpacked and
/// interleaved once and their scales converted once for both.
///
/// # Safety
/// As [`quant_lanes_2x4`], with `j < nb`.
#[inline(always)]
unsafe fn quant_block_2x4<const F: u8>(
    j: usize,
    x: &[*const u8; 2],
    y: &[*const u8; 4],
) -> (float32x4_t, float32x4_t) {
    let (xb, yb) = (x_bytes(F), y_bytes(F));
    let (x0, x1) = (x[0].wrapping_add(j * xb), x[1].wrapping_add(j * xb));
    let yj = [
        y[0].wrapping_add(j * yb),
        y[1].wrapping_add(j * yb),
        y[2].wrapping_add(j * yb),
        y[3].wrapping_add(j * yb),
    ];
    // 8 bytes of one row beside the same 8 of the other: one 2 × 8 operand.
    let rows = |a: int8x16_t, b: int8x16_t, hi: bool| {
        let (a, b) = (vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b));
        vreinterpretq_s8_s64(if hi {
            vzip2q_s64(a, b)
        } else {
            vzip1q_s64(a, b)
        })
    };
    // SAFETY (unpacking, loads, words): block j < nb at every pointer (caller).
    unsafe {
        let (u0, u1) = (unpack::<F>(x0), unpack::<F>(x1));
        let xr = [
            rows(u0.0, u1.0, false),
            rows(u0.0, u1.0, true),
            rows(u0.1, u1.1, false),
            rows(u0.1, u1.1, true),
        ];
        let sums = |ya: *const u8, yb2: *const u8| {
            let (a, b) = (act::<F>(ya), act::<F>(yb2));
            let mut s = vdupq_n_s32(0);
            s = smmla(s, xr[0], rows(a.0, b.0, false));
            s = smmla(s, xr[1], rows(a.0, b.0, true));
            s = smmla(s, xr[2], rows(a.1, b.1, false));
            smmla(s, xr[3], rows(a.1, b.1, true))
        };
        let (sa, sb) = (sums(yj[0], yj[1]), sums(yj[2], yj[3]));
        // Lanes (r0, c), (r0, c'), (r1, c), (r1, c'): the rows' scales twice each, the
        // columns' pairs twice over.
        let (dx, mx) = word_pairs(&[x0, x0, x1, x1]);
        let (dy, sy) = word_pairs(&yj);
        let value = |dy: float32x4_t, sy: float32x4_t, s: int32x4_t| {
            let v = vmulq_f32(vmulq_f32(dx, dy), vcvtq_f32_s32(s));
            if has_min(F) {
                vaddq_f32(v, vmulq_f32(mx, sy))
            } else {
                v
            }
        };
        let low = |v: float32x4_t| vcombine_f32(vget_low_f32(v), vget_low_f32(v));
        let high = |v: float32x4_t| vcombine_f32(vget_high_f32(v), vget_high_f32(v));
        (value(low(dy), low(sy), sa), value(high(dy), high(sy), sb))
    }
}

/// [`quant_lanes`] with `L == I8MM` for the rows `x = [r0, r1]` and the columns
/// `y = [c0, c1, c2, c3]`: lanes `(r0, c0), (r0, c1), (r1, c0), (r1, c1)`, then the same
/// with `c2, c3`, each lane's value and order that of [`quant_lanes`], bit for bit.
///
/// # Safety
/// `nb` blocks at every pointer; the CPU has FEAT_I8MM.
#[inline(always)]
unsafe fn quant_lanes_2x4<const F: u8>(
    nb: usize,
    x: [*const u8; 2],
    y: [*const u8; 4],
) -> [[f32; 4]; 2] {
    // SAFETY: sum_block_pairs asks only for blocks j < nb (caller's contract).
    unsafe { sum_block_pairs(nb, |j| quant_block_2x4::<F>(j, &x, &y)) }
}

/// Block `j` of [`quant_rows_2x4`]: for each of the two rows, the 4 lanes of
/// [`quant_block`] with that row and the columns `y[0..4]`; the columns' quants and scales
/// loaded and converted once for both rows.
///
/// # Safety
/// As [`quant_rows_2x4`], with `j < nb`.
#[inline(always)]
unsafe fn quant_block_rows_2x4<const L: u8, const F: u8>(
    j: usize,
    x: &[*const u8; 2],
    y: &[*const u8; 4],
) -> (float32x4_t, float32x4_t) {
    let (xb, yb) = (x_bytes(F), y_bytes(F));
    let (x0, x1) = (x[0].wrapping_add(j * xb), x[1].wrapping_add(j * xb));
    let yj = [
        y[0].wrapping_add(j * yb),
        y[1].wrapping_add(j * yb),
        y[2].wrapping_add(j * yb),
        y[3].wrapping_add(j * yb),
    ];
    // SAFETY (unpacking, loads, words): block j < nb at every pointer (caller).
    unsafe {
        let ys = [
            act::<F>(yj[0]),
            act::<F>(yj[1]),
            act::<F>(yj[2]),
            act::<F>(yj[3]),
        ];
        let sums = |xr: *const u8| {
            let u = unpack::<F>(xr);
            let p0 = dot32::<L>(u, ys[0]);
            let p1 = dot32::<L>(u, ys[1]);
            let p2 = dot32::<L>(u, ys[2]);
            let p3 = dot32::<L>(u, ys[3]);
            vpaddq_s32(vpaddq_s32(p0, p1), vpaddq_s32(p2, p3))
        };
        let (s0, s1) = (sums(x0), sums(x1));
        // Lanes [r0, r1, r0, r1] of the rows' scales, [c0, c1, c2, c3] of the columns'.
        let (dx, mx) = word_pairs(&[x0, x1, x0, x1]);
        let (dy, sy) = word_pairs(&yj);
        let value = |dx: float32x4_t, mx: float32x4_t, s: int32x4_t| {
            let v = vmulq_f32(vmulq_f32(dx, dy), vcvtq_f32_s32(s));
            if has_min(F) {
                vaddq_f32(v, vmulq_f32(mx, sy))
            } else {
                v
            }
        };
        (
            value(vdupq_laneq_f32::<0>(dx), vdupq_laneq_f32::<0>(mx), s0),
            value(vdupq_laneq_f32::<1>(dx), vdupq_laneq_f32::<1>(mx), s1),
        )
    }
}

/// [`quant_lanes`] with `L` `NEON` or `DOTPROD` for the rows `x = [r0, r1]` against the
/// columns `y = [c0, c1, c2, c3]`: lane `c` of the first result is `(r0, c)`, of the second
/// `(r1, c)`, each lane's value and order that of [`quant_lanes`], bit for bit.
///
/// # Safety
/// `nb` blocks at every pointer; the CPU has the extension `L` needs.
#[inline(always)]
unsafe fn quant_rows_2x4<const L: u8, const F: u8>(
    nb: usize,
    x: [*const u8; 2],
    y: [*const u8; 4],
) -> [[f32; 4]; 2] {
    // SAFETY: sum_block_pairs asks only for blocks j < nb (caller's contract).
    unsafe { sum_block_pairs(nb, |j| quant_block_rows_2x4::<L, F>(j, &x, &y)) }
}

/// [`quant_lanes`] for the K-quants (the same lanes): per super-block the exact integers of each
/// lane ([`kquant::kquant_ints`], or [`kquant::kquant_ints_i8mm`] for a 2 × 2 block with `L ==
/// I8MM`), then lane-wise `(d·dy)·sumi − (dmin·dy)·summins` (formats with mins) or `(d·dy)·sumi` as
/// [`r::block_value`](crate::reference::block_value), block `j` into accumulator `j % 8`, combined
/// as [`r::tree8`](crate::reference::tree8).
///
/// # Safety `nb` super-blocks at every pointer; the CPU has the extension `L` needs (FEAT_I8MM
/// implies FEAT_DotProd on this level).
#[inline(always)]
unsafe fn kquant_lanes<const L: u8, const F: u8>(
    nb: usize,
    xp: [*const u8; 4],
    yp: [*const u8; 4],
) -> [f32; 4] {
    let mut acc = [vdupq_n_f32(0.0); 8];
    for j in 0..nb {
        let xj = xp.map(|p| p.wrapping_add(j * x_bytes(F)));
        let yj = yp.map(|p| p.wrapping_add(j * kquant::Q8K_BYTES));
        let (mut si, mut sm) = ([0i32; 4], [0i32; 4]);
        // SAFETY (integers, scales): super-block j < nb at every pointer (caller).
        let v = unsafe {
            if L == I8MM {
                let (s, m) = kquant::kquant_ints_i8mm::<F>([xj[0], xj[2]], [yj[0], yj[1]]);
                vst1q_s32(si.as_mut_ptr(), s);
                vst1q_s32(sm.as_mut_ptr(), m);
            } else {
                for (t, (s, m)) in si.iter_mut().zip(&mut sm).enumerate() {
                    (*s, *m) = kquant::kquant_ints::<L, F>(xj[t], yj[t]);
                }
            }
            let dy = vld1q_f32(yj.map(|p| (p as *const f32).read_unaligned()).as_ptr());
            let d = vmulq_f32(words(&xj, kquant::d_at(F)), dy);
            let v = vmulq_f32(d, vcvtq_f32_s32(vld1q_s32(si.as_ptr())));
            if kquant::has_mins(F) {
                let dmin = vmulq_f32(words(&xj, kquant::dmin_at(F)), dy);
                vsubq_f32(v, vmulq_f32(dmin, vcvtq_f32_s32(vld1q_s32(sm.as_ptr()))))
            } else {
                v
            }
        };
        acc[j % 8] = vaddq_f32(acc[j % 8], v);
    }
    tree8_lanes(acc)
}

/// [`r::tree8`](crate::reference::tree8) lane-wise.
#[inline]
#[target_feature(enable = "neon")]
fn tree8_lanes(acc: [float32x4_t; 8]) -> [f32; 4] {
    let a0 = vaddq_f32(acc[0], acc[4]);
    let a1 = vaddq_f32(acc[1], acc[5]);
    let a2 = vaddq_f32(acc[2], acc[6]);
    let a3 = vaddq_f32(acc[3], acc[7]);
    let s = vaddq_f32(vaddq_f32(a0, a2), vaddq_f32(a1, a3));
    let mut l = [0f32; 4];
    // SAFETY: 4 floats of room.
    unsafe { vst1q_f32(l.as_mut_ptr(), s) };
    l
}

/// A tile of format `F`: its outputs (row-major pairs) 4 at a time in the lanes of
/// [`quant_lanes`] (a short last group repeats its last pair, not stored); with
/// `L == I8MM` and at least 2 rows and columns, in 2 × 2 blocks of rows and columns
/// (a missing row or column repeats the last one), otherwise as `DOTPROD`.
///
/// # Safety
/// With `L` above `NEON`, the CPU has its extension (FEAT_I8MM implies FEAT_DotProd on
/// this level).
#[inline(always)]
unsafe fn tile_f<const L: u8, const F: u8>(
    k: usize,
    a: &[&[u8]],
    b: &[&[u8]],
    out: &mut [f32; 16],
) {
    let nb = k / block_len(F);
    for ar in a {
        assert!(ar.len() >= nb * x_bytes(F), "weight row too short");
    }
    for br in b {
        assert!(br.len() >= nb * y_bytes(F), "activation row too short");
    }
    let (nr, nc) = (a.len(), b.len());
    if L == I8MM && nr >= 2 && nc >= 2 {
        for r0 in (0..nr).step_by(2) {
            let r1 = (r0 + 1).min(nr - 1);
            let mut c0 = 0;
            while c0 < nc {
                // Three or four columns: one 2 × 4 block of lanes (a missing fourth column
                // repeats the third), sharing the rows' unpacking and scales.
                if !is_k(F) && nc - c0 >= 3 {
                    let c3 = (c0 + 3).min(nc - 1);
                    let xp = [a[r0].as_ptr(), a[r1].as_ptr()];
                    let yp = [
                        b[c0].as_ptr(),
                        b[c0 + 1].as_ptr(),
                        b[c0 + 2].as_ptr(),
                        b[c3].as_ptr(),
                    ];
                    // SAFETY: rows of nb blocks (asserted); caller's contract.
                    let [s, t] = unsafe { quant_lanes_2x4::<F>(nb, xp, yp) };
                    let cols = [c0, c0 + 1, c0 + 2, c3];
                    for (h, v) in [s, t].iter().enumerate() {
                        let (ca, cb) = (cols[2 * h], cols[2 * h + 1]);
                        out[r0 * 4 + ca] = v[0];
                        out[r0 * 4 + cb] = v[1];
                        out[r1 * 4 + ca] = v[2];
                        out[r1 * 4 + cb] = v[3];
                    }
                    c0 += 4;
                    continue;
                }
                let c1 = (c0 + 1).min(nc - 1);
                let xp = [
                    a[r0].as_ptr(),
                    a[r0].as_ptr(),
                    a[r1].as_ptr(),
                    a[r1].as_ptr(),
                ];
                let yp = [
                    b[c0].as_ptr(),
                    b[c1].as_ptr(),
                    b[c0].as_ptr(),
                    b[c1].as_ptr(),
                ];
                // SAFETY: rows of nb blocks (asserted); caller's contract.
                let s = unsafe {
                    if is_k(F) {
                        kquant_lanes::<I8MM, F>(nb, xp, yp)
                    } else {
                        quant_lanes::<I8MM, F>(nb, xp, yp)
                    }
                };
                out[r0 * 4 + c0] = s[0];
                out[r0 * 4 + c1] = s[1];
                out[r1 * 4 + c0] = s[2];
                out[r1 * 4 + c1] = s[3];
                c0 += 2;
            }
        }
        return;
    }
    // Three or four columns: two rows at a time against the four columns (a missing
    // fourth column or second row repeats the last one), lane c the row with column c.
    if !is_k(F) && nc >= 3 {
        let c3 = (nc - 1).min(3);
        let yp = [b[0].as_ptr(), b[1].as_ptr(), b[2].as_ptr(), b[c3].as_ptr()];
        for r0 in (0..nr).step_by(2) {
            let r1 = (r0 + 1).min(nr - 1);
            let xp = [a[r0].as_ptr(), a[r1].as_ptr()];
            // SAFETY: rows of nb blocks (asserted); caller's contract.
            let [s, t] = unsafe {
                if L == NEON {
                    quant_rows_2x4::<NEON, F>(nb, xp, yp)
                } else {
                    quant_rows_2x4::<DOTPROD, F>(nb, xp, yp)
                }
            };
            out[r0 * 4..r0 * 4 + nc].copy_from_slice(&s[..nc]);
            out[r1 * 4..r1 * 4 + nc].copy_from_slice(&t[..nc]);
        }
        return;
    }
    let n = nr * nc;
    let mut o0 = 0;
    while o0 < n {
        let cnt = (n - o0).min(4);
        let pair = |t: usize| {
            let o = o0 + t.min(cnt - 1);
            (o / nc, o % nc)
        };
        let xp = [0, 1, 2, 3].map(|t| a[pair(t).0].as_ptr());
        let yp = [0, 1, 2, 3].map(|t| b[pair(t).1].as_ptr());
        // SAFETY: rows of nb blocks (asserted); caller's contract.
        let s = unsafe {
            match (L == NEON, is_k(F)) {
                (true, false) => quant_lanes::<NEON, F>(nb, xp, yp),
                (false, false) => quant_lanes::<DOTPROD, F>(nb, xp, yp),
                (true, true) => kquant_lanes::<NEON, F>(nb, xp, yp),
                (false, true) => kquant_lanes::<DOTPROD, F>(nb, xp, yp),
            }
        };
        for (t, &v) in s.iter().enumerate().take(cnt) {
            let (ri, ci) = pair(t);
            out[ri * 4 + ci] = v;
        }
        o0 += cnt;
    }
}

/// The tile of level `L` for the formats it has (see [`mm_with`]).
///
/// # Safety
/// As [`tile_f`].
#[inline(always)]
unsafe fn tile_quant<const L: u8>(
    w: DType,
    k: usize,
    a: &[&[u8]],
    b: &[&[u8]],
    out: &mut [f32; 16],
) {
    // SAFETY: caller's contract.
    unsafe {
        match w {
            DType::Q4_0 => tile_f::<L, Q4_0>(k, a, b, out),
            DType::Q4_1 => tile_f::<L, Q4_1>(k, a, b, out),
            DType::Q5_0 => tile_f::<L, Q5_0>(k, a, b, out),
            DType::Q5_1 => tile_f::<L, Q5_1>(k, a, b, out),
            DType::Q8_0 => tile_f::<L, Q8_0>(k, a, b, out),
            DType::Q2K => tile_f::<L, Q2K>(k, a, b, out),
            DType::Q3K => tile_f::<L, Q3K>(k, a, b, out),
            DType::Q4K => tile_f::<L, Q4K>(k, a, b, out),
            DType::Q5K => tile_f::<L, Q5K>(k, a, b, out),
            DType::Q6K => tile_f::<L, Q6K>(k, a, b, out),
            _ => unreachable!("offered only for the formats above"),
        }
    }
}

pub(super) fn tile_quant_neon(w: DType, k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) {
    // SAFETY: NEON is baseline on aarch64.
    unsafe { tile_quant::<NEON>(w, k, a, b, out) }
}

pub(super) fn tile_quant_dotprod(
    w: DType,
    k: usize,
    a: &[&[u8]],
    b: &[&[u8]],
    out: &mut [f32; 16],
) {
    // SAFETY: this table is installed only where FEAT_DotProd was detected.
    unsafe { tile_quant::<DOTPROD>(w, k, a, b, out) }
}

pub(super) fn tile_quant_i8mm(w: DType, k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]) {
    // SAFETY: this table is installed only where FEAT_DotProd and FEAT_I8MM were detected.
    unsafe { tile_quant::<I8MM>(w, k, a, b, out) }
}

// ---------------------------------------------------------------------------------------
// Matrix × vector

/// Up to 4 weight rows of format `F` against one activation row: lane `t` of
/// [`quant_lanes`] / [`kquant_lanes`] is row `t` (a missing row repeats the last one, its
/// lane not stored), so each output is the tile's for that row and column, bit for bit.
///
/// # Safety
/// With `L == DOTPROD`, the CPU has FEAT_DotProd.
#[inline(always)]
unsafe fn gemv_rows<const L: u8, const F: u8>(k: usize, a: &[&[u8]], y: &[u8], out: &mut [f32; 4]) {
    let nb = k / block_len(F);
    assert!((1..=4).contains(&a.len()), "1 to 4 weight rows");
    for ar in a {
        assert!(ar.len() >= nb * x_bytes(F), "weight row too short");
    }
    assert!(y.len() >= nb * y_bytes(F), "activation row too short");
    let last = a.len() - 1;
    let xp = [
        a[0].as_ptr(),
        a[1.min(last)].as_ptr(),
        a[2.min(last)].as_ptr(),
        a[3.min(last)].as_ptr(),
    ];
    let yp = [y.as_ptr(); 4];
    // SAFETY: nb blocks at every pointer (asserted); caller's contract.
    let s = unsafe {
        if is_k(F) {
            kquant_lanes::<L, F>(nb, xp, yp)
        } else {
            quant_lanes::<L, F>(nb, xp, yp)
        }
    };
    out[..a.len()].copy_from_slice(&s[..a.len()]);
}

/// The standard activation rows of the quantised tiles for weights of `w`
/// (`w.vec_dot_type()`), as a gemv layout, quantised by this level's quantisers.
fn standard_rows(w: DType) -> Option<Packer> {
    Some(match w.vec_dot_type() {
        DType::Q8_0 => Packer {
            row_bytes: |k| k / 32 * 34,
            pack: q8_0,
        },
        DType::Q8_1 => Packer {
            row_bytes: |k| k / 32 * 36,
            pack: q8_1,
        },
        DType::Q8K => Packer {
            row_bytes: |k| k / 256 * kquant::Q8K_BYTES,
            pack: q8_k,
        },
        _ => return None,
    })
}

/// The gemv table of level `$level` (`NEON` or `DOTPROD`) over [`gemv_rows`]: one safe
/// entry per weight format.
macro_rules! gemv_table {
    ($(#[$doc:meta])* $name:ident, $level:ident) => {
        $(#[$doc])*
        pub(super) fn $name(w: DType) -> Option<Gemv> {
            macro_rules! rows {
                ($f:ident) => {{
                    fn rows(k: usize, a: &[&[u8]], y: &[u8], out: &mut [f32; 4]) {
                        // SAFETY: the tables holding this entry are installed only where
                        // its level's extension is present (NEON is baseline; DOTPROD's
                        // tables only where FEAT_DotProd was detected).
                        unsafe { gemv_rows::<$level, $f>(k, a, y, out) }
                    }
                    rows as GemvRows
                }};
            }
            let rows = match w {
                DType::Q4_0 => rows!(Q4_0),
                DType::Q4_1 => rows!(Q4_1),
                DType::Q5_0 => rows!(Q5_0),
                DType::Q5_1 => rows!(Q5_1),
                DType::Q8_0 => rows!(Q8_0),
                DType::Q2K => rows!(Q2K),
                DType::Q3K => rows!(Q3K),
                DType::Q4K => rows!(Q4K),
                DType::Q5K => rows!(Q5K),
                DType::Q6K => rows!(Q6K),
                _ => return None,
            };
            Some(Gemv {
                pack: standard_rows(w)?,
                rows,
            })
        }
    };
}

gemv_table!(
    /// The NEON gemv kernels (widening multiplies).
    gemv_neon,
    NEON
);
gemv_table!(
    /// The dotprod gemv kernels (`sdot`), for the dotprod and i8mm tables.
    gemv_dotprod,
    DOTPROD
);
