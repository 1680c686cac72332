//! Allocation-free, `no_std` core of a Rust re-implementation of ggml.
#![no_std]
#![warn(missing_docs)]

pub mod dtype;
pub mod quant;

pub use dtype::{DType, ALL_DTYPES, QK_K};
pub use quant::{dequantize_row, quantize_row, QuantBlock, QuantError};
