//! The arithmetic of the exact and approximate instructions, on register bits. Each
//! function is the PTX ISA's definition; tests pin the edge cases (ties, NaN, zeros,
//! saturation, shifts past the width).

use super::half as exact16;
use crate::ptx::ir::{BinOp, Cmp, Rnd, Ty, UnOp};

/// The canonical NaN NVIDIA GPUs produce for f32 arithmetic.
pub const CANONICAL_NAN_F32: u32 = 0x7fff_ffff;

/// The NaN NVIDIA GPUs produce for f64 arithmetic without a NaN operand: negative, quiet,
/// no payload. Seen on an H200 (driver 580.159.04): `add.f64` of +inf and -inf, then
/// `cvt.rn.f32.f64`, gives 0xffc00000. Written out rather than left to the host, whose
/// default NaN differs between x86 (this one) and Arm (positive).
pub const DEFAULT_NAN_F64: u64 = 0xfff8_0000_0000_0000;

/// The quiet bit of an f64 NaN.
const QUIET_F64: u64 = 0x0008_0000_0000_0000;

/// `v` cut to `ty`'s width.
#[inline]
pub fn mask(v: u64, ty: Ty) -> u64 {
    let b = ty.bits();
    if b >= 64 {
        v
    } else {
        v & ((1u64 << b) - 1)
    }
}

/// `v` sign-extended from `ty`'s width.
#[inline]
pub fn sext(v: u64, ty: Ty) -> i64 {
    let b = ty.bits();
    if b >= 64 {
        v as i64
    } else {
        ((v << (64 - b)) as i64) >> (64 - b)
    }
}

#[inline]
fn f32_of(v: u64) -> f32 {
    f32::from_bits(v as u32)
}

#[inline]
fn ftz32(x: f32, ftz: bool) -> f32 {
    if ftz && x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

#[inline]
fn out32(x: f32, ftz: bool) -> u64 {
    let x = ftz32(x, ftz);
    if x.is_nan() {
        CANONICAL_NAN_F32 as u64
    } else {
        x.to_bits() as u64
    }
}

/// An f64 result's bits: a NaN result is the first NaN operand, quieted (IEEE's
/// recommended propagation), or [`DEFAULT_NAN_F64`] where no operand is NaN.
#[inline]
fn out64(r: f64, operands: &[f64]) -> u64 {
    if !r.is_nan() {
        return r.to_bits();
    }
    operands
        .iter()
        .find(|x| x.is_nan())
        .map_or(DEFAULT_NAN_F64, |x| x.to_bits() | QUIET_F64)
}

/// `cvt.f32.f64` of a NaN: its sign and the top of its payload, quieted (the H200 turns
/// [`DEFAULT_NAN_F64`] into 0xffc00000).
#[inline]
fn narrow_nan(bits: u64) -> u64 {
    let sign = (bits >> 63) << 31;
    sign | 0x7fc0_0000 | ((bits >> 29) & 0x003f_ffff)
}

/// IEEE minNum/maxNum as PTX defines `min.f32`/`max.f32`: a NaN operand yields the
/// other, -0 < +0.
fn minmax32(a: f32, b: f32, max: bool) -> f32 {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => f32::from_bits(CANONICAL_NAN_F32),
        (true, false) => b,
        (false, true) => a,
        _ => {
            if a == b {
                // Equal values differ only in the sign of zero.
                let a_neg = a.is_sign_negative();
                if a_neg == max {
                    b
                } else {
                    a
                }
            } else if (a > b) == max {
                a
            } else {
                b
            }
        }
    }
}

fn minmax64(a: f64, b: f64, max: bool) -> f64 {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => f64::from_bits(DEFAULT_NAN_F64),
        (true, false) => b,
        (false, true) => a,
        _ => {
            if a == b {
                if a.is_sign_negative() == max {
                    b
                } else {
                    a
                }
            } else if (a > b) == max {
                a
            } else {
                b
            }
        }
    }
}

/// A two-operand instruction.
pub fn bin(op: BinOp, ty: Ty, ftz: bool, a: u64, b: u64) -> u64 {
    match ty {
        Ty::F(32) => {
            let (x, y) = (ftz32(f32_of(a), ftz), ftz32(f32_of(b), ftz));
            let r = match op {
                BinOp::Add => x + y,
                BinOp::Sub => x - y,
                BinOp::MulLo => x * y,
                BinOp::Div => x / y,
                BinOp::Min => minmax32(x, y, false),
                BinOp::Max => minmax32(x, y, true),
                _ => f32::NAN,
            };
            out32(r, ftz)
        }
        Ty::F(64) => {
            let (x, y) = (f64::from_bits(a), f64::from_bits(b));
            let r = match op {
                BinOp::Add => x + y,
                BinOp::Sub => x - y,
                BinOp::MulLo => x * y,
                BinOp::Div => x / y,
                BinOp::Min => return minmax64(x, y, false).to_bits(),
                BinOp::Max => return minmax64(x, y, true).to_bits(),
                _ => f64::NAN,
            };
            out64(r, &[x, y])
        }
        _ => int_bin(op, ty, a, b),
    }
}

fn int_bin(op: BinOp, ty: Ty, a: u64, b: u64) -> u64 {
    let w = ty.bits();
    let signed = ty.is_signed();
    let (ua, ub) = (mask(a, ty), mask(b, ty));
    let (sa, sb) = (sext(a, ty), sext(b, ty));
    let r = match op {
        BinOp::Add => ua.wrapping_add(ub),
        BinOp::Sub => ua.wrapping_sub(ub),
        BinOp::MulLo => ua.wrapping_mul(ub),
        BinOp::MulHi => {
            if signed {
                ((sa as i128 * sb as i128) >> w) as u64
            } else {
                ((ua as u128 * ub as u128) >> w) as u64
            }
        }
        BinOp::MulWide => {
            // Double width: the caller's destination is 2w bits wide.
            return if signed {
                mask((sa.wrapping_mul(sb)) as u64, wide(ty))
            } else {
                mask(ua.wrapping_mul(ub), wide(ty))
            };
        }
        // Division by zero: all ones (the ISA leaves it unspecified; this is what NVIDIA
        // GPUs return for the unsigned case); remainder by zero: the dividend.
        BinOp::Div => {
            if ub == 0 {
                u64::MAX
            } else if signed {
                sa.wrapping_div(sb) as u64
            } else {
                ua / ub
            }
        }
        BinOp::Rem => {
            if ub == 0 {
                ua
            } else if signed {
                sa.wrapping_rem(sb) as u64
            } else {
                ua % ub
            }
        }
        BinOp::And => ua & ub,
        BinOp::Or => ua | ub,
        BinOp::Xor => ua ^ ub,
        BinOp::Shl => {
            let s = b as u32;
            if s >= w {
                0
            } else {
                ua << s
            }
        }
        BinOp::Shr => {
            let s = b as u32;
            if signed {
                (sa >> s.min(w - 1).min(63)) as u64
            } else if s >= w {
                0
            } else {
                ua >> s
            }
        }
        BinOp::Min => {
            if signed {
                sa.min(sb) as u64
            } else {
                ua.min(ub)
            }
        }
        BinOp::Max => {
            if signed {
                sa.max(sb) as u64
            } else {
                ua.max(ub)
            }
        }
    };
    mask(r, ty)
}

/// The double-width type of `mul.wide` / `mad.wide`.
pub fn wide(t: Ty) -> Ty {
    match t {
        Ty::U(b) => Ty::U(b * 2),
        Ty::S(b) => Ty::S(b * 2),
        Ty::B(b) => Ty::B(b * 2),
        other => other,
    }
}

/// `mad`/`fma`: `a * b + c` (float: one rounding).
#[inline]
pub fn mad(mode: BinOp, ty: Ty, ftz: bool, a: u64, b: u64, c: u64) -> u64 {
    match ty {
        Ty::F(32) => {
            let (x, y, z) = (
                ftz32(f32_of(a), ftz),
                ftz32(f32_of(b), ftz),
                ftz32(f32_of(c), ftz),
            );
            out32(x.mul_add(y, z), ftz)
        }
        Ty::F(64) => {
            let (x, y, z) = (f64::from_bits(a), f64::from_bits(b), f64::from_bits(c));
            out64(x.mul_add(y, z), &[x, y, z])
        }
        _ => {
            let p = int_bin(mode, ty, a, b);
            let rt = if mode == BinOp::MulWide { wide(ty) } else { ty };
            mask(p.wrapping_add(c), rt)
        }
    }
}

/// A one-operand instruction. `.approx` results are computed in f64 and rounded once to
/// f32, deterministic on every host. With `at_bound` (the default check
/// [`approx_at_bound`](crate::Checks::approx_at_bound)) that result is then moved to the
/// edge of the PTX ISA's bound, up or down as a hash of the input says: `ex2`/`lg2`
/// (2 ulp) by one ulp, `tanh` (relative 2^-10.987) by 2^-11 of itself (kept within
/// -1..1), `sin`/`cos`
/// (absolute 2^-20.9 in -pi..pi) by 2^-21 up or down; `rcp`/`sqrt`/`rsqrt.approx`
/// (1 ulp) stay correctly rounded, which is already at their bound.
pub fn un(op: UnOp, ty: Ty, ftz: bool, a: u64, at_bound: bool) -> u64 {
    if ty.is_float() {
        if ty == Ty::F(64) {
            let x = f64::from_bits(a);
            return match op {
                UnOp::Neg => (-x).to_bits(),
                UnOp::Abs => x.abs().to_bits(),
                _ => f64::NAN.to_bits(),
            };
        }
        let x = ftz32(f32_of(a), ftz);
        let d = x as f64;
        let r = match op {
            // Sign operations keep NaN payloads (they are bit operations on the GPU too).
            UnOp::Neg => return (ftz32(x, ftz).to_bits() ^ 0x8000_0000) as u64,
            UnOp::Abs => return (ftz32(x, ftz).to_bits() & 0x7fff_ffff) as u64,
            UnOp::Not => return mask(!a, ty),
            UnOp::Sqrt => x.sqrt(),
            UnOp::SqrtApprox => d.sqrt() as f32,
            UnOp::Ex2 => d.exp2() as f32,
            UnOp::Lg2 => d.log2() as f32,
            UnOp::Tanh => d.tanh() as f32,
            UnOp::RcpApprox => (1.0 / d) as f32,
            UnOp::Rcp => 1.0 / x,
            UnOp::Rsqrt => (1.0 / d.sqrt()) as f32,
            UnOp::Sin => d.sin() as f32,
            UnOp::Cos => d.cos() as f32,
        };
        let r = if at_bound {
            approx_at_bound(op, a, r)
        } else {
            r
        };
        return out32(r, ftz);
    }
    match op {
        UnOp::Neg => mask((sext(a, ty)).wrapping_neg() as u64, ty),
        UnOp::Abs => mask(sext(a, ty).wrapping_abs() as u64, ty),
        UnOp::Not => mask(!a, ty),
        _ => 0,
    }
}

/// `r`, the correctly rounded result of `op` on input bits `a`, moved to the edge of the
/// ISA's error bound for `op` (see [`un`]). Zeros, infinities and NaN stay.
fn approx_at_bound(op: UnOp, a: u64, r: f32) -> f32 {
    if !r.is_finite() || r == 0.0 {
        return r;
    }
    // One well-mixed bit of the input picks the direction, so errors do not all lean
    // one way (a systematic bias would be kinder to sums than a GPU is).
    let up = (a.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 63) == 1;
    match op {
        UnOp::Ex2 | UnOp::Lg2 => {
            let b = r.to_bits();
            let mag = b & 0x7fff_ffff;
            let stepped = if up { mag + 1 } else { mag - 1 };
            if stepped >= 0x7f80_0000 || stepped == 0 {
                r
            } else {
                f32::from_bits((b & 0x8000_0000) | stepped)
            }
        }
        UnOp::Tanh => {
            let e = if up { 1.0 } else { -1.0 } * (-11f64).exp2();
            (r as f64 * (1.0 + e)).clamp(-1.0, 1.0) as f32
        }
        UnOp::Sin | UnOp::Cos => {
            let e = (-21f64).exp2();
            (r as f64 + if up { e } else { -e }).clamp(-1.0, 1.0) as f32
        }
        _ => r,
    }
}

/// `setp`.
#[inline]
pub fn setp(cmp: Cmp, ty: Ty, ftz: bool, a: u64, b: u64) -> bool {
    use std::cmp::Ordering as O;
    let ord: Option<O> = match ty {
        Ty::F(32) => ftz32(f32_of(a), ftz).partial_cmp(&ftz32(f32_of(b), ftz)),
        Ty::F(64) => f64::from_bits(a).partial_cmp(&f64::from_bits(b)),
        _ if ty.is_signed() => Some(sext(a, ty).cmp(&sext(b, ty))),
        _ => Some(mask(a, ty).cmp(&mask(b, ty))),
    };
    match (cmp, ord) {
        (Cmp::Num, o) => o.is_some(),
        (Cmp::Nan, o) => o.is_none(),
        (Cmp::Equ | Cmp::Neu | Cmp::Ltu | Cmp::Leu | Cmp::Gtu | Cmp::Geu, None) => true,
        (_, None) => false,
        (Cmp::Eq | Cmp::Equ, Some(o)) => o == O::Equal,
        (Cmp::Ne | Cmp::Neu, Some(o)) => o != O::Equal,
        (Cmp::Lt | Cmp::Ltu, Some(o)) => o == O::Less,
        (Cmp::Le | Cmp::Leu, Some(o)) => o != O::Greater,
        (Cmp::Gt | Cmp::Gtu, Some(o)) => o == O::Greater,
        (Cmp::Ge | Cmp::Geu, Some(o)) => o != O::Less,
    }
}

fn float_of(v: u64, ty: Ty) -> f64 {
    match ty {
        Ty::F(16) => half::f16::from_bits(v as u16).to_f64(),
        Ty::Bf16 => half::bf16::from_bits(v as u16).to_f64(),
        Ty::F(32) => f32_of(v) as f64,
        _ => f64::from_bits(v),
    }
}

fn round_int(x: f64, r: Rnd) -> f64 {
    match r {
        Rnd::Nearest => x.round_ties_even(),
        Rnd::Zero => x.trunc(),
        Rnd::Down => x.floor(),
        Rnd::Up => x.ceil(),
    }
}

/// `cvt`: integer widths with sign or zero extension, float widths with IEEE rounding,
/// float to integer with the given integer rounding and saturation (NaN -> 0).
pub fn cvt(dty: Ty, sty: Ty, rnd: Option<Rnd>, ftz: bool, sat: bool, a: u64) -> u64 {
    match (dty.is_float(), sty.is_float()) {
        (false, false) => {
            let v: i128 = if sty.is_signed() {
                sext(a, sty) as i128
            } else {
                mask(a, sty) as i128
            };
            if sat {
                let (lo, hi) = int_range(dty);
                mask(v.clamp(lo, hi) as u64, dty)
            } else {
                mask(v as u64, dty)
            }
        }
        (false, true) => {
            let mut x = float_of(a, sty);
            if ftz && sty == Ty::F(32) && (x as f32).is_subnormal() {
                x = 0.0;
            }
            if x.is_nan() {
                return 0;
            }
            let r = round_int(x, rnd.unwrap_or(Rnd::Zero));
            let (lo, hi) = int_range(dty);
            // Saturation is implied for float to integer conversions.
            let v = if r <= lo as f64 {
                lo
            } else if r >= hi as f64 {
                hi
            } else {
                r as i128
            };
            mask(v as u64, dty)
        }
        (true, false) => {
            let v: i128 = if sty.is_signed() {
                sext(a, sty) as i128
            } else {
                mask(a, sty) as i128
            };
            from_f64_exactish(v, dty, ftz, sat)
        }
        (true, true) => {
            let int_round = dty == sty;
            if sty == Ty::F(32) && dty == Ty::F(32) {
                let x = ftz32(f32_of(a), ftz);
                let mut r = match rnd {
                    Some(r) if int_round => round_int(x as f64, r) as f32,
                    _ => x,
                };
                if sat {
                    r = sat01(r);
                }
                return out32(r, ftz);
            }
            let x = float_of(a, sty);
            let x = if ftz && sty == Ty::F(32) && (x as f32).is_subnormal() {
                0.0f64.copysign(x)
            } else {
                x
            };
            let x = match rnd {
                Some(r) if int_round => round_int(x, r),
                _ => x,
            };
            let x = if sat { sat01_64(x) } else { x };
            match dty {
                // From f32 the half crate rounds to nearest even. From f64 it does not
                // round once (it goes through f32 with F16C, or drops the f64's low 32
                // bits), so an f64 is rounded here.
                Ty::F(16) => {
                    if sty == Ty::F(32) {
                        half::f16::from_f32(x as f32).to_bits() as u64
                    } else {
                        narrow_f64(false, x)
                    }
                }
                Ty::Bf16 => {
                    if sty == Ty::F(32) {
                        half::bf16::from_f32(x as f32).to_bits() as u64
                    } else {
                        narrow_f64(true, x)
                    }
                }
                Ty::F(32) if x.is_nan() && sty == Ty::F(64) => narrow_nan(x.to_bits()),
                Ty::F(32) => out32(x as f32, ftz),
                _ => x.to_bits(),
            }
        }
    }
}

fn sat01(x: f32) -> f32 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(0.0, 1.0)
    }
}

fn sat01_64(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(0.0, 1.0)
    }
}

fn from_f64_exactish(v: i128, dty: Ty, ftz: bool, sat: bool) -> u64 {
    // Integer to float, round to nearest even (Rust's `as` conversions are RNE).
    match dty {
        Ty::F(32) => {
            let f = if v < 0 {
                (v as i64) as f32
            } else {
                (v as u64) as f32
            };
            out32(if sat { sat01(f) } else { f }, ftz)
        }
        Ty::F(64) => {
            let f = if v < 0 {
                (v as i64) as f64
            } else {
                (v as u64) as f64
            };
            (if sat { sat01_64(f) } else { f }).to_bits()
        }
        // Rounded once from the exact integer (through f64, a 64-bit integer would be
        // rounded twice).
        _ => {
            let v = if sat { v.clamp(0, 1) } else { v };
            let fmt = if dty == Ty::F(16) {
                exact16::F16
            } else {
                exact16::BF16
            };
            fmt.round(v < 0, v.unsigned_abs(), 0, false, true)
        }
    }
}

/// An f64 rounded once to nearest even in f16 (`bf16 = false`) or bf16; a NaN as the half
/// crate converts it.
pub(crate) fn narrow_f64(bf16: bool, x: f64) -> u64 {
    match (x.is_nan(), bf16) {
        (true, false) => half::f16::from_f64(x).to_bits() as u64,
        (true, true) => half::bf16::from_f64(x).to_bits() as u64,
        (false, false) => exact16::round_f64(exact16::F16, x),
        (false, true) => exact16::round_f64(exact16::BF16, x),
    }
}

fn int_range(t: Ty) -> (i128, i128) {
    let b = t.bits();
    if t.is_signed() {
        (-(1i128 << (b - 1)), (1i128 << (b - 1)) - 1)
    } else {
        (0, (1i128 << b) - 1)
    }
}

/// `bfe`: bit field extract, as the ISA defines it (position and length from the low 8
/// bits of their operands, sign fill from the field's top bit for signed types).
pub fn bfe(ty: Ty, a: u64, pos: u64, len: u64) -> u64 {
    let msb = ty.bits() - 1;
    let pos = (pos & 0xff) as u32;
    let len = (len & 0xff) as u32;
    let a = mask(a, ty);
    if len == 0 {
        return 0;
    }
    let sbit = if ty.is_signed() {
        let top = (pos + len - 1).min(msb);
        (a >> top) & 1
    } else {
        0
    };
    let mut d = 0u64;
    for i in 0..=msb {
        let bit = if i < len && pos + i <= msb {
            (a >> (pos + i)) & 1
        } else {
            sbit
        };
        d |= bit << i;
    }
    d
}

/// `dp4a`: four byte products of `a` and `b` (signed or unsigned bytes) added to `c`,
/// wrapping at 32 bits.
pub fn dp4a(a_signed: bool, b_signed: bool, a: u64, b: u64, c: u64) -> u64 {
    let byte = |v: u64, i: u32, s: bool| -> i32 {
        let x = ((v >> (8 * i)) & 0xff) as u8;
        if s {
            x as i8 as i32
        } else {
            x as i32
        }
    };
    let mut acc = c as u32 as i32;
    for i in 0..4 {
        acc = acc.wrapping_add(byte(a, i, a_signed).wrapping_mul(byte(b, i, b_signed)));
    }
    acc as u32 as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const F32: Ty = Ty::F(32);
    const F64: Ty = Ty::F(64);

    fn f(x: f32) -> u64 {
        x.to_bits() as u64
    }

    #[rstest]
    #[case::ties_to_even_up(2.5, Rnd::Nearest, 2)]
    #[case::ties_to_even_down(3.5, Rnd::Nearest, 4)]
    #[case::negative_tie(-2.5, Rnd::Nearest, -2)]
    #[case::toward_zero(-2.7, Rnd::Zero, -2)]
    #[case::down(-2.2, Rnd::Down, -3)]
    #[case::up(2.2, Rnd::Up, 3)]
    #[case::saturates_high(3e9, Rnd::Nearest, i32::MAX)]
    #[case::saturates_low(-3e9, Rnd::Nearest, i32::MIN)]
    #[case::nan_is_zero(f32::NAN, Rnd::Nearest, 0)]
    fn float_to_s32(#[case] x: f32, #[case] r: Rnd, #[case] want: i32) {
        assert_eq!(
            cvt(Ty::S(32), F32, Some(r), false, false, f(x)) as u32 as i32,
            want
        );
    }

    #[rstest]
    #[case::f16_tie_to_even(1.0 + 2f32.powi(-11), 0x3c00)]
    #[case::f16_tie_up(1.0 + 3.0 * 2f32.powi(-11), 0x3c02)]
    #[case::f16_overflow(70000.0, 0x7c00)]
    #[case::f16_subnormal(2f32.powi(-24), 0x0001)]
    fn f32_to_f16(#[case] x: f32, #[case] bits: u64) {
        assert_eq!(
            cvt(Ty::F(16), F32, Some(Rnd::Nearest), false, false, f(x)),
            bits
        );
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_nan() {
        let tie = f32::from_bits(0x3f80_8000); // halfway between two bf16 values
        assert_eq!(
            cvt(Ty::Bf16, F32, Some(Rnd::Nearest), false, false, f(tie)),
            0x3f80
        );
        let nan = cvt(Ty::Bf16, F32, Some(Rnd::Nearest), false, false, f(f32::NAN));
        assert!(half::bf16::from_bits(nan as u16).is_nan());
    }

    #[test]
    fn min_max_zero_signs_and_nan() {
        assert_eq!(bin(BinOp::Min, F32, false, f(-0.0), f(0.0)), f(-0.0));
        assert_eq!(bin(BinOp::Max, F32, false, f(-0.0), f(0.0)), f(0.0));
        assert_eq!(bin(BinOp::Max, F32, false, f(f32::NAN), f(1.0)), f(1.0));
        assert_eq!(bin(BinOp::Min, F32, false, f(2.0), f(f32::NAN)), f(2.0));
        let nn = bin(BinOp::Max, F32, false, f(f32::NAN), f(f32::NAN));
        assert_eq!(nn, CANONICAL_NAN_F32 as u64);
        assert_eq!(
            bin(
                BinOp::Add,
                F32,
                false,
                f(f32::INFINITY),
                f(f32::NEG_INFINITY)
            ),
            CANONICAL_NAN_F32 as u64
        );
    }

    /// What an H200 returned for sum_rows over a row holding +inf and -inf (an f64
    /// accumulator, then `cvt.rn.f32.f64`): 0xffc00000.
    #[test]
    fn f64_nan_results_and_their_narrowing_match_the_gpu() {
        let d = |x: f64| x.to_bits();
        let nan = bin(
            BinOp::Add,
            F64,
            false,
            d(f64::INFINITY),
            d(f64::NEG_INFINITY),
        );
        assert_eq!(nan, DEFAULT_NAN_F64);
        let zero_times_inf = mad(BinOp::MulLo, F64, false, d(0.0), d(f64::INFINITY), d(1.0));
        assert_eq!(zero_times_inf, DEFAULT_NAN_F64);
        assert_eq!(
            cvt(F32, F64, Some(Rnd::Nearest), false, false, nan),
            0xffc0_0000
        );
        // A NaN operand is kept (quieted), its payload's top bits survive narrowing.
        let signalling = 0x7ff0_0000_2000_0000u64;
        let kept = bin(BinOp::MulLo, F64, false, signalling, d(2.0));
        assert_eq!(kept, signalling | QUIET_F64);
        assert_eq!(cvt(F32, F64, None, false, false, kept), 0x7fc0_0001);
        assert_eq!(
            bin(BinOp::Max, F64, false, d(f64::NAN), d(f64::NAN)),
            DEFAULT_NAN_F64
        );
    }

    #[test]
    fn ftz_flushes_subnormals() {
        let sub = f32::from_bits(1);
        assert_eq!(bin(BinOp::Add, F32, false, f(sub), f(0.0)), 1);
        assert_eq!(bin(BinOp::Add, F32, true, f(sub), f(0.0)), 0);
    }

    #[rstest]
    #[case::shl_past_width(BinOp::Shl, Ty::B(32), 1, 32, 0)]
    #[case::shr_unsigned_past_width(BinOp::Shr, Ty::U(32), 0x8000_0000, 40, 0)]
    #[case::shr_signed_fills(BinOp::Shr, Ty::S(32), 0x8000_0000, 40, 0xffff_ffff)]
    #[case::div_by_zero(BinOp::Div, Ty::U(32), 7, 0, 0xffff_ffff)]
    #[case::rem_by_zero(BinOp::Rem, Ty::U(32), 7, 0, 7)]
    #[case::add_wraps(BinOp::Add, Ty::U(32), 0xffff_ffff, 2, 1)]
    #[case::mul_wide(BinOp::MulWide, Ty::U(32), 0xffff_ffff, 2, 0x1_ffff_fffe)]
    #[case::mul_wide_signed(BinOp::MulWide, Ty::S(32), 0xffff_ffff, 2, 0xffff_ffff_ffff_fffe)]
    #[case::min_signed(BinOp::Min, Ty::S(32), 0xffff_ffff, 1, 0xffff_ffff)]
    fn integer_ops(
        #[case] op: BinOp,
        #[case] ty: Ty,
        #[case] a: u64,
        #[case] b: u64,
        #[case] want: u64,
    ) {
        assert_eq!(bin(op, ty, false, a, b), want);
    }

    #[test]
    fn bfe_and_dp4a() {
        assert_eq!(bfe(Ty::U(32), 0xabcd_1234, 8, 8), 0x12);
        assert_eq!(bfe(Ty::S(32), 0x0000_0f00, 8, 4), 0xffff_ffff);
        assert_eq!(
            bfe(Ty::U(32), 0xffff_ffff, 28, 8),
            0xf,
            "field clipped at bit 31"
        );
        assert_eq!(bfe(Ty::U(32), 0xffff_ffff, 4, 0), 0);
        // a unsigned bytes (255, 1, 2, 3), b signed bytes (-1, 2, -3, 4), c = 10.
        let a = 0x0302_01ff;
        let b = 0x04fd_02ff;
        assert_eq!(
            dp4a(false, true, a, b, 10),
            (10 - 255 + 2 - 6 + 12) as u32 as u64
        );
    }

    #[test]
    fn approx_results_are_close_and_deterministic() {
        let e = f32::from_bits(un(UnOp::Ex2, F32, false, f(0.5), false) as u32);
        assert_eq!(e, std::f32::consts::SQRT_2);
        let t = f32::from_bits(un(UnOp::Tanh, F32, false, f(20.0), false) as u32);
        assert_eq!(t, 1.0);
        assert_eq!(un(UnOp::Neg, F32, false, f(0.0), true), f(-0.0));
    }

    #[test]
    fn approx_at_bound_stays_within_the_isa_bounds_and_moves() {
        let ulps = |a: f32, b: f32| (a.to_bits() as i64 - b.to_bits() as i64).abs();
        let (mut ex2_moved, mut up, mut down) = (0, 0, 0);
        for i in 0..2000 {
            let x = -30.0 + i as f32 * 0.0301;
            let exact = f32::from_bits(un(UnOp::Ex2, F32, false, f(x), false) as u32);
            let bound = f32::from_bits(un(UnOp::Ex2, F32, false, f(x), true) as u32);
            assert!(ulps(exact, bound) <= 1, "ex2({x}): {exact} vs {bound}");
            ex2_moved += (exact != bound) as u32;
            if bound > exact {
                up += 1;
            } else if bound < exact {
                down += 1;
            }
            let t = f32::from_bits(un(UnOp::Tanh, F32, false, f(x), true) as u32);
            let rel = ((t as f64 - (x as f64).tanh()) / (x as f64).tanh()).abs();
            assert!(
                rel <= (-10.987f64).exp2(),
                "tanh({x}): {t}, relative {rel:e}"
            );
            assert!(
                rel >= (-12f64).exp2() || x == 0.0 || t.abs() == 1.0,
                "tanh({x}) moved: {rel:e}"
            );
            assert!(t.abs() <= 1.0);
            let y = x / 10.0;
            let s = f32::from_bits(un(UnOp::Sin, F32, false, f(y), true) as u32);
            assert!((s as f64 - (y as f64).sin()).abs() <= (-20.9f64).exp2());
        }
        assert!(
            ex2_moved > 1900 && up > 500 && down > 500,
            "{up} up, {down} down"
        );
        // Correctly rounded where the bound is one ulp.
        assert_eq!(un(UnOp::RcpApprox, F32, false, f(3.0), true), f(1.0 / 3.0));
    }
}
