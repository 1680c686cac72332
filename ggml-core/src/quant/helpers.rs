//! ggml-quants.c's helper functions used by the `*_ref` quantizers, ported expression by
//! expression (same operation order, no fused multiply-add, no imatrix weights).
//!
//! Callers pass slices of equal length (a 16- or 32-value sub-block); the functions index
//! only within those lengths.

use super::fp::fabsf;

/// `GROUP_MAX_EPS`: a group whose largest magnitude is below this quantises to zero.
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round to nearest, ties to even, by adding 1.5 * 2^23 and reading
/// the mantissa. Exact for `|fval| <= 4194303` (ggml asserts that in debug builds); for
/// larger values, infinities and NaN it returns the same garbage as ggml's release build.
#[inline]
pub(crate) fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0;
    let i = val.to_bits() as i32;
    (i & 0x007F_FFFF) - 0x0040_0000
}

/// C's `(int)` conversion of a float as x86-64 compilers emit it (`cvttss2si`): truncation
/// toward zero, and the "integer indefinite" `i32::MIN` for NaN and out-of-range values
/// (undefined behaviour in C; this is what ggml does on x86-64). ggml's `(int8_t)f` and
/// `(uint8_t)f` casts are this followed by keeping the low byte (`as i8` / `as u8`).
#[inline]
pub(crate) fn c_float_to_int(v: f32) -> i32 {
    if (-2_147_483_648.0..2_147_483_648.0).contains(&v) {
        v as i32
    } else {
        i32::MIN
    }
}

/// `roundf`: round half away from zero.
#[inline]
pub(crate) fn roundf(v: f32) -> f32 {
    num_traits::float::Float::round(v)
}

/// `sqrtf` (correctly rounded).
#[inline]
pub(crate) fn sqrtf(v: f32) -> f32 {
    num_traits::float::Float::sqrt(v)
}

/// `MAX(-nmax, MIN(nmax - 1, l))`.
#[inline]
fn clamp_signed(l: i32, nmax: i32) -> i32 {
    l.min(nmax - 1).max(-nmax)
}

/// The first value of largest magnitude in `x` and that magnitude (`(0, 0)` when `x` is
/// empty or all zero), as ggml's quantizers scan for it.
#[inline]
pub(crate) fn max_by_magnitude(x: &[f32]) -> (f32, f32) {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &xi in x {
        let ax = fabsf(xi);
        if ax > amax {
            amax = ax;
            max = xi;
        }
    }
    (max, amax)
}

/// ggml's `make_qx_quants` with `qw == NULL`: symmetric quantisation of `x` to
/// `[-nmax, nmax - 1]`, stored offset by `nmax` in `ls`; returns the scale.
/// `rmse_type` as in ggml, for the values this crate uses: 0 (no search), 1 (the scale
/// search weighted by `x^2`, Q6_K's) and -1 (the first pass of that search only). ggml's
/// other weightings (2: 1, 3: |x|, else sqrt|x|) serve importance-matrix quantisation,
/// which this crate does not do.
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], ls: &mut [i8], rmse_type: i32) -> f32 {
    debug_assert!(
        (-1..=1).contains(&rmse_type),
        "make_qx_quants: rmse_type {rmse_type}"
    );
    let n = x.len().min(ls.len());
    let x = &x[..n];
    let ls = &mut ls[..n];
    let (max, amax) = max_by_magnitude(x);
    if amax < GROUP_MAX_EPS {
        ls.fill(0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    if rmse_type == 0 {
        for (l_out, &xi) in ls.iter_mut().zip(x) {
            let l = nearest_int(iscale * xi);
            *l_out = (nmax + clamp_signed(l, nmax)) as i8;
        }
        return 1.0 / iscale;
    }
    let return_early = rmse_type < 0;
    let weight = |xi: f32| -> f32 { xi * xi };
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for (l_out, &xi) in ls.iter_mut().zip(x) {
        let l = clamp_signed(nearest_int(iscale * xi), nmax);
        *l_out = (l + nmax) as i8;
        let w = weight(xi);
        let lf = l as f32;
        sumlx += w * xi * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 {
            0.5 * (scale + 1.0 / iscale)
        } else {
            1.0 / iscale
        };
    }
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &xi in x {
            let l = clamp_signed(nearest_int(iscale * xi), nmax);
            let w = weight(xi);
            let lf = l as f32;
            sumlx += w * xi * lf;
            suml2 += w * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (l_out, &xi) in ls.iter_mut().zip(x) {
                let l = nearest_int(iscale * xi);
                *l_out = (nmax + clamp_signed(l, nmax)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants`: symmetric quantisation of `x` to `[-nmax, nmax - 1]` (stored
/// offset by `nmax` in `ls`), optionally refined by coordinate descent on the
/// `x^2`-weighted error; returns the scale.
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], ls: &mut [i8], do_rmse: bool) -> f32 {
    let n = x.len().min(ls.len());
    let x = &x[..n];
    let ls = &mut ls[..n];
    let (max, amax) = max_by_magnitude(x);
    if amax < GROUP_MAX_EPS {
        ls.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    if do_rmse {
        let mut sumlx = 0.0f32;
        let mut suml2 = 0.0f32;
        for (l_out, &xi) in ls.iter_mut().zip(x) {
            let l = clamp_signed(nearest_int(iscale * xi), nmax);
            *l_out = l as i8;
            let w = xi * xi;
            let lf = l as f32;
            sumlx += w * xi * lf;
            suml2 += w * lf * lf;
        }
        for _itry in 0..5 {
            let mut n_changed = 0;
            for (l_cur, &xi) in ls.iter_mut().zip(x) {
                let w = xi * xi;
                let lc = *l_cur as f32;
                let mut slx = sumlx - w * xi * lc;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * lc * lc;
                    let new_l = clamp_signed(nearest_int(xi * sl2 / slx), nmax);
                    if new_l != *l_cur as i32 {
                        let nl = new_l as f32;
                        slx += w * xi * nl;
                        sl2 += w * nl * nl;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            *l_cur = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for l in ls.iter_mut() {
            *l = l.wrapping_add(nmax as i8);
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for (l_out, &xi) in ls.iter_mut().zip(x) {
        let l = clamp_signed(nearest_int(iscale * xi), nmax);
        *l_out = (l + nmax) as i8;
    }
    1.0 / iscale
}

/// Parameters of ggml's `make_qkx2_quants` scale search.
#[derive(Clone, Copy)]
pub(crate) struct Qkx2Params {
    /// Largest quant.
    pub nmax: i32,
    /// First trial offset of the inverse scale.
    pub rmin: f32,
    /// Step of the trial offsets.
    pub rdelta: f32,
    /// Number of steps (`nstep + 1` trials).
    pub nstep: i32,
    /// Absolute (true) or squared (false) error.
    pub use_mad: bool,
}

/// ggml's `make_qkx2_quants`: asymmetric quantisation `x ~ scale * l - the_min` with
/// `l` in `[0, nmax]` and weighted error; writes `ls` (using `laux` as scratch) and
/// returns `(scale, the_min)`.
pub(crate) fn make_qkx2_quants(
    p: Qkx2Params,
    x: &[f32],
    weights: &[f32],
    ls: &mut [u8],
    laux: &mut [u8],
) -> (f32, f32) {
    let n = x.len().min(weights.len()).min(ls.len()).min(laux.len());
    let (x, weights, ls, laux) = (&x[..n], &weights[..n], &mut ls[..n], &mut laux[..n]);
    let nmax = p.nmax;
    let (Some(&x0), Some(&w0)) = (x.first(), weights.first()) else {
        return (0.0, 0.0);
    };
    let mut min = x0;
    let mut max = x0;
    let mut sum_w = w0;
    let mut sum_x = sum_w * x0;
    for (&xi, &w) in x.iter().zip(weights).skip(1) {
        if xi < min {
            min = xi;
        }
        if xi > max {
            max = xi;
        }
        sum_w += w;
        sum_x += w * xi;
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        ls.fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for ((l_out, &xi), &w) in ls.iter_mut().zip(x).zip(weights) {
        let l = nearest_int(iscale * (xi - min));
        *l_out = l.min(nmax).max(0) as u8;
        let mut diff = scale * *l_out as f32 + min - xi;
        diff = if p.use_mad { fabsf(diff) } else { diff * diff };
        best_error += w * diff;
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let mut sum_l = 0.0f32;
        let mut sum_l2 = 0.0f32;
        let mut sum_xl = 0.0f32;
        for ((l_out, &xi), &w) in laux.iter_mut().zip(x).zip(weights) {
            let l = nearest_int(iscale * (xi - min)).min(nmax).max(0);
            *l_out = l as u8;
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * xi;
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for ((&l, &xi), &w) in laux.iter().zip(x).zip(weights) {
                let mut diff = this_scale * l as f32 + this_min - xi;
                diff = if p.use_mad { fabsf(diff) } else { diff * diff };
                cur_error += w * diff;
            }
            if cur_error < best_error {
                ls.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) from the
/// packed `scales` of a Q4_K / Q5_K block.
#[inline]
pub(crate) fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    let j = j & 7;
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-3.7), -4);
        assert_eq!(nearest_int(4_194_303.0), 4_194_303);
        assert_eq!(nearest_int(-4_194_303.0), -4_194_303);
    }

    #[test]
    fn c_float_to_int_like_x86() {
        assert_eq!(c_float_to_int(8.9), 8);
        assert_eq!(c_float_to_int(-0.9), 0);
        assert_eq!(c_float_to_int(-1.9), -1);
        assert_eq!(c_float_to_int(f32::NAN), i32::MIN);
        assert_eq!(c_float_to_int(f32::INFINITY), i32::MIN);
        assert_eq!(c_float_to_int(-f32::INFINITY), i32::MIN);
        assert_eq!(c_float_to_int(3e9), i32::MIN);
        assert_eq!(c_float_to_int(-2_147_483_648.0), i32::MIN);
        assert_eq!(c_float_to_int(2_147_483_520.0), 2_147_483_520);
    }

    #[test]
    fn roundf_half_away_from_zero() {
        assert_eq!(roundf(0.5), 1.0);
        assert_eq!(roundf(-0.5), -1.0);
        assert_eq!(roundf(2.5), 3.0);
        assert_eq!(roundf(0.499_999_97), 0.0);
    }

    #[test]
    fn scale_min_k4_unpacks() {
        let mut q = [0u8; 12];
        // j = 5: scale 0b10_1101, min 0b01_0110
        q[9] = 0b0110_1101;
        q[1] |= 0b10 << 6;
        q[5] |= 0b01 << 6;
        assert_eq!(get_scale_min_k4(5, &q), (0b10_1101, 0b01_0110));
        q[2] = 0b1111_1111;
        q[6] = 0b0000_0111;
        assert_eq!(get_scale_min_k4(2, &q), (63, 7));
    }
}
