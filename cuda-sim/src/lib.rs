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
//! - [`profile`]: exact per-launch counters (instruction classes, coalescing, DRAM
//!   sectors through an L2 model, bank conflicts, barriers, critical path).
//! - [`cost`]: a modelled time on a named GPU from the counters, its bound, occupancy,
//!   fitting of its constants to measurements, and drift guards.
//!
//! The crate depends on nothing of ggml: any project can use it to test its own PTX.
//!
//! # Profiling a PTX module
//!
//! ```rust
//! use cuda_sim::cost::{predict, GpuSpec, LaunchKind};
//! use cuda_sim::driver::{Driver, ProfileConfig, SimConfig};
//!
//! // x[i] *= 2 for i < n
//! let ptx = r#"
//! .version 8.0
//! .target sm_80
//! .address_size 64
//! .visible .entry scale(.param .u64 p_x, .param .u32 p_n)
//! {
//!     .reg .pred %p<2>;
//!     .reg .b32 %r<6>;
//!     .reg .f32 %f<3>;
//!     .reg .b64 %rd<4>;
//!     ld.param.u64 %rd0, [p_x];
//!     ld.param.u32 %r0, [p_n];
//!     mov.u32 %r1, %ctaid.x;
//!     mov.u32 %r2, %ntid.x;
//!     mov.u32 %r3, %tid.x;
//!     mad.lo.u32 %r4, %r1, %r2, %r3;
//!     setp.ge.u32 %p0, %r4, %r0;
//!     @%p0 bra DONE;
//!     mul.wide.u32 %rd1, %r4, 4;
//!     add.u64 %rd2, %rd0, %rd1;
//!     ld.global.f32 %f0, [%rd2];
//!     mul.rn.f32 %f1, %f0, 0f40000000;
//!     st.global.f32 [%rd2], %f1;
//! DONE:
//!     ret;
//! }
//! "#;
//! let driver = Driver::new(SimConfig::default());
//! let module = driver.module_load(0, "scale.ptx", ptx)?;
//! let scale = driver.module_function(module, "scale")?;
//! let n: usize = 1 << 16;
//! let x = driver.mem_alloc(0, n * 4)?;
//! driver.memcpy_htod(x, &vec![0u8; n * 4])?;
//!
//! let gpu = GpuSpec::h100_sxm();
//! driver.enable_profiling(ProfileConfig::new(gpu.clone()));
//! let stream = driver.legacy_stream(0)?;
//! driver.set_launch_tag(stream, Some(7))?; // e.g. the caller's graph node
//! let args: [&[u8]; 2] = [&x.to_le_bytes(), &(n as u32).to_le_bytes()];
//! driver.launch(scale, [(n / 256) as u32, 1, 1], [256, 1, 1], 0, stream, &args)?;
//! driver.stream_synchronize(stream)?;
//!
//! for r in driver.take_launch_records() {
//!     print!("{} of {} (tag {:?})\n{}", r.kernel, r.module_file, r.tag, r.counters.summary());
//!     // Without a ptxas resource table, occupancy counts threads and shared memory only.
//!     let p = predict(&gpu, &r.counters, None, LaunchKind::Stream)?;
//!     println!("H100 SXM: {}", p.summary());
//!     // A coalesced pass over n floats: n / 8 sectors read, as many written.
//!     assert_eq!(r.counters.global_load.sectors, n as u64 / 8);
//!     assert_eq!(r.counters.dram.unwrap().read_sectors, n as u64 / 8);
//! }
//! driver.reset_l2(); // the next pass starts with a cold L2
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

pub mod cost;
pub mod driver;
pub mod error;
pub mod exec;
pub mod fault;
pub mod mem;
pub mod profile;
pub mod ptx;
pub mod tensor;

pub use error::{CuError, ErrorCode};

/// The README's examples, run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
pub use fault::{Checks, FaultKind, KernelFault};
