#![doc = include_str!("../README.md")]
#![no_std]
#![warn(missing_docs)]
// Errors carry names inline because there is no allocator to box them into.
#![allow(clippy::result_large_err)]

#[cfg(test)]
extern crate std;

pub mod alloc;
pub mod backend;
pub mod context;
pub mod dtype;
pub mod error;
pub mod gguf;
pub mod graph;
pub mod name;
pub mod op;
pub mod op_time;
pub mod quant;
pub mod tensor;

pub use backend::{
    Backend, BackendCaps, BackendError, BackendErrorKind, BackendKind, BackendResult, BufferInfo,
    CopyQueue, EventId, EventRef, TableId,
};
pub use context::Context;
pub use dtype::{DType, ALL_DTYPES, QK_K};
pub use error::{Error, Result};
pub use gguf::{Gguf, GgufError};
pub use graph::Graph;
pub use name::{Name, MAX_NAME};
pub use op::{AttnParams, Op, RopeMode, RopeParams};
pub use op_time::{OpKey, OpTime};
pub use quant::{dequantize_row, quantize_row, QuantBlock, QuantError};
pub use tensor::{
    BufferId, DataRef, MemoryDomain, Tensor, TensorFlags, TensorId, MAX_DIMS, MAX_SRC,
};
