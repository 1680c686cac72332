//! The scheduler's error type.

use ggml_core::BackendError;
use thiserror::Error;

/// What went wrong while planning, allocating or running a graph.
#[derive(Debug, Error)]
pub enum SchedError {
    /// A graph or tensor descriptor is malformed (from ggml-core).
    #[error("graph: {0}")]
    Graph(#[from] ggml_core::Error),
    /// A backend operation failed; the scheduler drained every queue and can run again.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// No backend can run an op (DESIGN.md invariant 4: never a silent fallback).
    #[error("no backend supports op {op} of tensor '{tensor}'{detail}")]
    Unsupported {
        /// ggml name of the op.
        op: &'static str,
        /// Name of the tensor computed by the op.
        tensor: String,
        /// Which backend was pinned or required, if any.
        detail: String,
    },
    /// A tensor lives in memory no backend can use.
    #[error("no backend can use the memory (domain {domain}) of tensor '{tensor}'")]
    NoBackendForMemory {
        /// Name of the tensor.
        tensor: String,
        /// Its memory domain.
        domain: u32,
    },
    /// Options or arguments are out of range.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A device's queue did not get past a point within [`crate::SchedOptions::timeout`]
    /// (a hung device): which device, and what the host was waiting for.
    #[error("timed out after {seconds} s: {backend} did not finish {wait}; its last work: {last}; devices not done: {unfinished}")]
    Timeout {
        /// The device waited for.
        backend: String,
        /// The wait (event or queue, and the rule it discharges).
        wait: String,
        /// The timeout.
        seconds: f64,
        /// The last split enqueued on the device (its first and last ops), or `none`.
        last: String,
        /// Every backend whose queue had not finished when the wait gave up (the hung
        /// device among them when another one waits behind it), with its last split.
        unfinished: String,
    },
    /// `compute`, `set_input` or `get_tensor` was called before `alloc`.
    #[error("no graph is allocated; call Scheduler::alloc first")]
    NoGraph,
    /// The tensor is not one the call accepts.
    #[error("tensor {id} ('{name}'): {what}")]
    Tensor {
        /// Tensor id.
        id: u32,
        /// Tensor name.
        name: String,
        /// What is wrong.
        what: String,
    },
}

/// Result with [`SchedError`].
pub type Result<T> = std::result::Result<T, SchedError>;
