//! f32 <-> f16 / bf16 conversions exactly as ggml's reference code does them.
//!
//! * f16: `ggml_compute_fp32_to_fp16` / `ggml_compute_fp16_to_fp32` (ggml-impl.h, from
//!   the FP16 library), the conversions `ggml_fp32_to_fp16_row` and
//!   `ggml_fp16_to_fp32_row` use. Finite values and infinities round to nearest even,
//!   like IEEE and like [`half::f16::from_f32`]. NaN differs from `half`: ggml writes
//!   every f32 NaN as `sign | 0x7E00` (payload dropped), where `half` keeps the top
//!   payload bits. f16 NaN -> f32 gives the quieted NaN with the payload kept
//!   (`sign | 0x7FC00000 | mantissa << 13`), which is what the C code computes on x86
//!   and ARM and also what `half` gives.
//! * bf16: `ggml_compute_fp32_to_bf16` (used by `ggml_fp32_to_bf16_row_ref`): NaN ->
//!   `(bits >> 16) | 64`, else round to nearest even, which equals
//!   [`half::bf16::from_f32`] for every input (tested). bf16 -> f32 is a plain shift;
//!   it equals [`half::bf16::to_f32`] except for signaling NaNs, which `half` quiets and
//!   ggml keeps as they are.

use half::{bf16, f16};

use super::{check_len, QuantError};
use crate::dtype::DType;

/// ggml's `ggml_compute_fp32_to_fp16`: the f16 bits of `f`, rounded to nearest even; any
/// NaN becomes `sign | 0x7E00`.
#[inline]
pub fn fp32_to_fp16_bits(f: f32) -> u16 {
    let scale_to_inf = f32::from_bits(0x7780_0000); // 0x1.0p+112f
    let scale_to_zero = f32::from_bits(0x0880_0000); // 0x1.0p-110f
    let mut base = (fabsf(f) * scale_to_inf) * scale_to_zero;

    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let mut bias = shl1_w & 0xFF00_0000;
    if bias < 0x7100_0000 {
        bias = 0x7100_0000;
    }

    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x0000_7C00;
    let mantissa_bits = bits & 0x0000_0FFF;
    let nonsign = exp_bits + mantissa_bits;
    ((sign >> 16)
        | if shl1_w > 0xFF00_0000 {
            0x7E00
        } else {
            nonsign
        }) as u16
}

/// ggml's `ggml_compute_fp16_to_fp32` for the f16 bits `h` (exact; NaN payloads are kept
/// and quieted).
#[inline]
pub fn fp16_bits_to_fp32(h: u16) -> f32 {
    let w = (h as u32) << 16;
    let sign = w & 0x8000_0000;
    if (h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0 {
        // NaN. In C this goes through `normalized_value` below, a multiplication whose NaN
        // result the hardware quiets; spelled out so it does not depend on NaN propagation.
        return f32::from_bits(sign | 0x7FC0_0000 | (((h & 0x03FF) as u32) << 13));
    }
    let two_w = w.wrapping_add(w);

    let exp_offset = 0xE0u32 << 23;
    let exp_scale = f32::from_bits(0x0780_0000); // 0x1.0p-112f
    let normalized_value = f32::from_bits((two_w >> 4) + exp_offset) * exp_scale;

    let magic_mask = 126u32 << 23;
    let magic_bias = 0.5f32;
    let denormalized_value = f32::from_bits((two_w >> 17) | magic_mask) - magic_bias;

    let denormalized_cutoff = 1u32 << 27;
    let result = sign
        | if two_w < denormalized_cutoff {
            denormalized_value.to_bits()
        } else {
            normalized_value.to_bits()
        };
    f32::from_bits(result)
}

/// [`fp32_to_fp16_bits`] as an [`f16`](half::f16) (`GGML_FP32_TO_FP16`).
#[inline]
pub fn fp32_to_fp16(f: f32) -> f16 {
    f16::from_bits(fp32_to_fp16_bits(f))
}

/// [`fp16_bits_to_fp32`] of an [`f16`](half::f16) (`GGML_FP16_TO_FP32`).
#[inline]
pub fn fp16_to_fp32(h: f16) -> f32 {
    fp16_bits_to_fp32(h.to_bits())
}

/// ggml's `ggml_compute_fp32_to_bf16`: the bf16 bits of `f`, rounded to nearest even; a
/// NaN keeps its top bits and is made quiet (`(bits >> 16) | 64`).
#[inline]
pub fn fp32_to_bf16_bits(f: f32) -> u16 {
    let u = f.to_bits();
    if (u & 0x7FFF_FFFF) > 0x7F80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7FFF + ((u >> 16) & 1)) >> 16) as u16
}

/// ggml's `ggml_compute_bf16_to_fp32` for the bf16 bits `h` (exact).
#[inline]
pub fn bf16_bits_to_fp32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// [`fp32_to_bf16_bits`] as a [`bf16`](half::bf16) (`GGML_FP32_TO_BF16`).
#[inline]
pub fn fp32_to_bf16(f: f32) -> bf16 {
    bf16::from_bits(fp32_to_bf16_bits(f))
}

/// [`bf16_bits_to_fp32`] of a [`bf16`](half::bf16) (`GGML_BF16_TO_FP32`).
#[inline]
pub fn bf16_to_fp32(h: bf16) -> f32 {
    bf16_bits_to_fp32(h.to_bits())
}

/// `ggml_fp32_to_fp16_row`: converts `src` into `dst` (same length).
pub fn fp32_to_fp16_row(src: &[f32], dst: &mut [f16]) -> Result<(), QuantError> {
    check_len(DType::F16, "destination values", src.len(), dst.len())?;
    for (y, &x) in dst.iter_mut().zip(src) {
        *y = fp32_to_fp16(x);
    }
    Ok(())
}

/// `ggml_fp16_to_fp32_row`: converts `src` into `dst` (same length).
pub fn fp16_to_fp32_row(src: &[f16], dst: &mut [f32]) -> Result<(), QuantError> {
    check_len(DType::F16, "destination values", src.len(), dst.len())?;
    for (y, &x) in dst.iter_mut().zip(src) {
        *y = fp16_to_fp32(x);
    }
    Ok(())
}

/// `ggml_fp32_to_bf16_row_ref`: converts `src` into `dst` (same length).
pub fn fp32_to_bf16_row(src: &[f32], dst: &mut [bf16]) -> Result<(), QuantError> {
    check_len(DType::BF16, "destination values", src.len(), dst.len())?;
    for (y, &x) in dst.iter_mut().zip(src) {
        *y = fp32_to_bf16(x);
    }
    Ok(())
}

/// `ggml_bf16_to_fp32_row`: converts `src` into `dst` (same length).
pub fn bf16_to_fp32_row(src: &[bf16], dst: &mut [f32]) -> Result<(), QuantError> {
    check_len(DType::BF16, "destination values", src.len(), dst.len())?;
    for (y, &x) in dst.iter_mut().zip(src) {
        *y = bf16_to_fp32(x);
    }
    Ok(())
}

/// `fabsf`: clears the sign bit.
#[inline]
pub(crate) fn fabsf(x: f32) -> f32 {
    f32::from_bits(x.to_bits() & 0x7FFF_FFFF)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every f16 bit pattern: ggml's f16 -> f32 equals `half`'s (NaNs included).
    #[test]
    fn fp16_to_fp32_all_patterns_match_half() {
        for h in 0..=u16::MAX {
            let ours = fp16_bits_to_fp32(h).to_bits();
            let theirs = f16::from_bits(h).to_f32().to_bits();
            assert_eq!(ours, theirs, "h = {h:#06x}");
        }
    }

    /// Round trips f16 -> f32 -> f16 are exact except for NaN payload bits, which ggml drops.
    #[test]
    fn fp16_round_trip() {
        for h in 0..=u16::MAX {
            let back = fp32_to_fp16_bits(fp16_bits_to_fp32(h));
            if (h & 0x7C00) == 0x7C00 && (h & 0x03FF) != 0 {
                assert_eq!(back, (h & 0x8000) | 0x7E00, "h = {h:#06x}");
            } else {
                assert_eq!(back, h, "h = {h:#06x}");
            }
        }
    }

    /// A strided sweep over all f32 bit patterns (plus the neighbourhood of every f16
    /// rounding boundary): ggml's f32 -> f16 equals `half`'s except for NaN.
    #[test]
    fn fp32_to_fp16_matches_half_except_nan() {
        let check = |bits: u32| {
            let x = f32::from_bits(bits);
            let ours = fp32_to_fp16_bits(x);
            if x.is_nan() {
                assert_eq!(
                    ours,
                    ((bits >> 16) as u16 & 0x8000) | 0x7E00,
                    "{bits:#010x}"
                );
            } else {
                assert_eq!(ours, f16::from_f32(x).to_bits(), "{bits:#010x}");
            }
        };
        let mut bits = 0u32;
        while let Some(next) = bits.checked_add(9973) {
            check(bits);
            bits = next;
        }
        for h in 0..=u16::MAX {
            let b = fp16_bits_to_fp32(h).to_bits();
            for d in [0u32, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF] {
                check(b.wrapping_add(d));
                check(b.wrapping_sub(d));
            }
        }
    }

    /// ggml's f32 -> bf16 equals `half`'s, NaNs included; bf16 -> f32 too except that
    /// `half` quiets signaling NaNs.
    #[test]
    fn bf16_matches_half() {
        let check = |bits: u32| {
            let x = f32::from_bits(bits);
            assert_eq!(
                fp32_to_bf16_bits(x),
                bf16::from_f32(x).to_bits(),
                "{bits:#010x}"
            );
        };
        let mut bits = 0u32;
        while let Some(next) = bits.checked_add(4099) {
            check(bits);
            check(bits | 0x8000);
            check(bits & !0x7FFF);
            check(bits | 0x7FFF);
            bits = next;
        }
        for h in 0..=u16::MAX {
            let ours = bf16_bits_to_fp32(h).to_bits();
            let signaling_nan = (h & 0x7F80) == 0x7F80 && (h & 0x007F) != 0 && (h & 0x0040) == 0;
            if signaling_nan {
                // ggml shifts; half sets the quiet bit.
                assert_eq!(ours, (h as u32) << 16, "{h:#06x}");
                assert_eq!(
                    bf16::from_bits(h).to_f32().to_bits(),
                    ours | 0x0040_0000,
                    "{h:#06x}"
                );
            } else {
                assert_eq!(ours, bf16::from_bits(h).to_f32().to_bits(), "{h:#06x}");
            }
        }
        assert_eq!(fp32_to_bf16_bits(f32::from_bits(0x7F80_0001)), 0x7FC0);
        assert_eq!(fp32_to_bf16_bits(f32::from_bits(0x3F80_8000)), 0x3F80);
        assert_eq!(fp32_to_bf16_bits(f32::from_bits(0x3F81_8000)), 0x3F82);
    }

    #[test]
    fn known_values() {
        assert_eq!(fp32_to_fp16_bits(1.0), 0x3C00);
        assert_eq!(fp32_to_fp16_bits(-2.0), 0xC000);
        assert_eq!(fp32_to_fp16_bits(65520.0), 0x7C00);
        assert_eq!(fp32_to_fp16_bits(f32::NAN), 0x7E00);
        assert_eq!(fp32_to_fp16_bits(-f32::NAN), 0xFE00);
        assert_eq!(fp32_to_fp16_bits(f32::from_bits(0x3300_0000)), 0); // 2^-25 ties to 0
        assert_eq!(fp16_bits_to_fp32(0x0001), f32::from_bits(0x3380_0000));
        assert_eq!(fp16_bits_to_fp32(0x7C01).to_bits(), 0x7FC0_2000);
    }

    #[test]
    fn rows_check_lengths() {
        let mut h = [f16::ZERO; 2];
        assert!(fp32_to_fp16_row(&[1.0, 2.0], &mut h).is_ok());
        assert_eq!(h, [f16::ONE, f16::from_f32(2.0)]);
        let mut y = [0.0f32; 3];
        assert_eq!(
            fp16_to_fp32_row(&h, &mut y),
            Err(QuantError::SizeMismatch {
                dtype: DType::F16,
                what: "destination values",
                expected: 2,
                actual: 3
            })
        );
        let mut b = [bf16::ZERO; 1];
        assert!(fp32_to_bf16_row(&[1.0, 2.0], &mut b).is_err());
        assert!(fp32_to_bf16_row(&[-3.0], &mut b).is_ok());
        assert_eq!(b[0].to_bits(), 0xC040);
        assert!(bf16_to_fp32_row(&b, &mut y[..1]).is_ok());
        assert_eq!(y[0], -3.0);
    }

    /// The bf16-typed conversions give the bits of the bit-level ones.
    #[test]
    fn bf16_typed_conversions() {
        assert_eq!(fp32_to_bf16(1.5).to_bits(), 0x3FC0);
        assert_eq!(fp32_to_bf16(-0.0).to_bits(), 0x8000);
        assert_eq!(bf16_to_fp32(bf16::from_bits(0x3FC0)), 1.5);
        assert_eq!(bf16_to_fp32(bf16::from_bits(0xC040)), -3.0);
        assert_eq!(bf16_to_fp32(bf16::from_bits(0x4049)), 3.140625);
    }
}
