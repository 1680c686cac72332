//! Activation panels for the outer-product K-quant tiles.
//!
//! A panel holds [`PANEL_COLS`] activation rows (the product's columns) quantised to Q8_K
//! and interleaved so that one vector register loads the same 4 quants of every column:
//! a tile broadcasts 4 weight bytes of a row and runs one `vpdpbusd` against 16 columns,
//! and each K-quant scale is applied once per row and 16 columns. Per super-block of 256
//! values a panel takes [`PANEL_SB_BYTES`] bytes:
//! - 64 vectors of quants: vector `v` holds the dword `v` (quants `4v..4v + 4`) of every
//!   column, column `c` at byte `4c`;
//! - the columns' Q8_K scales `d` (f32, column `c` at byte `4096 + 4c`);
//! - 8 vectors of group-sum pairs: vector `i` holds `(bsum[2i], bsum[2i + 1])` (i16) of
//!   every column, column `c` at byte `4160 + 64i + 4c`.
//!
//! The bytes are exactly those of the columns' Q8_K rows, rearranged; so are the dots.

use ggml_core::DType;

/// Activation rows per panel.
pub(crate) const PANEL_COLS: usize = 16;

/// Bytes of a Q8_K block: f32 `d`, 256 i8 quants, 16 i16 group sums.
pub(crate) const Q8K_BLOCK: usize = 292;

/// Bytes of one super-block of a panel (the same as its columns' Q8_K blocks).
pub(crate) const PANEL_SB_BYTES: usize = PANEL_COLS * Q8K_BLOCK;

/// Byte offset, in a panel super-block, of the columns' scales.
pub(crate) const PANEL_D_AT: usize = 4096;

/// Byte offset, in a panel super-block, of the columns' group-sum pairs.
pub(crate) const PANEL_BSUM_AT: usize = 4096 + 64;

/// Bytes of a panel of activation rows of `k` values (`k` a multiple of 256).
pub(crate) fn panel_bytes(k: usize) -> usize {
    k / 256 * PANEL_SB_BYTES
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

/// Bytes of a weight row of `k` values unpacked for the panel tiles.
pub(crate) fn kp_row_bytes(k: usize) -> usize {
    k / 256 * KP_SB_BYTES
}

/// Weight rows per panel tile.
pub(crate) const PANEL_ROWS: usize = 4;

/// A panel tile: `out[(r·2 + p)·16 + c] = dot(rows[r], column c of panels[p])` for the 4
/// unpacked weight rows `rows` of dtype `w` and 1 or 2 panels, each of `k` values.
pub(crate) type PanelTile =
    fn(w: DType, k: usize, rows: &[&[u8]; PANEL_ROWS], panels: &[&[u8]], out: &mut [f32; 128]);

/// A level's outer-product tiles for a weight dtype.
#[derive(Clone, Copy)]
pub(crate) struct Panel {
    /// Unpacks a weight row of `k` values into [`kp_row_bytes`]`(k)` bytes.
    pub unpack: fn(w: DType, k: usize, row: &[u8], out: &mut [u8]),
    /// The tile.
    pub tile: PanelTile,
}

/// No panel tiles.
pub(crate) fn no_panel(_w: DType) -> Option<Panel> {
    None
}

/// Writes the Q8_K row `row` (`nb` blocks) as column `col` of the panel at `panel`.
///
/// # Safety
/// `panel` points to `nb * PANEL_SB_BYTES` writable bytes; no one else accesses column
/// `col`'s bytes of it meanwhile (other columns may be written concurrently).
pub(crate) unsafe fn scatter_column(row: &[u8], nb: usize, col: usize, panel: *mut u8) {
    assert!(col < PANEL_COLS && row.len() >= nb * Q8K_BLOCK);
    for j in 0..nb {
        let x = &row[j * Q8K_BLOCK..(j + 1) * Q8K_BLOCK];
        // SAFETY: every write is inside super-block j of the panel, in column col's bytes
        // (caller).
        unsafe {
            let p = panel.add(j * PANEL_SB_BYTES + 4 * col);
            for v in 0..64 {
                let q = &x[4 + 4 * v..8 + 4 * v];
                std::ptr::copy_nonoverlapping(q.as_ptr(), p.add(64 * v), 4);
            }
            std::ptr::copy_nonoverlapping(x.as_ptr(), p.add(PANEL_D_AT), 4);
            for i in 0..8 {
                let s = &x[260 + 4 * i..264 + 4 * i];
                std::ptr::copy_nonoverlapping(s.as_ptr(), p.add(PANEL_BSUM_AT + 64 * i), 4);
            }
        }
    }
}
