//! The dtype lists tests iterate over.
//!
//! rstest's `#[values(...)]` needs the values written out; test files spell them with
//! the variants imported (`use ggml_core::DType::*`), one line a list, these constants
//! are for loops.

use ggml_core::DType::{self, *};

/// Every dtype a weight matrix may have: what mul_mat and mul_mat_id take as `a`.
pub const WEIGHT_DTYPES: [DType; 13] = [
    F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K,
];

/// The quantised weight dtypes: [`WEIGHT_DTYPES`] without the float ones.
pub const QUANT_DTYPES: [DType; 10] = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quant_dtypes_are_the_quantised_weight_dtypes() {
        let q: Vec<DType> = WEIGHT_DTYPES
            .into_iter()
            .filter(|d| d.is_quantized())
            .collect();
        assert_eq!(q, QUANT_DTYPES);
    }
}
