//! The CPU backend of a Rust re-implementation of ggml.
//!
//! [`CpuBackend`] implements [`ggml_core::Backend`]: 64-byte aligned host buffers in its
//! own memory domain (plus [`ggml_core::MemoryDomain::HOST`] for wrapped memory such as
//! memory-mapped weights), an in-order queue run by a worker thread (its "stream":
//! `graph_compute` returns before the work is done), events other CPU backends can wait
//! on in their queues, and a persistent thread pool for parallelism inside ops.
//!
//! # Determinism
//!
//! Every kernel follows the reduction order defined by the scalar [`reference`](mod@reference) module:
//! fixed lanes per element index combined by a fixed tree (16 lanes for f32 reductions,
//! 8 block lanes for quantised dots), no fused multiply-add, one shared exp polynomial
//! and one scalar sin/cos routine. The AVX-512, AVX2, NEON (with dotprod and i8mm) and
//! scalar levels ([`Isa`]) therefore produce bit-identical results, independent of the
//! thread count, of the number of rows or tokens in a call, and of the tiling of the
//! output. See [`reference`](mod@reference) for the exact definitions.
//!
//! # Example
//!
//! ```
//! use ggml_core::{Backend, Context, DType, DataRef, Tensor};
//! use ggml_cpu::{CpuBackend, CpuBackendOptions};
//!
//! let cpu = CpuBackend::new(CpuBackendOptions::with_threads(2)).unwrap();
//! let mut slots = [Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 8];
//! let mut ctx = Context::new(&mut slots);
//! let w = ctx.new_tensor(DType::F32, [4, 3, 1, 1]).unwrap(); // 3 rows of 4
//! let x = ctx.new_tensor(DType::F32, [4, 1, 1, 1]).unwrap();
//! let y = ctx.mul_mat(w, x).unwrap(); // [3, 1]
//! let buf = cpu.alloc_buffer(256).unwrap();
//! for (id, off) in [(w, 0u64), (x, 64), (y, 128)] {
//!     ctx.get_mut(id).unwrap().data = Some(DataRef { buffer: buf.id, addr: buf.base + off });
//! }
//! let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
//! cpu.set_tensor_async(ctx.get(w).unwrap(), 0, &bytes(&[1.0; 12])).unwrap();
//! cpu.set_tensor_async(ctx.get(x).unwrap(), 0, &bytes(&[1.0, 2.0, 3.0, 4.0])).unwrap();
//! cpu.graph_compute(ctx.tensors(), &[y]).unwrap();
//! cpu.synchronize().unwrap();
//! let mut out = [0u8; 12];
//! cpu.get_tensor(ctx.get(y).unwrap(), 0, &mut out).unwrap();
//! assert_eq!(f32::from_le_bytes(out[0..4].try_into().unwrap()), 10.0);
//! ```
#![warn(missing_docs)]
// Errors of ggml-core carry names inline (no allocator there).
#![allow(clippy::result_large_err)]

mod affinity;
mod backend;
mod exec;
mod isa;
mod memory;
mod op_timing;
mod ops;
mod pool;
mod quant;
mod queue;
pub mod reference;
mod runs;
mod simd;

pub use backend::{CpuBackend, CpuBackendOptions};
pub use isa::{Isa, ALL_ISAS};
pub use memory::ALIGNMENT;

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
