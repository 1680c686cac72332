//! The rounding of cuda-sim's exact float instructions, each run as a one-instruction
//! kernel through the interpreter and compared bit for bit with values computed here:
//! `fma` / `mad` rounded once, `add` / `sub` / `mul` / `div` / `sqrt` / `rcp` with `.rn`
//! (the only rounding the parser accepts for them; the directed ones are refused),
//! `.ftz`, `min` / `max` NaN and signed-zero rules, `setp` with every ordered and
//! unordered comparison, `selp`, `neg` and `abs` as bit operations.
//!
//! The oracles: hand-worked tables (each row's bits derived in its comment), and for
//! random operands exact integer arithmetic on the encodings (`exact::Format::round`),
//! or, for f32 results, f64 arithmetic followed by that rounding, which is correct
//! because f64 has more than 2p + 2 bits (Figueroa, "When is double rounding
//! innocuous?", 1995; for fma the f64 sum is rounded to odd first: Boldo & Melquiond,
//! "Emulation of FMA and correctly rounded sums", 2008).

mod exact;

use exact::{assert_bits, d, f, rejected, run, Format, Rng, CANONICAL_NAN, F32, F64};
use rstest::rstest;

const F32_OPS: [&str; 4] = ["f32", "f32", "f32", "f32"];
const F64_OPS: [&str; 4] = ["f64", "f64", "f64", "f64"];

/// The f64 `x` rounded to f32 (nearest even) by [`Format::round`] on its encoding; NaN
/// gives the canonical NaN, infinities stay.
fn f64_to_f32_rn(x: f64) -> u64 {
    if x.is_nan() {
        return CANONICAL_NAN as u64;
    }
    match F64.decode(x.to_bits()) {
        Some((neg, m, e)) => F32.round(neg, m, e, false),
        None if x > 0.0 => F32.inf(),
        None => F32.inf() | F32.sign(),
    }
}

/// `x` as f64 from the f32 bits (exact).
fn wide(bits: u64) -> f64 {
    f32::from_bits(bits as u32) as f64
}

/// fma(a, b, c) on f32 bits rounded once: the product is exact in f64, the sum is
/// rounded to odd (TwoSum gives its error exactly), then to f32.
fn fma_f32(a: u64, b: u64, c: u64) -> u64 {
    let (p, z) = (wide(a) * wide(b), wide(c));
    let s = p + z;
    if !s.is_finite() {
        return f64_to_f32_rn(s);
    }
    let bb = s - p;
    let err = (p - (s - bb)) + (z - bb);
    let mut bits = s.to_bits();
    if err != 0.0 && bits & 1 == 0 {
        // The exact sum lies between s and its neighbour on err's side: take the odd one.
        if (err > 0.0) == (s > 0.0) {
            bits += 1;
        } else {
            bits -= 1;
        }
    }
    f64_to_f32_rn(f64::from_bits(bits))
}

/// An f64 `(neg, m, e)` sum of two exact values, as i128 at a common exponent.
fn signed(neg: bool, m: u128) -> i128 {
    if neg {
        -(m as i128)
    } else {
        m as i128
    }
}

/// `a * b + c` (or `a + c` with `b` None) on finite f64 bits, exactly, rounded once.
/// Exponents must be close enough for the aligned sum to fit 126 bits (the random cases
/// are drawn so).
fn f64_exact(a: u64, b: Option<u64>, c: u64) -> u64 {
    let (na, ma, ea) = exact::exact(F64, a);
    let (np, mp, ep) = match b {
        Some(b) => {
            let (nb, mb, eb) = exact::exact(F64, b);
            (na != nb, ma * mb, ea + eb)
        }
        None => (na, ma, ea),
    };
    let (nc, mc, ec) = exact::exact(F64, c);
    if mc == 0 && mp != 0 {
        return F64.round(np, mp, ep, false);
    }
    let e = ep.min(ec);
    let (sp, sc) = ((ep - e) as u32, (ec - e) as u32);
    assert!(sp < 126 - 106 && sc < 126 - 53, "exponents too far apart");
    let v = signed(np, mp << sp) + signed(nc, mc << sc);
    if v == 0 {
        // Exact zero: -0 only when both terms are -0 (round to nearest).
        let both_neg = np && nc && mp == 0 && mc == 0;
        return if both_neg { F64.sign() } else { 0 };
    }
    F64.round(v < 0, v.unsigned_abs(), e, false)
}

#[rstest]
// (1 + 2^-23)(1 - 2^-24) - 1 = 2^-24 - 2^-47 = 2^-25 (2 - 2^-22) exactly: 0x337ffffe.
// Rounding the product first gives 1 (its 2^-24 - 2^-47 is under half an ulp), then 0.
#[case::low_bits_of_the_product(0x3f80_0001, 0x3f7f_ffff, 0xbf80_0000, 0x337f_fffe)]
// (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24; minus the rounded product 1 + 2^-11 leaves 2^-24.
#[case::product_error_term(0x3f80_0800, 0x3f80_0800, 0xbf80_1000, 0x3380_0000)]
// 2^127 * 2 - 2^127 = 2^127: the product alone overflows, the fused result does not.
#[case::overflowing_product_brought_back(0x7f00_0000, 0x4000_0000, 0xff00_0000, 0x7f00_0000)]
// 2^-70 * 1.5 * 2^-70 = 3 * 2^-141 = 768 * 2^-149: a subnormal, exact.
#[case::subnormal_result(0x1c80_0000, 0x1cc0_0000, 0x0000_0000, 0x0000_0300)]
// 2^-75 * 2^-75 = 2^-150, half the smallest subnormal, plus 2^-149: 1.5 * 2^-149 rounds
// to even, 2 * 2^-149 (rounding the product first would give 0 + 2^-149).
#[case::subnormal_tie_after_a_tiny_product(0x1a00_0000, 0x1a00_0000, 0x0000_0001, 0x0000_0002)]
// A NaN operand, inf * 0 and inf - inf all give the canonical NaN.
#[case::nan_operand(0x7fc0_0001, 0x3f80_0000, 0x3f80_0000, 0x7fff_ffff)]
#[case::inf_times_zero(0x7f80_0000, 0x0000_0000, 0x3f80_0000, 0x7fff_ffff)]
#[case::inf_minus_inf(0x7f80_0000, 0x3f80_0000, 0xff80_0000, 0x7fff_ffff)]
// -1 * 0 + 0 = +0 (an exact zero sum is +0 when rounding to nearest); with -0 added, -0.
#[case::zero_sum_is_positive(0xbf80_0000, 0x0000_0000, 0x0000_0000, 0x0000_0000)]
#[case::negative_zeros_stay(0xbf80_0000, 0x0000_0000, 0x8000_0000, 0x8000_0000)]
fn fma_f32_rounds_once(
    #[values("fma.rn.f32", "mad.rn.f32")] op: &str,
    #[case] a: u64,
    #[case] b: u64,
    #[case] c: u64,
    #[case] want: u64,
) {
    assert_eq!(
        fma_f32(a, b, c),
        want,
        "the oracle disagrees with the table"
    );
    let got = run(F32_OPS, &format!("{op} %xd, %xa, %xb, %xc;"), &[[a, b, c]]);
    assert_bits(op, &[[a, b, c]], &got, &[want]);
}

/// Random fma operands, half of them cancelling the product (c near -(a * b)), where
/// one rounding and two differ most; the oracle agrees with the host's fused multiply-add,
/// and a double-rounded fma would miss at least a quarter of them.
#[test]
fn fma_f32_random_against_round_to_odd() {
    let mut r = Rng(1);
    let mut cases = Vec::new();
    for i in 0..4096 {
        let (x, y) = match i % 3 {
            0 => (r.f32_in(-20, 20), r.f32_in(-20, 20)),
            1 => (r.f32_in(-75, -60), r.f32_in(-75, -60)), // products near the subnormals
            _ => (r.f32_in(60, 66), r.f32_in(58, 64)),     // products past f32's range
        };
        let z = if i % 2 == 0 {
            let p = -(x * y);
            f32::from_bits(
                p.to_bits()
                    .wrapping_add((r.next() % 7) as u32)
                    .wrapping_sub(3),
            )
        } else {
            r.f32_in(-40, 40)
        };
        cases.push([f(x), f(y), f(z)]);
    }
    let want: Vec<u64> = cases.iter().map(|c| fma_f32(c[0], c[1], c[2])).collect();
    for (c, w) in cases.iter().zip(&want) {
        let host = f32::from_bits(c[0] as u32)
            .mul_add(f32::from_bits(c[1] as u32), f32::from_bits(c[2] as u32));
        if !host.is_nan() {
            assert_eq!(host.to_bits() as u64, *w, "oracle vs host fma on {c:#x?}");
        }
    }
    let twice = cases
        .iter()
        .zip(&want)
        .filter(|(c, w)| {
            let [x, y, z] = c.map(|v| f32::from_bits(v as u32));
            (x * y + z).to_bits() as u64 != **w
        })
        .count();
    assert!(
        twice * 4 >= cases.len(),
        "only {twice} cases tell fma from mul+add"
    );
    let got = run(F32_OPS, "fma.rn.f32 %xd, %xa, %xb, %xc;", &cases);
    assert_bits("fma.rn.f32", &cases, &got, &want);
}

/// `.ftz` flushes subnormal inputs and results to zero of the same sign.
#[rstest]
// 2^-140 (subnormal) * 2^20 = 2^-120; flushed, 0 * 2^20 + 0 = +0.
#[case::subnormal_input("fma.rn.f32", 0x0000_0200, 0x4980_0000, 0x0000_0000, 0x0380_0000, 0)]
// 2^-70 * -1.5 * 2^-70 = -768 * 2^-149 (subnormal); flushed to -0.
#[case::subnormal_result(
    "fma.rn.f32",
    0x1c80_0000,
    0x9cc0_0000,
    0x0000_0000,
    0x8000_0300,
    0x8000_0000
)]
#[case::add_input("add.rn.f32", 0x0000_0001, 0x0000_0000, 0, 0x0000_0001, 0)]
// 2^-125 - 1.75 * 2^-126 = 2^-128 (subnormal); flushed to +0.
#[case::sub_result("sub.rn.f32", 0x0100_0000, 0x00e0_0000, 0, 0x0020_0000, 0)]
// 2^-70 * -2^-70 = -2^-140 = -512 * 2^-149; flushed to -0.
#[case::mul_result("mul.rn.f32", 0x1c80_0000, 0x9c80_0000, 0, 0x8000_0200, 0x8000_0000)]
fn ftz_flushes_subnormals(
    #[case] op: &str,
    #[case] a: u64,
    #[case] b: u64,
    #[case] c: u64,
    #[case] plain: u64,
    #[case] flushed: u64,
) {
    let (operands, ftz_op) = if op.starts_with("fma") {
        ("%xa, %xb, %xc", op.replace(".rn.", ".rn.ftz."))
    } else {
        ("%xa, %xb", op.replace(".rn.", ".rn.ftz."))
    };
    let cases = [[a, b, c]];
    let got = run(F32_OPS, &format!("{op} %xd, {operands};"), &cases);
    assert_bits(op, &cases, &got, &[plain]);
    let got = run(F32_OPS, &format!("{ftz_op} %xd, {operands};"), &cases);
    assert_bits(&ftz_op, &cases, &got, &[flushed]);
}

#[rstest]
// (1 + 2^-52)(1 - 2^-53) - 1 = 2^-53 - 2^-105 = 2^-54 (2 - 2^-51): 0x3c9ffffffffffffe;
// rounding the product first gives 1, then 0.
#[case::low_bits_of_the_product(
    0x3ff0_0000_0000_0001,
    0x3fef_ffff_ffff_ffff,
    0xbff0_0000_0000_0000,
    0x3c9f_ffff_ffff_fffe
)]
// No NaN operand: the GPU's default NaN (seen on an H200), as cuda-sim documents.
#[case::inf_times_zero(0x7ff0_0000_0000_0000, 0, 0x3ff0_0000_0000_0000, 0xfff8_0000_0000_0000)]
// A NaN operand is kept, quieted.
#[case::signalling_nan_operand(
    0x7ff0_0000_0000_0001,
    0x3ff0_0000_0000_0000,
    0,
    0x7ff8_0000_0000_0001
)]
fn fma_f64_rounds_once(#[case] a: u64, #[case] b: u64, #[case] c: u64, #[case] want: u64) {
    let got = run(F64_OPS, "fma.rn.f64 %xd, %xa, %xb, %xc;", &[[a, b, c]]);
    assert_bits("fma.rn.f64", &[[a, b, c]], &got, &[want]);
}

/// A random f64 in [2^lo, 2^(hi+1)) with random sign, low bits often all ones or zeros.
fn f64_in(r: &mut Rng, lo: i32, hi: i32) -> f64 {
    let x = r.next();
    let exp = lo + (x % (hi - lo + 1) as u64) as i32;
    let mut frac = r.next() & ((1 << 52) - 1);
    match x >> 60 {
        0..=4 => frac |= 0xff_ffff,
        5..=9 => frac &= !0xff_ffff,
        _ => {}
    }
    f64::from_bits((x >> 59 & 1) << 63 | ((exp + 1023) as u64) << 52 | frac)
}

#[test]
fn fma_add_mul_f64_random_against_exact_integers() {
    let mut r = Rng(2);
    let mut cases = Vec::new();
    for i in 0..2048 {
        let (x, y) = (f64_in(&mut r, -3, 3), f64_in(&mut r, -3, 3));
        let z = if i % 2 == 0 {
            -(x * y) * (1.0 + (r.next() % 5) as f64 * f64::EPSILON)
        } else {
            f64_in(&mut r, -3, 3)
        };
        cases.push([d(x), d(y), d(z)]);
    }
    let fma: Vec<u64> = cases
        .iter()
        .map(|c| f64_exact(c[0], Some(c[1]), c[2]))
        .collect();
    let got = run(F64_OPS, "fma.rn.f64 %xd, %xa, %xb, %xc;", &cases);
    assert_bits("fma.rn.f64", &cases, &got, &fma);
    let add: Vec<u64> = cases.iter().map(|c| f64_exact(c[0], None, c[2])).collect();
    let got = run(F64_OPS, "add.rn.f64 %xd, %xa, %xc;", &cases);
    assert_bits("add.rn.f64", &cases, &got, &add);
    let zero = d(0.0);
    let mul: Vec<u64> = cases
        .iter()
        .map(|c| f64_exact(c[0], Some(c[1]), zero))
        .collect();
    let got = run(F64_OPS, "mul.rn.f64 %xd, %xa, %xb;", &cases);
    assert_bits("mul.rn.f64", &cases, &got, &mul);
}

#[rstest]
// 1 + 2^-24: a tie between 1 and 1 + 2^-23, to even: 1.
#[case::tie_to_even_down("add.rn.f32", 0x3f80_0000, 0x3380_0000, 0x3f80_0000)]
// (1 + 2^-23) + 2^-24: a tie between 1 + 2^-23 (odd) and 1 + 2^-22: 1 + 2^-22.
#[case::tie_to_even_up("add.rn.f32", 0x3f80_0001, 0x3380_0000, 0x3f80_0002)]
#[case::no_rounding_mode_is_rn("add.f32", 0x3f80_0001, 0x3380_0000, 0x3f80_0002)]
// max + 2^103 (half its ulp) is a tie to even: 2^128, which overflows; max + 2^102
// stays max.
#[case::tie_overflows("add.rn.f32", 0x7f7f_ffff, 0x7300_0000, 0x7f80_0000)]
#[case::below_the_tie_stays("add.rn.f32", 0x7f7f_ffff, 0x7280_0000, 0x7f7f_ffff)]
// 2^-126 - 2^-127 = 2^-127: a subnormal result, exact (gradual underflow).
#[case::subnormal_difference("sub.rn.f32", 0x0080_0000, 0x0040_0000, 0x0040_0000)]
#[case::x_minus_x_is_positive_zero("sub.rn.f32", 0xbf80_0000, 0xbf80_0000, 0x0000_0000)]
#[case::minus_zero_minus_zero("sub.rn.f32", 0x8000_0000, 0x0000_0000, 0x8000_0000)]
#[case::inf_minus_inf("sub.rn.f32", 0x7f80_0000, 0x7f80_0000, 0x7fff_ffff)]
#[case::nan_payload_not_kept("add.rn.f32", 0x7fc0_1234, 0x3f80_0000, 0x7fff_ffff)]
// 2^-149 * 0.5: a tie between 0 and 2^-149, to even: +0; times 1.5, between 1 and 2
// units: 2.
#[case::subnormal_tie_to_zero("mul.rn.f32", 0x0000_0001, 0x3f00_0000, 0x0000_0000)]
#[case::subnormal_tie_to_two("mul.rn.f32", 0x0000_0001, 0x3fc0_0000, 0x0000_0002)]
#[case::underflow_keeps_the_sign("mul.rn.f32", 0x8d80_0000, 0x0d80_0000, 0x8000_0000)]
#[case::zero_times_inf("mul.rn.f32", 0x0000_0000, 0xff80_0000, 0x7fff_ffff)]
#[case::no_rounding_mode_mul("mul.f32", 0x3f80_0001, 0x3f80_0001, 0x3f80_0002)]
// 1/3 = 0x3eaaaaab (0.333333343, the nearest f32).
#[case::one_third("div.rn.f32", 0x3f80_0000, 0x4040_0000, 0x3eaa_aaab)]
#[case::by_zero("div.rn.f32", 0xbf80_0000, 0x0000_0000, 0xff80_0000)]
#[case::zero_by_zero("div.rn.f32", 0x0000_0000, 0x8000_0000, 0x7fff_ffff)]
fn add_sub_mul_div_round_to_nearest_even(
    #[case] op: &str,
    #[case] a: u64,
    #[case] b: u64,
    #[case] want: u64,
) {
    let got = run(F32_OPS, &format!("{op} %xd, %xa, %xb;"), &[[a, b, 0]]);
    assert_bits(op, &[[a, b, 0]], &got, &[want]);
}

/// Random operands of every exponent (subnormals, overflow) against f64 arithmetic
/// rounded by `Format::round`.
#[rstest]
#[case::add("add.rn.f32", |a, b| a + b)]
#[case::sub("sub.rn.f32", |a, b| a - b)]
#[case::mul("mul.rn.f32", |a, b| a * b)]
#[case::div("div.rn.f32", |a, b| a / b)]
fn binary_f32_random(#[case] op: &str, #[case] exact: fn(f64, f64) -> f64) {
    let mut r = Rng(op.len() as u64 * 31 + op.as_bytes()[0] as u64);
    let mut cases = Vec::new();
    for i in 0..3000 {
        let (lo, hi) = match i % 4 {
            0 => (-149 + 23, -100), // subnormal results of sums and products
            1 => (60, 127),         // overflow of products
            _ => (-30, 30),
        };
        let x = r.f32_in(lo, hi);
        let y = if i % 5 == 0 {
            // Close to x: cancellation in sums, ratios near 1.
            f32::from_bits(x.to_bits() ^ (r.next() as u32 & 0x8000_00ff))
        } else {
            r.f32_in(lo.min(-30), hi)
        };
        cases.push([f(x), f(y), 0]);
    }
    let want: Vec<u64> = cases
        .iter()
        .map(|c| f64_to_f32_rn(exact(wide(c[0]), wide(c[1]))))
        .collect();
    let got = run(F32_OPS, &format!("{op} %xd, %xa, %xb;"), &cases);
    assert_bits(op, &cases, &got, &want);
}

#[rstest]
// sqrt(2) = 0x3fb504f3 (1.41421354, nearest f32).
#[case::sqrt_two("sqrt.rn.f32", 0x4000_0000, 0x3fb5_04f3)]
#[case::sqrt_minus_zero("sqrt.rn.f32", 0x8000_0000, 0x8000_0000)]
#[case::sqrt_negative("sqrt.rn.f32", 0xbf80_0000, 0x7fff_ffff)]
#[case::sqrt_inf("sqrt.rn.f32", 0x7f80_0000, 0x7f80_0000)]
// sqrt(2^-148) = 2^-74.
#[case::sqrt_subnormal("sqrt.rn.f32", 0x0000_0002, 0x1a80_0000)]
#[case::rcp_three("rcp.rn.f32", 0x4040_0000, 0x3eaa_aaab)]
#[case::rcp_minus_zero("rcp.rn.f32", 0x8000_0000, 0xff80_0000)]
fn sqrt_rcp_round_to_nearest_even(#[case] op: &str, #[case] a: u64, #[case] want: u64) {
    let got = run(F32_OPS, &format!("{op} %xd, %xa;"), &[[a, 0, 0]]);
    assert_bits(op, &[[a, 0, 0]], &got, &[want]);
}

#[test]
fn sqrt_rcp_random() {
    let mut r = Rng(5);
    let cases: Vec<[u64; 3]> = (0..3000)
        .map(|i| match i % 2 {
            0 => [(r.next() & 0x7f_ffff) | 1, 0, 0], // subnormals
            _ => [f(r.f32_in(-126, 127).abs()), 0, 0],
        })
        .collect();
    let want: Vec<u64> = cases
        .iter()
        .map(|c| f64_to_f32_rn(wide(c[0]).sqrt()))
        .collect();
    let got = run(F32_OPS, "sqrt.rn.f32 %xd, %xa;", &cases);
    assert_bits("sqrt.rn.f32", &cases, &got, &want);
    let want: Vec<u64> = cases
        .iter()
        .map(|c| f64_to_f32_rn(1.0 / wide(c[0])))
        .collect();
    let got = run(F32_OPS, "rcp.rn.f32 %xd, %xa;", &cases);
    assert_bits("rcp.rn.f32", &cases, &got, &want);
}

#[rstest]
#[case::one_plus_half_ulp(
    "add.rn.f64",
    0x3ff0_0000_0000_0000,
    0x3ca0_0000_0000_0000,
    0x3ff0_0000_0000_0000
)]
#[case::odd_plus_half_ulp(
    "add.rn.f64",
    0x3ff0_0000_0000_0001,
    0x3ca0_0000_0000_0000,
    0x3ff0_0000_0000_0002
)]
// 0.1 + 0.2 = 0.30000000000000004 (0x3fd3333333333334).
#[case::tenths(
    "add.rn.f64",
    0x3fb9_9999_9999_999a,
    0x3fc9_9999_9999_999a,
    0x3fd3_3333_3333_3334
)]
#[case::inf_minus_inf(
    "sub.rn.f64",
    0x7ff0_0000_0000_0000,
    0x7ff0_0000_0000_0000,
    0xfff8_0000_0000_0000
)]
// 1 / 3 = 0x3fd5555555555555 (the quotient 0x1.5555...p-2, the 53rd bit rounds down).
#[case::third(
    "div.rn.f64",
    0x3ff0_0000_0000_0000,
    0x4008_0000_0000_0000,
    0x3fd5_5555_5555_5555
)]
// 3 - 0.5 = 2.5 exactly; 1 - 2^-54 lies halfway between 1 - 2^-53 (odd significand) and 1:
// to even, 1.
#[case::sub_exact(
    "sub.rn.f64",
    0x4008_0000_0000_0000,
    0x3fe0_0000_0000_0000,
    0x4004_0000_0000_0000
)]
#[case::sub_tie_to_even(
    "sub.rn.f64",
    0x3ff0_0000_0000_0000,
    0x3c90_0000_0000_0000,
    0x3ff0_0000_0000_0000
)]
#[case::nan_operand_kept(
    "mul.rn.f64",
    0x7ff8_0000_0000_1234,
    0x3ff0_0000_0000_0000,
    0x7ff8_0000_0000_1234
)]
fn f64_arithmetic(#[case] op: &str, #[case] a: u64, #[case] b: u64, #[case] want: u64) {
    let got = run(F64_OPS, &format!("{op} %xd, %xa, %xb;"), &[[a, b, 0]]);
    assert_bits(op, &[[a, b, 0]], &got, &[want]);
}

/// The parser accepts only `.rn` for float arithmetic, f16 included (so no kernel can
/// use a rounding cuda-sim does not implement).
#[rstest]
#[case::add_rz("add.rz.f32 %xd, %xa, %xb;", "modifier '.rz'")]
#[case::sub_rm("sub.rm.f32 %xd, %xa, %xb;", "modifier '.rm'")]
#[case::mul_rp("mul.rp.f32 %xd, %xa, %xb;", "modifier '.rp'")]
#[case::div_rz("div.rz.f32 %xd, %xa, %xb;", "modifier '.rz'")]
#[case::fma_rz("fma.rz.f32 %xd, %xa, %xb, %xc;", "modifier '.rz'")]
#[case::fma_without_rounding("fma.f32 %xd, %xa, %xb, %xc;", "needs .rn")]
#[case::sqrt_rz("sqrt.rz.f32 %xd, %xa;", "modifier '.rz'")]
#[case::sqrt_without_rounding("sqrt.f32 %xd, %xa;", "rounding/approximation form")]
#[case::add_f16_rz("add.rz.f16 %xd, %xa, %xb;", "modifier '.rz'")]
fn unsupported_roundings_are_refused(#[case] instr: &str, #[case] why: &str) {
    let types = if instr.contains(".f16") {
        ["f16", "f16", "f16", "f16"]
    } else {
        F32_OPS
    };
    let e = rejected(types, instr).unwrap_or_else(|| panic!("{instr} was not refused"));
    assert!(e.contains(why), "{instr}: {e}");
}

/// `min` / `max`: a NaN operand gives the other operand, two NaN the canonical NaN, and
/// -0 is below +0.
#[rstest]
#[case::ordered(0x3f80_0000, 0x4000_0000, 0x3f80_0000, 0x4000_0000)]
#[case::reversed(0x4000_0000, 0x3f80_0000, 0x3f80_0000, 0x4000_0000)]
#[case::zeros(0x8000_0000, 0x0000_0000, 0x8000_0000, 0x0000_0000)]
#[case::zeros_reversed(0x0000_0000, 0x8000_0000, 0x8000_0000, 0x0000_0000)]
#[case::nan_first(0x7fc0_0000, 0xbf80_0000, 0xbf80_0000, 0xbf80_0000)]
#[case::nan_second(0x3f80_0000, 0xffc0_0001, 0x3f80_0000, 0x3f80_0000)]
#[case::signalling_nan(0x7f80_0001, 0x4000_0000, 0x4000_0000, 0x4000_0000)]
#[case::both_nan(0x7fc0_1234, 0xff80_0001, 0x7fff_ffff, 0x7fff_ffff)]
#[case::nan_and_minus_inf(0xff80_0000, 0x7fc0_0000, 0xff80_0000, 0xff80_0000)]
#[case::infinities(0x7f80_0000, 0xff80_0000, 0xff80_0000, 0x7f80_0000)]
#[case::subnormal_and_zero(0x0000_0001, 0x8000_0000, 0x8000_0000, 0x0000_0001)]
fn min_max_f32(#[case] a: u64, #[case] b: u64, #[case] min: u64, #[case] max: u64) {
    let c = [[a, b, 0]];
    assert_bits(
        "min.f32",
        &c,
        &run(F32_OPS, "min.f32 %xd, %xa, %xb;", &c),
        &[min],
    );
    assert_bits(
        "max.f32",
        &c,
        &run(F32_OPS, "max.f32 %xd, %xa, %xb;", &c),
        &[max],
    );
}

#[rstest]
#[case::zeros(0x8000_0000_0000_0000, 0, 0x8000_0000_0000_0000, 0)]
// 2 and 1 in both orders: the larger is the max whichever operand it is.
#[case::greater_first(
    0x4000_0000_0000_0000,
    0x3ff0_0000_0000_0000,
    0x3ff0_0000_0000_0000,
    0x4000_0000_0000_0000
)]
#[case::greater_second(
    0x3ff0_0000_0000_0000,
    0x4000_0000_0000_0000,
    0x3ff0_0000_0000_0000,
    0x4000_0000_0000_0000
)]
#[case::nan_first(
    0x7ff8_0000_0000_0000,
    0xbff0_0000_0000_0000,
    0xbff0_0000_0000_0000,
    0xbff0_0000_0000_0000
)]
#[case::nan_second(
    0x4000_0000_0000_0000,
    0xfff8_0000_0000_0001,
    0x4000_0000_0000_0000,
    0x4000_0000_0000_0000
)]
fn min_max_f64(#[case] a: u64, #[case] b: u64, #[case] min: u64, #[case] max: u64) {
    let c = [[a, b, 0]];
    assert_bits(
        "min.f64",
        &c,
        &run(F64_OPS, "min.f64 %xd, %xa, %xb;", &c),
        &[min],
    );
    assert_bits(
        "max.f64",
        &c,
        &run(F64_OPS, "max.f64 %xd, %xa, %xb;", &c),
        &[max],
    );
    let both = [[0x7ff8_0000_0000_0000, 0xfff0_0000_0000_0001, 0]];
    for op in ["min.f64", "max.f64"] {
        let r = run(F64_OPS, &format!("{op} %xd, %xa, %xb;"), &both)[0];
        assert!(F64.is_nan(r), "{op} of two NaN: {r:#x}");
    }
}

/// How two operands compare: less, equal, greater or unordered (a NaN).
#[derive(Clone, Copy, Debug)]
enum Rel {
    Lt,
    Eq,
    Gt,
    Un,
}

/// The PTX ISA's table of float comparisons: the result for (Lt, Eq, Gt, Un).
const CMP_TABLE: [(&str, [bool; 4]); 14] = [
    ("eq", [false, true, false, false]),
    ("ne", [true, false, true, false]),
    ("lt", [true, false, false, false]),
    ("le", [true, true, false, false]),
    ("gt", [false, false, true, false]),
    ("ge", [false, true, true, false]),
    ("equ", [false, true, false, true]),
    ("neu", [true, false, true, true]),
    ("ltu", [true, false, false, true]),
    ("leu", [true, true, false, true]),
    ("gtu", [false, false, true, true]),
    ("geu", [false, true, true, true]),
    ("num", [true, true, true, false]),
    ("nan", [false, false, false, true]),
];

/// Operand pairs (f32 bits) and how they compare.
const F32_PAIRS: [(u64, u64, Rel); 10] = [
    (0x3f80_0000, 0x4000_0000, Rel::Lt),
    (0x4000_0000, 0x3f80_0000, Rel::Gt),
    (0x3f80_0000, 0x3f80_0000, Rel::Eq),
    (0x8000_0000, 0x0000_0000, Rel::Eq), // -0 == +0
    (0x7f80_0000, 0x7f80_0000, Rel::Eq),
    (0xff80_0000, 0xff7f_ffff, Rel::Lt),
    (0x0000_0001, 0x0000_0000, Rel::Gt),
    (0x7fc0_0000, 0x3f80_0000, Rel::Un),
    (0x3f80_0000, 0xff80_0001, Rel::Un),
    (0x7fff_ffff, 0x7fff_ffff, Rel::Un),
];

#[test]
fn setp_f32_and_f64_every_comparison() {
    let f64_of = |b: u64| d(f32::from_bits(b as u32) as f64);
    for (cmp, table) in CMP_TABLE {
        let cases: Vec<[u64; 3]> = F32_PAIRS.iter().map(|&(a, b, _)| [a, b, 0]).collect();
        let want: Vec<u64> = F32_PAIRS
            .iter()
            .map(|&(_, _, rel)| table[rel as usize] as u64)
            .collect();
        let instr = |ty: &str| format!("setp.{cmp}.{ty} %q, %xa, %xb; selp.u32 %xd, 1, 0, %q;");
        let got = run(["f32", "f32", "f32", "u32"], &instr("f32"), &cases);
        assert_bits(&format!("setp.{cmp}.f32"), &cases, &got, &want);
        let wide_cases: Vec<[u64; 3]> = cases
            .iter()
            .map(|c| [f64_of(c[0]), f64_of(c[1]), 0])
            .collect();
        let got = run(["f64", "f64", "f64", "u32"], &instr("f64"), &wide_cases);
        assert_bits(&format!("setp.{cmp}.f64"), &wide_cases, &got, &want);
    }
}

#[rstest]
#[case::signed_lt("setp.lt.s32", 0xffff_ffff, 1, 1)]
#[case::unsigned_lo("setp.lo.u32", 0xffff_ffff, 1, 0)]
#[case::unsigned_lt("setp.lt.u32", 0xffff_ffff, 1, 0)]
#[case::unsigned_hs("setp.hs.u32", 0xffff_ffff, 1, 1)]
#[case::signed_ge("setp.ge.s32", 0x8000_0000, 0x7fff_ffff, 0)]
#[case::signed_64("setp.gt.s64", 0x8000_0000, 0xffff_ffff_ffff_ffff, 1)]
#[case::flushed_equal("setp.eq.ftz.f32", 0x0000_0001, 0x8000_0000, 1)]
#[case::unflushed_greater("setp.gt.f32", 0x0000_0001, 0x8000_0000, 1)]
#[case::flushed_not_greater("setp.gt.ftz.f32", 0x0000_0001, 0x8000_0000, 0)]
fn setp_integers_and_ftz(#[case] op: &str, #[case] a: u64, #[case] b: u64, #[case] want: u64) {
    let ty = op.rsplit('.').next().expect("a type");
    let c = [[a, b, 0]];
    let got = run(
        [ty, ty, "u32", "u32"],
        &format!("{op} %q, %xa, %xb; selp.u32 %xd, 1, 0, %q;"),
        &c,
    );
    assert_bits(op, &c, &got, &[want]);
}

/// `selp`, `neg` and `abs` move bits: NaN payloads and signs of zero survive.
#[rstest]
#[case::selp_true(
    "selp.f32 %xd, %xa, %xb, %q;",
    0x7fc0_1234,
    0x3f80_0000,
    1,
    0x7fc0_1234
)]
#[case::selp_false(
    "selp.f32 %xd, %xa, %xb, %q;",
    0x7fc0_1234,
    0x8000_0000,
    0,
    0x8000_0000
)]
#[case::neg_nan("neg.f32 %xd, %xa;", 0x7fc0_1234, 0, 0, 0xffc0_1234)]
#[case::neg_zero("neg.f32 %xd, %xa;", 0x0000_0000, 0, 0, 0x8000_0000)]
// -1 -> 1: the sign bit is flipped, not set.
#[case::neg_negative("neg.f32 %xd, %xa;", 0xbf80_0000, 0, 0, 0x3f80_0000)]
#[case::abs_nan("abs.f32 %xd, %xa;", 0xff80_0001, 0, 0, 0x7f80_0001)]
#[case::abs_minus_zero("abs.f32 %xd, %xa;", 0x8000_0000, 0, 0, 0x0000_0000)]
fn selp_neg_abs_move_bits(
    #[case] body: &str,
    #[case] a: u64,
    #[case] b: u64,
    #[case] p: u64,
    #[case] want: u64,
) {
    let c = [[a, b, p]];
    let instr = format!("setp.ne.u32 %q, %xc, 0; {body}");
    let got = run(["f32", "f32", "u32", "f32"], &instr, &c);
    assert_bits(body, &c, &got, &[want]);
}

#[rstest]
#[case::selp_b64(
    "selp.b64 %xd, %xa, %xb, %q;",
    0x1234_5678_9abc_def0,
    7,
    1,
    0x1234_5678_9abc_def0
)]
#[case::selp_s32_false("selp.s32 %xd, %xa, %xb, %q;", 1, 0xffff_fffe, 0, 0xffff_fffe)]
#[case::neg_f64_nan(
    "neg.f64 %xd, %xa;",
    0x7ff8_0000_0000_0001,
    0,
    0,
    0xfff8_0000_0000_0001
)]
#[case::abs_f64("abs.f64 %xd, %xa;", 0x8000_0000_0000_0000, 0, 0, 0)]
fn selp_neg_abs_wide(
    #[case] body: &str,
    #[case] a: u64,
    #[case] b: u64,
    #[case] p: u64,
    #[case] want: u64,
) {
    let ty = body
        .split(' ')
        .next()
        .and_then(|o| o.rsplit('.').next())
        .expect("a type");
    let c = [[a, b, p]];
    let instr = format!("setp.ne.u32 %q, %xc, 0; {body}");
    let got = run([ty, ty, "u32", ty], &instr, &c);
    let mask = if ty.ends_with("32") {
        0xffff_ffff
    } else {
        u64::MAX
    };
    assert_bits(
        body,
        &c,
        &got.iter().map(|v| v & mask).collect::<Vec<_>>(),
        &[want],
    );
}

/// `Format` itself: a few roundings whose bits are known by heart.
#[test]
fn the_rounding_oracle_knows_its_basics() {
    assert_eq!(F32.round(false, 1, 0, false), 0x3f80_0000);
    assert_eq!(F32.round(true, 3, -1, false), 0xbfc0_0000);
    // 2^24 + 1: a tie, to even 2^24; 2^24 + 3: to 2^24 + 4.
    assert_eq!(F32.round(false, (1 << 24) + 1, 0, false), 0x4b80_0000);
    assert_eq!(F32.round(false, (1 << 24) + 1, 0, true), 0x4b80_0001);
    assert_eq!(F32.round(false, (1 << 24) + 3, 0, false), 0x4b80_0002);
    assert_eq!(F32.round(false, 1, -149, false), 1);
    assert_eq!(F32.round(false, 1, -150, false), 0);
    assert_eq!(F32.round(false, 1, -150, true), 1);
    assert_eq!(F32.round(false, 1, 128, false), 0x7f80_0000);
    assert_eq!(Format::round(exact::F16, false, 65520, 0, false), 0x7c00);
    assert_eq!(Format::round(exact::F16, false, 65519, 0, false), 0x7bff);
    assert_eq!(exact::F16.inf(), 0x7c00);
    assert_eq!(exact::BF16.inf(), 0x7f80);
    assert_eq!(F64.inf(), 0x7ff0_0000_0000_0000);
    assert_eq!(f64_to_f32_rn(0.1), 0.1f32.to_bits() as u64);
}
