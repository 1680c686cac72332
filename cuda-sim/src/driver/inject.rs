//! Driver errors raised on request ([`Driver::inject_error`]): the failures a GPU
//! returns on its own (a kernel that touches a bad address, a launch the hardware
//! refuses, a copy over a failing link, an event operation that fails), made to happen
//! at a chosen point so that the layers above can be tested against each of them.
//!
//! An injection is armed for one device and raised by the first matching driver call
//! after it; the note given when arming goes into the error's text, so that a test can
//! tell its error from any other.

use super::{lock, Driver};
use crate::error::{CuError, ErrorCode};

/// A driver error cuda-sim raises on request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InjectedError {
    /// The next kernel launched on the device faults when it runs:
    /// `CUDA_ERROR_ILLEGAL_ADDRESS`, sticky. The launch call itself succeeds, as on a
    /// GPU; the error comes back from a later call.
    IllegalAddress,
    /// The next `cuLaunchKernel` on the device returns
    /// `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES` at the call. Nothing is enqueued and the
    /// context stays usable.
    Launch,
    /// The next copy between the device and another one (either direction, on a stream
    /// of either) fails when it runs: `CUDA_ERROR_NVLINK_UNCORRECTABLE`, sticky on the
    /// context of the stream that ran it.
    PeerCopy,
    /// The next `cuEventRecord` or `cuStreamWaitEvent` on a stream of the device returns
    /// `CUDA_ERROR_ILLEGAL_STATE` at the call; nothing is enqueued.
    Event,
}

impl InjectedError {
    /// Every kind.
    pub const ALL: [InjectedError; 4] = [
        InjectedError::IllegalAddress,
        InjectedError::Launch,
        InjectedError::PeerCopy,
        InjectedError::Event,
    ];

    /// The command-line name: `illegal-address`, `launch`, `peer-copy`, `event`.
    pub fn name(self) -> &'static str {
        match self {
            InjectedError::IllegalAddress => "illegal-address",
            InjectedError::Launch => "launch",
            InjectedError::PeerCopy => "peer-copy",
            InjectedError::Event => "event",
        }
    }

    /// The kind named `name`.
    pub fn from_name(name: &str) -> Option<InjectedError> {
        InjectedError::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The code the raised error carries.
    pub fn code(self) -> ErrorCode {
        match self {
            InjectedError::IllegalAddress => ErrorCode::IllegalAddress,
            InjectedError::Launch => ErrorCode::LaunchOutOfResources,
            InjectedError::PeerCopy => ErrorCode::NvlinkUncorrectable,
            InjectedError::Event => ErrorCode::IllegalState,
        }
    }
}

/// An armed injection.
pub(crate) struct Armed {
    dev: usize,
    kind: InjectedError,
    note: String,
}

impl Driver {
    /// Arms `kind` on device `dev`: the first matching call after this one raises it
    /// (see [`InjectedError`]), its text ending in `(injected: {note})`. Several
    /// injections on one device are raised in the order they were armed.
    pub fn inject_error(
        &self,
        dev: usize,
        kind: InjectedError,
        note: impl Into<String>,
    ) -> Result<(), CuError> {
        self.device(dev)?;
        lock(&self.shared.injected).push(Armed {
            dev,
            kind,
            note: note.into(),
        });
        Ok(())
    }

    /// Removes the injections of device `dev` not raised yet (their trigger never came)
    /// and returns their kinds.
    pub fn cancel_injected(&self, dev: usize) -> Vec<InjectedError> {
        let mut armed = lock(&self.shared.injected);
        let kinds = armed
            .iter()
            .filter(|a| a.dev == dev)
            .map(|a| a.kind)
            .collect();
        armed.retain(|a| a.dev != dev);
        kinds
    }

    /// Takes the first armed `kind` of a device for which `on` holds: the error to raise,
    /// `what` saying what failed.
    pub(crate) fn take_injected(
        &self,
        kind: InjectedError,
        on: impl Fn(usize) -> bool,
        what: &str,
    ) -> Option<CuError> {
        let mut armed = lock(&self.shared.injected);
        let i = armed.iter().position(|a| a.kind == kind && on(a.dev))?;
        let a = armed.remove(i);
        Some(CuError::new(
            kind.code(),
            format!("{what} (injected: {})", a.note),
        ))
    }
}
