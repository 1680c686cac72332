//! cuda-sim's f16 and bf16 arithmetic, scalar and on both halves of a register (`x2`),
//! run through the interpreter and compared bit for bit with values computed here:
//! `add` / `sub` / `mul` / `fma` with `.rn` (and `.ftz`, `.sat`), `min` / `max` (with
//! `.NaN`), `neg` / `abs`, `cvt.rn.{f16x2,bf16x2}.f32` and `mov.b32` packing and
//! unpacking, and `ex2.approx.f16x2` within its bound.
//!
//! The oracle works on the encodings only: operands decoded to exact integers times
//! powers of two ([`Format::decode`]), the exact sum or product formed in 128-bit
//! integers (a far smaller addend kept as a sticky bit with its sign), rounded once by
//! [`Format::round`]. No f16 library and none of the interpreter's code.

mod exact;

use exact::{assert_bits, rejected, run, Format, Rng, BF16, F16, F32, F64};
use rstest::rstest;

/// The canonical NaN of f16 and bf16 results.
const NAN16: u64 = 0x7fff;

/// An exact value: (negative, m, e) = (-1)^neg * m * 2^e, or a special.
#[derive(Clone, Copy, Debug)]
enum V {
    Num(bool, u128, i32),
    Inf(bool),
    Nan,
}

fn dec(fmt: Format, bits: u64) -> V {
    if fmt.is_nan(bits) {
        return V::Nan;
    }
    match fmt.decode(bits) {
        Some((n, m, e)) => V::Num(n, m, e),
        None => V::Inf(bits & fmt.sign() != 0),
    }
}

fn enc_inf(fmt: Format, neg: bool) -> u64 {
    fmt.inf() | if neg { fmt.sign() } else { 0 }
}

/// x + y exactly, as (negative, m, e, sticky): m * 2^e is exact down to 120 bits below
/// the larger operand; a smaller remainder only sets `sticky` (the value lies strictly
/// beyond m * 2^e in magnitude).
fn sum(x: (bool, u128, i32), y: (bool, u128, i32)) -> (bool, u128, i32, bool) {
    let top = |(_, m, e): (bool, u128, i32)| e + 127 - m.leading_zeros() as i32;
    if x.1 == 0 {
        return (y.0, y.1, y.2, false);
    }
    if y.1 == 0 {
        return (x.0, x.1, x.2, false);
    }
    let (big, small) = if top(x) >= top(y) { (x, y) } else { (y, x) };
    let base = top(big) - 120;
    let at = |(n, m, e): (bool, u128, i32)| -> (i128, bool) {
        let (v, lost) = if e >= base {
            (m << (e - base), false)
        } else {
            let s = (base - e) as u32;
            if s >= 128 {
                (0, true)
            } else {
                (m >> s, m & ((1 << s) - 1) != 0)
            }
        };
        (if n { -(v as i128) } else { v as i128 }, lost)
    };
    let (bv, _) = at(big);
    let (sv, lost) = at(small);
    let s = bv + sv;
    let neg = s < 0;
    let mag = s.unsigned_abs();
    if !lost {
        return (neg, mag, base, false);
    }
    // The lost part has small's sign: beyond mag when it points the same way as the
    // sum, just below it (mag - 1, then beyond) otherwise.
    if small.0 == neg {
        (neg, mag, base, true)
    } else {
        (neg, mag - 1, base, true)
    }
}

fn round(fmt: Format, (neg, m, e, sticky): (bool, u128, i32, bool)) -> u64 {
    if m == 0 && !sticky {
        return 0;
    }
    fmt.round(neg, m, e, sticky)
}

/// a * b + c (or a + b, a - b, a * b) in `fmt`, rounded once to nearest even.
fn oracle(fmt: Format, op: &str, a: u64, b: u64, c: u64) -> u64 {
    let flip = |v: V| match v {
        V::Num(n, m, e) => V::Num(!n, m, e),
        V::Inf(n) => V::Inf(!n),
        V::Nan => V::Nan,
    };
    let one = V::Num(false, 1, 0);
    let (x, y, z) = match op {
        "add" => (dec(fmt, a), one, Some(dec(fmt, b))),
        "sub" => (dec(fmt, a), one, Some(flip(dec(fmt, b)))),
        "mul" => (dec(fmt, a), dec(fmt, b), None),
        _ => (dec(fmt, a), dec(fmt, b), Some(dec(fmt, c))),
    };
    let p = match (x, y) {
        (V::Nan, _) | (_, V::Nan) => return NAN16,
        (V::Inf(_), V::Num(_, 0, _)) | (V::Num(_, 0, _), V::Inf(_)) => return NAN16,
        (V::Inf(s), V::Inf(t)) => V::Inf(s != t),
        (V::Inf(s), V::Num(n, _, _)) | (V::Num(n, _, _), V::Inf(s)) => V::Inf(s != n),
        (V::Num(s, m, e), V::Num(t, n, f)) => V::Num(s != t, m * n, e + f),
    };
    match (p, z) {
        (V::Nan, _) | (_, Some(V::Nan)) => NAN16,
        (V::Inf(s), Some(V::Inf(t))) if s != t => NAN16,
        (V::Inf(s), _) | (_, Some(V::Inf(s))) => enc_inf(fmt, s),
        (V::Num(n, m, e), None) => {
            if m == 0 {
                if n {
                    fmt.sign()
                } else {
                    0
                }
            } else {
                fmt.round(n, m, e, false)
            }
        }
        (V::Num(n, m, e), Some(V::Num(o, q, f))) => {
            if m == 0 && q == 0 {
                return if n && o { fmt.sign() } else { 0 };
            }
            round(fmt, sum((n, m, e), (o, q, f)))
        }
    }
}

/// Operands: every edge (zeros, subnormals, the largest finite, infinities, NaN, ones
/// and values near them) and random ones of every exponent, bits in the low 16.
fn halves(fmt: Format, seed: u64, n: usize) -> Vec<u64> {
    let s = fmt.sign();
    let inf = fmt.inf();
    let one = if fmt.p == 11 { 0x3c00 } else { 0x3f80 };
    let mut v = vec![
        0,
        s,
        1,
        s | 1,
        inf - 1,
        s | (inf - 1),
        inf,
        s | inf,
        inf | 1,
        one,
        one + 1,
        one - 1,
        s | one,
        (1 << (fmt.p - 1)) - 1,
        1 << (fmt.p - 1),
    ];
    let mut r = Rng(seed);
    while v.len() < n {
        let x = r.next() & (2 * s - 1);
        // Keep most finite (exponent field below all-ones).
        v.push(if x & inf == inf {
            x ^ (1 << (fmt.p - 1))
        } else {
            x
        });
    }
    v
}

fn cases3(fmt: Format, seed: u64, n: usize) -> Vec<[u64; 3]> {
    let a = halves(fmt, seed, n);
    let b = halves(fmt, seed + 1, n);
    let c = halves(fmt, seed + 2, n);
    let mut out = Vec::new();
    for (i, &x) in a.iter().take(15).enumerate() {
        for &y in b.iter().take(15) {
            out.push([x, y, c[i]]);
        }
    }
    out.extend((0..n).map(|i| [a[i], b[(i * 7 + 3) % n], c[(i * 11 + 5) % n]]));
    out
}

fn fmt_of(ty: &str) -> Format {
    if ty.starts_with("bf16") {
        BF16
    } else {
        F16
    }
}

#[rstest]
fn scalar_arithmetic_is_rounded_once(
    #[values("add", "sub", "mul", "fma")] op: &str,
    #[values("f16", "bf16")] ty: &str,
) {
    let fmt = fmt_of(ty);
    let cases = cases3(fmt, 11, 700);
    let instr = match op {
        "fma" => format!("fma.rn.{ty} %xd, %xa, %xb, %xc;"),
        _ => format!("{op}.rn.{ty} %xd, %xa, %xb;"),
    };
    let got: Vec<u64> = run(["b16", "b16", "b16", "b16"], &instr, &cases)
        .iter()
        .map(|g| g & 0xffff)
        .collect();
    let want: Vec<u64> = cases
        .iter()
        .map(|c| oracle(fmt, op, c[0], c[1], c[2]))
        .collect();
    assert_bits(&instr, &cases, &got, &want);
}

/// Both halves are independent: high and low operands differ, each half checked.
#[rstest]
fn paired_arithmetic_works_per_half(
    #[values("add", "sub", "mul", "fma", "min", "max")] op: &str,
    #[values("f16x2", "bf16x2")] ty: &str,
) {
    let fmt = fmt_of(ty);
    let lo = cases3(fmt, 21, 300);
    let hi = cases3(fmt, 31, 300);
    let cases: Vec<[u64; 3]> = lo
        .iter()
        .zip(&hi)
        .map(|(l, h)| [h[0] << 16 | l[0], h[1] << 16 | l[1], h[2] << 16 | l[2]])
        .collect();
    let instr = match op {
        "fma" => format!("fma.rn.{ty} %xd, %xa, %xb, %xc;"),
        "min" | "max" => format!("{op}.{ty} %xd, %xa, %xb;"),
        _ => format!("{op}.rn.{ty} %xd, %xa, %xb;"),
    };
    let got = run(["b32", "b32", "b32", "b32"], &instr, &cases);
    let one = |c: &[u64; 3], sh: u32| {
        let (a, b, cc) = (
            c[0] >> sh & 0xffff,
            c[1] >> sh & 0xffff,
            c[2] >> sh & 0xffff,
        );
        match op {
            "min" | "max" => min_max(fmt, a, b, op == "max", false),
            _ => oracle(fmt, op, a, b, cc),
        }
    };
    let want: Vec<u64> = cases.iter().map(|c| one(c, 16) << 16 | one(c, 0)).collect();
    let got: Vec<u64> = got.iter().map(|g| g & 0xffff_ffff).collect();
    assert_bits(&instr, &cases, &got, &want);
}

/// IEEE minNum/maxNum on encodings: NaN yields the other operand (both NaN, or any
/// with `.NaN`: the canonical NaN), -0 is below +0.
fn min_max(fmt: Format, a: u64, b: u64, max: bool, nan: bool) -> u64 {
    let (na, nb) = (fmt.is_nan(a), fmt.is_nan(b));
    if (na && nb) || (nan && (na || nb)) {
        return NAN16;
    }
    if na {
        return b;
    }
    if nb {
        return a;
    }
    let key = |x: u64| -> i64 {
        let mag = (x & (fmt.sign() - 1)) as i64;
        if x & fmt.sign() != 0 {
            -mag - 1
        } else {
            mag
        }
    };
    if (key(a) >= key(b)) == max {
        a
    } else {
        b
    }
}

#[rstest]
// Subnormal inputs flush to zero: 2^-24 + 0 = +0.
#[case::ftz_input("add.rn.ftz.f16", 0x0001, 0x0000, 0, 0x0000)]
// A subnormal result flushes too: (1 + 2^-10) 2^-14 - 2^-14 = 2^-24, subnormal.
#[case::ftz_result("sub.rn.ftz.f16", 0x0401, 0x0400, 0, 0x0000)]
#[case::no_ftz_result("sub.rn.f16", 0x0401, 0x0400, 0, 0x0001)]
// .sat clamps to [0, 1]: 0.75 + 0.5 -> 1.0, -0.5 * 1 -> +0, NaN -> +0.
#[case::sat_high("add.rn.sat.f16", 0x3a00, 0x3800, 0, 0x3c00)]
#[case::sat_low("mul.rn.sat.f16", 0xb800, 0x3c00, 0, 0x0000)]
#[case::sat_nan("mul.rn.sat.f16", 0x7e00, 0x3c00, 0, 0x0000)]
// min.NaN propagates a NaN operand; plain min takes the other.
#[case::min_nan("min.NaN.f16", 0x7e00, 0x3c00, 0, NAN16)]
#[case::min_plain("min.f16", 0x7e00, 0x3c00, 0, 0x3c00)]
#[case::min_zeros("min.f16", 0x0000, 0x8000, 0, 0x8000)]
#[case::max_zeros("max.bf16", 0x8000, 0x0000, 0, 0x0000)]
// neg and abs flip or clear the sign bit (NaN payloads kept).
#[case::neg("neg.f16", 0x3c00, 0, 0, 0xbc00)]
#[case::neg_nan("neg.f16", 0x7e01, 0, 0, 0xfe01)]
#[case::abs("abs.bf16", 0xbf80, 0, 0, 0x3f80)]
#[case::abs_ftz("abs.ftz.f16", 0x8001, 0, 0, 0x0000)]
fn half_table(
    #[case] instr: &str,
    #[case] a: u64,
    #[case] b: u64,
    #[case] c: u64,
    #[case] want: u64,
) {
    let text = if instr.starts_with("neg") || instr.starts_with("abs") {
        format!("{instr} %xd, %xa;")
    } else {
        format!("{instr} %xd, %xa, %xb;")
    };
    let got = run(["b16", "b16", "b16", "b16"], &text, &[[a, b, c]]);
    assert_eq!(got[0] & 0xffff, want, "{text} of {a:#06x}, {b:#06x}");
}

/// `cvt.rn.f16x2.f32 d, a, b`: a into the upper half, b into the lower, each rounded
/// to nearest even (the oracle rounds the f32 encoding with [`Format::round`]).
#[rstest]
fn pack_conversion_rounds_each_half(#[values("f16x2", "bf16x2")] ty: &str) {
    let fmt = fmt_of(ty);
    let mut r = Rng(5);
    let mut cases: Vec<[u64; 3]> = vec![
        [0x3f80_1000, 0x3f80_0fff, 0], // ties and near ties for f16 (13 dropped bits)
        [0x7fc0_0000, 0xff80_0000, 0], // NaN, -inf
        [0x4780_0000, 0x3380_0000, 0], // 65536 (f16 overflow), 2^-24
        [0x3f80_8000, 0x3f81_8000, 0], // bf16 ties to even, down and up
    ];
    for _ in 0..400 {
        cases.push([r.next() & 0xffff_ffff, r.next() & 0xffff_ffff, 0]);
    }
    let to = |x: u64| -> u64 {
        if F32.is_nan(x) {
            return NAN16;
        }
        match F32.decode(x) {
            Some((n, 0, _)) => {
                if n {
                    fmt.sign()
                } else {
                    0
                }
            }
            Some((n, m, e)) => fmt.round(n, m, e, false),
            None => enc_inf(fmt, x & F32.sign() != 0),
        }
    };
    let instr = format!("cvt.rn.{ty}.f32 %xd, %xa, %xb;");
    let got: Vec<u64> = run(["f32", "f32", "f32", "b32"], &instr, &cases)
        .iter()
        .map(|g| g & 0xffff_ffff)
        .collect();
    let want: Vec<u64> = cases.iter().map(|c| to(c[0]) << 16 | to(c[1])).collect();
    assert_bits(&instr, &cases, &got, &want);
}

/// `mov.b32 d, {lo, hi}` packs the first register into the low half; `mov.b32 {lo, hi},
/// a` unpacks the same way round.
#[test]
fn mov_packs_and_unpacks_halves() {
    let cases = [[0x1234u64, 0xabcd, 0]];
    let got = run(
        ["b16", "b16", "b16", "b32"],
        "mov.b32 %xd, {%xa, %xb};",
        &cases,
    );
    assert_eq!(got[0] & 0xffff_ffff, 0xabcd_1234);
    let got = run(
        ["b32", "b16", "b16", "b16"],
        "mov.b32 {%xd, %xb}, %xa;",
        &[[0xabcd_1234, 0, 0]],
    );
    assert_eq!(got[0] & 0xffff, 0x1234);
    let got = run(
        ["b32", "b16", "b16", "b16"],
        "mov.b32 {%xb, %xd}, %xa;",
        &[[0xabcd_1234, 0, 0]],
    );
    assert_eq!(got[0] & 0xffff, 0xabcd);
}

/// `ex2.approx.f16x2` stays within the ISA's relative error 2^-9.9 of 2^x per half.
#[test]
fn ex2_f16x2_within_its_bound() {
    let mut cases = Vec::new();
    for i in 0..600u64 {
        // x from -14 to 15 in steps of about 0.05, as f16, in both halves.
        let x = -14.0 + i as f64 * 0.048;
        let bits = |x: f64| match F64.decode(x.to_bits()) {
            Some((n, m, e)) if m != 0 => F16.round(n, m, e, false),
            _ => 0,
        };
        let lo = bits(x);
        let hi = bits(-x * 0.5);
        cases.push([hi << 16 | lo, 0, 0]);
    }
    let got = run(
        ["b32", "b32", "b32", "b32"],
        "ex2.approx.f16x2 %xd, %xa;",
        &cases,
    );
    let value = |bits: u64| match F16.decode(bits) {
        Some((n, m, e)) => (if n { -1.0 } else { 1.0 }) * m as f64 * (e as f64).exp2(),
        None => f64::INFINITY,
    };
    for (c, g) in cases.iter().zip(&got) {
        for sh in [0, 16] {
            let x = value(c[0] >> sh & 0xffff);
            let y = value(g >> sh & 0xffff);
            let rel = ((y - x.exp2()) / x.exp2()).abs();
            assert!(
                rel <= (-9.9f64).exp2(),
                "ex2({x}) = {y}, relative error {rel:e}"
            );
        }
    }
}

#[rstest]
#[case::fma_needs_rn("fma.f16 %xd, %xa, %xb, %xc;")]
#[case::directed_rounding("add.rz.f16 %xd, %xa, %xb;")]
#[case::ex2_without_approx("ex2.f16 %xd, %xa;")]
#[case::bf16_sat("add.rn.sat.bf16 %xd, %xa, %xb;")]
#[case::cvt_pack_needs_rn("cvt.rz.f16x2.f32 %xd, %xa, %xb;")]
fn unsupported_forms_are_refused(#[case] instr: &str) {
    let e = rejected(["b32", "b32", "b32", "b32"], instr).expect("refused");
    assert!(e.contains("unsupported"), "{e}");
}
