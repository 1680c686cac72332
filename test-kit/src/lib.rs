//! What the tests of the workspace share, in one place: seeded generators and the
//! tensors and quantised weights they make, tolerance helpers (NMSE, ulps), the dtype
//! lists tests iterate over, temporary files and folders that remove themselves, and a
//! short seeded fuzz run over a fuzz target's seeds.
//!
//! Only a dev-dependency (never published): it depends on ggml-core and external crates
//! alone, so any crate of the workspace, a library's own `#[cfg(test)]` modules included,
//! can use it without a dependency cycle.
//!
//! Every generator here is the one a test file carried before, value for value: tests
//! that pin digests of their results keep them.
#![warn(missing_docs)]

pub mod bytes;
pub mod dtypes;
pub mod mutate;
pub mod quant;
pub mod rng;
pub mod temp;
pub mod tolerance;

pub use dtypes::{QUANT_DTYPES, WEIGHT_DTYPES};
pub use mutate::fuzz_short;
pub use quant::{lcg_quant_rows, quantize_rows, xorshift_dot_blocks, xorshift_quant_blocks};
pub use rng::{Lcg, Xorshift};
pub use temp::{TempDir, TempFile};
pub use tolerance::{max_ulps, nmse, ulps};
