//! ROPE (normal and NeoX layouts), F32 and F16.

use ggml_core::{BackendErrorKind, RopeParams};

use crate::exec::{KResult, NodeCtx};
use crate::pool::ThreadCtx;
use crate::reference::{rope_cache, rope_row};

pub(crate) fn run(c: &NodeCtx<'_>, th: &ThreadCtx<'_>, p: &RopeParams) -> KResult {
    let (dst, a, pos) = (c.dst, c.src[0], c.src[1]);
    let n = dst.ne[0];
    let (r0, r1) = NodeCtx::split(dst.nrows(), th.ith, th.nth);
    let sc = c.scratch_f32();
    let (xa, rest) = sc.split_at_mut(n);
    let (cache, rest) = rest.split_at_mut(n + 2);
    let xo = &mut rest[..n];
    let mut cached: Option<(usize, usize)> = None;
    for r in r0..r1 {
        let (i1, i2, i3) = dst.row_index(r);
        if cached != Some((i2, i3)) {
            // SAFETY: element i2 of the 1-D I32 positions tensor.
            let p_i =
                unsafe { (pos.ptr.wrapping_add(i2 * pos.nb[0]) as *const i32).read_unaligned() };
            rope_cache(p_i as f32, p, cache);
            cached = Some((i2, i3));
        }
        // SAFETY: rows of resolved tensors; the dst row is this thread's alone and the
        // source row is copied to scratch before the destination is written.
        unsafe { a.read_row(i1, i2, i3, xa) };
        if p.n_dims as usize > n {
            return Err((BackendErrorKind::InvalidArgument, "n_dims > ne0"));
        }
        rope_row(xa, cache, p.mode, p.n_dims as usize, xo);
        unsafe { dst.write_row(i1, i2, i3, xo) };
    }
    Ok(())
}
