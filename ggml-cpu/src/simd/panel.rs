//! Activation panels for the outer-product tiles.
//!
//! A panel holds `cols` activation rows (the product's columns: 16 on AVX-512, 8 on AVX2)
//! quantised to the weights' dot type and interleaved so that one vector register loads
//! the same 4 quants of every column: a tile broadcasts 4 weight bytes of a row and runs
//! one `vpdpbusd` (AVX2: `vpmaddubsw`) against all the columns, and each scale is applied
//! once per row and `cols` columns. Per super-block of 256 values (K-quants, Q8_K
//! activations) a panel takes `292·cols` bytes ([`kpanel_sb_bytes`]):
//! - 64 vectors of quants: vector `v` holds the dword `v` (quants `4v..4v + 4`) of every
//!   column, column `c` at byte `4·cols·v + 4c`;
//! - the columns' Q8_K scales `d` (f32) at [`kpanel_d_at`];
//! - 8 vectors of group-sum pairs: vector `i` holds `(bsum[2i], bsum[2i + 1])` (i16) of
//!   every column, at [`kpanel_bsum_at`]` + 4·cols·i`.
//!
//! For the legacy formats (blocks of 32 with Q8_0 or Q8_1 activations) a block of a panel
//! takes `44·cols` bytes ([`lpanel_block_bytes`]): 8 vectors of quants (as above), the
//! columns' scales `d` and Q8_1 sums `s` (0 for Q8_0) as f32, and the sums of each
//! column's 32 quants as i32.
//!
//! The quants and scales are exactly those of the columns' quantised rows, rearranged; so
//! are the dots.

// The offsets of the unpacked weights are read only by the x86 tiles.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]

use ggml_core::DType;

/// Bytes of a Q8_K block: f32 `d`, 256 i8 quants, 16 i16 group sums.
pub(crate) const Q8K_BLOCK: usize = 292;

/// Bytes of one super-block of a K-quant panel of `cols` columns.
pub(crate) const fn kpanel_sb_bytes(cols: usize) -> usize {
    Q8K_BLOCK * cols
}

/// Byte offset, in a K-quant panel super-block, of the columns' scales.
pub(crate) const fn kpanel_d_at(cols: usize) -> usize {
    256 * cols
}

/// Byte offset, in a K-quant panel super-block, of the columns' group-sum pairs.
pub(crate) const fn kpanel_bsum_at(cols: usize) -> usize {
    260 * cols
}

/// Bytes of one block of a legacy-format panel of `cols` columns.
pub(crate) const fn lpanel_block_bytes(cols: usize) -> usize {
    44 * cols
}

/// Byte offset, in a legacy panel block, of the columns' `d`.
pub(crate) const fn lpanel_d_at(cols: usize) -> usize {
    32 * cols
}

/// Byte offset, in a legacy panel block, of the columns' Q8_1 `s`.
pub(crate) const fn lpanel_s_at(cols: usize) -> usize {
    36 * cols
}

/// Byte offset, in a legacy panel block, of the columns' quant sums.
pub(crate) const fn lpanel_sum_at(cols: usize) -> usize {
    40 * cols
}

/// Bytes of a panel of `cols` activation rows of `k` values for weights of dtype `w` (`k`
/// a multiple of its block size).
pub(crate) fn panel_bytes(w: DType, k: usize, cols: usize) -> usize {
    if w.block_size() == 256 {
        k / 256 * kpanel_sb_bytes(cols)
    } else {
        k / 32 * lpanel_block_bytes(cols)
    }
}

/// Bytes per super-block of a weight row unpacked for the panel tiles: 256 quants as u8
/// without the format's offset, the 16 group scales as i32, the 16 i16 aux terms (the
/// group mins, or `offset·scale_g`), `d` and `dmin` as f32; padded to a cache line.
pub(crate) const KP_SB_BYTES: usize = 384;

/// Byte offsets in an unpacked super-block (see [`KP_SB_BYTES`]).
pub(crate) const KP_SCALES_AT: usize = 256;
pub(crate) const KP_AUX_AT: usize = 320;
pub(crate) const KP_D_AT: usize = 352;
pub(crate) const KP_DMIN_AT: usize = 356;

/// Bytes per block of a legacy-format weight row unpacked for the panel tiles: 32 quants
/// as u8 without the format's offset, `d` and `m` (0 without mins) as f32.
pub(crate) const LW_BLOCK_BYTES: usize = 40;

/// Byte offsets in an unpacked legacy block (see [`LW_BLOCK_BYTES`]).
pub(crate) const LW_D_AT: usize = 32;
pub(crate) const LW_M_AT: usize = 36;

/// Bytes of a weight row of dtype `w` and `k` values unpacked for the panel tiles.
pub(crate) fn kp_row_bytes(w: DType, k: usize) -> usize {
    if w.block_size() == 256 {
        k / 256 * KP_SB_BYTES
    } else {
        k / 32 * LW_BLOCK_BYTES
    }
}

/// Weight rows per panel tile.
pub(crate) const PANEL_ROWS: usize = 4;

/// A panel tile: `out[(p·cols + c)·4 + r] = dot(rows[r], column c of panels[p])` for the 4
/// unpacked weight rows `rows` of dtype `w` and 1 or 2 panels, each of `k` values.
pub(crate) type PanelTile =
    fn(w: DType, k: usize, rows: &[&[u8]; PANEL_ROWS], panels: &[&[u8]], out: &mut [f32; 128]);

/// A level's outer-product tiles for a weight dtype.
#[derive(Clone, Copy)]
pub(crate) struct Panel {
    /// Columns per panel.
    pub cols: usize,
    /// Unpacks a weight row of `k` values into [`kp_row_bytes`]`(w, k)` bytes.
    pub unpack: fn(w: DType, k: usize, row: &[u8], out: &mut [u8]),
    /// The tile.
    pub tile: PanelTile,
}

/// No panel tiles.
pub(crate) fn no_panel(_w: DType) -> Option<Panel> {
    None
}

/// Writes the activation row `row` (`k` values, quantised to `w.vec_dot_type()`) as column
/// `col` of the panel of `cols` columns at `panel`.
///
/// # Safety
/// `panel` points to `panel_bytes(w, k, cols)` writable bytes; no one else accesses
/// column `col`'s bytes of it meanwhile (other columns may be written concurrently).
pub(crate) unsafe fn scatter_column(
    w: DType,
    row: &[u8],
    k: usize,
    cols: usize,
    col: usize,
    panel: *mut u8,
) {
    assert!(col < cols);
    if w.block_size() != 256 {
        // SAFETY: as this function's.
        unsafe { scatter_legacy_column(w.vec_dot_type(), row, k / 32, cols, col, panel) };
        return;
    }
    let nb = k / 256;
    assert!(row.len() >= nb * Q8K_BLOCK);
    for j in 0..nb {
        let x = &row[j * Q8K_BLOCK..(j + 1) * Q8K_BLOCK];
        // SAFETY: every write is inside super-block j of the panel, in column col's bytes
        // (caller).
        unsafe {
            let p = panel.add(j * kpanel_sb_bytes(cols) + 4 * col);
            for v in 0..64 {
                let q = &x[4 + 4 * v..8 + 4 * v];
                std::ptr::copy_nonoverlapping(q.as_ptr(), p.add(4 * cols * v), 4);
            }
            std::ptr::copy_nonoverlapping(x.as_ptr(), p.add(kpanel_d_at(cols)), 4);
            for i in 0..8 {
                let s = &x[260 + 4 * i..264 + 4 * i];
                let at = kpanel_bsum_at(cols) + 4 * cols * i;
                std::ptr::copy_nonoverlapping(s.as_ptr(), p.add(at), 4);
            }
        }
    }
}

/// [`scatter_column`] for a Q8_0 or Q8_1 row of `nb` blocks.
///
/// # Safety
/// As [`scatter_column`]'s.
unsafe fn scatter_legacy_column(
    vdt: DType,
    row: &[u8],
    nb: usize,
    cols: usize,
    col: usize,
    panel: *mut u8,
) {
    let (bb, qs_at) = match vdt {
        DType::Q8_0 => (34, 2),
        DType::Q8_1 => (36, 4),
        _ => panic!("no legacy panels for activations of {vdt}"),
    };
    assert!(row.len() >= nb * bb);
    let f16 =
        |b: &[u8], at: usize| crate::reference::f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]));
    for j in 0..nb {
        let x = &row[j * bb..(j + 1) * bb];
        let qs = &x[qs_at..qs_at + 32];
        let s = if qs_at == 4 { f16(x, 2) } else { 0.0 };
        let sum: i32 = qs.iter().map(|&q| i32::from(q as i8)).sum();
        // SAFETY: every write is inside block j of the panel, in column col's bytes
        // (caller).
        unsafe {
            let p = panel.add(j * lpanel_block_bytes(cols) + 4 * col);
            for v in 0..8 {
                std::ptr::copy_nonoverlapping(qs[4 * v..].as_ptr(), p.add(4 * cols * v), 4);
            }
            (p.add(lpanel_d_at(cols)) as *mut f32).write_unaligned(f16(x, 0));
            (p.add(lpanel_s_at(cols)) as *mut f32).write_unaligned(s);
            (p.add(lpanel_sum_at(cols)) as *mut i32).write_unaligned(sum);
        }
    }
}
