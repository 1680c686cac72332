//! The host mirror of `kernels/rope.ptx`: the launch constants the host computes, the
//! kernel's `sincos_f` and one row's rotation, each float operation the kernel's own.

use super::arith::{add, div, fma, max, min, mul, rni, rzi_s32, sub};
use ggml_core::{RopeMode, RopeParams};

/// What the host passes the rope kernel for one op (`p_theta_scale` .. `p_corr_high`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConsts {
    /// `freq_base^(-2 / n_dims)`.
    pub theta_scale: f32,
    /// `freq_scale` of the op.
    pub freq_scale: f32,
    /// `ext_factor` of the op (0 turns YaRN's ramp off).
    pub ext_factor: f32,
    /// `attn_factor`, times `1 + 0.1 ln(1 / freq_scale)` when `ext_factor != 0`.
    pub mscale: f32,
    /// YaRN's correction dims (low, high), as [`yarn_corr_dims`].
    pub corr: [f32; 2],
    /// Rotated dimensions.
    pub n_dims: usize,
    /// NeoX pairs (i, i + n_dims/2) rather than (2i, 2i+1).
    pub neox: bool,
}

impl RopeConsts {
    /// The constants of `p`, computed on the host as ggml does.
    pub fn new(p: &RopeParams) -> RopeConsts {
        let mscale = if p.ext_factor != 0.0 {
            p.attn_factor * (1.0 + 0.1 * (1.0 / p.freq_scale).ln())
        } else {
            p.attn_factor
        };
        RopeConsts {
            theta_scale: p.freq_base.powf(-2.0 / p.n_dims as f32),
            freq_scale: p.freq_scale,
            ext_factor: p.ext_factor,
            mscale,
            corr: yarn_corr_dims(
                p.n_dims,
                p.n_ctx_orig,
                p.freq_base,
                p.beta_fast,
                p.beta_slow,
            ),
            n_dims: p.n_dims as usize,
            neox: p.mode == RopeMode::Neox,
        }
    }
}

/// YaRN correction dims as `ggml_rope_yarn_corr_dims`.
pub fn yarn_corr_dims(
    n_dims: u32,
    n_ctx_orig: u32,
    freq_base: f32,
    beta_fast: f32,
    beta_slow: f32,
) -> [f32; 2] {
    let corr_dim = |n_rot: f32| {
        n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * freq_base.ln())
    };
    let start = corr_dim(beta_fast).floor();
    let end = corr_dim(beta_slow).ceil();
    [start.max(0.0), end.min(n_dims as f32 - 1.0)]
}

const fn hex(bits: u32) -> f32 {
    f32::from_bits(bits)
}

/// `sincos_f` of rope.ptx: (sin x, cos x) by Cody-Waite reduction by pi/2 (three fma)
/// and the cephes polynomials, with the kernel's operations in its order.
pub fn sincos(x: f32) -> (f32, f32) {
    let k = rni(mul(x, hex(0x3F22_F983)));
    let j = rzi_s32(k);
    let mut r = fma(k, hex(0xBFC9_0FDB), x);
    r = fma(k, hex(0x333B_BD2E), r);
    r = fma(k, hex(0x26F7_2CED), r);
    let z = mul(r, r);
    // sin(r) = r + r*z*(S1 + z*(S2 + z*S3))
    let mut s = fma(z, hex(0xB94C_A1F9), hex(0x3C08_839E));
    s = fma(z, s, hex(0xBE2A_AAA3));
    s = mul(s, z);
    s = fma(r, s, r);
    // cos(r) = 1 - z/2 + z*z*(C1 + z*(C2 + z*C3))
    let mut co = fma(z, hex(0x37CC_F5CE), hex(0xBAB6_061A));
    co = fma(z, co, hex(0x3D2A_AAA5));
    let zz = mul(z, z);
    let one_minus = fma(z, hex(0xBF00_0000), 1.0);
    co = fma(zz, co, one_minus);
    // Quadrant q = j & 3: (sin, cos) = (s, c), (c, -s), (-s, -c), (-c, s); neg.f32 is
    // a sign flip.
    let q = j as u32 & 3;
    let (mut sin, mut cos) = if q & 1 != 0 { (co, s) } else { (s, co) };
    if q >= 2 {
        sin = -sin;
    }
    if q == 1 || q == 2 {
        cos = -cos;
    }
    (sin, cos)
}

/// The angle of pair `i` at position `pos`: `theta_0 = pos`, `theta_{k+1} = theta_k *
/// theta_scale` (in order), times `freq_scale`, mixed with YaRN's ramp when
/// `ext_factor != 0`.
fn angle(c: &RopeConsts, pos: i32, i: usize) -> f32 {
    let mut theta = pos as f32; // cvt.rn.f32.s32
    for _ in 0..i {
        theta = mul(theta, c.theta_scale);
    }
    let interp = mul(c.freq_scale, theta);
    if c.ext_factor == 0.0 {
        return interp;
    }
    let y = sub(i as f32, c.corr[0]);
    let span = max(sub(c.corr[1], c.corr[0]), hex(0x3A83_126F));
    let y = min(max(div(y, span), 0.0), 1.0);
    let mix = mul(sub(1.0, y), c.ext_factor);
    add(mul(interp, sub(1.0, mix)), mul(theta, mix))
}

/// One row (`x.len() = ne0` values) at position `pos` rotated as the rope kernel does:
/// `(x0, x1) -> (x0 cos - x1 sin, x0 sin + x1 cos)` with cos and sin scaled by `mscale`;
/// values from `n_dims` on are copied.
pub fn rope_row(x: &[f32], pos: i32, c: &RopeConsts, out: &mut [f32]) {
    out.copy_from_slice(x);
    for i in 0..c.n_dims / 2 {
        let (s, co) = sincos(angle(c, pos, i));
        let (s, co) = (mul(s, c.mscale), mul(co, c.mscale));
        let (i0, i1) = if c.neox {
            (i, i + c.n_dims / 2)
        } else {
            (2 * i, 2 * i + 1)
        };
        let (x0, x1) = (x[i0], x[i1]);
        out[i0] = sub(mul(x0, co), mul(x1, s));
        out[i1] = add(mul(x0, s), mul(x1, co));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The polynomial is within a few ulp of the true sine and cosine, in every
    /// quadrant, with the right signs.
    #[test]
    fn sincos_is_close_to_libm() {
        for i in -2000..2000 {
            let x = i as f32 * 0.0137;
            let (s, co) = sincos(x);
            let (ws, wc) = ((x as f64).sin(), (x as f64).cos());
            assert!((s as f64 - ws).abs() < 4e-7, "sin {x}: {s} vs {ws}");
            assert!((co as f64 - wc).abs() < 4e-7, "cos {x}: {co} vs {wc}");
        }
        assert_eq!(sincos(0.0), (0.0, 1.0));
    }

    #[test]
    fn yarn_corr_dims_are_ordered_within_the_dims() {
        let c = yarn_corr_dims(64, 4096, 10000.0, 32.0, 1.0);
        assert!(c[0] >= 0.0 && c[1] <= 63.0 && c[0] <= c[1]);
    }

    #[test]
    fn rope_row_rotates_pairs_and_copies_the_rest() {
        let p = RopeParams::llama(4, 10000.0);
        let c = RopeConsts::new(&p);
        let x = [1.0, 0.0, 0.0, 1.0, 7.0, 8.0];
        let mut out = [0.0; 6];
        rope_row(&x, 0, &c, &mut out);
        assert_eq!(out, x, "position 0 is the identity");
        rope_row(&x, 3, &c, &mut out);
        let (s, co) = sincos(3.0);
        assert_eq!((out[0], out[1]), (co, s));
        assert_eq!(&out[4..], &[7.0, 8.0]);
        let r = (out[0] * out[0] + out[1] * out[1]).sqrt();
        assert!((r - 1.0).abs() < 1e-6);
    }
}
