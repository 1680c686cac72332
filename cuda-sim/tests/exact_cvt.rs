//! `cvt` in every form the kernels can use, run through the interpreter and compared bit
//! for bit with conversions computed here from the encodings (`exact::Format`): f32 to
//! f16 / bf16 and f64 to f32 rounding to nearest even (ties, subnormals, overflow to
//! infinity, NaN), the exact widenings (every f16 and bf16 value), rounding to an
//! integral float, float to integer with `.rni` / `.rzi` / `.rmi` / `.rpi` (saturating,
//! NaN to 0, as the PTX ISA defines), integer to float, and integer to integer (sign or
//! zero extension, truncation, `.sat`). Forms cuda-sim does not implement are refused.

mod exact;

use exact::{
    assert_bits, d, f, rejected, round_to_int, run, Format, Rng, BF16, CANONICAL_NAN, F16, F32, F64,
};
use rstest::rstest;

/// `bits` of format `from` converted to `to`, rounding to nearest even; `None` for NaN.
fn convert(from: Format, to: Format, bits: u64) -> Option<u64> {
    if from.is_nan(bits) {
        return None;
    }
    let sign = if bits & from.sign() != 0 {
        to.sign()
    } else {
        0
    };
    Some(match from.decode(bits) {
        Some((neg, m, e)) => to.round(neg, m, e, false),
        None => sign | to.inf(),
    })
}

/// Runs `cvt` on the cases and checks them against `convert`; NaN inputs must give some
/// NaN (the ISA leaves the payload open).
fn check_conversion(instr: &str, types: [&str; 4], from: Format, to: Format, inputs: &[u64]) {
    let cases: Vec<[u64; 3]> = inputs.iter().map(|&x| [x, 0, 0]).collect();
    let got = run(types, &format!("{instr} %xd, %xa;"), &cases);
    let (mut want, mut have) = (Vec::new(), Vec::new());
    for (i, &x) in inputs.iter().enumerate() {
        match convert(from, to, x) {
            Some(w) => {
                want.push(w);
                have.push(got[i]);
            }
            None => assert!(to.is_nan(got[i]), "{instr} of NaN {x:#x}: {:#x}", got[i]),
        }
    }
    let kept: Vec<[u64; 3]> = cases
        .iter()
        .filter(|c| !from.is_nan(c[0]))
        .copied()
        .collect();
    assert_bits(instr, &kept, &have, &want);
}

/// The f64 value of a finite encoding.
fn value(fmt: Format, bits: u64) -> f64 {
    let (neg, m, e) = fmt.decode(bits).expect("finite");
    let v = m as f64 * 2f64.powi(e);
    if neg {
        -v
    } else {
        v
    }
}

/// For each finite non-negative value `h` of `narrow` (every `step`-th): `h` itself, the
/// midpoint to the next value (a tie; the largest value's is the overflow threshold)
/// and the f32 values one ulp either side of that midpoint, all as f32 bits, with
/// negated copies of some.
fn near_ties(narrow: Format, step: usize) -> Vec<u64> {
    let mut out = Vec::new();
    for h in (0..narrow.inf()).step_by(step) {
        let here = value(narrow, h);
        let next = if h + 1 == narrow.inf() {
            // One ulp past the largest finite value.
            here + (here - value(narrow, h - 1))
        } else {
            value(narrow, h + 1)
        };
        let mid = ((here + next) / 2.0) as f32; // exact: one bit more than `narrow`
        assert_eq!(mid as f64, (here + next) / 2.0);
        let m = mid.to_bits();
        for x in [
            here as f32,
            mid,
            f32::from_bits(m - 1),
            f32::from_bits(m + 1),
        ] {
            out.push(f(x));
            if h % 3 == 0 {
                out.push(f(-x));
            }
        }
    }
    out
}

/// Infinities, NaNs (quiet, signalling, negative, the canonical one), zeros, the f32
/// extremes.
const F32_SPECIALS: [u64; 10] = [
    0x7f80_0000,
    0xff80_0000,
    0x7fc0_0000,
    0x7f80_0001,
    0xffc0_1234,
    0x7fff_ffff,
    0x0000_0000,
    0x8000_0000,
    0x7f7f_ffff,
    0x0000_0001,
];

#[test]
fn f32_to_f16_rounds_to_nearest_even() {
    let mut inputs = near_ties(F16, 1);
    inputs.extend(F32_SPECIALS);
    // Far past the range: infinity; far below: zero of the same sign.
    inputs.extend([f(1e10), f(-1e10), f(1e-10), f(-1e-10)]);
    check_conversion(
        "cvt.rn.f16.f32",
        ["f32", "u32", "u32", "f16"],
        F32,
        F16,
        &inputs,
    );
}

#[test]
fn f32_to_bf16_rounds_to_nearest_even() {
    let mut inputs = near_ties(BF16, 1);
    inputs.extend(F32_SPECIALS);
    check_conversion(
        "cvt.rn.bf16.f32",
        ["f32", "u32", "u32", "bf16"],
        F32,
        BF16,
        &inputs,
    );
}

#[rstest]
// The ties of the table above, worked by hand: 1 + 2^-11 is halfway between f16 1 and
// 1 + 2^-10 (to even: 1, 0x3c00); 1 + 3 * 2^-11 between 1 + 2^-10 and 1 + 2^-9 (0x3c02).
#[case::f16_tie_down("cvt.rn.f16.f32", 0x3f80_1000, 0x3c00)]
#[case::f16_tie_up("cvt.rn.f16.f32", 0x3f80_3000, 0x3c02)]
// 65520 = 65504 + 16, half the top ulp: a tie, to even, which is 2^16: infinity.
#[case::f16_overflow_tie("cvt.rn.f16.f32", 0x477f_f000, 0x7c00)]
#[case::f16_below_overflow("cvt.rn.f16.f32", 0x477f_efff, 0x7bff)]
// 2^-25: half the smallest f16 subnormal, to even: +0; 3 * 2^-26: 0.75 of it: 0x0001.
#[case::f16_subnormal_tie("cvt.rn.f16.f32", 0x3300_0000, 0x0000)]
#[case::f16_subnormal_up("cvt.rn.f16.f32", 0x3340_0000, 0x0001)]
#[case::f16_negative_zero("cvt.rn.f16.f32", 0x8000_0000, 0x8000)]
// 0x3f808000 is halfway between bf16 0x3f80 and 0x3f81: to even, 0x3f80.
#[case::bf16_tie_down("cvt.rn.bf16.f32", 0x3f80_8000, 0x3f80)]
#[case::bf16_tie_up("cvt.rn.bf16.f32", 0x3f81_8000, 0x3f82)]
// The largest f32 is past bf16's overflow threshold: infinity.
#[case::bf16_overflow("cvt.rn.bf16.f32", 0x7f7f_ffff, 0x7f80)]
// 1.5 * 2^-133 (f32 subnormal 0x18000): halfway between bf16 subnormals 1 and 2: to 2.
#[case::bf16_subnormal_tie("cvt.rn.bf16.f32", 0x0001_8000, 0x0002)]
fn narrowing_table(#[case] instr: &str, #[case] x: u64, #[case] want: u64) {
    let to = instr.split('.').nth(2).expect("a type");
    let c = [[x, 0, 0]];
    let got = run(["f32", "u32", "u32", to], &format!("{instr} %xd, %xa;"), &c);
    assert_bits(instr, &c, &got, &[want]);
}

/// Every f16 and every bf16 value widens exactly (NaN to a NaN).
#[rstest]
#[case::f16("cvt.f32.f16", "f16", F16)]
#[case::bf16("cvt.f32.bf16", "bf16", BF16)]
fn half_to_f32_is_exact_for_every_value(
    #[case] instr: &str,
    #[case] ty: &str,
    #[case] from: Format,
) {
    let all: Vec<u64> = (0..=u16::MAX as u64).collect();
    check_conversion(instr, [ty, "u32", "u32", "f32"], from, F32, &all);
}

#[test]
fn f32_to_f64_is_exact() {
    let mut r = Rng(11);
    let mut inputs: Vec<u64> = (0..2000).map(|_| f(r.f32_in(-126, 127))).collect();
    inputs.extend((0..200).map(|_| r.next() & 0x807f_ffff)); // subnormals
    inputs.extend(F32_SPECIALS);
    check_conversion(
        "cvt.f64.f32",
        ["f32", "u32", "u32", "f64"],
        F32,
        F64,
        &inputs,
    );
}

#[test]
fn f64_to_f32_rounds_to_nearest_even() {
    let mut r = Rng(12);
    let mut inputs = Vec::new();
    for i in 0..3000 {
        // An f32-sized significand with one extra bit (a tie when it is set), placed at
        // exponents from past the subnormals to past the overflow, nudged by an f64 ulp.
        let m = (r.next() & 0x1ff_ffff) | 0x100_0000;
        let e = -175 + (r.next() % 310) as i32;
        let x = m as f64 * 2f64.powi(e - 24);
        let bits = x.to_bits();
        let nudged = match i % 3 {
            0 => bits,
            1 => bits + 1,
            _ => bits - 1,
        };
        inputs.push(nudged | (r.next() & 1) << 63);
    }
    inputs.extend([
        d(0.0),
        d(-0.0),
        d(f64::INFINITY),
        d(f64::MAX),
        d(f64::MIN_POSITIVE),
    ]);
    inputs.extend([0x7ff8_0000_0000_0000, 0x7ff0_0000_0000_0001]);
    check_conversion(
        "cvt.rn.f32.f64",
        ["f64", "u32", "u32", "f32"],
        F64,
        F32,
        &inputs,
    );
}

/// cuda-sim narrows an f64 NaN as an H200 does: sign and top of the payload kept, quiet
/// (its documented choice: the GPU's default f64 NaN 0xfff8... gives 0xffc00000).
#[test]
fn f64_nan_narrows_as_the_gpu() {
    let c = [[0xfff8_0000_0000_0000, 0, 0], [0x7ff0_0000_2000_0000, 0, 0]];
    let got = run(["f64", "u32", "u32", "f32"], "cvt.rn.f32.f64 %xd, %xa;", &c);
    assert_bits("cvt.rn.f32.f64", &c, &got, &[0xffc0_0000, 0x7fc0_0001]);
}

/// Rounding mode letters of `.rni` and friends.
const MODES: [(&str, char); 4] = [("rni", 'n'), ("rzi", 'z'), ("rmi", 'm'), ("rpi", 'p')];

/// Values around ties, integers and the edges of every integer type, as f32 bits.
fn int_edges() -> Vec<u64> {
    let mut v: Vec<u64> = [
        0.5f32,
        1.5,
        2.5,
        -0.5,
        -1.5,
        -2.5,
        0.49999997,
        2.4999998,
        -0.0,
        0.0,
        1.0,
        -1.0,
        3e9,
        -3e9,
        1e20,
        -1e20,
        65535.5,
        255.5,
        -128.5,
        127.5,
        32767.5,
        -32768.5,
        -32769.0,
        1e19,
        4294967040.0,
        2147483520.0,
    ]
    .iter()
    .map(|&x| f(x))
    .collect();
    v.extend([
        0x4f00_0000, // 2^31
        0xcf00_0000, // -2^31
        0x4f80_0000, // 2^32
        0x5f00_0000, // 2^63
        0xdf00_0000, // -2^63
        0x5f80_0000, // 2^64
        0x0000_0001, // the smallest subnormal
        0x8000_0001,
    ]);
    v.extend(F32_SPECIALS);
    let mut r = Rng(13);
    v.extend((0..300).map(|i| f(r.f32_in(-3, if i % 2 == 0 { 10 } else { 66 }))));
    v
}

/// The integer range of a PTX integer type.
fn range(ty: &str) -> (i128, i128) {
    let bits: u32 = ty[1..].parse().expect("a width");
    if ty.starts_with('s') {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    }
}

fn width_mask(ty: &str) -> u64 {
    let bits: u32 = ty[1..].parse().expect("a width");
    if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// Float to integer, saturating to the destination's range, NaN to 0 (PTX ISA, cvt:
/// "the result is clamped to the destination range by default"; NaN converts to 0).
fn to_int(fmt: Format, bits: u64, mode: char, ty: &str) -> u64 {
    let (lo, hi) = range(ty);
    let v = match round_to_int(fmt, bits, mode) {
        Some(v) => v.clamp(lo, hi),
        None if fmt.is_nan(bits) => 0,
        None if bits & fmt.sign() != 0 => lo,
        None => hi,
    };
    v as u64 & width_mask(ty)
}

#[rstest]
fn f32_to_integer_every_mode_and_width(
    #[values("s8", "u8", "s16", "u16", "s32", "u32", "s64", "u64")] ty: &str,
) {
    let inputs = int_edges();
    let cases: Vec<[u64; 3]> = inputs.iter().map(|&x| [x, 0, 0]).collect();
    for (m, mode) in MODES {
        let instr = format!("cvt.{m}.{ty}.f32");
        let got = run(
            ["f32", "u32", "u32", ty],
            &format!("{instr} %xd, %xa;"),
            &cases,
        );
        let got: Vec<u64> = got.iter().map(|g| g & width_mask(ty)).collect();
        let want: Vec<u64> = inputs.iter().map(|&x| to_int(F32, x, mode, ty)).collect();
        assert_bits(&instr, &cases, &got, &want);
    }
}

#[rstest]
fn f64_to_integer_every_mode(#[values("s32", "u32", "s64", "u64")] ty: &str) {
    let mut inputs: Vec<u64> = [
        4294967295.5f64,
        2147483647.5,
        -2147483648.5,
        -2147483649.0,
        9007199254740993.0,
        -0.5,
        1.5,
        2.5,
        1e300,
        -1e300,
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MIN_POSITIVE,
    ]
    .iter()
    .map(|&x| d(x))
    .collect();
    let mut r = Rng(14);
    inputs.extend((0..300).map(|_| {
        let m = (r.next() >> 11) as f64;
        let sign = if r.next() & 1 == 0 { 1.0 } else { -1.0 };
        d(sign * m * 2f64.powi(-((r.next() % 60) as i32)))
    }));
    let cases: Vec<[u64; 3]> = inputs.iter().map(|&x| [x, 0, 0]).collect();
    for (m, mode) in MODES {
        let instr = format!("cvt.{m}.{ty}.f64");
        let got = run(
            ["f64", "u32", "u32", ty],
            &format!("{instr} %xd, %xa;"),
            &cases,
        );
        let got: Vec<u64> = got.iter().map(|g| g & width_mask(ty)).collect();
        let want: Vec<u64> = inputs.iter().map(|&x| to_int(F64, x, mode, ty)).collect();
        assert_bits(&instr, &cases, &got, &want);
    }
}

/// `cvt.rXi.f32.f32`: to an integral f32, the sign of zero kept, NaN canonical.
#[test]
fn f32_to_integral_f32_every_mode() {
    let inputs = int_edges();
    let cases: Vec<[u64; 3]> = inputs.iter().map(|&x| [x, 0, 0]).collect();
    for (m, mode) in MODES {
        let instr = format!("cvt.{m}.f32.f32");
        let got = run(
            ["f32", "u32", "u32", "f32"],
            &format!("{instr} %xd, %xa;"),
            &cases,
        );
        let want: Vec<u64> = inputs
            .iter()
            .map(|&x| {
                if F32.is_nan(x) {
                    return CANONICAL_NAN as u64;
                }
                let neg = x & F32.sign() != 0;
                match F32.decode(x) {
                    // Infinities and values of exponent >= 0 (integers already) stay.
                    None => return x,
                    Some((_, _, e)) if e >= 0 => return x,
                    _ => {}
                }
                match round_to_int(F32, x, mode).expect("finite") {
                    0 => neg as u64 * F32.sign(),
                    v => F32.round(v < 0, v.unsigned_abs(), 0, false),
                }
            })
            .collect();
        assert_bits(&instr, &cases, &got, &want);
    }
}

/// `.sat` on a float destination clamps to [0, 1] and turns NaN into +0.
#[rstest]
#[case::negative("cvt.sat.f32.f32", 0xbf80_0000, 0x0000_0000)]
#[case::above_one("cvt.sat.f32.f32", 0x4000_0000, 0x3f80_0000)]
#[case::inside("cvt.sat.f32.f32", 0x3f00_0000, 0x3f00_0000)]
#[case::nan("cvt.sat.f32.f32", 0x7fc0_0000, 0x0000_0000)]
#[case::infinity("cvt.sat.f32.f32", 0x7f80_0000, 0x3f80_0000)]
#[case::rounded_then_clamped("cvt.rni.sat.f32.f32", 0x3f19_999a, 0x3f80_0000)]
fn saturating_float(#[case] instr: &str, #[case] x: u64, #[case] want: u64) {
    let c = [[x, 0, 0]];
    let got = run(
        ["f32", "u32", "u32", "f32"],
        &format!("{instr} %xd, %xa;"),
        &c,
    );
    assert_bits(instr, &c, &got, &[want]);
}

/// The value of the low `ty` bits of `x`, sign- or zero-extended.
fn int_value(ty: &str, x: u64) -> i128 {
    let bits: u32 = ty[1..].parse().expect("a width");
    let low = x & width_mask(ty);
    if ty.starts_with('s') && low >> (bits - 1) & 1 == 1 {
        low as i128 - (1i128 << bits)
    } else {
        low as i128
    }
}

/// Integers around the rounding points of f16 / f32 / f64 (ties above 2^11, 2^24, 2^53)
/// and every type's extremes.
fn int_inputs() -> Vec<u64> {
    let mut v = vec![0u64, 1, 2, 3, 0xff, 0x80, 0x7f, 0xffff, 0x8000, 0x7fff];
    for p in [11u32, 12, 24, 25, 31, 32, 53, 54, 63] {
        for k in [0u64, 1, 2, 3, 5, 7] {
            v.push((1u64 << p) + k);
            v.push((1u64 << p).wrapping_sub(k));
            v.push(((1u64 << p) + k).wrapping_neg());
        }
    }
    v.extend([
        u64::MAX,
        i64::MAX as u64,
        i64::MIN as u64,
        0xffff_ffff,
        0x8000_0000,
    ]);
    // A tie at f16's, f32's or f64's precision with a 1 far below it: one rounding goes
    // up; rounding first to a wider format (dropping the low 1) and then to the narrow
    // one would land on the tie and go to even.
    for (p, shifts) in [(11u32, 1..16u32), (24, 1..40), (53, 1..11)] {
        for s in shifts {
            let tie = ((1u64 << p) + 1) << s;
            v.extend([tie, tie + 1, tie - 1, (tie + 1).wrapping_neg()]);
        }
    }
    let mut r = Rng(15);
    v.extend((0..300).map(|_| r.next() >> (r.next() % 64)));
    v
}

#[rstest]
#[case::f32_from_s32("cvt.rn.f32.s32", "s32", F32)]
#[case::f32_from_u32("cvt.rn.f32.u32", "u32", F32)]
#[case::f32_from_s64("cvt.rn.f32.s64", "s64", F32)]
#[case::f32_from_u64("cvt.rn.f32.u64", "u64", F32)]
#[case::f32_from_s16("cvt.rn.f32.s16", "s16", F32)]
#[case::f32_from_u8("cvt.rn.f32.u8", "u8", F32)]
#[case::f64_from_s64("cvt.rn.f64.s64", "s64", F64)]
#[case::f64_from_u64("cvt.rn.f64.u64", "u64", F64)]
#[case::f16_from_s32("cvt.rn.f16.s32", "s32", F16)]
#[case::f16_from_u16("cvt.rn.f16.u16", "u16", F16)]
fn integer_to_float_rounds_to_nearest_even(
    #[case] instr: &str,
    #[case] src: &str,
    #[case] to: Format,
) {
    let inputs = int_inputs();
    let cases: Vec<[u64; 3]> = inputs.iter().map(|&x| [x, 0, 0]).collect();
    let dty = instr.split('.').nth(2).expect("a type");
    let got = run(
        [src, "u32", "u32", dty],
        &format!("{instr} %xd, %xa;"),
        &cases,
    );
    let want: Vec<u64> = inputs
        .iter()
        .map(|&x| {
            let v = int_value(src, x);
            to.round(v < 0, v.unsigned_abs(), 0, false)
        })
        .collect();
    assert_bits(instr, &cases, &got, &want);
}

#[rstest]
#[case::sign_extends("cvt.s64.s32", "s32", "s64", false)]
#[case::zero_extends("cvt.u64.u32", "u32", "u64", false)]
#[case::signed_source_to_unsigned("cvt.u64.s32", "s32", "u64", false)]
#[case::truncates("cvt.u32.u64", "u64", "u32", false)]
#[case::truncates_signed("cvt.s16.s32", "s32", "s16", false)]
#[case::byte("cvt.s8.s32", "s32", "s8", false)]
#[case::saturates_s8("cvt.sat.s8.s32", "s32", "s8", true)]
#[case::saturates_u8("cvt.sat.u8.s32", "s32", "u8", true)]
#[case::saturates_u32("cvt.sat.u32.s64", "s64", "u32", true)]
#[case::saturates_s32_from_u32("cvt.sat.s32.u32", "u32", "s32", true)]
fn integer_to_integer(
    #[case] instr: &str,
    #[case] src: &str,
    #[case] dst: &str,
    #[case] sat: bool,
) {
    let inputs = int_inputs();
    let cases: Vec<[u64; 3]> = inputs.iter().map(|&x| [x, 0, 0]).collect();
    let got = run(
        [src, "u32", "u32", dst],
        &format!("{instr} %xd, %xa;"),
        &cases,
    );
    let got: Vec<u64> = got.iter().map(|g| g & width_mask(dst)).collect();
    let want: Vec<u64> = inputs
        .iter()
        .map(|&x| {
            let v = int_value(src, x);
            let v = if sat {
                let (lo, hi) = range(dst);
                v.clamp(lo, hi)
            } else {
                v
            };
            v as u64 & width_mask(dst)
        })
        .collect();
    assert_bits(instr, &cases, &got, &want);
}

/// Forms the ISA requires a rounding for, and directed roundings into a float type
/// (which cuda-sim does not implement), are refused.
#[rstest]
#[case::float_to_int_needs_integer_rounding("cvt.s32.f32", ["f32", "u32", "u32", "s32"], "needs .rni")]
#[case::float_to_int_with_rn("cvt.rn.s32.f32", ["f32", "u32", "u32", "s32"], "needs .rni")]
#[case::narrowing_needs_rounding("cvt.f16.f32", ["f32", "u32", "u32", "f16"], "narrowing")]
#[case::narrowing_with_integer_rounding("cvt.rni.f16.f32", ["f32", "u32", "u32", "f16"], "narrowing")]
#[case::int_to_float_needs_rounding("cvt.f32.s32", ["s32", "u32", "u32", "f32"], "integer to float")]
#[case::directed_into_f16("cvt.rz.f16.f32", ["f32", "u32", "u32", "f16"], "directed rounding")]
#[case::directed_from_int("cvt.rm.f32.s32", ["s32", "u32", "u32", "f32"], "directed rounding")]
#[case::directed_from_f64("cvt.rp.f32.f64", ["f64", "u32", "u32", "f32"], "directed rounding")]
#[case::int_with_rounding("cvt.rn.s32.s64", ["s64", "u32", "u32", "s32"], "takes no rounding")]
fn unsupported_forms_are_refused(#[case] instr: &str, #[case] types: [&str; 4], #[case] why: &str) {
    let e = rejected(types, &format!("{instr} %xd, %xa;"))
        .unwrap_or_else(|| panic!("{instr} was not refused"));
    assert!(e.contains(why), "{instr}: {e}");
}
