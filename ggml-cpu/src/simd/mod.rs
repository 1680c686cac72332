//! Kernel tables per instruction-set level.
//!
//! Each level provides the same functions; every one is bit-identical to the scalar
//! reference ([`crate::reference`]) because it performs the same f32 operations in the
//! same order per output element (vectorised across independent lanes or elements only).
//! Integer parts of quantised dots are exact, so they may be vectorised freely.

#[macro_use]
mod tables;
#[cfg(target_arch = "x86_64")]
#[macro_use]
mod x86_elementwise;
#[cfg(target_arch = "x86_64")]
#[macro_use]
mod x86_kquant;
#[cfg(target_arch = "x86_64")]
#[macro_use]
mod x86_kpanel;
#[cfg(target_arch = "x86_64")]
#[macro_use]
mod x86_quant;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "aarch64")]
mod neon;
pub(crate) mod panel;
mod scalar;

use ggml_core::DType;

use crate::isa::Isa;

/// A matrix-multiplication tile: `out[r*4 + c] = dot(a[r], b[c])` for `a.len() <= 4`
/// weight rows of dtype `w` and `b.len() <= 4` activation rows of `w.vec_dot_type()`, each
/// of `k` values.
pub(crate) type MmTile = fn(w: DType, k: usize, a: &[&[u8]], b: &[&[u8]], out: &mut [f32; 16]);

/// [`Kernels::dots_f16_heads`]: `(qs, k, stride, outs)`.
pub(crate) type DotsHeads = fn(qs: &[&[u16]], k: &[u16], stride: usize, outs: &mut [&mut [f32]]);

/// [`Kernels::axpy_f16_rows`]: `(accs, ws, v, stride)`.
pub(crate) type AxpyRows = fn(accs: &mut [&mut [f32]], ws: &[&[f32]], v: &[u16], stride: usize);

/// The kernels of one instruction-set level.
pub(crate) struct Kernels {
    /// The level.
    #[allow(dead_code)]
    pub isa: Isa,
    /// [`crate::reference::dot_f32`].
    pub dot_f32: fn(&[f32], &[f32]) -> f32,
    /// [`crate::reference::sum_sq`].
    pub sum_sq: fn(&[f32]) -> f32,
    /// [`crate::reference::max`].
    pub max: fn(&[f32]) -> f32,
    /// [`crate::reference::exp_shift_sum`].
    pub exp_shift_sum: fn(&mut [f32], f32) -> f32,
    /// `out_i = silu(x_i)`.
    pub silu: fn(&[f32], &mut [f32]),
    /// `out_i = silu(a_i) * b_i`.
    pub swiglu: fn(&[f32], &[f32], &mut [f32]),
    /// f32 to f16 bits, round to nearest even.
    pub f32_to_f16: fn(&[f32], &mut [u16]),
    /// `acc_i = acc_i + w * v_i`.
    pub axpy_f32: fn(&mut [f32], f32, &[f32]),
    /// `out[j] = dot_f16(q, k[j*stride..][..q.len()])` for every `j < out.len()`: one
    /// query against a run of equally spaced key rows (attention scores).
    pub dots_f16: fn(q: &[u16], k: &[u16], stride: usize, out: &mut [f32]),
    /// `outs[h] = dots_f16(qs[h], k, stride)` for every query `h` against the same key
    /// rows, where the level has a kernel that reads each row once for several queries.
    pub dots_f16_heads: Option<DotsHeads>,
    /// For every head `h`: `axpy_f16(accs[h], ws[h][j], v[j*stride..][..d])` for `j = 0,
    /// 1, ...` in order: weighted sums of the same equally spaced value rows (attention
    /// output of the query heads that share a KV head). Every `accs[h]` has the same
    /// length `d`, every `ws[h]` the same length.
    pub axpy_f16_rows: AxpyRows,
    /// Quantises activations to Q8_0, Q8_1 or Q8_K exactly as ggml-core's reference.
    pub quantize: fn(DType, &[f32], &mut [u8]),
    /// The mul_mat tile for weights of a dtype.
    pub mm: fn(DType) -> Option<MmTile>,
    /// The activation layout the tile of a weight dtype reads, if not the standard
    /// `vec_dot_type` rows.
    pub pack: fn(DType) -> Option<Packer>,
    /// A kernel for a single activation row (matrix × vector) for weights of a dtype,
    /// if the level has one; used instead of `mm` when the activations have one column.
    pub gemv: fn(DType) -> Option<Gemv>,
    /// Weight rows unpacked once per chunk for a dtype, if the level does that; used
    /// instead of `mm` for several activation columns.
    pub unpacked: fn(DType) -> Option<Unpacked>,
    /// Outer-product tiles on activation panels ([`panel`]) for a dtype, if the level
    /// has them; used by mul_mat for products with at least a panel of columns.
    pub panel: fn(DType) -> Option<panel::Panel>,
}

/// A level's tile on weight rows unpacked once and reused for every activation column
/// of a chunk (the nibbles split and the blocks transposed once per row instead of once
/// per 4 columns). The results are those of `mm`'s tile, bit for bit.
#[derive(Clone, Copy)]
pub(crate) struct Unpacked {
    /// Unpacks a weight row of `k` values (`unpacked_row_bytes(w, k)` bytes of output).
    pub unpack: fn(w: DType, k: usize, row: &[u8], out: &mut [u8]),
    /// The tile, on unpacked weight rows and packed activation rows.
    pub tile: MmTile,
}

/// No unpacked tiles: mul_mat uses `mm` on the raw weight rows.
pub(crate) fn no_unpacked(_w: DType) -> Option<Unpacked> {
    None
}

/// Bytes per group of 8 blocks of an unpacked weight row: 256 transposed quants, 8 f32
/// `d`, 8 f32 `m`.
#[allow(dead_code)] // unused on targets without x86 tiles
pub(crate) const UNPACK_GROUP: usize = 320;

/// Bytes per unpacked K-quant super-block: 256 quants, 8 chunk scale vectors, the aux
/// vector (see `x86_kquant`).
#[allow(dead_code)] // unused on targets without x86 tiles
pub(crate) const UNPACK_KQ_BLOCK: usize = 256 + 256 + 32;

/// Bytes of an unpacked weight row of `k` values of dtype `w`: legacy formats in groups
/// of 8 blocks ([`UNPACK_GROUP`]); K-quants as super-blocks ([`UNPACK_KQ_BLOCK`])
/// followed by their `d` and then their `dmin` as f32, each list padded with zeros to a
/// multiple of 8.
pub(crate) fn unpacked_row_bytes(w: DType, k: usize) -> usize {
    if w.block_size() == 256 {
        let nb = k / 256;
        nb * UNPACK_KQ_BLOCK + 2 * 4 * 8 * nb.div_ceil(8)
    } else {
        (k / 32).div_ceil(8) * UNPACK_GROUP
    }
}

/// `out[r] = dot(a[r], y)` for `a.len() <= 4` weight rows of dtype `w` and one activation
/// row `y` packed by the kernel's [`Packer`], each of `k` values.
pub(crate) type GemvRows = fn(k: usize, a: &[&[u8]], y: &[u8], out: &mut [f32; 4]);

/// A matrix × vector kernel with its activation layout.
#[derive(Clone, Copy)]
pub(crate) struct Gemv {
    /// The activation layout.
    pub pack: Packer,
    /// The kernel.
    pub rows: GemvRows,
}

/// Values spanned by `n` rows of `len` values whose starts are `stride` apart (0 for no
/// rows): what [`Kernels::dots_f16`] and [`Kernels::axpy_f16_rows`] read.
pub(crate) fn rows_span(n: usize, stride: usize, len: usize) -> usize {
    match n {
        0 => 0,
        _ => (n - 1) * stride + len,
    }
}

/// No gemv kernel: mul_mat uses the tiles for every shape.
pub(crate) fn no_gemv(_w: DType) -> Option<Gemv> {
    None
}

/// An ISA-specific activation layout for mul_mat tiles.
#[derive(Clone, Copy)]
pub(crate) struct Packer {
    /// Bytes of a packed row of `k` values.
    pub row_bytes: fn(usize) -> usize,
    /// Packs a row of f32 activations.
    pub pack: fn(&[f32], &mut [u8]),
}

/// Bytes per group of 8 blocks in the packed Q8 activation layout of the x86 tiles:
/// 256 transposed quants, 8 f32 `d`, 8 f32 `s`, 8 i32 `Σq`.
#[allow(dead_code)] // unused on targets without x86 tiles
pub(crate) const PACK_GROUP: usize = 352;

/// Bytes of a packed Q8 activation row of `k` values.
pub(crate) fn packed_row_bytes(k: usize) -> usize {
    (k / 32).div_ceil(8) * PACK_GROUP
}

impl Kernels {
    /// The table of `isa` (which must be available).
    pub(crate) fn get(isa: Isa) -> &'static Kernels {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => &avx2::KERNELS,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => &avx512::KERNELS,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => &avx512::KERNELS_VNNI,
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => &neon::KERNELS,
            #[cfg(target_arch = "aarch64")]
            Isa::NeonDotprod => &neon::KERNELS_DOTPROD,
            #[cfg(target_arch = "aarch64")]
            Isa::NeonI8mm => &neon::KERNELS_I8MM,
            _ => &scalar::KERNELS,
        }
    }
}

/// Views bytes as f32 values (the caller guarantees 4-byte alignment).
pub(crate) fn as_f32(b: &[u8]) -> &[f32] {
    // SAFETY: every bit pattern is a valid f32; alignment is asserted by align_to's split.
    let (pre, mid, _) = unsafe { b.align_to::<f32>() };
    assert!(pre.is_empty(), "misaligned f32 row");
    mid
}

/// Views bytes as u16 values (the caller guarantees 2-byte alignment).
pub(crate) fn as_u16(b: &[u8]) -> &[u16] {
    // SAFETY: every bit pattern is a valid u16; alignment is asserted by align_to's split.
    let (pre, mid, _) = unsafe { b.align_to::<u16>() };
    assert!(pre.is_empty(), "misaligned f16 row");
    mid
}

#[cfg(test)]
pub(crate) fn all_tables() -> Vec<&'static Kernels> {
    Isa::available().into_iter().map(Kernels::get).collect()
}

#[cfg(test)]
mod tests;
