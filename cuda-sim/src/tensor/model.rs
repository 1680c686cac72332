//! The arithmetic of one output element of an `mma`: `d = c + sum_k a_k * b_k`.
//!
//! **Exact** (fixed by the ISA): integer `mma` (`.s8`/`.u8` products summed exactly in
//! 32 bits, wrapping, or clamped to the s32 range with `.satfinite`), the fragment
//! layouts, the conversion of an f16 accumulator to f32 and of the result to f16 (round
//! to nearest even).
//!
//! **Model** (not fixed by the ISA, measured on GPUs): how the f16/bf16 products and the
//! accumulator are added. After Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior
//! of NVIDIA tensor cores", PeerJ Computer Science 7:e330 (2021):
//!
//! 1. every product `a_k * b_k` is exact (no rounding; subnormal inputs kept);
//! 2. the k products are taken in blocks of [`MmaModel::block`] consecutive ones, in
//!    increasing k; each block is one fused addition of its products and the running
//!    accumulator (`c` for the first block);
//! 3. in a block, every addend is aligned to the largest exponent among them and
//!    truncated (toward zero, each addend on its own) to [`MmaModel::align_bits`]
//!    significant bits below and including that exponent's leading bit; the aligned
//!    addends are summed exactly (carries kept);
//! 4. the block's sum is normalised and rounded to f32 by [`MmaModel::rounding`]
//!    (toward zero on the GPUs measured so far) and becomes the next accumulator;
//! 5. with an f16 accumulator the final f32 value is rounded to f16 (nearest even).
//!
//! NaN operands, `inf - inf` and `0 * inf` give the canonical NaN `0x7fffffff`; an
//! infinite product or accumulator otherwise gives that infinity.

use crate::exec::half::{Exact, Fmt, Val, BF16, F16, F32};

/// How a block's exact (aligned and truncated) sum becomes the next f32 accumulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockRounding {
    /// Truncation (round toward zero), as measured on V100, T4, A100 and H100.
    TowardZero,
    /// Round to nearest, ties to even.
    NearestEven,
}

/// The parameters of the f16/bf16 accumulation model (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmaModel {
    /// Products added in one fused block with the accumulator (a divisor of k).
    pub block: u32,
    /// Significant bits each aligned addend keeps, counted from the leading bit of the
    /// block's largest addend (24 = f32's precision, no extra bit).
    pub align_bits: u32,
    /// The rounding of each block's sum to f32.
    pub rounding: BlockRounding,
}

impl MmaModel {
    /// sm_80 (A100): blocks of 8 products (Fasi et al. 2021, A100 with binary16 and
    /// bfloat16 inputs), truncated alignment keeping 24 bits (the "24-bit" accumulator
    /// width measured on A100 and Ada GPUs by the emulation_sys probes of Hu et al.,
    /// github.com/huweim/emulation_sys), block sums truncated to f32.
    pub const SM80: MmaModel = MmaModel {
        block: 8,
        align_bits: 24,
        rounding: BlockRounding::TowardZero,
    };

    /// sm_90 (H100/H200): the literature's values, to be pinned by the calibration kit's
    /// `mma_f16_numerics` probe: blocks of 16 products (FTTN, Li et al. 2024, and
    /// Khattak and Mikaitis 2025 report larger fused blocks on Hopper than A100's 8),
    /// 25 bits kept in the alignment (emulation_sys, H100: one bit more than A100),
    /// truncated block sums.
    pub const SM90: MmaModel = MmaModel {
        block: 16,
        align_bits: 25,
        rounding: BlockRounding::TowardZero,
    };

    /// Every model [`crate::tensor::fit_f16_model`] considers: blocks of 2, 4, 8, 16,
    /// 24 to 31 bits kept, either rounding (64 models). All obey [`error_bound`].
    pub fn candidates() -> Vec<MmaModel> {
        let mut v = Vec::new();
        for block in [2, 4, 8, 16] {
            for align_bits in 24..=31 {
                for rounding in [BlockRounding::TowardZero, BlockRounding::NearestEven] {
                    v.push(MmaModel {
                        block,
                        align_bits,
                        rounding,
                    });
                }
            }
        }
        v
    }
}

impl Default for MmaModel {
    /// [`MmaModel::SM90`]: the GPUs this emulator's users target (H100, H200).
    fn default() -> Self {
        MmaModel::SM90
    }
}

/// The element type of an f16-class `mma`'s A and B.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HalfInput {
    /// IEEE binary16.
    F16,
    /// bfloat16.
    Bf16,
}

impl HalfInput {
    fn fmt(self) -> Fmt {
        match self {
            HalfInput::F16 => F16,
            HalfInput::Bf16 => BF16,
        }
    }
}

/// The canonical f32 NaN.
const NAN32: u32 = 0x7fff_ffff;

/// The bound cuda-sim declares for an f16/bf16 `mma` with f32 accumulation, and that
/// every [`MmaModel::candidates`] model obeys: `|d - exact| <= (k + 1) * 2^-22 *
/// (|c| + sum_k |a_k * b_k|)`, where `exact` is the exact `c + sum_k a_k b_k`. (A block
/// of B products loses less than one unit of 2^-23 relative to the block's largest
/// magnitude per addend and one unit of the f32 result: (B + 2) units per block, K/B
/// blocks, at most 2K units for B >= 2, plus second-order slack.) With an f16
/// accumulator add half an f16 unit of the result: `2^-11 * (|exact| + bound)`.
pub fn error_bound(k: u32, sum_abs: f64) -> f64 {
    (k + 1) as f64 * (-22f64).exp2() * sum_abs
}

/// Special operands of a dot product, checked before any arithmetic: `Some(bits)` is
/// the f32 result.
fn specials(fmt: Fmt, c: Val, a: &[u16], b: &[u16]) -> Option<u32> {
    let (mut pos_inf, mut neg_inf, mut nan) = (false, false, false);
    let mut terms = vec![c];
    for (&x, &y) in a.iter().zip(b) {
        terms.push(match (fmt.decode(x as u64), fmt.decode(y as u64)) {
            (Val::Nan, _) | (_, Val::Nan) => Val::Nan,
            (Val::Inf(_), Val::Finite(f)) | (Val::Finite(f), Val::Inf(_)) if f.m == 0 => Val::Nan,
            (Val::Inf(s), Val::Inf(t)) => Val::Inf(s != t),
            (Val::Inf(s), Val::Finite(f)) | (Val::Finite(f), Val::Inf(s)) => Val::Inf(s != f.neg),
            (Val::Finite(_), Val::Finite(_)) => continue,
        });
    }
    for t in terms {
        match t {
            Val::Nan => nan = true,
            Val::Inf(true) => neg_inf = true,
            Val::Inf(false) => pos_inf = true,
            Val::Finite(_) => {}
        }
    }
    if nan || (pos_inf && neg_inf) {
        Some(NAN32)
    } else if pos_inf {
        Some(0x7f80_0000)
    } else if neg_inf {
        Some(0xff80_0000)
    } else {
        None
    }
}

fn finite(v: Val) -> Exact {
    match v {
        Val::Finite(x) => x,
        _ => unreachable!("specials() handled non-finite values"),
    }
}

fn top(x: Exact) -> i32 {
    x.e + (127 - x.m.leading_zeros() as i32)
}

impl MmaModel {
    /// `c + sum_k a[k] * b[k]` by this model: `c` f32 bits, `a` and `b` the k input
    /// encodings of row and column. Returns f32 bits.
    pub fn dot(&self, input: HalfInput, c: u32, a: &[u16], b: &[u16]) -> u32 {
        let fmt = input.fmt();
        let cv = F32.decode(c as u64);
        if let Some(r) = specials(fmt, cv, a, b) {
            return r;
        }
        let mut acc = c;
        let block = (self.block as usize).max(1);
        let mut terms: Vec<Exact> = Vec::with_capacity(block + 1);
        for (ka, kb) in a.chunks(block).zip(b.chunks(block)) {
            terms.clear();
            let accv = finite(F32.decode(acc as u64));
            let mut all_neg_zero = accv.neg;
            terms.push(accv);
            for (&x, &y) in ka.iter().zip(kb) {
                let (p, q) = (finite(fmt.decode(x as u64)), finite(fmt.decode(y as u64)));
                let prod = Exact {
                    neg: p.neg != q.neg,
                    m: p.m * q.m,
                    e: p.e + q.e,
                };
                all_neg_zero &= prod.neg && prod.m == 0;
                terms.push(prod);
            }
            let Some(emax) = terms.iter().filter(|t| t.m != 0).map(|t| top(*t)).max() else {
                acc = if all_neg_zero { 0x8000_0000 } else { 0 };
                continue;
            };
            let g = emax - (self.align_bits as i32 - 1);
            let mut sum: i128 = 0;
            for t in &terms {
                let mag = if t.e >= g {
                    t.m << (t.e - g)
                } else if g - t.e >= 128 {
                    0
                } else {
                    t.m >> (g - t.e)
                } as i128;
                sum += if t.neg { -mag } else { mag };
            }
            acc = if sum == 0 {
                0
            } else {
                let nearest = self.rounding == BlockRounding::NearestEven;
                F32.round(sum < 0, sum.unsigned_abs(), g, false, nearest) as u32
            };
        }
        acc
    }
}

/// `c + sum_k a[k] * b[k]` at the edge of [`error_bound`]: the exact value moved by
/// the bound, up or down by a hash of the inputs, then rounded toward the exact value
/// (so the result stays within the bound). `c` and the result are f32 bits.
pub fn dot_at_bound(input: HalfInput, c: u32, a: &[u16], b: &[u16]) -> u32 {
    let fmt = input.fmt();
    let cv = F32.decode(c as u64);
    if let Some(r) = specials(fmt, cv, a, b) {
        return r;
    }
    let (exact, sum_abs, all_neg_zero) = exact_sum(fmt, c, a, b);
    let bound = error_bound(a.len() as u32, sum_abs);
    if bound == 0.0 {
        return if all_neg_zero { 0x8000_0000 } else { 0 };
    }
    let up = direction(exact, sum_abs);
    let target = if up { exact + bound } else { exact - bound };
    toward(exact, target, F32) as u32
}

/// [`dot_at_bound`] with an f16 result: the bound grows by half an f16 unit of the
/// result. Returns f16 bits.
pub fn dot_at_bound_f16(input: HalfInput, c: u32, a: &[u16], b: &[u16]) -> u16 {
    let fmt = input.fmt();
    let cv = F32.decode(c as u64);
    if let Some(r) = specials(fmt, cv, a, b) {
        return f32_to_f16(r);
    }
    let (exact, sum_abs, all_neg_zero) = exact_sum(fmt, c, a, b);
    let b32 = error_bound(a.len() as u32, sum_abs);
    if b32 == 0.0 {
        return if all_neg_zero { 0x8000 } else { 0 };
    }
    let bound = b32 + (-11f64).exp2() * (exact.abs() + b32);
    let up = direction(exact, sum_abs);
    let target = if up { exact + bound } else { exact - bound };
    toward(exact, target, F16) as u16
}

/// The exact sum in f64 (products of 16-bit values are exact; the sum's rounding error
/// is far below [`error_bound`]), the sum of magnitudes, and whether every term is -0.
fn exact_sum(fmt: Fmt, c: u32, a: &[u16], b: &[u16]) -> (f64, f64, bool) {
    let val = |x: Exact| {
        let v = x.m as f64 * (x.e as f64).exp2();
        if x.neg {
            -v
        } else {
            v
        }
    };
    let cx = finite(F32.decode(c as u64));
    let (mut s, mut abs) = (val(cx), val(cx).abs());
    let mut all_neg_zero = cx.neg && cx.m == 0;
    for (&x, &y) in a.iter().zip(b) {
        let (p, q) = (finite(fmt.decode(x as u64)), finite(fmt.decode(y as u64)));
        let v = val(p) * val(q);
        all_neg_zero &= v == 0.0 && (p.neg != q.neg);
        s += v;
        abs += v.abs();
    }
    (s, abs, all_neg_zero)
}

/// Which way the bound moves a result: one well-mixed bit of its inputs.
fn direction(exact: f64, sum_abs: f64) -> bool {
    let h =
        (exact.to_bits() ^ sum_abs.to_bits().rotate_left(29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h >> 63 == 1
}

/// `target` rounded in `fmt` toward `exact` (the encoding nearest `target` that lies
/// between the two; overflow clamps to the largest finite value).
fn toward(exact: f64, target: f64, fmt: Fmt) -> u64 {
    let r = crate::exec::half::round_f64(fmt, target);
    let v = value(fmt, r);
    let overshoot = if target > exact {
        v > target
    } else {
        v < target
    };
    if overshoot || v.is_infinite() {
        step(fmt, r, target < exact)
    } else {
        r
    }
}

fn value(fmt: Fmt, bits: u64) -> f64 {
    match fmt.decode(bits) {
        Val::Finite(x) => {
            let v = x.m as f64 * (x.e as f64).exp2();
            if x.neg {
                -v
            } else {
                v
            }
        }
        Val::Inf(s) => {
            if s {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            }
        }
        Val::Nan => f64::NAN,
    }
}

/// The neighbouring encoding of `bits` upward (toward +inf) or downward.
fn step(fmt: Fmt, bits: u64, up: bool) -> u64 {
    let sign = 1u64 << (fmt_bits(fmt) - 1);
    let neg = bits & sign != 0;
    let mag = bits & (sign - 1);
    if mag == 0 {
        return if up { 1 } else { sign | 1 };
    }
    if up != neg {
        bits + 1
    } else {
        bits - 1
    }
}

fn fmt_bits(fmt: Fmt) -> u32 {
    if fmt == F32 {
        32
    } else {
        16
    }
}

/// An f32 encoding rounded to f16 (nearest even; NaN to the canonical f16 NaN).
pub(crate) fn f32_to_f16(bits: u32) -> u16 {
    crate::exec::half::from_f32(false, false, bits as u64) as u16
}

/// An f16 encoding as f32 bits (exact).
pub(crate) fn f16_to_f32(bits: u16) -> u32 {
    match F16.decode(bits as u64) {
        Val::Nan => NAN32,
        Val::Inf(s) => {
            if s {
                0xff80_0000
            } else {
                0x7f80_0000
            }
        }
        Val::Finite(x) => F32.round(x.neg, x.m, x.e, false, true) as u32,
    }
}

/// The integer `mma` element: `c + sum_k a[k] * b[k]` with bytes signed or unsigned,
/// exact, then wrapped to 32 bits or (`satfinite`) clamped to the s32 range.
pub fn dot_int8(
    a_signed: bool,
    b_signed: bool,
    satfinite: bool,
    c: u32,
    a: &[u8],
    b: &[u8],
) -> u32 {
    let val = |x: u8, s: bool| if s { x as i8 as i64 } else { x as i64 };
    let mut acc = c as i32 as i64;
    for (&x, &y) in a.iter().zip(b) {
        acc += val(x, a_signed) * val(y, b_signed);
    }
    if satfinite {
        acc.clamp(i32::MIN as i64, i32::MAX as i64) as i32 as u32
    } else {
        acc as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: u16 = 0x3c00;

    fn f16(x: f64) -> u16 {
        crate::exec::half::round_f64(F16, x) as u16
    }

    #[test]
    fn small_products_below_the_alignment_are_truncated() {
        // 1 + 8 * 2^-26 = 1 + 2^-23: each small product is below the grid of 1 unless
        // 27 bits are kept (grid 2^-26), and their sum reaches an f32 unit only if all
        // eight share the block of the 1.
        let mut a = vec![ONE; 9];
        let mut b = vec![ONE; 9];
        for k in 1..9 {
            a[k] = f16((-13f64).exp2());
            b[k] = f16((-13f64).exp2());
        }
        let m = |block, align_bits| MmaModel {
            block,
            align_bits,
            rounding: BlockRounding::TowardZero,
        };
        let one = 1f32.to_bits();
        assert_eq!(m(16, 24).dot(HalfInput::F16, 0, &a, &b), one);
        assert_eq!(m(16, 26).dot(HalfInput::F16, 0, &a, &b), one);
        assert_eq!(m(16, 27).dot(HalfInput::F16, 0, &a, &b), one + 1);
        // Blocks of 8: 1 + 7 * 2^-26 truncates to 1, then 1 + 2^-26 does too.
        assert_eq!(m(8, 27).dot(HalfInput::F16, 0, &a, &b), one);
        // To nearest: 1 + 0.875 ulp rounds up in the first block.
        let rn = MmaModel {
            rounding: BlockRounding::NearestEven,
            ..m(8, 27)
        };
        assert_eq!(rn.dot(HalfInput::F16, 0, &a, &b), one + 1);
    }

    #[test]
    fn int8_wraps_or_saturates() {
        let a = [0x80u8; 4]; // -128 signed, 128 unsigned
        let b = [0x80u8; 4];
        let c = i32::MAX as u32;
        let s = dot_int8(true, true, false, c, &a, &b);
        assert_eq!(s, (i32::MAX as i64 + 4 * 16384) as u32);
        assert_eq!(dot_int8(true, true, true, c, &a, &b), i32::MAX as u32);
        assert_eq!(
            dot_int8(false, true, false, 0, &a, &b),
            (-4 * 16384i32) as u32
        );
    }

    #[test]
    fn specials_give_nan_and_inf() {
        let inf = 0x7c00;
        assert_eq!(MmaModel::SM90.dot(HalfInput::F16, 0, &[inf], &[0]), NAN32);
        assert_eq!(
            MmaModel::SM90.dot(HalfInput::F16, 0xff80_0000, &[inf], &[ONE]),
            NAN32
        );
        assert_eq!(
            MmaModel::SM90.dot(HalfInput::F16, 0, &[inf], &[ONE]),
            0x7f80_0000
        );
        assert_eq!(dot_at_bound(HalfInput::F16, 0, &[0x7e00], &[ONE]), NAN32);
    }

    #[test]
    fn f16_conversions_round_trip() {
        for bits in [0u16, 0x8000, 1, 0x3c00, 0x7bff, 0xfbff, 0x0400, 0x03ff] {
            assert_eq!(f32_to_f16(f16_to_f32(bits)), bits);
        }
    }
}
