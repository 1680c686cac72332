//! FLASH_ATTN_EXT with F16/F32 K and V, optional F16/F32 mask, ALiBi and soft-capping.
//!
//! Per output row (query `iq`, head `h`): scores for every KV position (masked −∞
//! positions skipped), max over the rest, weights `exp(s − max)` summed in 16 lanes by
//! position, `Σ w·v` accumulated in position order, then scaled by `1/Σw`. Identical to
//! [`crate::reference`]'s definition; padding the KV length with masked positions leaves
//! the result bit-identical.
//!
//! The positions between the first and the last unmasked one are handled in 16-aligned
//! lane order, masked ones as score −∞ (weight exactly `+0`, which leaves a lane sum
//! unchanged); the rows of a run of unmasked positions go to the multi-row kernels
//! (`dots_f16`, `axpy_f16_rows`) when K and V are dense F16.

use ggml_core::{DType, Tensor};

use crate::exec::{KResult, NodeCtx, TView};
use crate::pool::ThreadCtx;
use crate::reference::{alibi_slope, tree16, LANES};
use crate::simd::rows_span;

/// Per-thread scratch bytes.
pub(crate) fn scratch(t: &Tensor, tensors: &[Tensor]) -> usize {
    let get = |i: usize| t.src[i].map(|s| tensors[s.index()].ne);
    let (q, k, v) = (
        get(0).unwrap_or_default(),
        get(1).unwrap_or_default(),
        get(2).unwrap_or_default(),
    );
    let (d, n_kv, dv) = (q[0], k[1], v[0]);
    let group = (q[2] / k[2].max(1)).clamp(1, MAX_JOINT);
    4 * ((group + 2) * n_kv + 3 * d + group * d.div_ceil(2) + (group + 1) * dv + 64)
}

/// Most query heads per KV head whose value sums run together.
const MAX_JOINT: usize = 8;

/// Maximal runs `[a, b)` of unmasked positions in `lo..hi`.
fn unmasked_runs(
    bias: Option<&[f32]>,
    lo: usize,
    hi: usize,
) -> impl Iterator<Item = (usize, usize)> + '_ {
    let masked = move |j: usize| bias.is_some_and(|b| b[j] == f32::NEG_INFINITY);
    let mut j = lo;
    std::iter::from_fn(move || {
        while j < hi && masked(j) {
            j += 1;
        }
        if j >= hi {
            return None;
        }
        let a = j;
        while j < hi && !masked(j) {
            j += 1;
        }
        Some((a, j))
    })
}

/// The first and one past the last unmasked position of `n`, if any.
fn unmasked_window(bias: Option<&[f32]>, n: usize) -> Option<(usize, usize)> {
    let masked = |j: usize| bias.is_some_and(|b| b[j] == f32::NEG_INFINITY);
    let lo = (0..n).find(|&j| !masked(j))?;
    let hi = 1 + (lo..n).rev().find(|&j| !masked(j)).unwrap_or(lo);
    Some((lo, hi))
}

/// `len` u16 values from row `(i1, i2, i3)` on, rows `nb[1]` bytes apart, if the tensor
/// is F16 with dense, 2-byte aligned rows.
///
/// # Safety
/// The values must lie in resolved tensor memory nobody writes meanwhile.
unsafe fn f16_rows<'a>(
    t: &TView,
    i1: usize,
    i2: usize,
    i3: usize,
    len: usize,
) -> Option<&'a [u16]> {
    let p = t.row_ptr(i1, i2, i3);
    let aligned = (p as usize).is_multiple_of(2) && t.nb[1].is_multiple_of(2);
    if t.dtype != DType::F16 || !t.rows_dense() || !aligned {
        return None;
    }
    // SAFETY: aligned F16 values in resolved memory (caller's contract).
    Some(unsafe { std::slice::from_raw_parts(p as *const u16, len) })
}

/// What one query row of one head needs to know.
#[derive(Clone, Copy)]
struct Row {
    h: usize,
    hk: usize,
    iq: usize,
    i3: usize,
}

/// The attention parameters of the node.
#[derive(Clone, Copy)]
struct Params {
    scale: f32,
    softcap: f32,
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
    let par = Params { scale, softcap };
    // Without ALiBi every head adds the same mask, so the heads of a KV head share one
    // window and weigh the same value rows: their weighted sums run together (each
    // still in its own order), converting each value row once for all of them.
    let joint = max_bias <= 0.0
        && (2..=MAX_JOINT).contains(&group)
        && v.dtype == DType::F16
        && v.rows_dense()
        && (v.ptr as usize).is_multiple_of(2)
        && v.nb[1..].iter().all(|s| s.is_multiple_of(2));
    let slots = if joint { group } else { 1 };
    let sc = c.scratch_f32();
    let (scores_all, rest) = sc.split_at_mut(slots * n_kv);
    let (mrow, rest) = rest.split_at_mut(n_kv);
    let (slope_mrow, rest) = rest.split_at_mut(n_kv);
    let (qf, rest) = rest.split_at_mut(d);
    let (krow, rest) = rest.split_at_mut(d);
    let (qh_f, rest) = rest.split_at_mut(d.div_ceil(2));
    let (vrow, rest) = rest.split_at_mut(dv);
    let (accs_all, rest) = rest.split_at_mut(slots * dv);
    let qhs_f = &mut rest[..slots * d.div_ceil(2)];
    // SAFETY: `qh_f` is a 4-byte aligned f32 area of ceil(d/2) values, reinterpreted as d
    // u16 values; it is not used as f32 anywhere.
    let qh: &mut [u16] =
        unsafe { std::slice::from_raw_parts_mut(qh_f.as_mut_ptr() as *mut u16, d) };
    // SAFETY: as `qh`: `slots` rows of ceil(d/2) f32, each row's first d u16 a query.
    let qhs: &mut [u16] =
        unsafe { std::slice::from_raw_parts_mut(qhs_f.as_mut_ptr() as *mut u16, 2 * qhs_f.len()) };
    // The joint heads' scores in one pass over the key rows, where the level can.
    let heads_dots = c.k.dots_f16_heads.filter(|_| {
        joint
            && k.dtype == DType::F16
            && k.rows_dense()
            && (k.ptr as usize).is_multiple_of(2)
            && k.nb[1..].iter().all(|s| s.is_multiple_of(2))
    });
    let v_stride = v.nb[1] / 2;
    // Destination rows are (h, iq, i3). Under a causal mask later queries see more
    // positions, so each thread takes every nth query (all heads) for an even share of
    // the work. With fewer queries than threads (generation) each query's heads are cut
    // into ranges, one per unit of work; no result depends on the split.
    let queries = dst.ne[2] * dst.ne[3];
    let splits = if queries >= th.nth {
        1
    } else {
        n_head.min(th.nth.div_ceil(queries.max(1)))
    };
    for u in (th.ith..queries * splits).step_by(th.nth.max(1)) {
        let g = u / splits;
        let (h0, h1) = NodeCtx::split(n_head, u % splits, splits);
        let (iq, i3) = (g % dst.ne[2], g / dst.ne[2]);
        if let Some(m) = mask {
            // SAFETY: a row of a resolved operand (operands never overlap the fresh
            // destination; checked through `alias`), as every read below.
            unsafe { m.read_row(iq, 0, 0, mrow) };
        }
        let shared = (max_bias <= 0.0).then(|| unmasked_window(mask.map(|_| &*mrow), n_kv));
        for hk in h0 / group..h1.div_ceil(group) {
            // The heads of KV head hk in this unit.
            let (ha, hb) = ((hk * group).max(h0), ((hk + 1) * group).min(h1));
            if joint && hb - ha >= 2 {
                let mut sums = [0f32; MAX_JOINT];
                let mut window = None;
                let bias = mask.map(|_| &*mrow);
                if let Some(f) = heads_dots {
                    let heads = Heads { ha, hb, hk, iq, i3 };
                    let (sc, sums) = (&mut *scores_all, &mut sums[..]);
                    window = joint_scores(c, f, heads, par, bias, shared, sc, sums, qf, qhs);
                } else {
                    for h in ha..hb {
                        let row = Row { h, hk, iq, i3 };
                        let scores = &mut scores_all[(h - ha) * n_kv..(h - ha + 1) * n_kv];
                        let w = head_scores(c, row, par, bias, shared, scores, qf, qh, krow);
                        if let Some((lo, hi, sum)) = w {
                            sums[h - ha] = sum;
                            window = Some((lo, hi));
                        }
                    }
                }
                let accs_all = &mut accs_all[..(hb - ha) * dv];
                accs_all.fill(0.0);
                // Every head has the shared window (or none).
                if let Some((lo, hi)) = window {
                    for (a, b) in unmasked_runs(mask.map(|_| &*mrow), lo, hi) {
                        let mut accs: [&mut [f32]; MAX_JOINT] = Default::default();
                        for (slot, acc) in accs.iter_mut().zip(accs_all.chunks_exact_mut(dv)) {
                            *slot = acc;
                        }
                        let mut ws: [&[f32]; MAX_JOINT] = [&[]; MAX_JOINT];
                        for (hs, w) in ws.iter_mut().enumerate().take(hb - ha) {
                            *w = &scores_all[hs * n_kv + a..hs * n_kv + b];
                        }
                        // SAFETY: value rows of a resolved operand; dense, aligned F16
                        // (`joint`).
                        let rows =
                            unsafe { f16_rows(&v, a, hk, i3, rows_span(b - a, v_stride, dv)) }
                                .expect("dense aligned F16 values");
                        (c.k.axpy_f16_rows)(&mut accs[..hb - ha], &ws[..hb - ha], rows, v_stride);
                    }
                }
                for (hs, acc) in accs_all.chunks_exact_mut(dv).enumerate() {
                    finish_row(&dst, acc, sums[hs], ha + hs, iq, i3);
                }
                continue;
            }
            for h in ha..hb {
                let row = Row { h, hk, iq, i3 };
                let slope = alibi_slope(max_bias, h, n_head);
                // The mask as added to scores: `slope · m` (exactly `m` for slope 1).
                let bias: Option<&[f32]> = match mask {
                    None => None,
                    Some(_) if slope == 1.0 => Some(mrow),
                    Some(_) => {
                        for (b, &m) in slope_mrow.iter_mut().zip(mrow.iter()) {
                            *b = slope * m;
                        }
                        Some(slope_mrow)
                    }
                };
                let scores = &mut scores_all[..n_kv];
                let window = head_scores(c, row, par, bias, shared, scores, qf, qh, krow);
                let acc = &mut accs_all[..dv];
                acc.fill(0.0);
                let Some((lo, hi, sum)) = window else {
                    // SAFETY: destination row (h, iq, i3), this thread's alone.
                    unsafe { dst.write_row(h, iq, i3, acc) };
                    continue;
                };
                for (a, b) in unmasked_runs(bias, lo, hi) {
                    let w = &scores_all[a..b];
                    match unsafe { f16_rows(&v, a, hk, i3, rows_span(b - a, v_stride, dv)) } {
                        Some(rows) => (c.k.axpy_f16_rows)(&mut [&mut *acc], &[w], rows, v_stride),
                        None => {
                            for (j, &wj) in (a..b).zip(w.iter()) {
                                match unsafe { v.row_f32(j, hk, i3) } {
                                    Some(vs) => (c.k.axpy_f32)(acc, wj, vs),
                                    None => {
                                        unsafe { v.read_row(j, hk, i3, vrow) };
                                        (c.k.axpy_f32)(acc, wj, vrow);
                                    }
                                }
                            }
                        }
                    }
                }
                finish_row(&dst, acc, sum, h, iq, i3);
            }
        }
    }
    Ok(())
}

/// The softmax weights of one head's query row into `scores` (`exp(s − max)` over the
/// 16-aligned window, masked positions `+0`): returns the unmasked window `[lo, hi)` and
/// the weights' sum, or `None` where every position is masked.
#[allow(clippy::too_many_arguments)]
fn head_scores(
    c: &NodeCtx<'_>,
    row: Row,
    par: Params,
    bias: Option<&[f32]>,
    shared: Option<Option<(usize, usize)>>,
    scores: &mut [f32],
    qf: &mut [f32],
    qh: &mut [u16],
    krow: &mut [f32],
) -> Option<(usize, usize, f32)> {
    let (q, k) = (c.src[0], c.src[1]);
    let Row { h, hk, iq, i3 } = row;
    let d = q.ne[0];
    let (lo, hi) = shared.unwrap_or_else(|| unmasked_window(bias, scores.len()))?;
    let lo16 = lo - lo % LANES;
    // SAFETY: a row of a resolved operand.
    unsafe { q.read_row(iq, h, i3, qf) };
    if k.dtype == DType::F16 {
        (c.k.f32_to_f16)(qf, qh);
    }
    let k_stride = k.nb[1] / 2;
    scores[lo16..hi].fill(f32::NEG_INFINITY);
    for (a, b) in unmasked_runs(bias, lo, hi) {
        let run = &mut scores[a..b];
        // SAFETY: key rows of a resolved operand.
        match unsafe { f16_rows(&k, a, hk, i3, rows_span(b - a, k_stride, d)) } {
            Some(rows) => (c.k.dots_f16)(qh, rows, k_stride, run),
            None => {
                for (j, s) in (a..b).zip(run.iter_mut()) {
                    *s = key_dot(c, &k, j, hk, i3, qf, qh, krow);
                }
            }
        }
        adjust_scores(par, bias, a, run);
    }
    Some((lo, hi, finish_scores(c, scores, lo, hi)))
}

/// Scaled, soft-capped and biased scores of positions `a ..` from raw dots.
fn adjust_scores(par: Params, bias: Option<&[f32]>, a: usize, run: &mut [f32]) {
    for (j, s) in (a..).zip(run.iter_mut()) {
        let mut x = *s * par.scale;
        if par.softcap > 0.0 {
            x = par.softcap * (x / par.softcap).tanh();
        }
        if let Some(bias) = bias {
            x += bias[j];
        }
        *s = x;
    }
}

/// The softmax weights `exp(s − max)` of the window `[lo, hi)` of `scores` (from its
/// 16-aligned start, masked positions −∞), and their sum.
fn finish_scores(c: &NodeCtx<'_>, scores: &mut [f32], lo: usize, hi: usize) -> f32 {
    // 16-aligned, so lane i of the kernels is lane j % 16 of the definition.
    let window = &mut scores[lo - lo % LANES..hi];
    let mx = (c.k.max)(window);
    (c.k.exp_shift_sum)(window, mx)
}

/// The query rows of heads `ha..hb`, which share KV head `hk` (and one mask row).
#[derive(Clone, Copy)]
struct Heads {
    ha: usize,
    hb: usize,
    hk: usize,
    iq: usize,
    i3: usize,
}

/// [`head_scores`] for the heads of `hs` at once: head `h`'s softmax weights in
/// `scores_all[(h − ha)·n_kv ..]` and their sum in `sums[h − ha]`, the key rows (dense,
/// aligned F16) read once for all of them by `dots`. Returns the shared unmasked window,
/// or `None` (sums untouched) where every position is masked.
#[allow(clippy::too_many_arguments)]
fn joint_scores(
    c: &NodeCtx<'_>,
    dots: crate::simd::DotsHeads,
    hs: Heads,
    par: Params,
    bias: Option<&[f32]>,
    shared: Option<Option<(usize, usize)>>,
    scores_all: &mut [f32],
    sums: &mut [f32],
    qf: &mut [f32],
    qhs: &mut [u16],
) -> Option<(usize, usize)> {
    let (q, k) = (c.src[0], c.src[1]);
    let Heads { ha, hb, hk, iq, i3 } = hs;
    let (d, n_kv) = (q.ne[0], k.ne[1]);
    let (lo, hi) = shared.unwrap_or_else(|| unmasked_window(bias, n_kv))?;
    let nh = hb - ha;
    // Each query's f16 values start a whole f32 of scratch after the last (see `run`).
    let dq = d.div_ceil(2) * 2;
    for h in ha..hb {
        // SAFETY: a row of a resolved operand.
        unsafe { q.read_row(iq, h, i3, qf) };
        (c.k.f32_to_f16)(qf, &mut qhs[(h - ha) * dq..][..d]);
        scores_all[(h - ha) * n_kv..][lo - lo % LANES..hi].fill(f32::NEG_INFINITY);
    }
    let k_stride = k.nb[1] / 2;
    for (a, b) in unmasked_runs(bias, lo, hi) {
        // SAFETY: key rows of a resolved operand (dense, aligned F16: the caller's filter).
        let rows = unsafe { f16_rows(&k, a, hk, i3, rows_span(b - a, k_stride, d)) }
            .expect("dense aligned F16 keys");
        let mut qs: [&[u16]; MAX_JOINT] = [&[]; MAX_JOINT];
        for (h, qh) in qs.iter_mut().enumerate().take(nh) {
            *qh = &qhs[h * dq..][..d];
        }
        let mut outs: [&mut [f32]; MAX_JOINT] = Default::default();
        for (out, sc) in outs
            .iter_mut()
            .zip(scores_all.chunks_exact_mut(n_kv))
            .take(nh)
        {
            *out = &mut sc[a..b];
        }
        dots(&qs[..nh], rows, k_stride, &mut outs[..nh]);
        for out in outs.iter_mut().take(nh) {
            adjust_scores(par, bias, a, out);
        }
    }
    for (sum, scores) in sums
        .iter_mut()
        .zip(scores_all.chunks_exact_mut(n_kv))
        .take(nh)
    {
        *sum = finish_scores(c, scores, lo, hi);
    }
    Some((lo, hi))
}

/// Scales a head's weighted sum by `1/Σw` (0 for an empty sum) and writes it as row
/// `(h, iq, i3)` of the destination.
fn finish_row(dst: &TView, acc: &mut [f32], sum: f32, h: usize, iq: usize, i3: usize) {
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for a in acc.iter_mut() {
        *a *= inv;
    }
    // SAFETY: destination row (h, iq, i3), this thread's alone.
    unsafe { dst.write_row(h, iq, i3, acc) };
}

/// The unscaled score of key row `(j, hk, i3)` for a query given as f32 (`qf`) and as f16
/// bits (`qh`, used when K is F16), for K rows the multi-row kernel cannot read.
#[allow(clippy::too_many_arguments)]
fn key_dot(
    c: &NodeCtx<'_>,
    k: &TView,
    j: usize,
    hk: usize,
    i3: usize,
    qf: &[f32],
    qh: &[u16],
    krow: &mut [f32],
) -> f32 {
    // SAFETY (reads): a row of a resolved operand tensor.
    if k.dtype == DType::F16 {
        // Same products and lanes as `dot_f16`, from the exact f32 values.
        unsafe { k.read_row(j, hk, i3, krow) };
        let mut lane = [0f32; LANES];
        for (i, (&a, &b)) in qh.iter().zip(krow.iter()).enumerate() {
            lane[i % LANES] += crate::reference::f16_to_f32(a) * b;
        }
        tree16(lane)
    } else {
        match unsafe { k.row_f32(j, hk, i3) } {
            Some(ks) => (c.k.dot_f32)(qf, ks),
            None => {
                unsafe { k.read_row(j, hk, i3, krow) };
                (c.k.dot_f32)(qf, krow)
            }
        }
    }
}
