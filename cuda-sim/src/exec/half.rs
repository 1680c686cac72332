//! f16 and bf16 arithmetic (`add`, `sub`, `mul`, `fma`, `min`, `max`, `neg`, `abs`,
//! `ex2.approx`), on one value or on both halves of a 32-bit register, and the packing
//! conversions `cvt.rn.{f16x2,bf16x2}.f32`.
//!
//! Every exact operation computes the exact result (products of two 16-bit values are
//! exact in 64 bits; sums are kept exact down to far below the last place, anything
//! smaller only as a sticky bit) and rounds it once to nearest even, as the ISA defines
//! `.rn`. A NaN result is the canonical `0x7fff` that NVIDIA GPUs produce.

use crate::ptx::ir::HalfOp;

/// The canonical NaN of f16 and bf16 arithmetic.
pub const CANONICAL_NAN_16: u16 = 0x7fff;

/// A 16-bit float format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fmt {
    /// Significand bits, the hidden bit included.
    p: u32,
    /// Exponent of the smallest normal.
    emin: i32,
    /// Exponent of the largest finite value.
    emax: i32,
    /// Width of the exponent field.
    ebits: u32,
}

/// IEEE binary16.
pub(crate) const F16: Fmt = Fmt {
    p: 11,
    emin: -14,
    emax: 15,
    ebits: 5,
};

/// bfloat16.
pub(crate) const BF16: Fmt = Fmt {
    p: 8,
    emin: -126,
    emax: 127,
    ebits: 8,
};

/// IEEE binary32 (the bit-level helpers below also serve f32 results).
pub(crate) const F32: Fmt = Fmt {
    p: 24,
    emin: -126,
    emax: 127,
    ebits: 8,
};

/// A finite value as sign, integer significand and exponent: `(-1)^neg * m * 2^e`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Exact {
    pub neg: bool,
    pub m: u128,
    pub e: i32,
}

/// What an encoding holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Val {
    Finite(Exact),
    Inf(bool),
    Nan,
}

impl Fmt {
    fn frac_bits(self) -> u32 {
        self.p - 1
    }

    fn sign_bit(self) -> u64 {
        1 << (self.frac_bits() + self.ebits)
    }

    fn inf(self) -> u64 {
        ((1u64 << self.ebits) - 1) << self.frac_bits()
    }

    /// Decodes an encoding (only the format's low bits are read).
    pub(crate) fn decode(self, bits: u64) -> Val {
        let neg = bits & self.sign_bit() != 0;
        let mag = bits & (self.sign_bit() - 1);
        if mag > self.inf() {
            return Val::Nan;
        }
        if mag == self.inf() {
            return Val::Inf(neg);
        }
        let field = (mag >> self.frac_bits()) as i32;
        let frac = (mag & ((1 << self.frac_bits()) - 1)) as u128;
        let shift = self.emax + self.frac_bits() as i32;
        Val::Finite(if field == 0 {
            Exact {
                neg,
                m: frac,
                e: 1 - shift,
            }
        } else {
            Exact {
                neg,
                m: frac | 1 << self.frac_bits(),
                e: field - shift,
            }
        })
    }

    /// Whether `bits` is a subnormal (non-zero, exponent field zero).
    fn is_subnormal(self, bits: u64) -> bool {
        let mag = bits & (self.sign_bit() - 1);
        mag != 0 && mag >> self.frac_bits() == 0
    }

    /// A subnormal encoding flushed to a zero of its sign.
    pub(crate) fn flush(self, bits: u64) -> u64 {
        if self.is_subnormal(bits) {
            bits & self.sign_bit()
        } else {
            bits
        }
    }

    /// `(-1)^neg * (m * 2^e)`, where `sticky` says that a non-zero remainder of smaller
    /// magnitude follows below `m` (of the same sign), rounded by `mode`: to nearest
    /// even, or toward zero. Overflow: infinity (nearest) or the largest finite value
    /// (toward zero); underflow: subnormals, then zero.
    pub(crate) fn round(self, neg: bool, m: u128, e: i32, sticky: bool, nearest: bool) -> u64 {
        let sign = if neg { self.sign_bit() } else { 0 };
        if m == 0 {
            return sign;
        }
        let top = e + (127 - m.leading_zeros() as i32);
        let p = self.p as i32;
        let q = (top - (p - 1)).max(self.emin - (p - 1));
        let shift = q - e;
        let mut mant = if shift <= 0 {
            m << (-shift).min(127)
        } else if shift >= 128 {
            // m < 2^127: less than half of the last place.
            0
        } else {
            let kept = m >> shift;
            let rem = m & ((1u128 << shift) - 1);
            let half = 1u128 << (shift - 1);
            let up = nearest && (rem > half || (rem == half && (sticky || kept & 1 == 1)));
            kept + up as u128
        };
        let mut q = q;
        if mant == 1u128 << p {
            mant >>= 1;
            q += 1;
        }
        let hidden = 1u128 << (p - 1);
        if mant >= hidden {
            let exp = q + p - 1;
            if exp > self.emax {
                return if nearest {
                    sign | self.inf()
                } else {
                    sign | (self.inf() - 1)
                };
            }
            let field = (exp + self.emax) as u64;
            sign | field << self.frac_bits() | (mant - hidden) as u64
        } else {
            sign | mant as u64
        }
    }
}

/// `x + y`, exact down to 128 bits below the larger operand's top bit; anything
/// smaller is folded into one odd bit below that (its sign kept), which rounds
/// identically since no rounding point lies that low.
pub(crate) fn add_exact(x: Exact, y: Exact) -> (bool, u128, i32) {
    let top = |v: Exact| v.e + (127 - v.m.leading_zeros() as i32);
    if x.m == 0 {
        return (y.neg, y.m, y.e);
    }
    if y.m == 0 {
        return (x.neg, x.m, x.e);
    }
    let (big, small) = if top(x) >= top(y) { (x, y) } else { (y, x) };
    // Base two bits below the lowest bit we keep exactly: `big` sits under 2^(base+100).
    let base = top(big) - 98;
    let scale = |v: Exact| -> (i128, bool) {
        if v.e >= base {
            ((v.m << (v.e - base)) as i128, false)
        } else {
            let s = (base - v.e) as u32;
            let kept = if s >= 128 { 0 } else { v.m >> s };
            let lost = s >= 128 || v.m & ((1u128 << s) - 1) != 0;
            (kept as i128, lost)
        }
    };
    let (bm, _) = scale(big);
    let (sm, lost) = scale(small);
    let sv = |neg: bool, v: i128| if neg { -v } else { v };
    let mut sum = sv(big.neg, bm) + sv(small.neg, sm);
    let mut e = base;
    if lost {
        // The lost part of `small` has small's sign and is below one unit of 2^base:
        // one more bit of resolution, moved half a unit in its direction.
        sum = sum * 2 + if small.neg { -1 } else { 1 };
        e -= 1;
    }
    (sum < 0, sum.unsigned_abs(), e)
}

/// The exact product of two finite values.
fn mul_exact(x: Exact, y: Exact) -> Exact {
    Exact {
        neg: x.neg != y.neg,
        m: x.m * y.m,
        e: x.e + y.e,
    }
}

fn fmt_of(bf16: bool) -> Fmt {
    if bf16 {
        BF16
    } else {
        F16
    }
}

/// IEEE minNum/maxNum: a NaN operand yields the other, -0 below +0; with `nan`, any
/// NaN operand yields the canonical NaN.
fn min_max(fmt: Fmt, a: u64, b: u64, max: bool, nan: bool) -> u64 {
    let (va, vb) = (fmt.decode(a), fmt.decode(b));
    match (va, vb) {
        (Val::Nan, Val::Nan) => return CANONICAL_NAN_16 as u64,
        (Val::Nan, _) | (_, Val::Nan) if nan => return CANONICAL_NAN_16 as u64,
        (Val::Nan, _) => return b,
        (_, Val::Nan) => return a,
        _ => {}
    }
    // Order by value: map encodings to a signed key (negatives reversed, -0 < +0).
    let key = |bits: u64| -> i64 {
        let mag = (bits & (fmt.sign_bit() - 1)) as i64;
        if bits & fmt.sign_bit() != 0 {
            -mag - 1
        } else {
            mag
        }
    };
    let a_first = if max {
        key(a) >= key(b)
    } else {
        key(a) <= key(b)
    };
    if a_first {
        a
    } else {
        b
    }
}

/// One lane of a half operation on encodings `a`, `b`, `c` (low 16 bits each).
/// `at_bound` is the approx check (only `ex2` is approximate).
#[allow(clippy::too_many_arguments)]
pub(crate) fn half_op(
    op: HalfOp,
    bf16: bool,
    ftz: bool,
    sat: bool,
    nan: bool,
    a: u64,
    b: u64,
    c: u64,
    at_bound: bool,
) -> u64 {
    let fmt = fmt_of(bf16);
    let mask = (fmt.sign_bit() << 1) - 1;
    let (a, b, c) = (a & mask, b & mask, c & mask);
    let (a, b, c) = if ftz {
        (fmt.flush(a), fmt.flush(b), fmt.flush(c))
    } else {
        (a, b, c)
    };
    let r = match op {
        HalfOp::Neg => return a ^ fmt.sign_bit(),
        HalfOp::Abs => return a & !fmt.sign_bit(),
        HalfOp::Min | HalfOp::Max => min_max(fmt, a, b, op == HalfOp::Max, nan),
        HalfOp::Add | HalfOp::Sub | HalfOp::Mul | HalfOp::Fma => {
            arith(fmt, op, a, b, c).unwrap_or(CANONICAL_NAN_16 as u64)
        }
        HalfOp::Ex2 => ex2(fmt, a, at_bound),
    };
    let r = if sat { saturate(fmt, r) } else { r };
    if ftz {
        fmt.flush(r)
    } else {
        r
    }
}

/// `.sat`: clamped to [+0, 1], NaN to +0.
fn saturate(fmt: Fmt, r: u64) -> u64 {
    let one = (fmt.emax as u64) << fmt.frac_bits();
    match fmt.decode(r) {
        Val::Nan => 0,
        Val::Inf(true) => 0,
        Val::Inf(false) => one,
        Val::Finite(x) if x.neg => 0,
        Val::Finite(_) if r > one => one,
        Val::Finite(_) => r,
    }
}

/// add/sub/mul/fma; `None` for a NaN result.
fn arith(fmt: Fmt, op: HalfOp, a: u64, b: u64, c: u64) -> Option<u64> {
    let (va, vb, vc) = (fmt.decode(a), fmt.decode(b), fmt.decode(c));
    let flip = |v: Val| match v {
        Val::Finite(x) => Val::Finite(Exact { neg: !x.neg, ..x }),
        Val::Inf(s) => Val::Inf(!s),
        Val::Nan => Val::Nan,
    };
    // Every operation as x * y + z (z absent: exact zero of the right sign handling).
    let one = Val::Finite(Exact {
        neg: false,
        m: 1,
        e: 0,
    });
    let (x, y, z) = match op {
        HalfOp::Add => (va, one, Some(vb)),
        HalfOp::Sub => (va, one, Some(flip(vb))),
        HalfOp::Mul => (va, vb, None),
        _ => (va, vb, Some(vc)),
    };
    let prod = match (x, y) {
        (Val::Nan, _) | (_, Val::Nan) => return None,
        (Val::Inf(_), Val::Finite(f)) | (Val::Finite(f), Val::Inf(_)) if f.m == 0 => return None,
        (Val::Inf(s), Val::Inf(t)) => Val::Inf(s != t),
        (Val::Inf(s), Val::Finite(f)) | (Val::Finite(f), Val::Inf(s)) => Val::Inf(s != f.neg),
        (Val::Finite(p), Val::Finite(q)) => Val::Finite(mul_exact(p, q)),
    };
    let Some(z) = z else {
        return Some(match prod {
            Val::Inf(s) => (if s { fmt.sign_bit() } else { 0 }) | fmt.inf(),
            Val::Finite(p) => fmt.round(p.neg, p.m, p.e, false, true),
            Val::Nan => return None,
        });
    };
    match (prod, z) {
        (_, Val::Nan) | (Val::Nan, _) => None,
        (Val::Inf(s), Val::Inf(t)) if s != t => None,
        (Val::Inf(s), _) | (_, Val::Inf(s)) => {
            Some((if s { fmt.sign_bit() } else { 0 }) | fmt.inf())
        }
        (Val::Finite(p), Val::Finite(q)) => {
            if p.m == 0 && q.m == 0 {
                // +0 unless both are -0 (round to nearest).
                return Some(if p.neg && q.neg { fmt.sign_bit() } else { 0 });
            }
            let (neg, m, e) = add_exact(p, q);
            if m == 0 {
                return Some(0);
            }
            Some(fmt.round(neg, m, e, false, true))
        }
    }
}

/// `ex2.approx` on a 16-bit format: 2^x in f64, rounded to nearest; at the bound, one
/// unit in the last place further (up or down by a hash of the input) where that stays
/// within the ISA's relative error bound (2^-9.9 for f16, 2^-7 for bf16).
fn ex2(fmt: Fmt, a: u64, at_bound: bool) -> u64 {
    let x = match fmt.decode(a) {
        Val::Nan => return CANONICAL_NAN_16 as u64,
        Val::Inf(true) => return 0,
        Val::Inf(false) => return fmt.inf(),
        Val::Finite(v) => {
            let s = (v.m as f64) * (v.e as f64).exp2();
            if v.neg {
                -s
            } else {
                s
            }
        }
    };
    let exact = x.exp2();
    let r = round_f64(fmt, exact);
    if !at_bound {
        return r;
    }
    let bound = if fmt == BF16 {
        (-7f64).exp2()
    } else {
        (-9.9f64).exp2()
    };
    let up = (a.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 63) == 1;
    let stepped = if up { r + 1 } else { r.wrapping_sub(1) };
    if r == 0 || r >= fmt.inf() || stepped >= fmt.inf() {
        return r;
    }
    let v = match fmt.decode(stepped) {
        Val::Finite(v) => (v.m as f64) * (v.e as f64).exp2(),
        _ => return r,
    };
    if ((v - exact) / exact).abs() <= bound {
        stepped
    } else {
        r
    }
}

/// A finite or infinite f64 rounded to nearest even in `fmt` (exact: an f64 has all
/// the bits the rounding needs).
pub(crate) fn round_f64(fmt: Fmt, x: f64) -> u64 {
    if x.is_nan() {
        return CANONICAL_NAN_16 as u64;
    }
    let sign = if x.is_sign_negative() {
        fmt.sign_bit()
    } else {
        0
    };
    if x.is_infinite() {
        return sign | fmt.inf();
    }
    let bits = x.to_bits();
    let field = (bits >> 52 & 0x7ff) as i32;
    let frac = (bits & ((1 << 52) - 1)) as u128;
    let (m, e) = if field == 0 {
        (frac, -1074)
    } else {
        (frac | 1 << 52, field - 1075)
    };
    fmt.round(sign != 0, m, e, false, true)
}

/// `cvt.rn[.relu].{f16,bf16}.f32` of one f32 encoding: rounded to nearest even; NaN to
/// the canonical NaN; with `relu`, negative results (and -0) to +0.
pub(crate) fn from_f32(bf16: bool, relu: bool, a: u64) -> u64 {
    let fmt = fmt_of(bf16);
    let r = match F32.decode(a & 0xffff_ffff) {
        Val::Nan => CANONICAL_NAN_16 as u64,
        Val::Inf(s) => (if s { fmt.sign_bit() } else { 0 }) | fmt.inf(),
        Val::Finite(v) => fmt.round(v.neg, v.m, v.e, false, true),
    };
    if relu && r != CANONICAL_NAN_16 as u64 && r & fmt.sign_bit() != 0 {
        0
    } else {
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_ties_and_edges() {
        // 1 + 2^-11 is halfway between 1 and the next f16: ties to even (1).
        assert_eq!(F16.round(false, (1 << 11) + 1, -11, false, true), 0x3c00);
        // With a sticky bit below, it rounds up.
        assert_eq!(F16.round(false, (1 << 11) + 1, -11, true, true), 0x3c01);
        // Toward zero keeps the truncated value, and overflows to the largest finite.
        assert_eq!(F16.round(false, (1 << 11) + 1, -11, true, false), 0x3c00);
        assert_eq!(F16.round(false, 1, 16, false, false), 0x7bff);
        assert_eq!(F16.round(true, 1, 16, false, true), 0xfc00);
        // The smallest subnormal, and half of it (a tie to even: zero).
        assert_eq!(F16.round(false, 1, -24, false, true), 1);
        assert_eq!(F16.round(false, 1, -25, false, true), 0);
        assert_eq!(F16.round(false, 3, -26, false, true), 1);
    }

    #[test]
    fn add_exact_keeps_tiny_parts_as_sticky() {
        let one = Exact {
            neg: false,
            m: 1,
            e: 0,
        };
        let tiny = Exact {
            neg: true,
            m: 1,
            e: -300,
        };
        let (neg, m, e) = add_exact(one, tiny);
        assert!(!neg);
        // Just below 1: rounds to 1 at nearest, to the next value below toward zero.
        assert_eq!(BF16.round(neg, m, e, false, true), 0x3f80);
        assert_eq!(BF16.round(neg, m, e, false, false), 0x3f7f);
    }
}
