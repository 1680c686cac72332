//! Element types: plain scalars and ggml's block-quantised formats.

use core::fmt;

/// An element type, numbered as in ggml (`enum ggml_type`) so GGUF files map directly.
///
/// Quantised types store values in blocks of [`DType::block_size`] elements that take
/// [`DType::type_size`] bytes; a row's first dimension must be a multiple of the block size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum DType {
    /// IEEE 754 binary32.
    F32 = 0,
    /// IEEE 754 binary16.
    F16 = 1,
    /// 32 values: f16 scale `d`, 4-bit quants `q`; `x = d * (q - 8)`.
    Q4_0 = 2,
    /// 32 values: f16 scale `d` and min `m`, 4-bit quants; `x = d * q + m`.
    Q4_1 = 3,
    /// 32 values: f16 scale, 5-bit quants (high bits packed apart); `x = d * (q - 16)`.
    Q5_0 = 6,
    /// 32 values: f16 scale and min, 5-bit quants; `x = d * q + m`.
    Q5_1 = 7,
    /// 32 values: f16 scale, 8-bit signed quants; `x = d * q`.
    Q8_0 = 8,
    /// 32 values: f16 scale `d`, f16 `s = d * sum(q)`, 8-bit signed quants (a dot type).
    Q8_1 = 9,
    /// 256-value super-blocks of 16 sub-blocks with 4-bit scales and mins, 2-bit quants.
    Q2K = 10,
    /// 256-value super-blocks of 16 sub-blocks with 6-bit scales, 3-bit quants.
    Q3K = 11,
    /// 256-value super-blocks of 8 sub-blocks with 6-bit scales and mins, 4-bit quants.
    Q4K = 12,
    /// 256-value super-blocks of 8 sub-blocks with 6-bit scales and mins, 5-bit quants.
    Q5K = 13,
    /// 256-value super-blocks of 16 sub-blocks with 8-bit scales, 6-bit quants.
    Q6K = 14,
    /// 256-value blocks: f32 scale, 8-bit quants, and sums of each 16 quants (a dot type).
    Q8K = 15,
    /// 32-bit signed integer (indices, positions).
    I32 = 26,
    /// bfloat16.
    BF16 = 30,
}

/// Every dtype this crate supports, in ggml id order.
pub const ALL_DTYPES: [DType; 16] = [
    DType::F32,
    DType::F16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q8_1,
    DType::Q2K,
    DType::Q3K,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::Q8K,
    DType::I32,
    DType::BF16,
];

/// Number of values in a k-quant super-block (`QK_K` in ggml).
pub const QK_K: usize = 256;

impl DType {
    /// The dtype with ggml's numeric id `id`, or `None` if this crate does not support it.
    pub const fn from_ggml_id(id: u32) -> Option<DType> {
        Some(match id {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::Q4_0,
            3 => DType::Q4_1,
            6 => DType::Q5_0,
            7 => DType::Q5_1,
            8 => DType::Q8_0,
            9 => DType::Q8_1,
            10 => DType::Q2K,
            11 => DType::Q3K,
            12 => DType::Q4K,
            13 => DType::Q5K,
            14 => DType::Q6K,
            15 => DType::Q8K,
            26 => DType::I32,
            30 => DType::BF16,
            _ => return None,
        })
    }

    /// ggml's numeric id of this dtype.
    pub const fn ggml_id(self) -> u32 {
        self as u32
    }

    /// Number of values in one block (1 for scalar types).
    pub const fn block_size(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 | DType::I32 => 1,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 | DType::Q8_1 => 32,
            DType::Q2K | DType::Q3K | DType::Q4K | DType::Q5K | DType::Q6K | DType::Q8K => QK_K,
        }
    }

    /// Bytes of one block (of one element for scalar types).
    pub const fn type_size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q8_0 => 34,
            DType::Q8_1 => 36,
            DType::Q2K => 84,
            DType::Q3K => 110,
            DType::Q4K => 144,
            DType::Q5K => 176,
            DType::Q6K => 210,
            DType::Q8K => 292,
        }
    }

    /// Whether values are stored in quantised blocks.
    pub const fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Whether this is a quantised type weights are stored in: every quantised type but
    /// Q8_1 and Q8_K, which hold activations quantised for dot products.
    pub const fn is_weight_quant(self) -> bool {
        self.is_quantized() && !matches!(self, DType::Q8_1 | DType::Q8K)
    }

    /// Whether this is a floating-point scalar type (F32, F16, BF16).
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// The type ggml quantises activations to for a dot product with weights of this type
    /// (`vec_dot_type`): Q8_0, Q8_1 or Q8_K for quantised weights, F16 for F16 weights,
    /// F32 otherwise.
    pub const fn vec_dot_type(self) -> DType {
        match self {
            DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => DType::Q8_0,
            DType::Q4_1 | DType::Q5_1 => DType::Q8_1,
            DType::Q2K | DType::Q3K | DType::Q4K | DType::Q5K | DType::Q6K => DType::Q8K,
            DType::F16 => DType::F16,
            DType::BF16 => DType::BF16,
            DType::F32 | DType::Q8_1 | DType::Q8K | DType::I32 => DType::F32,
        }
    }

    /// Bytes of a row of `n` values, or `None` if `n` is not a multiple of the block size
    /// or the size overflows `usize`.
    pub const fn row_size(self, n: usize) -> Option<usize> {
        let bs = self.block_size();
        if n % bs != 0 {
            return None;
        }
        (n / bs).checked_mul(self.type_size())
    }

    /// ggml's name of the dtype (`"q4_1"`, `"f32"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q8_0 => "q8_0",
            DType::Q8_1 => "q8_1",
            DType::Q2K => "q2_K",
            DType::Q3K => "q3_K",
            DType::Q4K => "q4_K",
            DType::Q5K => "q5_K",
            DType::Q6K => "q6_K",
            DType::Q8K => "q8_K",
            DType::I32 => "i32",
            DType::BF16 => "bf16",
        }
    }

    /// The dtype named `name` (as printed by [`DType::name`], case-insensitive).
    pub fn from_name(name: &str) -> Option<DType> {
        ALL_DTYPES
            .iter()
            .copied()
            .find(|d| d.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for d in ALL_DTYPES {
            assert_eq!(DType::from_ggml_id(d.ggml_id()), Some(d));
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        assert_eq!(DType::from_ggml_id(4), None);
        assert_eq!(DType::from_ggml_id(16), None);
    }

    #[test]
    fn row_sizes() {
        assert_eq!(DType::Q4_1.row_size(576), Some(18 * 20));
        assert_eq!(DType::Q4_1.row_size(33), None);
        assert_eq!(DType::Q6K.row_size(512), Some(420));
        assert_eq!(DType::F32.row_size(usize::MAX), None);
    }

    #[test]
    fn weight_quants_are_the_quantised_types_but_the_activation_ones() {
        use DType::*;
        let weights = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K];
        for d in ALL_DTYPES {
            assert_eq!(d.is_weight_quant(), weights.contains(&d), "{}", d.name());
        }
    }
}
