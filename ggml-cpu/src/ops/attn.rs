//! FLASH_ATTN_EXT with F16/F32 K and V, optional F16/F32 mask, ALiBi and soft-capping.
//!
//! Per output row (query `iq`, head `h`): scores for every KV position (masked −∞
//! positions skipped), max over the rest, weights `exp(s − max)` summed in 16 lanes by
//! position, `Σ w·v` accumulated in position order, then scaled by `1/Σw`. Identical to
//! [`crate::reference`]'s definition; padding the KV length with masked positions leaves
//! the result bit-identical.

use ggml_core::{DType, Tensor};

use crate::exec::{KResult, NodeCtx};
use crate::pool::ThreadCtx;
use crate::reference::{alibi_slope, exp, fmax, tree16, tree16_max, LANES};

/// Per-thread scratch bytes.
pub(crate) fn scratch(t: &Tensor, tensors: &[Tensor]) -> usize {
    let get = |i: usize| t.src[i].map(|s| tensors[s.index()].ne);
    let (q, k, v) = (
        get(0).unwrap_or_default(),
        get(1).unwrap_or_default(),
        get(2).unwrap_or_default(),
    );
    let (d, n_kv, dv) = (q[0], k[1], v[0]);
    4 * (2 * n_kv + 3 * d + 2 * dv + 64)
}

pub(crate) fn run(
    c: &NodeCtx<'_>,
    th: &ThreadCtx<'_>,
    scale: f32,
    max_bias: f32,
    softcap: f32,
) -> KResult {
    let (dst, q, k, v) = (c.dst, c.src[0], c.src[1], c.src[2]);
    let mask = c.node.src[3].map(|_| c.src[3]);
    let (d, n_head) = (q.ne[0], q.ne[2]);
    let (n_kv, h_kv) = (k.ne[1], k.ne[2]);
    let dv = v.ne[0];
    let group = n_head / h_kv;
    let sc = c.scratch_f32();
    let (scores, rest) = sc.split_at_mut(n_kv);
    let (mrow, rest) = rest.split_at_mut(n_kv);
    let (qf, rest) = rest.split_at_mut(d);
    let (krow, rest) = rest.split_at_mut(d);
    let (qh_f, rest) = rest.split_at_mut(d.div_ceil(2));
    let (vrow, rest) = rest.split_at_mut(dv);
    let acc = &mut rest[..dv];
    // SAFETY: `qh_f` is a 4-byte aligned f32 area of ceil(d/2) values, reinterpreted as d
    // u16 values; it is not used as f32 anywhere.
    let qh: &mut [u16] =
        unsafe { std::slice::from_raw_parts_mut(qh_f.as_mut_ptr() as *mut u16, d) };
    let k_f16 = k.dtype == DType::F16;
    let (r0, r1) = NodeCtx::split(dst.nrows(), th.ith, th.nth);
    for r in r0..r1 {
        // Destination row (h, iq, i3).
        let (h, iq, i3) = dst.row_index(r);
        let hk = h / group;
        let slope = alibi_slope(max_bias, h, n_head);
        // SAFETY (all reads below): rows of resolved operand tensors, which do not overlap
        // the destination (the result is a fresh tensor; checked through `alias`).
        unsafe { q.read_row(iq, h, i3, qf) };
        if k_f16 {
            (c.k.f32_to_f16)(qf, qh);
        }
        if let Some(m) = mask {
            unsafe { m.read_row(iq, 0, 0, mrow) };
        }
        let masked = |j: usize| mask.is_some() && slope * mrow[j] == f32::NEG_INFINITY;
        let mut lanes = [f32::NEG_INFINITY; LANES];
        for j in 0..n_kv {
            if masked(j) {
                continue;
            }
            let kp = k.row_ptr(j, hk, i3);
            let dot = if k_f16 {
                if k.rows_dense() && (kp as usize).is_multiple_of(2) {
                    // SAFETY: dense, aligned F16 row of d values.
                    let ks = unsafe { std::slice::from_raw_parts(kp as *const u16, d) };
                    (c.k.dot_f16)(qh, ks)
                } else {
                    // Same products and lanes as `dot_f16`, from the exact f32 values.
                    unsafe { k.read_row(j, hk, i3, krow) };
                    let mut lane = [0f32; LANES];
                    for (i, (&a, &b)) in qh.iter().zip(krow.iter()).enumerate() {
                        lane[i % LANES] += crate::reference::f16_to_f32(a) * b;
                    }
                    tree16(lane)
                }
            } else {
                match unsafe { k.row_f32(j, hk, i3) } {
                    Some(ks) => (c.k.dot_f32)(qf, ks),
                    None => {
                        unsafe { k.read_row(j, hk, i3, krow) };
                        (c.k.dot_f32)(qf, krow)
                    }
                }
            };
            let mut s = dot * scale;
            if softcap > 0.0 {
                s = softcap * (s / softcap).tanh();
            }
            if mask.is_some() {
                s += slope * mrow[j];
            }
            scores[j] = s;
            lanes[j % LANES] = fmax(s, lanes[j % LANES]);
        }
        let mx = tree16_max(lanes);
        let mut sum = [0f32; LANES];
        acc.fill(0.0);
        for j in 0..n_kv {
            if masked(j) {
                continue;
            }
            let w = exp(scores[j] - mx);
            sum[j % LANES] += w;
            let vp = v.row_ptr(j, hk, i3);
            if v.dtype == DType::F16 && v.rows_dense() && (vp as usize).is_multiple_of(2) {
                // SAFETY: dense aligned F16 row of dv values.
                let vs = unsafe { std::slice::from_raw_parts(vp as *const u16, dv) };
                (c.k.axpy_f16)(acc, w, vs);
            } else {
                let vs: &[f32] = match unsafe { v.row_f32(j, hk, i3) } {
                    Some(s) => s,
                    None => {
                        unsafe { v.read_row(j, hk, i3, vrow) };
                        vrow
                    }
                };
                (c.k.axpy_f32)(acc, w, vs);
            }
        }
        let s = tree16(sum);
        let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
        for a in acc.iter_mut() {
            *a *= inv;
        }
        // SAFETY: destination row r, this thread's alone.
        unsafe { dst.write_row(h, iq, i3, acc) };
    }
    Ok(())
}
