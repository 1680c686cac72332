//! Block structs, byte-for-byte the layout of ggml's `block_*` types (ggml-common.h).
//!
//! ggml declares some scale pairs as a union with a `ggml_half2` (a `uint32_t`), which
//! gives those C structs 4-byte alignment; here they are two [`f16`](half::f16) fields (2-byte
//! alignment). Sizes and field offsets are the same, and no block has padding.

use core::mem::size_of;

use bytemuck::{Pod, Zeroable};
use half::f16;

use crate::dtype::{DType, QK_K};

/// Values in a Q4_0 block (`QK4_0`).
pub const QK4_0: usize = 32;
/// Values in a Q4_1 block (`QK4_1`).
pub const QK4_1: usize = 32;
/// Values in a Q5_0 block (`QK5_0`).
pub const QK5_0: usize = 32;
/// Values in a Q5_1 block (`QK5_1`).
pub const QK5_1: usize = 32;
/// Values in a Q8_0 block (`QK8_0`).
pub const QK8_0: usize = 32;
/// Values in a Q8_1 block (`QK8_1`).
pub const QK8_1: usize = 32;
/// Bytes of packed 6-bit scales and mins in Q4_K and Q5_K blocks (`K_SCALE_SIZE`).
pub const K_SCALE_SIZE: usize = 12;

/// Q4_0: `x = d * (q - 8)`, 4-bit `q`; value `j` is the low nibble of `qs[j]`, value
/// `j + 16` the high nibble.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// Scale.
    pub d: f16,
    /// Nibbles.
    pub qs: [u8; QK4_0 / 2],
}

/// Q4_1: `x = d * q + m`, 4-bit `q`, nibbles as in [`BlockQ4_0`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// Scale.
    pub d: f16,
    /// Minimum (offset).
    pub m: f16,
    /// Nibbles.
    pub qs: [u8; QK4_1 / 2],
}

/// Q5_0: `x = d * (q - 16)`, 5-bit `q`: low 4 bits in nibbles as in [`BlockQ4_0`], the
/// fifth bit of value `j` in bit `j` of the little-endian `u32` `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: f16,
    /// Fifth bits (a `u32` in host byte order, as ggml `memcpy`s it).
    pub qh: [u8; 4],
    /// Low nibbles.
    pub qs: [u8; QK5_0 / 2],
}

/// Q5_1: `x = d * q + m`, 5-bit `q` packed as in [`BlockQ5_0`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5_1 {
    /// Scale.
    pub d: f16,
    /// Minimum (offset).
    pub m: f16,
    /// Fifth bits (a `u32` in host byte order).
    pub qh: [u8; 4],
    /// Low nibbles.
    pub qs: [u8; QK5_1 / 2],
}

/// Q8_0: `x = d * q`, 8-bit signed `q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// Scale.
    pub d: f16,
    /// Quants.
    pub qs: [i8; QK8_0],
}

/// Q8_1: `x = d * q`, 8-bit signed `q`, plus `s = d * sum(q)` for dot products.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8_1 {
    /// Scale.
    pub d: f16,
    /// `d * sum(qs)`.
    pub s: f16,
    /// Quants.
    pub qs: [i8; QK8_1],
}

/// Q2_K: 16 sub-blocks of 16 values, `x = d * sc * q - dmin * m` with 2-bit `q` and
/// 4-bit sub-block scale `sc` (low nibble of `scales`) and min `m` (high nibble).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ2K {
    /// Sub-block scales (low nibble) and mins (high nibble).
    pub scales: [u8; QK_K / 16],
    /// 2-bit quants.
    pub qs: [u8; QK_K / 4],
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
}

/// Q3_K: 16 sub-blocks of 16 values, `x = d * (sc - 32) * q`, 3-bit signed `q` (2 low
/// bits in `qs`, the high bit in `hmask`), 6-bit sub-block scales packed in `scales`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ3K {
    /// High bits of the quants.
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits of the quants.
    pub qs: [u8; QK_K / 4],
    /// 6-bit sub-block scales, packed.
    pub scales: [u8; 12],
    /// Super-block scale.
    pub d: f16,
}

/// Q4_K: 8 sub-blocks of 32 values, `x = d * sc * q - dmin * m`, 4-bit `q`, 6-bit
/// sub-block scales and mins packed in `scales`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ4K {
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
    /// 6-bit scales and mins, packed.
    pub scales: [u8; K_SCALE_SIZE],
    /// 4-bit quants.
    pub qs: [u8; QK_K / 2],
}

/// Q5_K: as [`BlockQ4K`] with 5-bit quants (the fifth bit in `qh`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ5K {
    /// Super-block scale of the scales.
    pub d: f16,
    /// Super-block scale of the mins.
    pub dmin: f16,
    /// 6-bit scales and mins, packed.
    pub scales: [u8; K_SCALE_SIZE],
    /// Fifth bits of the quants.
    pub qh: [u8; QK_K / 8],
    /// Low 4 bits of the quants.
    pub qs: [u8; QK_K / 2],
}

/// Q6_K: 16 sub-blocks of 16 values, `x = d * sc * (q - 32)`, 6-bit `q` (low 4 bits in
/// `ql`, high 2 in `qh`), 8-bit signed sub-block scales.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ6K {
    /// Low 4 bits of the quants.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits of the quants.
    pub qh: [u8; QK_K / 4],
    /// Sub-block scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale.
    pub d: f16,
}

/// Q8_K: `x = d * q` with an f32 scale, 8-bit signed `q`, and the sum of each group of 16
/// quants (for k-quant dot products).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8K {
    /// Scale.
    pub d: f32,
    /// Quants.
    pub qs: [i8; QK_K],
    /// `bsums[j] = sum(qs[16 * j..16 * j + 16])`.
    pub bsums: [i16; QK_K / 16],
}

const _: () =
    assert!(size_of::<BlockQ4_0>() == 18 && size_of::<BlockQ4_0>() == DType::Q4_0.type_size());
const _: () =
    assert!(size_of::<BlockQ4_1>() == 20 && size_of::<BlockQ4_1>() == DType::Q4_1.type_size());
const _: () =
    assert!(size_of::<BlockQ5_0>() == 22 && size_of::<BlockQ5_0>() == DType::Q5_0.type_size());
const _: () =
    assert!(size_of::<BlockQ5_1>() == 24 && size_of::<BlockQ5_1>() == DType::Q5_1.type_size());
const _: () =
    assert!(size_of::<BlockQ8_0>() == 34 && size_of::<BlockQ8_0>() == DType::Q8_0.type_size());
const _: () =
    assert!(size_of::<BlockQ8_1>() == 36 && size_of::<BlockQ8_1>() == DType::Q8_1.type_size());
const _: () =
    assert!(size_of::<BlockQ2K>() == 84 && size_of::<BlockQ2K>() == DType::Q2K.type_size());
const _: () =
    assert!(size_of::<BlockQ3K>() == 110 && size_of::<BlockQ3K>() == DType::Q3K.type_size());
const _: () =
    assert!(size_of::<BlockQ4K>() == 144 && size_of::<BlockQ4K>() == DType::Q4K.type_size());
const _: () =
    assert!(size_of::<BlockQ5K>() == 176 && size_of::<BlockQ5K>() == DType::Q5K.type_size());
const _: () =
    assert!(size_of::<BlockQ6K>() == 210 && size_of::<BlockQ6K>() == DType::Q6K.type_size());
const _: () =
    assert!(size_of::<BlockQ8K>() == 292 && size_of::<BlockQ8K>() == DType::Q8K.type_size());
const _: () = assert!(
    QK4_0 == DType::Q4_0.block_size()
        && QK4_1 == DType::Q4_1.block_size()
        && QK5_0 == DType::Q5_0.block_size()
        && QK5_1 == DType::Q5_1.block_size()
        && QK8_0 == DType::Q8_0.block_size()
        && QK8_1 == DType::Q8_1.block_size()
);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    /// Field offsets as in ggml-common.h.
    #[test]
    fn field_offsets_match_ggml() {
        assert_eq!(offset_of!(BlockQ4_1, qs), 4);
        assert_eq!(offset_of!(BlockQ5_0, qh), 2);
        assert_eq!(offset_of!(BlockQ5_0, qs), 6);
        assert_eq!(offset_of!(BlockQ5_1, qh), 4);
        assert_eq!(offset_of!(BlockQ5_1, qs), 8);
        assert_eq!(offset_of!(BlockQ8_1, qs), 4);
        assert_eq!(offset_of!(BlockQ2K, qs), 16);
        assert_eq!(offset_of!(BlockQ2K, d), 80);
        assert_eq!(offset_of!(BlockQ2K, dmin), 82);
        assert_eq!(offset_of!(BlockQ3K, qs), 32);
        assert_eq!(offset_of!(BlockQ3K, scales), 96);
        assert_eq!(offset_of!(BlockQ3K, d), 108);
        assert_eq!(offset_of!(BlockQ4K, scales), 4);
        assert_eq!(offset_of!(BlockQ4K, qs), 16);
        assert_eq!(offset_of!(BlockQ5K, qh), 16);
        assert_eq!(offset_of!(BlockQ5K, qs), 48);
        assert_eq!(offset_of!(BlockQ6K, qh), 128);
        assert_eq!(offset_of!(BlockQ6K, scales), 192);
        assert_eq!(offset_of!(BlockQ6K, d), 208);
        assert_eq!(offset_of!(BlockQ8K, qs), 4);
        assert_eq!(offset_of!(BlockQ8K, bsums), 260);
    }
}
