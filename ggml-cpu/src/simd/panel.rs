//! Activation panels for the outer-product tiles.
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
//!
//! For the legacy formats (blocks of 32 with Q8_0 or Q8_1 activations) a block of a panel
//! takes [`LP_BLOCK_BYTES`]: 8 vectors of quants (as above), the columns' scales `d` and
//! Q8_1 sums `s` (0 for Q8_0) as f32, and the sums of each column's 32 quants as i32.

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

/// Bytes of one block of a legacy-format panel.
pub(crate) const LP_BLOCK_BYTES: usize = 704;

/// Byte offsets, in a legacy panel block, of the columns' `d`, `s` and quant sums.
pub(crate) const LP_D_AT: usize = 512;
pub(crate) const LP_S_AT: usize = 576;
pub(crate) const LP_SUM_AT: usize = 640;

/// Bytes of a panel of activation rows of `k` values for weights of dtype `w` (`k` a
/// multiple of its block size).
pub(crate) fn panel_bytes(w: DType, k: usize) -> usize {
    if w.block_size() == 256 {
        k / 256 * PANEL_SB_BYTES
    } else {
        k / 32 * LP_BLOCK_BYTES
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

/// A panel tile: `out[(p·16 + c)·4 + r] = dot(rows[r], column c of panels[p])` for the 4
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

/// Writes the activation row `row` (`k` values, quantised to `w.vec_dot_type()`) as column
/// `col` of the panel at `panel`.
///
/// # Safety
/// `panel` points to `panel_bytes(w, k)` writable bytes; no one else accesses column
/// `col`'s bytes of it meanwhile (other columns may be written concurrently).
pub(crate) unsafe fn scatter_column(w: DType, row: &[u8], k: usize, col: usize, panel: *mut u8) {
    if w.block_size() != 256 {
        // SAFETY: as this function's.
        unsafe { scatter_legacy_column(w.vec_dot_type(), row, k / 32, col, panel) };
        return;
    }
    let nb = k / 256;
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

/// [`scatter_column`] for a Q8_0 or Q8_1 row of `nb` blocks.
///
/// # Safety
/// As [`scatter_column`]'s.
unsafe fn scatter_legacy_column(vdt: DType, row: &[u8], nb: usize, col: usize, panel: *mut u8) {
    let (bb, qs_at) = match vdt {
        DType::Q8_0 => (34, 2),
        DType::Q8_1 => (36, 4),
        _ => panic!("no legacy panels for activations of {vdt}"),
    };
    assert!(col < PANEL_COLS && row.len() >= nb * bb);
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
            let p = panel.add(j * LP_BLOCK_BYTES + 4 * col);
            for v in 0..8 {
                std::ptr::copy_nonoverlapping(qs[4 * v..].as_ptr(), p.add(64 * v), 4);
            }
            (p.add(LP_D_AT) as *mut f32).write_unaligned(f16(x, 0));
            (p.add(LP_S_AT) as *mut f32).write_unaligned(s);
            (p.add(LP_SUM_AT) as *mut i32).write_unaligned(sum);
        }
    }
}
