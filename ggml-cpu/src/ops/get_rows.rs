//! GET_ROWS for every dtype (dequantising to F32).

use ggml_core::BackendErrorKind;

use crate::exec::{KResult, NodeCtx};
use crate::pool::ThreadCtx;

pub(crate) fn run(c: &NodeCtx<'_>, th: &ThreadCtx<'_>) -> KResult {
    let (dst, a, idx) = (c.dst, c.src[0], c.src[1]);
    let (r0, r1) = NodeCtx::split(dst.nrows(), th.ith, th.nth);
    let sc = c.scratch_f32();
    for r in r0..r1 {
        let (i1, i2, i3) = dst.row_index(r);
        let at = idx
            .ptr
            .wrapping_add(i1 * idx.nb[0] + i2 * idx.nb[1] + i3 * idx.nb[2]);
        // SAFETY: element (i1, i2, i3) of the I32 index tensor (shape checked by core).
        let row = unsafe { (at as *const i32).read_unaligned() };
        if row < 0 || row as usize >= a.ne[1] {
            return Err((BackendErrorKind::BadData, "row index out of range"));
        }
        let (j1, j2, j3) = (row as usize, i2, i3 % a.ne[3]);
        // SAFETY: rows of resolved tensors; dst row r is this thread's alone.
        match unsafe { dst.row_f32_mut(i1, i2, i3) } {
            Some(o) if !c.alias[0] => unsafe { a.read_row(j1, j2, j3, o) },
            _ => unsafe {
                a.read_row(j1, j2, j3, sc);
                dst.write_row(i1, i2, i3, sc);
            },
        }
    }
    Ok(())
}
