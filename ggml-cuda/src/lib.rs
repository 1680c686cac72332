//! CUDA backend of ggml-rs: hand-written PTX kernels driven through the CUDA driver API.
//!
//! - [`CudaBackend`] implements [`ggml_core::Backend`]: device buffers, one non-blocking
//!   stream per instance, events, async host copies through pinned staging, and
//!   device-to-device / peer copies that run on the *source* stream
//!   ([`ggml_core::CopyQueue::Source`]). Several instances on one GPU are the virtual
//!   devices `cuda:0xN` ([`CudaBackend::new_virtual`]).
//! - The kernels are PTX written by hand (`kernels/*.ptx`, one file per op family, PTX ISA
//!   8.0 for `sm_80`), embedded in the binary and JIT-compiled by the driver once per
//!   device context ([`kernels`]). On sm_90 and newer the text is retargeted to sm_90 and
//!   the decode products and attention, which wait for the grid before them with
//!   `griddepcontrol.wait` before touching global memory, are launched with programmatic
//!   stream serialisation (programmatic dependent launch: their launch and prologue
//!   overlap the kernel before them; [`CudaTuning::pdl`]); below sm_90 those lines are
//!   commented out ([`cuda_sim::ptx::for_arch`]).
//! - libcuda is loaded at run time: the crate builds and its tests pass on machines
//!   without CUDA; creating a backend there returns an error that says why.
//!
//! # Determinism
//!
//! Every reduction in every kernel (over K in mul_mat, over a row in rms_norm and
//! soft_max, over KV positions in flash attention) gives element `i` to lane `i mod 32`
//! of one warp, each lane accumulating in increasing index order, and combines the 32
//! partials with a butterfly `shfl.xor` tree (offsets 16, 8, 4, 2, 1). The order depends
//! only on the reduction length and the kernel class (below [`MMQ_MIN_N`] tokens a call
//! runs decode kernels, with orders of their own, as invariant 2 allows), never on the
//! number of rows or tokens in a call within its class, the grid, or how outputs are
//! split across devices. Quantised products follow the same
//! rule with their own lanes: each chunk of 32 values of K has an exact integer dot, and
//! the chunks' f32 terms are chained in index order, in one chain per output in the
//! tiled class ([`MulMatClass::Mmq`]: [`MMQ_MIN_N`] tokens or more) and in 8 chains
//! (chunk `j` in chain `j mod 8`, the chains meeting in a butterfly over lane distances
//! 4, 2, 1) in the decode class (fewer tokens); every fused run keeps its class's order;
//! [`CudaBackend::kernel_stats`] reports which class ran. [`reference`](mod@reference)
//! reproduces each order on the host.
//!
//! # Example
//!
//! ```no_run
//! use ggml_core::Backend;
//! use ggml_cuda::CudaBackend;
//!
//! match CudaBackend::new(0, 0) {
//!     Ok(gpu) => {
//!         let buf = gpu.alloc_buffer(1 << 20).expect("device memory");
//!         println!("{} on {}: buffer at {:#x}", gpu.name(), gpu.device_name(), buf.base);
//!     }
//!     Err(e) => println!("no CUDA: {e}"),
//! }
//! ```
#![warn(missing_docs)]
// Backend errors carry names inline (ggml-core's no-alloc error type).
#![allow(clippy::result_large_err)]

mod backend;
mod calibrate;
mod driver;
mod err_words;
mod fusion;
mod graph_run;
mod graphs;
mod host_counters;
mod host_io;
pub mod kernels;
pub mod launch;
mod op_timing;
mod ops;
mod qmm;
mod qmm_variant;
mod readback;
pub mod reference;
mod replay;
mod tuning;
mod uploads;
mod waiter;

pub use backend::{CudaBackend, KernelStats, ALIGNMENT, STAGING_LIMIT};
pub use calibrate::{mma_numerics_results, Calibration, Probe, ProbeSize, CALIBRATE_PTX};
pub use driver::libcuda::{device_count, driver, driver_version};
pub use driver::{CuError, DriverKind, REQUIRED_SYMBOLS};
pub use host_counters::{DriverCalls, HostCounters};
pub use kernels::KernelId;
pub use launch::{mul_mat_class, MulMatClass, MMQ_MIN_N};
pub use replay::{LaunchTime, RecordedLaunch};
pub use tuning::{CudaTuning, TuningParseError};

/// The emulator behind `cuda-sim:N` devices, re-exported for users who configure it
/// (device count, memory, chaos, checks) or inspect it (memory in use, fault reports).
#[cfg(feature = "sim")]
pub use cuda_sim;

/// The process-wide emulated driver that [`DriverKind::Sim`] backends run on.
#[cfg(feature = "sim")]
pub fn sim_driver() -> Result<std::sync::Arc<cuda_sim::driver::Driver>, CuError> {
    driver::sim::driver()
}
