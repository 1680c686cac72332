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
//! 3. in a block, every addend is aligned to the block's reference exponent and
//!    truncated (toward zero, each addend on its own) to [`MmaModel::align_bits`] bits
//!    below and including the reference exponent's bit; the aligned addends are summed
//!    exactly (carries kept). The reference ([`MmaModel::align_to`]) is the largest
//!    addend's leading bit ([`AlignRef::LeadingBit`]), or the largest exponent the
//!    addends have before their significands are multiplied: `e_a + e_b` for a product,
//!    C's own exponent ([`AlignRef::InputExponents`]; a product whose significands
//!    multiply to 2 or more then has its leading bit one place above the reference);
//! 4. the block's sum is normalised and rounded to f32 by [`MmaModel::rounding`]
//!    (toward zero on the GPUs measured so far) and becomes the next accumulator;
//! 5. with an f16 accumulator the final f32 value is rounded to f16 (nearest even).
//!
//! NaN operands, `inf - inf` and `0 * inf` give the canonical NaN `0x7fffffff`; an
//! infinite product or accumulator otherwise gives that infinity.

use crate::exec::half::{Fmt, Val, BF16, F16, F32};

/// How a block's exact (aligned and truncated) sum becomes the next f32 accumulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockRounding {
    /// Truncation (round toward zero), as measured on V100, T4, A100 and H100.
    TowardZero,
    /// Round to nearest, ties to even.
    NearestEven,
}

/// The exponent a block's addends are aligned to (step 3 of the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AlignRef {
    /// The leading bit of the block's largest addend (the accumulator's, or a product's
    /// after its significands are multiplied).
    LeadingBit,
    /// The largest of the accumulator's exponent and the products' input exponent sums
    /// `e_a + e_b`, taken before the significands are multiplied (as an adder that
    /// computes its alignment shifts in parallel with the multipliers would): a product
    /// whose significands multiply to 2 or more keeps one bit more than
    /// [`MmaModel::align_bits`] from its leading bit. An input's exponent is that of its
    /// leading bit (for a subnormal input too, which the H100 data does not pin: the
    /// format's minimum exponent reproduces it as well).
    InputExponents,
}

/// The parameters of the f16/bf16 accumulation model (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmaModel {
    /// Products added in one fused block with the accumulator (a divisor of k).
    pub block: u32,
    /// Bits each aligned addend keeps, counted from the block's reference exponent
    /// ([`MmaModel::align_to`]; 24 = f32's precision, no extra bit).
    pub align_bits: u32,
    /// What the block's addends are aligned to.
    pub align_to: AlignRef,
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
        align_to: AlignRef::LeadingBit,
        rounding: BlockRounding::TowardZero,
    };

    /// sm_90 (H100/H200), measured: the only candidate that reproduces all 1024 raw
    /// results of the calibration kit's `mma_f16_numerics` probe on an NVIDIA H100 80GB
    /// HBM3 (`harness/reference/cuda-h100-a5a7363/probes.json`). One fused block of 16
    /// products (as FTTN, Li et al. 2024, and Khattak and Mikaitis 2025 report for
    /// Hopper), addends aligned to the largest input exponent sum (or C's exponent) and
    /// truncated 26 bits below and including it, the block's sum truncated to f32. The
    /// leading-bit alignment with 26 bits (the best of those) differs in 64 results, all
    /// where the largest product's significands multiply to 2 or more: there the H100
    /// keeps the 27th bit below that product's leading bit.
    pub const SM90: MmaModel = MmaModel {
        block: 16,
        align_bits: 26,
        align_to: AlignRef::InputExponents,
        rounding: BlockRounding::TowardZero,
    };

    /// Every model [`crate::tensor::fit_f16_model`] considers: blocks of 2, 4, 8, 16,
    /// either rounding, aligned to the leading bit with 24 to 31 bits kept, or to the
    /// input exponents with 24 to 28 (104 models). Wider input-exponent alignments are
    /// left out: from 29 bits on, blocks of 2 to 8 give (almost) the same results as
    /// the leading-bit alignment on [`crate::tensor::numerics_cases`], which could then
    /// not tell the two apart. All obey [`error_bound`].
    pub fn candidates() -> Vec<MmaModel> {
        let mut v = Vec::new();
        for (align_to, widths) in [
            (AlignRef::LeadingBit, 24..=31),
            (AlignRef::InputExponents, 24..=28),
        ] {
            for block in [2, 4, 8, 16] {
                for align_bits in widths.clone() {
                    for rounding in [BlockRounding::TowardZero, BlockRounding::NearestEven] {
                        v.push(MmaModel {
                            block,
                            align_bits,
                            align_to,
                            rounding,
                        });
                    }
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

/// A finite 16-bit input decoded once: `(-1)^neg * m * 2^e`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Fin {
    pub neg: bool,
    pub m: u32,
    pub e: i32,
}

impl Fin {
    /// The exponent of the leading bit (meaningless for zero, which no caller asks).
    fn top(self) -> i32 {
        self.e + 31 - self.m.leading_zeros() as i32
    }

    /// The value as f64 (exact).
    pub(crate) fn value(self) -> f64 {
        let v = self.m as f64 * pow2(self.e);
        if self.neg {
            -v
        } else {
            v
        }
    }
}

impl HalfInput {
    /// `bits` decoded, or `None` for an infinity or NaN.
    pub(crate) fn finite(self, bits: u16) -> Option<Fin> {
        match self.fmt().decode(bits as u64) {
            Val::Finite(x) => Some(Fin {
                neg: x.neg,
                m: x.m as u32,
                e: x.e,
            }),
            _ => None,
        }
    }

    fn all_finite(self, v: &[u16]) -> Vec<Fin> {
        v.iter()
            .map(|&x| {
                self.finite(x)
                    .expect("specials() handled non-finite values")
            })
            .collect()
    }
}

/// 2^e for the exponents of 16-bit inputs (-133 to 127: normal in f64), built from bits.
fn pow2(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// `(-1)^neg * mag * 2^e` (mag > 0) rounded to f32 by truncation or to nearest even;
/// overflow gives the largest finite value (truncation) or infinity.
fn round_f32(neg: bool, mag: u64, e: i32, nearest: bool) -> u32 {
    let sign = if neg { 0x8000_0000 } else { 0 };
    let top = e + 63 - mag.leading_zeros() as i32;
    // Exponent of the last kept place: 23 below the top, never below 2^-149.
    let q = (top - 23).max(-149);
    let shift = q - e;
    let mut m = if shift <= 0 {
        mag << (-shift)
    } else if shift >= 64 {
        0
    } else {
        let kept = mag >> shift;
        let rem = mag & ((1u64 << shift) - 1);
        let half = 1u64 << (shift - 1);
        kept + (nearest && (rem > half || (rem == half && kept & 1 == 1))) as u64
    };
    let mut q = q;
    if m == 1 << 24 {
        m >>= 1;
        q += 1;
    }
    if m >= 1 << 23 {
        let exp = q + 23 + 127;
        if exp >= 255 {
            return sign | if nearest { 0x7f80_0000 } else { 0x7f7f_ffff };
        }
        sign | (exp as u32) << 23 | (m as u32 & 0x7f_ffff)
    } else {
        sign | m as u32
    }
}

/// Whether the f32 encoding `c` is finite.
pub(crate) fn finite_f32(c: u32) -> bool {
    c & 0x7f80_0000 != 0x7f80_0000
}

impl MmaModel {
    /// `c + sum_k a[k] * b[k]` by this model: `c` f32 bits, `a` and `b` the k input
    /// encodings of row and column. Returns f32 bits.
    pub fn dot(&self, input: HalfInput, c: u32, a: &[u16], b: &[u16]) -> u32 {
        let cv = F32.decode(c as u64);
        if let Some(r) = specials(input.fmt(), cv, a, b) {
            return r;
        }
        self.dot_finite(c, &input.all_finite(a), &input.all_finite(b))
    }

    /// [`MmaModel::dot`] of finite operands already decoded (`c` finite f32 bits).
    pub(crate) fn dot_finite(&self, c: u32, a: &[Fin], b: &[Fin]) -> u32 {
        let mut acc = c;
        let block = (self.block as usize).clamp(1, 32);
        let nearest = self.rounding == BlockRounding::NearestEven;
        let inputs = self.align_to == AlignRef::InputExponents;
        // (negative, significand, exponent) of the accumulator and the block's products.
        let mut terms = [(false, 0u64, 0i32); 33];
        for (ka, kb) in a.chunks(block).zip(b.chunks(block)) {
            let accv = f32_parts(acc);
            let mut n = 0;
            let mut emax = i32::MIN;
            let mut all_neg_zero = accv.neg;
            // `reference`: the addend's exponent for the alignment (step 3).
            let mut push = |neg: bool, m: u64, e: i32, reference: i32| {
                if m != 0 {
                    emax = emax.max(reference);
                    terms[n] = (neg, m, e);
                    n += 1;
                }
            };
            push(accv.neg, accv.m as u64, accv.e, accv.top());
            for (p, q) in ka.iter().zip(kb) {
                let neg = p.neg != q.neg;
                all_neg_zero &= neg;
                let (m, e) = (p.m as u64 * q.m as u64, p.e + q.e);
                let reference = if inputs {
                    p.top() + q.top()
                } else {
                    e + 63 - m.leading_zeros() as i32
                };
                push(neg, m, e, reference);
            }
            if n == 0 {
                // Only zeros: -0 when every one is -0 (accumulator and products).
                acc = if all_neg_zero { 0x8000_0000 } else { 0 };
                continue;
            }
            let g = emax - (self.align_bits as i32 - 1);
            let mut sum: i64 = 0;
            for &(neg, m, e) in &terms[..n] {
                let mag = if e >= g {
                    (m << (e - g)) as i64
                } else if g - e >= 64 {
                    0
                } else {
                    (m >> (g - e)) as i64
                };
                sum += if neg { -mag } else { mag };
            }
            acc = if sum == 0 {
                0
            } else {
                round_f32(sum < 0, sum.unsigned_abs(), g, nearest)
            };
        }
        acc
    }
}

/// A finite f32 encoding as sign, significand, exponent.
fn f32_parts(bits: u32) -> Fin {
    let field = (bits >> 23 & 0xff) as i32;
    let frac = bits & 0x7f_ffff;
    let (m, e) = if field == 0 {
        (frac, -149)
    } else {
        (frac | 1 << 23, field - 150)
    };
    Fin {
        neg: bits >> 31 == 1,
        m,
        e,
    }
}

/// `c + sum_k a[k] * b[k]` at the edge of [`error_bound`]: the exact value moved by
/// the bound, up or down by a hash of the inputs, then rounded toward the exact value
/// (so the result stays within the bound). `c` and the result are f32 bits.
pub fn dot_at_bound(input: HalfInput, c: u32, a: &[u16], b: &[u16]) -> u32 {
    let cv = F32.decode(c as u64);
    if let Some(r) = specials(input.fmt(), cv, a, b) {
        return r;
    }
    let v = |x: &[u16]| -> Vec<f64> { input.all_finite(x).iter().map(|f| f.value()).collect() };
    at_bound_finite(c, &v(a), &v(b), false)
}

/// [`dot_at_bound`] with an f16 result: the bound grows by half an f16 unit of the
/// result. Returns f16 bits.
pub fn dot_at_bound_f16(input: HalfInput, c: u32, a: &[u16], b: &[u16]) -> u16 {
    let cv = F32.decode(c as u64);
    if let Some(r) = specials(input.fmt(), cv, a, b) {
        return f32_to_f16(r);
    }
    let v = |x: &[u16]| -> Vec<f64> { input.all_finite(x).iter().map(|f| f.value()).collect() };
    at_bound_finite(c, &v(a), &v(b), true) as u16
}

/// The at-bound result of finite operands given as f64 values (exact: 16-bit inputs),
/// `c` finite f32 bits; an f32 result, or with `f16_out` an f16 one.
pub(crate) fn at_bound_finite(c: u32, a: &[f64], b: &[f64], f16_out: bool) -> u32 {
    // The sum in f64: products of 16-bit values are exact, the sum's rounding error is
    // far below the bound.
    let cf = f32::from_bits(c) as f64;
    let (mut exact, mut sum_abs) = (cf, cf.abs());
    let mut all_neg_zero = cf == 0.0 && cf.is_sign_negative();
    for (&x, &y) in a.iter().zip(b) {
        let p = x * y;
        all_neg_zero &= p == 0.0 && p.is_sign_negative();
        exact += p;
        sum_abs += p.abs();
    }
    let b32 = error_bound(a.len() as u32, sum_abs);
    if b32 == 0.0 {
        let zero = if f16_out { 0x8000 } else { 0x8000_0000 };
        return if all_neg_zero { zero } else { 0 };
    }
    let (bound, fmt) = if f16_out {
        (b32 + (-11f64).exp2() * (exact.abs() + b32), F16)
    } else {
        (b32, F32)
    };
    let up = direction(exact, sum_abs);
    let target = if up { exact + bound } else { exact - bound };
    toward(exact, target, fmt) as u32
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
    let r = if fmt == F32 {
        // f64 to f32 `as` rounds to nearest even (subnormals and overflow included).
        (target as f32).to_bits() as u64
    } else {
        crate::exec::half::round_f64(fmt, target)
    };
    let v = if fmt == F32 {
        f32::from_bits(r as u32) as f64
    } else {
        value(fmt, r)
    };
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
    let dot = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| val(x, a_signed) * val(y, b_signed))
        .sum();
    int_acc(c, dot, satfinite)
}

/// `c` (s32 bits) plus an exact dot product, wrapped or clamped (`satfinite`).
pub(crate) fn int_acc(c: u32, dot: i64, satfinite: bool) -> u32 {
    let acc = c as i32 as i64 + dot;
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
            align_to: AlignRef::LeadingBit,
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
    fn input_exponent_alignment_keeps_a_bit_more_below_a_carrying_product() {
        // A large product and fifteen of 2^-25 (2^-12 * 2^-13), C = 0.
        let sum = |large: u16, model: MmaModel| {
            let mut a = vec![f16((-12f64).exp2()); 16];
            let mut b = vec![f16((-13f64).exp2()); 16];
            (a[0], b[0]) = (large, large);
            f32::from_bits(model.dot(HalfInput::F16, 0, &a, &b))
        };
        let lead = MmaModel {
            align_to: AlignRef::LeadingBit,
            ..MmaModel::SM90
        };
        let two23 = (-23f64).exp2() as f32;
        // 1 * 1: both references are 2^0, the grid 2^-25 keeps every small product:
        // 1 + 15 * 2^-25 = 1 + 3.75 units of 2^-23, truncated to 3.
        assert_eq!(sum(ONE, MmaModel::SM90), 1.0 + 3.0 * two23);
        assert_eq!(sum(ONE, lead), 1.0 + 3.0 * two23);
        // 1.5 * 1.5 = 2.25 has its leading bit at 2^1 but its input exponents sum to 0:
        // aligned to the inputs the grid stays 2^-25 (15 * 2^-25 = 1.875 units of
        // 2^-22, truncated to 1); aligned to the leading bit it is 2^-24, and every small
        // product is dropped.
        let big = f16(1.5);
        assert_eq!(sum(big, MmaModel::SM90), 2.25 + 2.0 * two23);
        assert_eq!(sum(big, lead), 2.25);
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
