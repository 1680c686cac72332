//! RMS_NORM and SOFT_MAX over rows.

use crate::exec::{KResult, NodeCtx};
use crate::pool::ThreadCtx;
use crate::reference::alibi_slope;

pub(crate) fn rms_norm(c: &NodeCtx<'_>, th: &ThreadCtx<'_>, eps: f32) -> KResult {
    let (dst, a) = (c.dst, c.src[0]);
    let n = dst.ne[0];
    let (r0, r1) = NodeCtx::split(dst.nrows(), th.ith, th.nth);
    let sc = c.scratch_f32();
    let (xa, rest) = sc.split_at_mut(n);
    let xo = &mut rest[..n];
    for r in r0..r1 {
        let (i1, i2, i3) = dst.row_index(r);
        // SAFETY: rows of resolved tensors; dst row r is this thread's alone; aliased
        // sources are copied first.
        let x: &[f32] = match (c.alias[0], unsafe { a.row_f32(i1, i2, i3) }) {
            (false, Some(s)) => s,
            _ => {
                unsafe { a.read_row(i1, i2, i3, xa) };
                xa
            }
        };
        let mean = (c.k.sum_sq)(x) / n as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        // SAFETY: as above.
        match unsafe { dst.row_f32_mut(i1, i2, i3) } {
            Some(o) => {
                for (o, &v) in o.iter_mut().zip(x) {
                    *o = v * scale;
                }
            }
            None => {
                for (o, &v) in xo.iter_mut().zip(x) {
                    *o = v * scale;
                }
                unsafe { dst.write_row(i1, i2, i3, xo) };
            }
        }
    }
    Ok(())
}

pub(crate) fn soft_max(c: &NodeCtx<'_>, th: &ThreadCtx<'_>, scale: f32, max_bias: f32) -> KResult {
    let (dst, a) = (c.dst, c.src[0]);
    let mask = c.node.src[1].map(|_| c.src[1]);
    let n = dst.ne[0];
    let (r0, r1) = NodeCtx::split(dst.nrows(), th.ith, th.nth);
    let sc = c.scratch_f32();
    let (xa, rest) = sc.split_at_mut(n);
    let (xm, rest) = rest.split_at_mut(n);
    let xo = &mut rest[..n];
    for r in r0..r1 {
        let (i1, i2, i3) = dst.row_index(r);
        // SAFETY: rows of resolved tensors; dst row r is this thread's alone; aliased
        // sources are copied first.
        let x: &[f32] = match (c.alias[0], unsafe { a.row_f32(i1, i2, i3) }) {
            (false, Some(s)) => s,
            _ => {
                unsafe { a.read_row(i1, i2, i3, xa) };
                xa
            }
        };
        let direct = unsafe { dst.row_f32_mut(i1, i2, i3) };
        let is_direct = direct.is_some();
        let w: &mut [f32] = match direct {
            Some(d) => d,
            None => &mut xo[..],
        };
        for (o, &v) in w.iter_mut().zip(x) {
            *o = v * scale;
        }
        if let Some(m) = mask {
            let (j2, j3) = (i2 % m.ne[2], i3 % m.ne[3]);
            let mv: &[f32] = match (c.alias[1], unsafe { m.row_f32(i1, j2, j3) }) {
                (false, Some(s)) => s,
                _ => {
                    unsafe { m.read_row(i1, j2, j3, xm) };
                    xm
                }
            };
            let slope = alibi_slope(max_bias, i2, dst.ne[2]);
            for (o, &v) in w.iter_mut().zip(mv) {
                *o += slope * v;
            }
        }
        let mx = (c.k.max)(w);
        let sum = (c.k.exp_shift_sum)(w, mx);
        let inv = 1.0 / sum;
        for o in w.iter_mut() {
            *o *= inv;
        }
        if !is_direct {
            unsafe { dst.write_row(i1, i2, i3, xo) };
        }
    }
    Ok(())
}
