//! CPY, CONT, SET_ROWS, CONCAT, and the byte copies of `cpy_tensor_async`.

use ggml_core::{BackendError, BackendErrorKind, DType, Tensor};

use crate::exec::{KResult, NodeCtx, TView};
use crate::memory::{resolve, Registry};
use crate::pool::ThreadCtx;
use crate::queue::Queue;

/// Multi-index of flat element `flat` of a tensor of shape `ne`.
fn index_of(flat: usize, ne: [usize; 4]) -> [usize; 4] {
    let i0 = flat % ne[0];
    let r = flat / ne[0];
    let i1 = r % ne[1];
    let r = r / ne[1];
    [i0, i1, r % ne[2], r / ne[2]]
}

pub(crate) fn cpy(c: &NodeCtx<'_>, th: &ThreadCtx<'_>) -> KResult {
    let (dst, a) = (c.dst, c.src[0]);
    if c.alias[0] {
        if a.ptr == dst.ptr && a.nb == dst.nb && a.ne == dst.ne && a.dtype == dst.dtype {
            return Ok(());
        }
        return Err((
            BackendErrorKind::InvalidArgument,
            "copy source overlaps its destination",
        ));
    }
    let n = dst.ne[0];
    let (r0, r1) = NodeCtx::split(dst.nrows(), th.ith, th.nth);
    let sc = c.scratch_f32();
    let same_shape = a.ne == dst.ne;
    for r in r0..r1 {
        let (i1, i2, i3) = dst.row_index(r);
        if a.dtype == dst.dtype && (a.dtype.is_quantized() || a.dtype == DType::I32) && same_shape {
            // Raw copy (CONT of quantised or integer tensors).
            if a.dtype.is_quantized() {
                let rs = a.dtype.row_size(n).unwrap_or(0);
                // SAFETY: dense quantised rows of resolved, non-overlapping tensors.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        a.row_ptr(i1, i2, i3),
                        dst.row_ptr(i1, i2, i3),
                        rs,
                    )
                };
            } else {
                let (s, d) = (a.row_ptr(i1, i2, i3), dst.row_ptr(i1, i2, i3));
                for i0 in 0..n {
                    // SAFETY: elements of resolved, non-overlapping rows.
                    unsafe {
                        std::ptr::copy_nonoverlapping(s.add(i0 * a.nb[0]), d.add(i0 * dst.nb[0]), 4)
                    };
                }
            }
            continue;
        }
        let vals = &mut sc[..n];
        if same_shape {
            // SAFETY: row of a resolved source tensor.
            unsafe { a.read_row(i1, i2, i3, vals) };
        } else {
            let flat0 = r * n;
            for (k, v) in vals.iter_mut().enumerate() {
                let i = index_of(flat0 + k, a.ne);
                let row = a.row_ptr(i[1], i[2], i[3]);
                // SAFETY: element of the resolved source tensor.
                *v = unsafe { a.get(row, i[0]) };
            }
        }
        if dst.dtype.is_quantized() {
            let rs = dst.dtype.row_size(n).unwrap_or(0);
            // SAFETY: dense destination row (checked by `supports`), this thread's alone.
            let out = unsafe { std::slice::from_raw_parts_mut(dst.row_ptr(i1, i2, i3), rs) };
            crate::quant::quantize_row(dst.dtype, vals, out);
        } else {
            // SAFETY: destination row, this thread's alone.
            unsafe { dst.write_row(i1, i2, i3, vals) };
        }
    }
    Ok(())
}

/// Each thread owns a range of destination rows and writes the source rows whose index
/// falls in it, in source order: no two threads touch one row, and for repeated indices
/// the last source row wins, as in the reference.
pub(crate) fn set_rows(c: &NodeCtx<'_>, th: &ThreadCtx<'_>) -> KResult {
    let (dst, a, idx) = (c.dst, c.src[0], c.src[1]);
    if c.alias[0] || c.alias[1] {
        return Err((
            BackendErrorKind::InvalidArgument,
            "set_rows operand overlaps its destination",
        ));
    }
    let (d0, d1) = NodeCtx::split(dst.ne[1], th.ith, th.nth);
    let vals = &mut c.scratch_f32()[..dst.ne[0]];
    for i in 0..a.ne[1] {
        let at = idx.ptr.wrapping_add(i * idx.nb[0]);
        // SAFETY: element i of the I32 index tensor (shape checked by core).
        let row = unsafe { (at as *const i32).read_unaligned() };
        if row < 0 || row as usize >= dst.ne[1] {
            return Err((BackendErrorKind::BadData, "row index out of range"));
        }
        let row = row as usize;
        if (d0..d1).contains(&row) {
            // SAFETY: row i of the resolved source; destination row `row` is this
            // thread's alone (threads own disjoint row ranges).
            unsafe {
                a.read_row(i, 0, 0, vals);
                dst.write_row(row, 0, 0, vals);
            }
        }
    }
    Ok(())
}

pub(crate) fn concat(c: &NodeCtx<'_>, th: &ThreadCtx<'_>, dim: usize) -> KResult {
    let (dst, a, b) = (c.dst, c.src[0], c.src[1]);
    if c.alias[0] || c.alias[1] {
        return Err((
            BackendErrorKind::InvalidArgument,
            "concat operand overlaps the result",
        ));
    }
    let ts = dst.dtype.type_size();
    let (r0, r1) = NodeCtx::split(dst.nrows(), th.ith, th.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = dst.row_index(r);
        let drow = dst.row_ptr(i1, i2, i3);
        // A destination row is one or two runs of elements, each from one operand row.
        let mut runs: [(Option<&TView>, [usize; 4], usize, usize); 2] =
            [(None, [0; 4], 0, 0), (None, [0; 4], 0, 0)];
        if dim == 0 {
            runs[0] = (Some(&a), [0, i1, i2, i3], 0, a.ne[0]);
            runs[1] = (Some(&b), [0, i1, i2, i3], a.ne[0], b.ne[0]);
        } else {
            let mut i = [0, i1, i2, i3];
            let t: &TView = if i[dim] < a.ne[dim] {
                &a
            } else {
                i[dim] -= a.ne[dim];
                &b
            };
            runs[0] = (Some(t), i, 0, dst.ne[0]);
        }
        for (t, i, at, len) in runs {
            let Some(t) = t else { continue };
            let s = t
                .ptr
                .wrapping_add(i[1] * t.nb[1] + i[2] * t.nb[2] + i[3] * t.nb[3]);
            if t.nb[0] == ts && dst.nb[0] == ts {
                // SAFETY: `len` dense elements of a resolved operand row and of the
                // destination row, which do not overlap (checked above).
                unsafe { std::ptr::copy_nonoverlapping(s, drow.add(at * ts), len * ts) };
                continue;
            }
            for k in 0..len {
                // SAFETY: one element of a resolved operand row and of the destination
                // row, which do not overlap (checked above).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        s.wrapping_add(k * t.nb[0]),
                        drow.add((at + k) * dst.nb[0]),
                        ts,
                    )
                };
            }
        }
    }
    Ok(())
}

/// Copies `src` into `dst` (same dtype and shape, any strides) on the queue thread.
pub(crate) fn copy_same_dtype(
    q: &Queue,
    src_reg: &Registry,
    src: &Tensor,
    dst_reg: &Registry,
    dst: &Tensor,
) -> Result<(), BackendError> {
    let bad = |d| {
        q.err(BackendErrorKind::InvalidArgument, d)
            .at("CPY", dst.name)
    };
    let (Some(sd), Some(dd)) = (src.data, dst.data) else {
        return Err(bad("tensor has no data"));
    };
    if src.dtype != dst.dtype || src.ne != dst.ne {
        return Err(bad("copy needs equal dtypes and shapes"));
    }
    let (_sr, sp) = resolve(src_reg, sd, src.nbytes()).map_err(bad)?;
    let (dr, dp) = resolve(dst_reg, dd, dst.nbytes()).map_err(bad)?;
    if !dr.writable() {
        return Err(bad("destination is read-only"));
    }
    let (s0, s1) = (sp as usize, sp as usize + src.nbytes());
    let (d0, d1) = (dp as usize, dp as usize + dst.nbytes());
    if s0 < d1 && d0 < s1 {
        if sp == dp && src.nb == dst.nb {
            return Ok(());
        }
        return Err(bad("copy source overlaps its destination"));
    }
    if src.is_contiguous() && dst.is_contiguous() {
        // SAFETY: both ranges resolved in live regions and disjoint.
        unsafe { std::ptr::copy_nonoverlapping(sp, dp, src.nbytes()) };
        return Ok(());
    }
    let ts = src.dtype.type_size();
    let (row_dense, rs) = (
        src.rows_contiguous() && dst.rows_contiguous(),
        src.row_size(),
    );
    for i3 in 0..src.ne[3] {
        for i2 in 0..src.ne[2] {
            for i1 in 0..src.ne[1] {
                let so = src.offset_of([0, i1, i2, i3]);
                let doff = dst.offset_of([0, i1, i2, i3]);
                if row_dense {
                    // SAFETY: a row inside both resolved, disjoint ranges.
                    unsafe { std::ptr::copy_nonoverlapping(sp.add(so), dp.add(doff), rs) };
                } else {
                    for i0 in 0..src.ne[0] / src.dtype.block_size() {
                        // SAFETY: one element inside both ranges.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                sp.add(so + i0 * src.nb[0]),
                                dp.add(doff + i0 * dst.nb[0]),
                                ts,
                            )
                        };
                    }
                }
            }
        }
    }
    Ok(())
}
