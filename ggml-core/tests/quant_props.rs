//! Properties of the byte-level quantisation API: no panics on any input (any lengths,
//! any f32 bit patterns, any block bytes), and errors exactly when the lengths are wrong.

use ggml_core::quant::{dequantize_row, quantize_row, QuantError};
use ggml_core::{DType, ALL_DTYPES};
use proptest::prelude::*;

fn dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(ALL_DTYPES.to_vec())
}

/// f32 values from arbitrary bits (NaNs, infinities, subnormals) and from ordinary ranges.
fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        any::<u32>().prop_map(f32::from_bits),
        -10.0f32..10.0,
        (-1e-30f32..1e-30),
        Just(0.0f32),
    ]
}

/// Whether a row of `n` values of `dtype` fits a byte buffer of `bytes` bytes.
fn fits(dtype: DType, n: usize, bytes: usize) -> bool {
    dtype.row_size(n) == Some(bytes)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn quantize_never_panics(
        dtype in dtype(),
        blocks in 0usize..4,
        extra in prop_oneof![Just(0usize), 0usize..300],
        dst_delta in prop_oneof![Just(0isize), -3isize..4],
        seed in prop::collection::vec(value(), 1..64),
    ) {
        let n = blocks * dtype.block_size() + extra;
        let src: Vec<f32> = (0..n).map(|i| seed[i % seed.len()]).collect();
        let want = dtype.row_size(n).unwrap_or(n * 4);
        let len = (want as isize + dst_delta).max(0) as usize;
        let mut dst = vec![0xA5u8; len];
        let r = quantize_row(dtype, &src, &mut dst);
        if dtype == DType::I32 {
            prop_assert_eq!(r, Err(QuantError::Unsupported { dtype }));
        } else {
            prop_assert_eq!(r.is_ok(), fits(dtype, n, len), "{:?}", r);
        }
        if r.is_err() {
            prop_assert!(dst.iter().all(|&b| b == 0xA5), "wrote on error");
        }
    }

    #[test]
    fn dequantize_never_panics(
        dtype in dtype(),
        blocks in 0usize..4,
        extra in prop_oneof![Just(0usize), 0usize..300],
        src_delta in prop_oneof![Just(0isize), -3isize..4],
        bytes in prop::collection::vec(any::<u8>(), 1..1200),
    ) {
        let n = blocks * dtype.block_size() + extra;
        let want = dtype.row_size(n).unwrap_or(n * 4);
        let len = (want as isize + src_delta).max(0) as usize;
        let src: Vec<u8> = (0..len).map(|i| bytes[i % bytes.len()]).collect();
        let mut dst = vec![1.5f32; n];
        let r = dequantize_row(dtype, &src, &mut dst);
        if dtype == DType::I32 {
            prop_assert_eq!(r, Err(QuantError::Unsupported { dtype }));
        } else {
            prop_assert_eq!(r.is_ok(), fits(dtype, n, len), "{:?}", r);
        }
        if r.is_err() {
            prop_assert!(dst.iter().all(|&v| v == 1.5), "wrote on error");
        }
    }

    /// Finite inputs round-trip without NaN for every float and quantised dtype, as long
    /// as the scales fit in f16 (|x| < 60000 keeps every f16 scale finite).
    #[test]
    fn finite_inputs_give_finite_outputs(
        dtype in dtype(),
        values in prop::collection::vec(-6e4f32..6e4, 256..=256),
    ) {
        prop_assume!(dtype != DType::I32);
        let mut q = vec![0u8; dtype.row_size(256).unwrap()];
        quantize_row(dtype, &values, &mut q).unwrap();
        let mut y = vec![0.0f32; 256];
        dequantize_row(dtype, &q, &mut y).unwrap();
        prop_assert!(y.iter().all(|v| v.is_finite()), "{}: {:?}", dtype, y);
    }
}
