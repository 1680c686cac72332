//! CUDA driver error codes (`CUresult` values) and the error type of the emulated driver.

use std::fmt;

/// The `CUresult` codes the emulated driver returns, with the numeric values of the
/// real driver (so code that matches on them works with both).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ErrorCode {
    /// `CUDA_ERROR_INVALID_VALUE`: a bad argument.
    InvalidValue = 1,
    /// `CUDA_ERROR_OUT_OF_MEMORY`: the device's configured memory is exhausted.
    OutOfMemory = 2,
    /// `CUDA_ERROR_NOT_INITIALIZED`.
    NotInitialized = 3,
    /// `CUDA_ERROR_NO_DEVICE`: no emulated device is configured.
    NoDevice = 100,
    /// `CUDA_ERROR_INVALID_DEVICE`: an ordinal past the last device.
    InvalidDevice = 101,
    /// `CUDA_ERROR_INVALID_CONTEXT`.
    InvalidContext = 201,
    /// `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`.
    PeerAccessUnsupported = 217,
    /// `CUDA_ERROR_NVLINK_UNCORRECTABLE`: a copy between devices hit an uncorrectable
    /// link error. Sticky in cuda-sim (the context that ran the copy is unusable).
    NvlinkUncorrectable = 220,
    /// `CUDA_ERROR_INVALID_PTX`: the PTX did not parse (the log names file and line).
    InvalidPtx = 218,
    /// `CUDA_ERROR_INVALID_HANDLE`: a stream, event, module or function that does not
    /// exist (or was destroyed).
    InvalidHandle = 400,
    /// `CUDA_ERROR_ILLEGAL_STATE`: a resource the call needs is not in a state that
    /// allows it.
    IllegalState = 401,
    /// `CUDA_ERROR_NOT_FOUND`: e.g. a kernel name missing from its module.
    NotFound = 500,
    /// `CUDA_ERROR_NOT_READY`: an event or stream query found work still pending.
    NotReady = 600,
    /// `CUDA_ERROR_ILLEGAL_ADDRESS`: a kernel or copy touched memory outside a live
    /// allocation. Sticky: the context is unusable afterwards.
    IllegalAddress = 700,
    /// `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`: too many threads or too much shared memory.
    LaunchOutOfResources = 701,
    /// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`.
    PeerAccessAlreadyEnabled = 704,
    /// `CUDA_ERROR_PEER_ACCESS_NOT_ENABLED`.
    PeerAccessNotEnabled = 705,
    /// `CUDA_ERROR_ILLEGAL_INSTRUCTION`. Sticky.
    IllegalInstruction = 715,
    /// `CUDA_ERROR_MISALIGNED_ADDRESS`: a load or store not aligned to its size. Sticky.
    MisalignedAddress = 716,
    /// `CUDA_ERROR_LAUNCH_FAILED`: a kernel failed one of cuda-sim's checks (race,
    /// uninitialised read, sync mask) that real hardware may let pass silently. Sticky.
    LaunchFailed = 719,
    /// `CUDA_ERROR_NOT_SUPPORTED`.
    NotSupported = 801,
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`: the call is not permitted while a stream
    /// is capturing (synchronising it, an allocation under a capture that prohibits it,
    /// a copy from or to pageable memory into a capture). Invalidates the capture.
    StreamCaptureUnsupported = 900,
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`: the capture was invalidated by an earlier
    /// error; ending it returns this and no graph.
    StreamCaptureInvalidated = 901,
    /// `CUDA_ERROR_STREAM_CAPTURE_MERGE`: the call would merge two independent captures.
    StreamCaptureMerge = 902,
    /// `CUDA_ERROR_STREAM_CAPTURE_UNMATCHED`: the capture was not begun on this stream.
    StreamCaptureUnmatched = 903,
    /// `CUDA_ERROR_STREAM_CAPTURE_UNJOINED`: a fork of the capture was not joined back.
    StreamCaptureUnjoined = 904,
    /// `CUDA_ERROR_STREAM_CAPTURE_ISOLATION`: a dependency would cross the capture's
    /// boundary (a capturing stream waiting on an event recorded outside it).
    StreamCaptureIsolation = 905,
    /// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`: the legacy NULL stream would depend
    /// implicitly on a capturing blocking stream.
    StreamCaptureImplicit = 906,
    /// `CUDA_ERROR_CAPTURED_EVENT`: the event was last recorded in a capture (it stands
    /// for a graph node, not for work on a stream).
    CapturedEvent = 907,
    /// `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`: a capture not begun in relaxed mode
    /// ended from another thread than the one that began it.
    StreamCaptureWrongThread = 908,
    /// `CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE`: the graph differs from the executable
    /// graph in more than an update may change.
    GraphExecUpdateFailure = 910,
}

impl ErrorCode {
    /// The driver's name of the code, e.g. `"CUDA_ERROR_ILLEGAL_ADDRESS"`.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::InvalidValue => "CUDA_ERROR_INVALID_VALUE",
            ErrorCode::OutOfMemory => "CUDA_ERROR_OUT_OF_MEMORY",
            ErrorCode::NotInitialized => "CUDA_ERROR_NOT_INITIALIZED",
            ErrorCode::NoDevice => "CUDA_ERROR_NO_DEVICE",
            ErrorCode::InvalidDevice => "CUDA_ERROR_INVALID_DEVICE",
            ErrorCode::InvalidContext => "CUDA_ERROR_INVALID_CONTEXT",
            ErrorCode::PeerAccessUnsupported => "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
            ErrorCode::NvlinkUncorrectable => "CUDA_ERROR_NVLINK_UNCORRECTABLE",
            ErrorCode::InvalidPtx => "CUDA_ERROR_INVALID_PTX",
            ErrorCode::InvalidHandle => "CUDA_ERROR_INVALID_HANDLE",
            ErrorCode::IllegalState => "CUDA_ERROR_ILLEGAL_STATE",
            ErrorCode::NotFound => "CUDA_ERROR_NOT_FOUND",
            ErrorCode::NotReady => "CUDA_ERROR_NOT_READY",
            ErrorCode::IllegalAddress => "CUDA_ERROR_ILLEGAL_ADDRESS",
            ErrorCode::LaunchOutOfResources => "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
            ErrorCode::PeerAccessAlreadyEnabled => "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
            ErrorCode::PeerAccessNotEnabled => "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
            ErrorCode::IllegalInstruction => "CUDA_ERROR_ILLEGAL_INSTRUCTION",
            ErrorCode::MisalignedAddress => "CUDA_ERROR_MISALIGNED_ADDRESS",
            ErrorCode::LaunchFailed => "CUDA_ERROR_LAUNCH_FAILED",
            ErrorCode::NotSupported => "CUDA_ERROR_NOT_SUPPORTED",
            ErrorCode::StreamCaptureUnsupported => "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
            ErrorCode::StreamCaptureInvalidated => "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
            ErrorCode::StreamCaptureMerge => "CUDA_ERROR_STREAM_CAPTURE_MERGE",
            ErrorCode::StreamCaptureUnmatched => "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
            ErrorCode::StreamCaptureUnjoined => "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
            ErrorCode::StreamCaptureIsolation => "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
            ErrorCode::StreamCaptureImplicit => "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
            ErrorCode::CapturedEvent => "CUDA_ERROR_CAPTURED_EVENT",
            ErrorCode::StreamCaptureWrongThread => "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
            ErrorCode::GraphExecUpdateFailure => "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
        }
    }

    /// Whether the error poisons the context, as on a GPU: every later call on it
    /// returns the same error.
    pub fn is_sticky(self) -> bool {
        matches!(
            self,
            ErrorCode::IllegalAddress
                | ErrorCode::IllegalInstruction
                | ErrorCode::MisalignedAddress
                | ErrorCode::LaunchFailed
                | ErrorCode::NvlinkUncorrectable
        )
    }
}

/// A failed call of the emulated driver: the code a GPU would return, and what
/// happened in words (for a kernel fault: kernel, PTX line, block, thread, address).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CuError {
    /// The `CUresult` code.
    pub code: ErrorCode,
    /// What failed and why.
    pub detail: String,
}

impl CuError {
    /// An error with `code` and `detail`.
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> CuError {
        CuError {
            code,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for CuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.code.name(),
            self.code as u32,
            self.detail
        )
    }
}

impl std::error::Error for CuError {}
