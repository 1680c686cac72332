//! Access to ggml-core's reference (de)quantisation, which is bit-exact with ggml.

use ggml_core::DType;

/// Whether `dequantize_row` supports `d` (GET_ROWS sources).
pub(crate) fn can_dequantize(d: DType) -> bool {
    d.is_quantized()
}

/// Whether `quantize_row` supports `d` as a CPY destination (weight formats; not the
/// dot-only Q8_1 and Q8_K, which core's `cpy` rejects).
pub(crate) fn can_quantize(d: DType) -> bool {
    d.is_quantized() && !matches!(d, DType::Q8_1 | DType::Q8K)
}

/// Dequantises one row (`out.len()` values from `x`).
pub(crate) fn dequantize_row(d: DType, x: &[u8], out: &mut [f32]) {
    if ggml_core::quant::dequantize_row(d, x, out).is_err() {
        out.fill(f32::NAN);
    }
}

/// Quantises one row with the reference quantiser.
pub(crate) fn quantize_row(d: DType, x: &[f32], out: &mut [u8]) {
    if ggml_core::quant::quantize_row(d, x, out).is_err() {
        out.fill(0);
    }
}
