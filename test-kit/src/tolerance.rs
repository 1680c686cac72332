//! How far results may be from a reference: NMSE for approximate kernels, ulps for
//! near-exact ones.

/// Normalised mean squared error of `got` against `want`: Σ(got - want)² / Σ want², in
/// f64 (0 when both are all zero; infinite when only `want` is). Panics when the
/// lengths differ.
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "nmse of slices of different lengths");
    let (mut num, mut den) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        let d = f64::from(g) - f64::from(w);
        num += d * d;
        den += f64::from(w) * f64::from(w);
    }
    if num == 0.0 {
        0.0
    } else {
        num / den
    }
}

/// Position of `x` on a line where adjacent f32 values are adjacent integers (-0 and +0
/// both at 0).
fn ordinal(x: f32) -> i64 {
    let b = x.to_bits();
    if b & 0x8000_0000 != 0 {
        -i64::from(b & 0x7fff_ffff)
    } else {
        i64::from(b)
    }
}

/// How many f32 values lie between `a` and `b` plus one (0 when equal, -0 equals +0);
/// `u64::MAX` when either is NaN.
pub fn ulps(a: f32, b: f32) -> u64 {
    if a.is_nan() || b.is_nan() {
        return u64::MAX;
    }
    ordinal(a).abs_diff(ordinal(b))
}

/// The largest [`ulps`] over pairs of `got` and `want`. Panics when the lengths differ.
pub fn max_ulps(got: &[f32], want: &[f32]) -> u64 {
    assert_eq!(got.len(), want.len(), "ulps of slices of different lengths");
    got.iter()
        .zip(want)
        .map(|(&g, &w)| ulps(g, w))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ulps_counts_representable_steps() {
        assert_eq!(ulps(1.0, 1.0), 0);
        assert_eq!(ulps(0.0, -0.0), 0);
        assert_eq!(ulps(1.0, f32::from_bits(1.0f32.to_bits() + 3)), 3);
        // Across zero: the two smallest subnormals are two steps apart.
        assert_eq!(ulps(f32::from_bits(1), -f32::from_bits(1)), 2);
        assert_eq!(ulps(f32::MAX, f32::INFINITY), 1);
        assert_eq!(ulps(f32::NAN, 1.0), u64::MAX);
        assert_eq!(
            max_ulps(&[1.0, 2.0], &[1.0, f32::from_bits(2.0f32.to_bits() - 1)]),
            1
        );
    }

    #[test]
    fn nmse_is_relative() {
        assert_eq!(nmse(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert_eq!(nmse(&[0.0], &[0.0]), 0.0);
        assert!(nmse(&[1.0], &[0.0]).is_infinite());
        let e = nmse(&[1.1, 2.0], &[1.0, 2.0]);
        assert!((e - 0.01 / 5.0).abs() < 1e-9, "{e}");
    }
}
