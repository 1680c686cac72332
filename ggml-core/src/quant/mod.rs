//! Block quantisation: ggml's block layouts and its reference (de)quantisation, bit for bit.
//!
//! * [`BlockQ4_0`] ... [`BlockQ8K`]: `#[repr(C)]` blocks byte-identical to ggml's
//!   `block_q4_0` ... `block_q8_K`, [`bytemuck::Pod`], sizes equal to
//!   [`DType::type_size`] (checked at compile time).
//! * `quantize_block_*` / `dequantize_block_*`: one block, infallible, allocation-free;
//!   `quantize_row_*` / `dequantize_row_*`: typed rows (the hot-loop entry points of the
//!   CPU backend), and the [`QuantBlock`] trait over them.
//! * [`quantize_row`] / [`dequantize_row`]: rows as bytes, for any [`DType`] but I32.
//!
//! Every function reproduces ggml's reference C code (`quantize_row_*_ref` and
//! `dequantize_row_*` in ggml/src/ggml-quants.c, the f16/bf16 conversions of
//! ggml-impl.h): the same float operations in the same order (Rust never contracts
//! `a * b + c` into a fused multiply-add), `nearest_int`'s magic-number rounding, and
//! the helpers `make_qx_quants`, `make_q3_quants` and `make_qkx2_quants` as the `_ref`
//! quantizers call them (without importance weights). (`make_qkx1_quants` is not used by
//! any `_ref` function, so it is not ported.) The Q8_0, Q8_1 and Q8_K activation
//! quantizers are exactly ggml's `_ref` versions, the baseline for SIMD versions.
//!
//! Where ggml's C has undefined behaviour on extreme inputs (a float outside the range of
//! the integer it is cast to, which only happens when a block's inverse scale overflows,
//! e.g. for subnormal inputs, or for NaN/infinite inputs), this code does what ggml
//! compiled for x86-64 does (see `c_float_to_int` in the helpers; the subnormal vectors
//! below exercise it), and it never panics.
//!
//! # Verification
//!
//! `tests/quant_oracle.rs` checks every dtype against vectors in
//! `tests/data/quant_vectors.bin` (regenerate with `tests/data/gen_quant_vectors.py`):
//! quantised bytes and dequantised f32 bits must be identical. Inputs include zeros,
//! constant rows, tiny, subnormal, large and f16-overflowing values, mixed signs, ties,
//! outliers and multi-block rows with different scales; dequantisation is also checked on
//! random block bytes. The oracles, per dtype:
//!
//! | dtype | quantize | dequantize |
//! |-------|----------|------------|
//! | F32   | identity; gguf | identity; gguf |
//! | F16   | ggml C (`ggml_compute_fp32_to_fp16`); gguf/numpy except NaN | ggml C; gguf/numpy except NaN |
//! | BF16  | ggml C (`ggml_compute_fp32_to_bf16`); gguf | ggml C; gguf |
//! | Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 | ggml C `quantize_row_*_ref`; gguf | ggml C `dequantize_row_*`; gguf |
//! | Q8_1  | ggml C `quantize_row_q8_1_ref` | `d * q` (ggml has none; C oracle shim) |
//! | Q2_K, Q3_K, Q4_K, Q5_K, Q6_K | ggml C `quantize_row_*_ref` | ggml C `dequantize_row_*`; gguf |
//! | Q8_K  | ggml C `quantize_row_q8_K_ref` | ggml C `dequantize_row_q8_K` |
//!
//! "ggml C" is llama.cpp's unmodified ggml-quants.c (as vendored in llama-cpp-python
//! 0.3.36) compiled with gcc `-O2 -DNDEBUG -ffp-contract=off` for baseline x86-64 (no
//! FMA, no F16C; `-O0` gives the same vectors); "gguf" is the
//! `gguf` Python package's numpy implementation (`gguf.quants`), which agreed with the C
//! oracle on every vector it implements. One deliberate difference: for an all-zero
//! block, ggml's `quantize_row_q8_K_ref` leaves `bsums` untouched; here they are zero
//! (the oracle's output buffer was zeroed, so the vectors agree).

mod blocks;
mod fp;
mod helpers;
mod kquants;
mod legacy;

use core::fmt;
use core::mem::size_of;

use bytemuck::{Pod, Zeroable};

use crate::dtype::{DType, QK_K};

pub use blocks::{
    BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K,
    BlockQ8K, BlockQ8_0, BlockQ8_1, K_SCALE_SIZE, QK4_0, QK4_1, QK5_0, QK5_1, QK8_0, QK8_1,
};
pub use fp::{
    bf16_bits_to_fp32, bf16_to_fp32, bf16_to_fp32_row, fp16_bits_to_fp32, fp16_to_fp32,
    fp16_to_fp32_row, fp32_to_bf16, fp32_to_bf16_bits, fp32_to_bf16_row, fp32_to_fp16,
    fp32_to_fp16_bits, fp32_to_fp16_row,
};
pub use kquants::{
    dequantize_block_q2_k, dequantize_block_q3_k, dequantize_block_q4_k, dequantize_block_q5_k,
    dequantize_block_q6_k, dequantize_block_q8_k, quantize_block_q2_k, quantize_block_q3_k,
    quantize_block_q4_k, quantize_block_q5_k, quantize_block_q6_k, quantize_block_q8_k,
};
pub use legacy::{
    dequantize_block_q4_0, dequantize_block_q4_1, dequantize_block_q5_0, dequantize_block_q5_1,
    dequantize_block_q8_0, dequantize_block_q8_1, quantize_block_q4_0, quantize_block_q4_1,
    quantize_block_q5_0, quantize_block_q5_1, quantize_block_q8_0, quantize_block_q8_1,
};

/// Why a row could not be (de)quantised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantError {
    /// The dtype has no f32 conversion (I32).
    Unsupported {
        /// The dtype asked for.
        dtype: DType,
    },
    /// The number of values is not a multiple of the dtype's block size.
    NotBlockMultiple {
        /// The dtype of the row.
        dtype: DType,
        /// Number of f32 values given.
        len: usize,
    },
    /// A buffer's length does not fit the other one.
    SizeMismatch {
        /// The dtype of the row.
        dtype: DType,
        /// Which buffer and unit, e.g. `"destination bytes"`.
        what: &'static str,
        /// The length the other buffer implies.
        expected: usize,
        /// The length given.
        actual: usize,
    },
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            QuantError::Unsupported { dtype } => {
                write!(f, "{dtype}: no conversion to or from f32")
            }
            QuantError::NotBlockMultiple { dtype, len } => write!(
                f,
                "{dtype}: row of {len} values is not a multiple of the block size {}",
                dtype.block_size()
            ),
            QuantError::SizeMismatch {
                dtype,
                what,
                expected,
                actual,
            } => write!(f, "{dtype}: {what}: got {actual}, expected {expected}"),
        }
    }
}

impl core::error::Error for QuantError {}

/// A quantised block type: its dtype and typed row (de)quantisation.
///
/// Implemented by every `Block*` struct; lets callers be generic over the block format.
pub trait QuantBlock: Pod + Zeroable {
    /// The dtype stored in blocks of this type.
    const DTYPE: DType;
    /// Values per block (`DTYPE.block_size()`).
    const BLOCK_SIZE: usize;

    /// Quantizes `src` (a multiple of [`Self::BLOCK_SIZE`] values) into `dst`, one block
    /// per `BLOCK_SIZE` values.
    fn quantize_row(src: &[f32], dst: &mut [Self]) -> Result<(), QuantError>;

    /// Dequantizes `src` into `dst`, which must hold `src.len() * BLOCK_SIZE` values.
    fn dequantize_row(src: &[Self], dst: &mut [f32]) -> Result<(), QuantError>;
}

fn check_len(
    dtype: DType,
    what: &'static str,
    expected: usize,
    actual: usize,
) -> Result<(), QuantError> {
    if expected == actual {
        Ok(())
    } else {
        Err(QuantError::SizeMismatch {
            dtype,
            what,
            expected,
            actual,
        })
    }
}

fn not_multiple(dtype: DType, len: usize) -> QuantError {
    QuantError::NotBlockMultiple { dtype, len }
}

fn blocks32(dtype: DType, x: &[f32]) -> Result<&[[f32; 32]], QuantError> {
    bytemuck::try_cast_slice(x).map_err(|_| not_multiple(dtype, x.len()))
}

fn blocks32_mut(dtype: DType, x: &mut [f32]) -> Result<&mut [[f32; 32]], QuantError> {
    let len = x.len();
    bytemuck::try_cast_slice_mut(x).map_err(|_| not_multiple(dtype, len))
}

fn blocks256(dtype: DType, x: &[f32]) -> Result<&[[f32; QK_K]], QuantError> {
    bytemuck::try_cast_slice(x).map_err(|_| not_multiple(dtype, x.len()))
}

fn blocks256_mut(dtype: DType, x: &mut [f32]) -> Result<&mut [[f32; QK_K]], QuantError> {
    let len = x.len();
    bytemuck::try_cast_slice_mut(x).map_err(|_| not_multiple(dtype, len))
}

macro_rules! typed_rows {
    ($block:ty, $dtype:expr, $n:expr, $split:ident, $split_mut:ident,
     $qblock:ident, $dqblock:ident, $qrow:ident, $dqrow:ident, $name:literal) => {
        #[doc = concat!("Quantizes a row to ", $name, " (ggml's `quantize_row_", $name, "_ref`).")]
        ///
        /// `src.len()` must be a multiple of the block size and `dst` must hold exactly one
        /// block per block of `src`; otherwise nothing is written and an error is returned.
        pub fn $qrow(src: &[f32], dst: &mut [$block]) -> Result<(), QuantError> {
            let xs = $split($dtype, src)?;
            check_len($dtype, "destination blocks", xs.len(), dst.len())?;
            for (x, y) in xs.iter().zip(dst.iter_mut()) {
                *y = $qblock(x);
            }
            Ok(())
        }

        #[doc = concat!("Dequantizes a row of ", $name, " blocks (ggml's `dequantize_row_", $name, "`).")]
        ///
        /// `dst` must hold exactly `src.len()` times the block size values; otherwise
        /// nothing is written and an error is returned.
        pub fn $dqrow(src: &[$block], dst: &mut [f32]) -> Result<(), QuantError> {
            let ys = $split_mut($dtype, dst)?;
            check_len($dtype, "source blocks", ys.len(), src.len())?;
            for (b, y) in src.iter().zip(ys.iter_mut()) {
                $dqblock(b, y);
            }
            Ok(())
        }

        impl QuantBlock for $block {
            const DTYPE: DType = $dtype;
            const BLOCK_SIZE: usize = $n;

            fn quantize_row(src: &[f32], dst: &mut [Self]) -> Result<(), QuantError> {
                $qrow(src, dst)
            }

            fn dequantize_row(src: &[Self], dst: &mut [f32]) -> Result<(), QuantError> {
                $dqrow(src, dst)
            }
        }
    };
}

typed_rows!(
    BlockQ4_0,
    DType::Q4_0,
    32,
    blocks32,
    blocks32_mut,
    quantize_block_q4_0,
    dequantize_block_q4_0,
    quantize_row_q4_0,
    dequantize_row_q4_0,
    "q4_0"
);
typed_rows!(
    BlockQ4_1,
    DType::Q4_1,
    32,
    blocks32,
    blocks32_mut,
    quantize_block_q4_1,
    dequantize_block_q4_1,
    quantize_row_q4_1,
    dequantize_row_q4_1,
    "q4_1"
);
typed_rows!(
    BlockQ5_0,
    DType::Q5_0,
    32,
    blocks32,
    blocks32_mut,
    quantize_block_q5_0,
    dequantize_block_q5_0,
    quantize_row_q5_0,
    dequantize_row_q5_0,
    "q5_0"
);
typed_rows!(
    BlockQ5_1,
    DType::Q5_1,
    32,
    blocks32,
    blocks32_mut,
    quantize_block_q5_1,
    dequantize_block_q5_1,
    quantize_row_q5_1,
    dequantize_row_q5_1,
    "q5_1"
);
typed_rows!(
    BlockQ8_0,
    DType::Q8_0,
    32,
    blocks32,
    blocks32_mut,
    quantize_block_q8_0,
    dequantize_block_q8_0,
    quantize_row_q8_0,
    dequantize_row_q8_0,
    "q8_0"
);
typed_rows!(
    BlockQ8_1,
    DType::Q8_1,
    32,
    blocks32,
    blocks32_mut,
    quantize_block_q8_1,
    dequantize_block_q8_1,
    quantize_row_q8_1,
    dequantize_row_q8_1,
    "q8_1"
);
typed_rows!(
    BlockQ2K,
    DType::Q2K,
    QK_K,
    blocks256,
    blocks256_mut,
    quantize_block_q2_k,
    dequantize_block_q2_k,
    quantize_row_q2_k,
    dequantize_row_q2_k,
    "q2_K"
);
typed_rows!(
    BlockQ3K,
    DType::Q3K,
    QK_K,
    blocks256,
    blocks256_mut,
    quantize_block_q3_k,
    dequantize_block_q3_k,
    quantize_row_q3_k,
    dequantize_row_q3_k,
    "q3_K"
);
typed_rows!(
    BlockQ4K,
    DType::Q4K,
    QK_K,
    blocks256,
    blocks256_mut,
    quantize_block_q4_k,
    dequantize_block_q4_k,
    quantize_row_q4_k,
    dequantize_row_q4_k,
    "q4_K"
);
typed_rows!(
    BlockQ5K,
    DType::Q5K,
    QK_K,
    blocks256,
    blocks256_mut,
    quantize_block_q5_k,
    dequantize_block_q5_k,
    quantize_row_q5_k,
    dequantize_row_q5_k,
    "q5_K"
);
typed_rows!(
    BlockQ6K,
    DType::Q6K,
    QK_K,
    blocks256,
    blocks256_mut,
    quantize_block_q6_k,
    dequantize_block_q6_k,
    quantize_row_q6_k,
    dequantize_row_q6_k,
    "q6_K"
);
typed_rows!(
    BlockQ8K,
    DType::Q8K,
    QK_K,
    blocks256,
    blocks256_mut,
    quantize_block_q8_k,
    dequantize_block_q8_k,
    quantize_row_q8_k,
    dequantize_row_q8_k,
    "q8_K"
);

/// Checks a row of `n` values of `dtype` against a byte buffer of `bytes` bytes.
fn check_row(dtype: DType, n: usize, bytes: usize, what: &'static str) -> Result<(), QuantError> {
    let bs = dtype.block_size();
    if n % bs != 0 {
        return Err(not_multiple(dtype, n));
    }
    // n / bs * type_size <= n * 4 bytes, so this cannot overflow for any slice length,
    // but stay checked anyway.
    let expected = (n / bs)
        .checked_mul(dtype.type_size())
        .ok_or(not_multiple(dtype, n))?;
    check_len(dtype, what, expected, bytes)
}

fn quantize_bytes<B: QuantBlock>(src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    check_row(B::DTYPE, src.len(), dst.len(), "destination bytes")?;
    if let Ok(blocks) = bytemuck::try_cast_slice_mut::<u8, B>(dst) {
        return B::quantize_row(src, blocks);
    }
    // `dst` is not aligned for `B`: go through one aligned block at a time.
    for (x, out) in src
        .chunks_exact(B::BLOCK_SIZE)
        .zip(dst.chunks_exact_mut(size_of::<B>()))
    {
        let mut b = B::zeroed();
        B::quantize_row(x, core::slice::from_mut(&mut b))?;
        out.copy_from_slice(bytemuck::bytes_of(&b));
    }
    Ok(())
}

fn dequantize_bytes<B: QuantBlock>(src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    check_row(B::DTYPE, dst.len(), src.len(), "source bytes")?;
    if let Ok(blocks) = bytemuck::try_cast_slice::<u8, B>(src) {
        return B::dequantize_row(blocks, dst);
    }
    // `src` is not aligned for `B`: copy one block at a time.
    for (bytes, y) in src
        .chunks_exact(size_of::<B>())
        .zip(dst.chunks_exact_mut(B::BLOCK_SIZE))
    {
        let b: B =
            bytemuck::try_pod_read_unaligned(bytes).map_err(|_| not_multiple(B::DTYPE, y.len()))?;
        B::dequantize_row(core::slice::from_ref(&b), y)?;
    }
    Ok(())
}

/// Converts a row of f32 values to `dtype`, written as bytes into `dst` (the in-memory
/// layout ggml uses: host byte order, blocks as the `Block*` structs).
///
/// F32 is copied; F16 and BF16 are converted as ggml's `ggml_fp32_to_fp16_row` and
/// `ggml_fp32_to_bf16_row_ref` do; quantised types use ggml's `quantize_row_*_ref`.
/// `src.len()` must be a multiple of the block size and `dst.len()` must be the row size
/// in bytes ([`DType::row_size`]); I32 is [`QuantError::Unsupported`]. On error nothing
/// is written.
pub fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    match dtype {
        DType::F32 => {
            check_row(dtype, src.len(), dst.len(), "destination bytes")?;
            for (out, &x) in dst.chunks_exact_mut(4).zip(src) {
                out.copy_from_slice(&x.to_ne_bytes());
            }
            Ok(())
        }
        DType::F16 | DType::BF16 => {
            check_row(dtype, src.len(), dst.len(), "destination bytes")?;
            let conv = if dtype == DType::F16 {
                fp32_to_fp16_bits
            } else {
                fp32_to_bf16_bits
            };
            for (out, &x) in dst.chunks_exact_mut(2).zip(src) {
                out.copy_from_slice(&conv(x).to_ne_bytes());
            }
            Ok(())
        }
        DType::I32 => Err(QuantError::Unsupported { dtype }),
        DType::Q4_0 => quantize_bytes::<BlockQ4_0>(src, dst),
        DType::Q4_1 => quantize_bytes::<BlockQ4_1>(src, dst),
        DType::Q5_0 => quantize_bytes::<BlockQ5_0>(src, dst),
        DType::Q5_1 => quantize_bytes::<BlockQ5_1>(src, dst),
        DType::Q8_0 => quantize_bytes::<BlockQ8_0>(src, dst),
        DType::Q8_1 => quantize_bytes::<BlockQ8_1>(src, dst),
        DType::Q2K => quantize_bytes::<BlockQ2K>(src, dst),
        DType::Q3K => quantize_bytes::<BlockQ3K>(src, dst),
        DType::Q4K => quantize_bytes::<BlockQ4K>(src, dst),
        DType::Q5K => quantize_bytes::<BlockQ5K>(src, dst),
        DType::Q6K => quantize_bytes::<BlockQ6K>(src, dst),
        DType::Q8K => quantize_bytes::<BlockQ8K>(src, dst),
    }
}

/// Converts a row stored as `dtype` bytes in `src` to f32 values in `dst`.
///
/// F32 is copied; F16 and BF16 are converted as ggml's `ggml_fp16_to_fp32_row` and
/// `ggml_bf16_to_fp32_row` do; quantised types use ggml's `dequantize_row_*` (Q8_1,
/// which ggml cannot dequantize, as `d * q`). `dst.len()` must be a multiple of the
/// block size and `src.len()` the row size in bytes of `dst.len()` values; I32 is
/// [`QuantError::Unsupported`]. On error nothing is written.
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    match dtype {
        DType::F32 => {
            check_row(dtype, dst.len(), src.len(), "source bytes")?;
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *y = f32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
            }
            Ok(())
        }
        DType::F16 | DType::BF16 => {
            check_row(dtype, dst.len(), src.len(), "source bytes")?;
            let conv = if dtype == DType::F16 {
                fp16_bits_to_fp32
            } else {
                bf16_bits_to_fp32
            };
            for (y, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *y = conv(u16::from_ne_bytes([b[0], b[1]]));
            }
            Ok(())
        }
        DType::I32 => Err(QuantError::Unsupported { dtype }),
        DType::Q4_0 => dequantize_bytes::<BlockQ4_0>(src, dst),
        DType::Q4_1 => dequantize_bytes::<BlockQ4_1>(src, dst),
        DType::Q5_0 => dequantize_bytes::<BlockQ5_0>(src, dst),
        DType::Q5_1 => dequantize_bytes::<BlockQ5_1>(src, dst),
        DType::Q8_0 => dequantize_bytes::<BlockQ8_0>(src, dst),
        DType::Q8_1 => dequantize_bytes::<BlockQ8_1>(src, dst),
        DType::Q2K => dequantize_bytes::<BlockQ2K>(src, dst),
        DType::Q3K => dequantize_bytes::<BlockQ3K>(src, dst),
        DType::Q4K => dequantize_bytes::<BlockQ4K>(src, dst),
        DType::Q5K => dequantize_bytes::<BlockQ5K>(src, dst),
        DType::Q6K => dequantize_bytes::<BlockQ6K>(src, dst),
        DType::Q8K => dequantize_bytes::<BlockQ8K>(src, dst),
    }
}

#[cfg(test)]
mod tests;
