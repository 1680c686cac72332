//! Tensor-core matrix instructions (`mma.sync`) as cuda-sim executes them: which lane
//! holds which matrix element ([`fragment`]), the arithmetic of one output element
//! ([`model`]), and fitting the f16 model's parameters to what a GPU computed
//! ([`fit`]).
//!
//! Integer `mma` is exact (the ISA fixes it). For f16/bf16 inputs with f32 accumulation
//! the ISA fixes nothing about the order or rounding of the additions, so cuda-sim runs a
//! parameterised model of measured tensor cores ([`MmaModel`]) or, under the approx check,
//! pushes every result to the edge of a declared error bound ([`error_bound`]).

pub mod fit;
pub mod fragment;
pub mod model;

pub use fit::{fit_f16_model, numerics_cases, FitResult, NumericsCase};
pub use fragment::{fragment_coord, Matrix};
pub use model::{error_bound, AlignRef, BlockRounding, HalfInput, MmaModel};
