//! The f32 arithmetic of the kernels as a GPU performs it, for the host mirrors: each
//! operation is the one IEEE operation of its PTX instruction (`add.rn`, `mul.rn`,
//! `fma.rn`, ...), and every NaN result is the canonical NaN NVIDIA GPUs give, so a
//! mirror's bits are the kernel's bits even where a NaN appears.

/// The NaN every f32 arithmetic instruction of an NVIDIA GPU returns (0x7fffffff).
pub const CANONICAL_NAN: f32 = f32::from_bits(0x7fff_ffff);

/// `x` as the GPU leaves an arithmetic result: a NaN becomes [`CANONICAL_NAN`].
#[inline]
pub fn gpu(x: f32) -> f32 {
    if x.is_nan() {
        CANONICAL_NAN
    } else {
        x
    }
}

/// `add.rn.f32`.
#[inline]
pub fn add(a: f32, b: f32) -> f32 {
    gpu(a + b)
}

/// `sub.rn.f32`.
#[inline]
pub fn sub(a: f32, b: f32) -> f32 {
    gpu(a - b)
}

/// `mul.rn.f32`.
#[inline]
pub fn mul(a: f32, b: f32) -> f32 {
    gpu(a * b)
}

/// `div.rn.f32`.
#[inline]
pub fn div(a: f32, b: f32) -> f32 {
    gpu(a / b)
}

/// `fma.rn.f32`: `a * b + c` rounded once.
#[inline]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    gpu(a.mul_add(b, c))
}

/// `max.f32`: a NaN operand gives the other, two NaN the canonical NaN, +0 above -0.
pub fn max(a: f32, b: f32) -> f32 {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => CANONICAL_NAN,
        (true, false) => b,
        (false, true) => a,
        _ if a == b => {
            if a.is_sign_negative() {
                b
            } else {
                a
            }
        }
        _ if a > b => a,
        _ => b,
    }
}

/// `min.f32`: a NaN operand gives the other, two NaN the canonical NaN, -0 below +0.
pub fn min(a: f32, b: f32) -> f32 {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => CANONICAL_NAN,
        (true, false) => b,
        (false, true) => a,
        _ if a == b => {
            if a.is_sign_negative() {
                a
            } else {
                b
            }
        }
        _ if a < b => a,
        _ => b,
    }
}

/// `cvt.rni.f32.f32`: to the nearest integral value, ties to even (NaN canonical).
#[inline]
pub fn rni(x: f32) -> f32 {
    gpu(x.round_ties_even())
}

/// `cvt.rzi.s32.f32`: toward zero, saturating, NaN to 0 (Rust's `as` does exactly this).
#[inline]
pub fn rzi_s32(x: f32) -> i32 {
    x as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_results_are_canonical_and_min_max_skip_nan() {
        let nan = f32::from_bits(0x7fc0_1234);
        assert_eq!(add(nan, 1.0).to_bits(), 0x7fff_ffff);
        assert_eq!(mul(0.0, f32::INFINITY).to_bits(), 0x7fff_ffff);
        assert_eq!(max(nan, -1.0), -1.0);
        assert_eq!(min(2.0, nan), 2.0);
        assert_eq!(max(nan, nan).to_bits(), 0x7fff_ffff);
        assert_eq!(max(-0.0, 0.0).to_bits(), 0);
        assert_eq!(min(0.0, -0.0).to_bits(), 0x8000_0000);
        assert_eq!(rni(2.5), 2.0);
        assert_eq!(rni(-0.4).to_bits(), 0x8000_0000);
        assert_eq!(
            (rzi_s32(f32::NAN), rzi_s32(3e9), rzi_s32(-2.7)),
            (0, i32::MAX, -2)
        );
        // One rounding: (1 + 2^-23)(1 - 2^-24) - 1 keeps the product's low bits.
        let (a, b) = (f32::from_bits(0x3f80_0001), f32::from_bits(0x3f7f_ffff));
        assert_eq!(fma(a, b, -1.0).to_bits(), 0x337f_fffe);
    }
}
