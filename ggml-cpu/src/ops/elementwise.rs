//! ADD, MUL (with broadcasting), SCALE, SILU, SWIGLU.

use ggml_core::Op;

use crate::exec::{KResult, NodeCtx};
use crate::pool::ThreadCtx;

pub(crate) fn run(c: &NodeCtx<'_>, th: &ThreadCtx<'_>) -> KResult {
    let dst = c.dst;
    let n = dst.ne[0];
    let (r0, r1) = NodeCtx::split(dst.nrows(), th.ith, th.nth);
    let sc = c.scratch_f32();
    let (xa, rest) = sc.split_at_mut(n);
    let (xb, rest) = rest.split_at_mut(n);
    let xo = &mut rest[..n];
    let a = c.src[0];
    let b = c.src[1];
    let binary = matches!(c.node.op, Op::Add | Op::Mul | Op::Swiglu);
    for r in r0..r1 {
        let (i1, i2, i3) = dst.row_index(r);
        // SAFETY (all row accesses below): rows of resolved tensors; this thread alone
        // writes dst row r, and sources that share bytes with dst are copied first.
        let av: &[f32] = match (c.alias[0], unsafe { a.row_f32(i1, i2, i3) }) {
            (false, Some(s)) => s,
            _ => {
                unsafe { a.read_row(i1, i2, i3, xa) };
                xa
            }
        };
        let bv: &[f32] = if binary {
            let (j1, j2, j3) = (i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]);
            match (c.alias[1], b.ne[0] == n, unsafe { b.row_f32(j1, j2, j3) }) {
                (false, true, Some(s)) => s,
                (_, true, _) => {
                    unsafe { b.read_row(j1, j2, j3, xb) };
                    xb
                }
                _ => {
                    let row = b.row_ptr(j1, j2, j3);
                    for (i0, v) in xb.iter_mut().enumerate() {
                        *v = unsafe { b.get(row, i0 % b.ne[0]) };
                    }
                    xb
                }
            }
        } else {
            &[]
        };
        let direct = unsafe { dst.row_f32_mut(i1, i2, i3) };
        let is_direct = direct.is_some();
        let out: &mut [f32] = match direct {
            Some(d) => d,
            None => &mut xo[..],
        };
        match c.node.op {
            Op::Add => {
                for ((o, &x), &y) in out.iter_mut().zip(av).zip(bv) {
                    *o = x + y;
                }
            }
            Op::Mul => {
                for ((o, &x), &y) in out.iter_mut().zip(av).zip(bv) {
                    *o = x * y;
                }
            }
            Op::Scale { scale } => {
                for (o, &x) in out.iter_mut().zip(av) {
                    *o = x * scale;
                }
            }
            Op::Silu => (c.k.silu)(av, out),
            Op::Swiglu => (c.k.swiglu)(av, bv, out),
            _ => {
                return Err((
                    ggml_core::BackendErrorKind::UnsupportedOp,
                    "not elementwise",
                ))
            }
        }
        if !is_direct {
            unsafe { dst.write_row(i1, i2, i3, xo) };
        }
    }
    Ok(())
}
