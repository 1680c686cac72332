//! Allocation-free, `no_std` core of a Rust re-implementation of ggml.
#![no_std]
#![warn(missing_docs)]

pub mod dtype;
pub mod gguf;

pub use dtype::{DType, ALL_DTYPES, QK_K};
pub use gguf::{Gguf, GgufError};
