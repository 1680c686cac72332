//! The harness's error type: one line that says what went wrong and where.

use thiserror::Error;

pub use ggml_model::error::ModelError;

/// Everything that can go wrong in the harness: its own errors, and the model runtime's
/// ([`ModelError`]) shown as they are.
#[derive(Debug, Error)]
pub enum HarnessError {
    /// Loading or running a model failed.
    #[error(transparent)]
    Runtime(#[from] ModelError),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The model is not something this harness can run (or make).
    #[error("model: {0}")]
    Model(String),
    /// Bad command-line or run settings.
    #[error("{0}")]
    Usage(String),
    /// A matrix file is not valid.
    #[error("{path}:{line}: {reason}")]
    Matrix {
        /// The file.
        path: String,
        /// The line of the mistake (1-based).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A matrix run broke some of its rules (each is listed in the report).
    #[error("{0} matrix rule violations")]
    Violations(usize),
}

// Through the runtime's error, so that a failing graph, backend or scheduler reads the
// same wherever it failed.
impl From<ggml_core::Error> for HarnessError {
    fn from(e: ggml_core::Error) -> Self {
        HarnessError::Runtime(e.into())
    }
}

impl From<ggml_core::BackendError> for HarnessError {
    fn from(e: ggml_core::BackendError) -> Self {
        HarnessError::Runtime(e.into())
    }
}

impl From<ggml_sched::SchedError> for HarnessError {
    fn from(e: ggml_sched::SchedError) -> Self {
        HarnessError::Runtime(e.into())
    }
}

/// Result with [`HarnessError`].
pub type Result<T> = std::result::Result<T, HarnessError>;
