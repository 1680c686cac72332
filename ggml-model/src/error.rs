//! The model runtime's error type: one line that says what went wrong and where.

use thiserror::Error;

/// Everything that can go wrong loading and running a model.
#[derive(Debug, Error)]
pub enum ModelError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The GGUF file is malformed.
    #[error("{path}: not a valid GGUF file: {detail}")]
    Gguf {
        /// The file.
        path: String,
        /// The parser's message (field and byte offset).
        detail: String,
    },
    /// A metadata key is missing.
    #[error("missing metadata key '{0}'")]
    MissingKey(String),
    /// A metadata key has the wrong type.
    #[error("metadata key '{key}' has type {found}, expected {expected}")]
    KeyType {
        /// The key.
        key: String,
        /// Its type in the file.
        found: String,
        /// What was expected.
        expected: &'static str,
    },
    /// A weight tensor is missing.
    #[error("missing tensor '{0}'")]
    MissingTensor(String),
    /// The model is not something this crate can run.
    #[error("model: {0}")]
    Model(String),
    /// Building a graph failed.
    #[error("graph: {0}")]
    Graph(Box<ggml_core::Error>),
    /// A backend operation failed.
    #[error("{0}")]
    Backend(Box<ggml_core::BackendError>),
    /// The scheduler failed.
    #[error("{0}")]
    Sched(Box<ggml_sched::SchedError>),
    /// Bad run settings or arguments; the message names a setting by its command-line
    /// flag (`--threads`).
    #[error("{0}")]
    Usage(String),
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

// The foreign errors are boxed so that `Result<T>` stays small on the happy path.
impl From<ggml_core::Error> for ModelError {
    fn from(e: ggml_core::Error) -> Self {
        ModelError::Graph(Box::new(e))
    }
}

impl From<ggml_core::BackendError> for ModelError {
    fn from(e: ggml_core::BackendError) -> Self {
        ModelError::Backend(Box::new(e))
    }
}

impl From<ggml_sched::SchedError> for ModelError {
    fn from(e: ggml_sched::SchedError) -> Self {
        ModelError::Sched(Box::new(e))
    }
}

/// Result with [`ModelError`].
pub type Result<T> = std::result::Result<T, ModelError>;
