//! Edges of cuda-sim's arithmetic that the broad exactness tests do not reach: `.sat` on
//! conversions that go through f64 (to or from f64, f32 to f16, integer to f16 / bf16),
//! `.ftz` and the integer rounding modes on conversions,
//! `ex2.approx` at the bottom of the subnormal range with the bound check on (the result
//! is moved by one ulp, but never onto zero), and `rcp.approx` / `rsqrt.approx` within
//! their bounds of values computed in the test. Expected bits are written out from the
//! encodings.

mod exact;

use exact::{assert_bits, d, f, run};
use rstest::rstest;

const F64_ONE: u64 = 0x3ff0_0000_0000_0000;
const F64_HALF: u64 = 0x3fe0_0000_0000_0000;

/// `instr` (a `cvt` whose last two suffixes are the destination and source types) of
/// `x`, an operand of type `src`, gives exactly `want`.
fn assert_converts(instr: &str, src: &str, x: u64, want: u64) {
    let dst = instr.rsplit('.').nth(1).expect("destination type");
    let c = [[x, 0, 0]];
    let got = run([src, "u32", "u32", dst], &format!("{instr} %xd, %xa;"), &c);
    assert_bits(instr, &c, &got, &[want]);
}

/// `.sat` clamps a float result to [0, 1] (NaN to +0), whatever the source type.
#[rstest]
#[case::s32_one("cvt.rn.sat.f64.s32", "s32", 1, F64_ONE)]
#[case::s32_above("cvt.rn.sat.f64.s32", "s32", 7, F64_ONE)]
#[case::s32_negative("cvt.rn.sat.f64.s32", "s32", (-3i32) as u32 as u64, 0)]
#[case::s32_zero("cvt.rn.sat.f64.s32", "s32", 0, 0)]
#[case::u64_big("cvt.rn.sat.f64.u64", "u64", u64::MAX, F64_ONE)]
#[case::f32_inside("cvt.sat.f64.f32", "f32", 0x3f00_0000, F64_HALF)]
#[case::f32_above("cvt.sat.f64.f32", "f32", 0x4000_0000, F64_ONE)]
#[case::f32_negative("cvt.sat.f64.f32", "f32", 0xbf80_0000, 0)]
#[case::f32_nan("cvt.sat.f64.f32", "f32", 0x7fc0_0000, 0)]
#[case::f32_infinity("cvt.sat.f64.f32", "f32", 0x7f80_0000, F64_ONE)]
#[case::f64_to_f32_inside("cvt.rn.sat.f32.f64", "f64", d(0.25), 0x3e80_0000)]
#[case::f64_to_f32_above("cvt.rn.sat.f32.f64", "f64", d(1e300), 0x3f80_0000)]
#[case::f64_to_f32_negative("cvt.rn.sat.f32.f64", "f64", d(-1e-300), 0)]
#[case::f32_to_f16_inside("cvt.rn.sat.f16.f32", "f32", f(0.75), 0x3a00)]
#[case::f32_to_f16_above("cvt.rn.sat.f16.f32", "f32", f(5.0), 0x3c00)]
#[case::f32_to_f16_nan("cvt.rn.sat.f16.f32", "f32", 0x7fc0_0000, 0)]
#[case::s32_to_f16_above("cvt.rn.sat.f16.s32", "s32", 5, 0x3c00)]
#[case::s32_to_f16_negative("cvt.rn.sat.f16.s32", "s32", (-2i32) as u32 as u64, 0)]
#[case::u32_to_f16_one("cvt.rn.sat.f16.u32", "u32", 1, 0x3c00)]
#[case::s32_to_bf16_above("cvt.rn.sat.bf16.s32", "s32", 5, 0x3f80)]
#[case::s32_to_bf16_negative("cvt.rn.sat.bf16.s32", "s32", (-2i32) as u32 as u64, 0)]
fn saturating_conversions_through_f64(
    #[case] instr: &str,
    #[case] src: &str,
    #[case] x: u64,
    #[case] want: u64,
) {
    assert_converts(instr, src, x, want);
}

/// `.ftz` flushes a subnormal f32 source to a zero of its sign before a conversion rounds
/// it (to an integer, or to f64), the integer rounding modes of a float-to-float
/// conversion round f64 values to integers, and f64 and 64-bit integers round once to f16
/// and bf16 (the half crate's f64 conversions do not: a bug these cases found). Expected
/// bits written out: 2^-149 as f64 is 0x36a0... (exponent 1023 - 149 = 0x36a).
#[rstest]
#[case::ceil_of_a_subnormal("cvt.rpi.s32.f32", "f32", 1, 1)]
#[case::ceil_of_a_flushed_subnormal("cvt.rpi.ftz.s32.f32", "f32", 1, 0)]
#[case::floor_of_a_flushed_negative_subnormal("cvt.rmi.ftz.s32.f32", "f32", 0x8000_0001, 0)]
#[case::subnormal_widened("cvt.f64.f32", "f32", 1, 0x36a0_0000_0000_0000)]
#[case::subnormal_flushed_then_widened("cvt.ftz.f64.f32", "f32", 1, 0)]
#[case::negative_subnormal_flushed("cvt.ftz.f64.f32", "f32", 0x8000_0001, 0x8000_0000_0000_0000)]
#[case::f64_to_nearest_even_integer("cvt.rni.f64.f64", "f64", d(2.5), d(2.0))]
#[case::f64_down_to_an_integer("cvt.rmi.f64.f64", "f64", d(-0.5), d(-1.0))]
#[case::f64_up_to_an_integer("cvt.rpi.f64.f64", "f64", d(1.25), d(2.0))]
#[case::f64_towards_zero("cvt.rzi.f64.f64", "f64", d(-1.75), d(-1.0))]
// Just above the f16 tie 1 + 2^-11: rounded once, up to 1 + 2^-10 (0x3c01); through f32
// first it would land on the tie and go to even, 1.0.
#[case::f64_to_f16_rounds_once("cvt.rn.f16.f64", "f64", d(1.0 + 2f64.powi(-11) + 2f64.powi(-40)), 0x3c01)]
// The same for bf16: just above the tie 1 + 2^-8, up to 1 + 2^-7 (0x3f81).
#[case::f64_to_bf16_rounds_once("cvt.rn.bf16.f64", "f64", d(1.0 + 2f64.powi(-8) + 2f64.powi(-40)), 0x3f81)]
// 2^60 + 2^52 + 1 is just above the bf16 tie 2^60 + 2^52: up to 2^60 + 2^53 (exponent
// 187 = 0xbb, last mantissa bit set: 0x5d81); through f64 the +1 is lost first.
#[case::u64_to_bf16_rounds_once("cvt.rn.bf16.u64", "u64", (1u64 << 60) + (1 << 52) + 1, 0x5d81)]
// The largest finite f16 is 65504; from 65520 on, infinity.
#[case::u64_to_f16_largest("cvt.rn.f16.u64", "u64", 65519, 0x7bff)]
#[case::u64_to_f16_overflow("cvt.rn.f16.u64", "u64", 65520, 0x7c00)]
fn flushed_sources_and_integer_rounding_in_conversions(
    #[case] instr: &str,
    #[case] src: &str,
    #[case] x: u64,
    #[case] want: u64,
) {
    assert_converts(instr, src, x, want);
}

/// Inputs in (-150, -148.415) have 2^x rounding to 2^-149, the smallest subnormal
/// (2^x / 2^-149 lies in (0.5, 1.5)). `ex2.approx.f32` (no `.ftz`) must give that value or
/// the one ulp above it: the bound check moves results one ulp up or down, and down from
/// the smallest subnormal would be zero, an error of a whole ulp in a value that is not
/// zero (a relative error of 100 %), outside the ISA's bound.
#[test]
fn ex2_at_the_smallest_subnormal_never_moves_onto_zero() {
    let cases: Vec<[u64; 3]> = (0..64)
        .map(|i| [f(-149.9 + i as f32 * 0.02), 0, 0])
        .collect();
    let got = run(
        ["f32", "u32", "u32", "f32"],
        "ex2.approx.f32 %xd, %xa;",
        &cases,
    );
    for (c, &g) in cases.iter().zip(&got) {
        let x = f32::from_bits(c[0] as u32);
        assert!(
            g == 1 || g == 2,
            "ex2.approx.f32({x}) = {g:#x}, want 0x1 (2^-149) or 0x2"
        );
    }
    // Both directions occur, so the test sees the downward move that the edge stops.
    assert!(got.contains(&1) && got.contains(&2), "{got:x?}");
}

/// `rcp.approx.f32` and `rsqrt.approx.f32` stay within their ISA bounds (relative error
/// 2^-23 and 2^-22.9; here 2^-21, room for the bound check's one-ulp move) of 1/x and
/// 1/sqrt(x) computed in f64 here, over normal inputs from 1e-20 to 1e20.
#[rstest]
#[case::rcp("rcp.approx.f32 %xd, %xa;", |x: f64| 1.0 / x)]
#[case::rsqrt("rsqrt.approx.f32 %xd, %xa;", |x: f64| 1.0 / x.sqrt())]
fn reciprocals_stay_within_their_bounds(#[case] instr: &str, #[case] want: fn(f64) -> f64) {
    let xs = [1e-20f32, 0.1, 0.75, 1.0, 2.0, 3.0, 7.5, 12345.678, 1e20];
    let cases: Vec<[u64; 3]> = xs.iter().map(|&x| [f(x), 0, 0]).collect();
    let got = run(["f32", "u32", "u32", "f32"], instr, &cases);
    for (&x, &g) in xs.iter().zip(&got) {
        let (g, w) = (f64::from(f32::from_bits(g as u32)), want(f64::from(x)));
        let rel = ((g - w) / w).abs();
        assert!(
            rel <= 2f64.powi(-21),
            "{instr} of {x}: {g} vs {w} (relative error {rel:e})"
        );
    }
}

/// With the bound check on, results that are exactly zero stay zero (signed as the input):
/// the check moves a result to the edge of the ISA's bound, and `sin(±0)` and `tanh(±0)`
/// are ±0 on every GPU.
#[rstest]
#[case::sin("sin.approx.f32 %xd, %xa;")]
#[case::tanh("tanh.approx.f32 %xd, %xa;")]
fn zero_results_stay_zero_under_the_bound_check(#[case] instr: &str) {
    let cases = [[f(0.0), 0, 0], [f(-0.0), 0, 0]];
    let got = run(["f32", "u32", "u32", "f32"], instr, &cases);
    assert_bits(instr, &cases, &got, &[0, 0x8000_0000]);
}

/// `tanh.approx.f32` within its ISA bound (relative error 2^-10.987; here 2^-10) of tanh
/// computed in f64 here, with the bound check on.
#[test]
fn tanh_stays_within_its_bound() {
    let xs = [-5.0f32, -1.0, -0.3, 0.001, 0.2, 0.7, 1.5, 3.0];
    let cases: Vec<[u64; 3]> = xs.iter().map(|&x| [f(x), 0, 0]).collect();
    let got = run(
        ["f32", "u32", "u32", "f32"],
        "tanh.approx.f32 %xd, %xa;",
        &cases,
    );
    for (&x, &g) in xs.iter().zip(&got) {
        let (g, w) = (f64::from(f32::from_bits(g as u32)), f64::from(x).tanh());
        let rel = ((g - w) / w).abs();
        assert!(
            rel <= 2f64.powi(-10),
            "tanh.approx({x}) = {g}, want {w} (relative error {rel:e})"
        );
    }
}

/// `sin.approx.f32` with the bound check on: within the ISA's absolute error 2^-20.9 of sin
/// computed in f64 here, and moved both up and down from the correctly rounded value over
/// 64 inputs (a move that always leaned one way would be kinder to sums than a GPU is).
#[test]
fn sin_moves_both_ways_within_its_bound() {
    let xs: Vec<f32> = (0..64).map(|i| -3.0 + i as f32 * 0.0937).collect();
    let cases: Vec<[u64; 3]> = xs.iter().map(|&x| [f(x), 0, 0]).collect();
    let got = run(
        ["f32", "u32", "u32", "f32"],
        "sin.approx.f32 %xd, %xa;",
        &cases,
    );
    let (mut up, mut down) = (0, 0);
    for (&x, &g) in xs.iter().zip(&got) {
        let w = f64::from(x).sin();
        let g = f32::from_bits(g as u32);
        let err = (f64::from(g) - w).abs();
        assert!(
            err <= 2f64.powf(-20.9),
            "sin.approx({x}) = {g}, want {w} (error {err:e})"
        );
        match g.partial_cmp(&(w as f32)) {
            Some(std::cmp::Ordering::Greater) => up += 1,
            Some(std::cmp::Ordering::Less) => down += 1,
            _ => {}
        }
    }
    assert!(up > 0 && down > 0, "moved up {up} and down {down} times");
}
