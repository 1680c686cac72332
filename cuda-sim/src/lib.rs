//! cuda-sim: a PTX emulator and an emulated CUDA driver, so that code written for the
//! CUDA driver API (and the PTX it loads) runs and is checked on any machine.
//!
//! - [`ptx`]: parses PTX text as the driver's JIT receives it into a decoded module.
//! - [`exec`]: runs a kernel of a module over a grid of blocks of warps of 32 lanes,
//!   bit-exact for every exact instruction, with the checks of [`fault::Checks`].
//! - [`driver`]: the emulated driver: devices with their own memory, pinned host
//!   memory, streams (each executed in order by its own worker, with the legacy NULL
//!   stream's rules), events, peer copies, seeded chaos delays, real CUDA error codes.
//! - [`mem`]: the global-memory interface between the two.
//!
//! The crate depends on nothing of ggml: any project can use it to test its own PTX.
#![warn(missing_docs)]

pub mod cost;
pub mod driver;
pub mod error;
pub mod exec;
pub mod fault;
pub mod mem;
pub mod profile;
pub mod ptx;

pub use error::{CuError, ErrorCode};
pub use fault::{Checks, FaultKind, KernelFault};
