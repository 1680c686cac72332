//! Allocation-free, `no_std` core of a Rust re-implementation of ggml.
//!
//! - [`dtype`]: element types, including ggml's block-quantised formats;
//! - [`Tensor`] descriptors in a [`Context`] over caller-provided memory, ops with shape
//!   rules ([`op`]), and [`Graph`]s of fixed capacity;
//! - [`backend`]: the object-safe contract every backend implements.
//!
//! Nothing here allocates or panics on bad input: every failure is an error value that
//! says what and where.
#![no_std]
#![warn(missing_docs)]
// Errors carry names inline because there is no allocator to box them into.
#![allow(clippy::result_large_err)]

#[cfg(test)]
extern crate std;

pub mod backend;
pub mod context;
pub mod dtype;
pub mod error;
pub mod graph;
pub mod name;
pub mod op;
pub mod quant;
pub mod tensor;

pub use backend::{
    Backend, BackendCaps, BackendError, BackendErrorKind, BackendKind, BackendResult, BufferInfo,
    CopyQueue, EventId, EventRef,
};
pub use context::Context;
pub use dtype::{DType, ALL_DTYPES, QK_K};
pub use error::{Error, Result};
pub use graph::Graph;
pub use name::{Name, MAX_NAME};
pub use op::{AttnParams, Op, RopeMode, RopeParams};
pub use quant::{dequantize_row, quantize_row, QuantBlock, QuantError};
pub use tensor::{
    BufferId, DataRef, MemoryDomain, Tensor, TensorFlags, TensorId, MAX_DIMS, MAX_SRC,
};
