//! Access to ggml-core's reference quantisation (bit-exact with ggml).
//!
//! TEMPORARY: until the `quant` branch lands, no quantised dtype is (de)quantisable here.

use ggml_core::DType;

/// Whether `dequantize_row` supports `d`.
pub(crate) fn can_dequantize(_d: DType) -> bool {
    false
}

/// Whether `quantize_row` supports `d` as a CPY destination.
pub(crate) fn can_quantize(_d: DType) -> bool {
    false
}

/// Dequantises one row.
pub(crate) fn dequantize_row(_d: DType, _x: &[u8], out: &mut [f32]) {
    out.fill(f32::NAN);
}

/// Quantises one row with the reference quantiser.
pub(crate) fn quantize_row(_d: DType, _x: &[f32], out: &mut [u8]) {
    out.fill(0);
}
