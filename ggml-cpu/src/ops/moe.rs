//! Mixture-of-experts ops: MUL_MAT_ID, ARGSORT_TOP_K, SUM_ROWS; and ARGMAX, the
//! per-row selection greedy sampling runs on the logits.
//!
//! MUL_MAT_ID works as ggml's. Phase 0 converts every row of `b` once to the weights'
//! dot type, in the layout mul_mat's kernels read, and thread 0 groups the
//! `(slot e, token t)` pairs by expert (a counting sort of `ids`, pairs of an expert in
//! increasing `t·n_used + e`) into shared scratch, rejecting ids out of range. Phase 1
//! hands out chunks of (expert, up to [`MC`] weight rows, up to [`NC`] of the expert's
//! pairs) and runs mul_mat's tiles on them, each column reading its converted row of
//! `b` in place, each result going to `out[:, e, t]`. As in mul_mat, an expert with at
//! least [`MIN_UNPACKED_COLS`] pairs has its weight rows unpacked once per chunk of up to
//! [`NC_UNPACKED`] pairs where the level can. An expert with at least
//! [`MIN_PANEL_COLS`] pairs on a level with panel tiles runs them as mul_mat's many
//! columns do: phase 0 also writes each pair's activation row as its column of the
//! expert's panels (every thread sorts the pairs privately to know where, so no third
//! phase is needed), and phase 1 runs the outer-product tiles on chunks of up to
//! [`NC_PANEL`] pairs. A single token uses the level's matrix × vector kernel where it
//! has one. Every dot product is the same sequence of
//! operations whatever the kernel or its position in a tile (see [`crate::reference`]),
//! so a pair's result depends neither on how the tokens are routed nor on the threads.

use std::sync::atomic::Ordering;

use ggml_core::{BackendErrorKind, DType, Tensor};

use super::mul_mat::{
    activation_row, block, convert_b, convert_row, gather_a, needs_gather, operand_scratch,
    panel_chunk, prefetch, round64, store_rows, thread_scratch, thread_scratch_of, unpack_rows,
    PanelChunk, GEMV_CHUNKS, MC, MIN_PANEL_COLS, MIN_UNPACKED_COLS, NC, NC_PANEL, NC_UNPACKED,
    PF_DIST,
};
use crate::exec::{KResult, NodeCtx, TView};
use crate::pool::ThreadCtx;
use crate::reference as r;
use crate::simd::panel::{panel_bytes, scatter_column};
use crate::simd::Packer;

/// `u32`s of the expert map: `n_as + 1` offsets, `n_as` cursors, then the pairs.
fn map_words(n_as: usize, n_pairs: usize) -> usize {
    2 * n_as + 1 + n_pairs
}

/// Scratch `(shared, per thread)` bytes of MUL_MAT_ID: the expert map, `b`'s rows in
/// the largest of the layouts a level may pick, room for gathered float weights and the
/// experts' activation panels; per thread, mul_mat's (4 unpacked weight rows) and a
/// private expert map with each pair's place in it.
pub(crate) fn mul_mat_id_scratch(t: &Tensor, tensors: &[Tensor]) -> (usize, usize) {
    let (Some(a), Some(b)) = (t.src[0], t.src[1]) else {
        return (0, 0);
    };
    let (a, b) = (&tensors[a.index()], &tensors[b.index()]);
    let (n_as, n_pairs) = (a.ne[2], t.ne[1] * t.ne[2]);
    let map = round64(4 * map_words(n_as, n_pairs));
    let (panels, private) = if may_use_panels(a.dtype, n_pairs) {
        // Panels of the widest kind (bytes per panel grow with its columns): each expert
        // wastes at most one.
        let pb = panel_bytes(a.dtype, a.ne[0], MIN_PANEL_COLS);
        let panels = (n_pairs.div_ceil(MIN_PANEL_COLS) + n_as) * pb;
        (
            round64(panels),
            round64(4 * (map_words(n_as, n_pairs) + n_pairs)),
        )
    } else {
        (0, 0)
    };
    (
        map + operand_scratch(a, b, tensors) + panels,
        round64(thread_scratch(a)) + private,
    )
}

/// Whether a product of weights `w` over `n_pairs` pairs may run experts on panel tiles
/// (where the level has them): the scratch has room for the panels then.
fn may_use_panels(w: DType, n_pairs: usize) -> bool {
    w.is_weight_quant() && n_pairs >= MIN_PANEL_COLS
}

/// Expert id `(e, t)` of the resolved I32 `ids`.
fn expert_id(ids: TView, e: usize, t: usize) -> i32 {
    let p = ids.ptr.wrapping_add(e * ids.nb[0] + t * ids.nb[1]);
    // SAFETY: element (e, t) of the resolved I32 ids tensor; nobody writes it now.
    unsafe { (p as *const i32).read_unaligned() }
}

/// Counting sort of the pairs `p = t·n_used + e` by expert `ids[e, t]` into `map`.
fn group_by_expert(ids: TView, n_as: usize, map: &mut [u32]) -> KResult {
    let (n_used, n_tok) = (ids.ne[0], ids.ne[1]);
    let (off, rest) = map.split_at_mut(n_as + 1);
    let (cur, pairs) = rest.split_at_mut(n_as);
    let id = |e: usize, t: usize| expert_id(ids, e, t);
    off.fill(0);
    for t in 0..n_tok {
        for e in 0..n_used {
            let x = id(e, t);
            if x < 0 || x as usize >= n_as {
                return Err((BackendErrorKind::BadData, "expert id out of range"));
            }
            off[x as usize + 1] += 1;
        }
    }
    for x in 0..n_as {
        off[x + 1] += off[x];
    }
    cur.copy_from_slice(&off[..n_as]);
    for t in 0..n_tok {
        for e in 0..n_used {
            let x = id(e, t) as usize;
            pairs[cur[x] as usize] = (t * n_used + e) as u32;
            cur[x] += 1;
        }
    }
    Ok(())
}

/// Panels of the pairs of each expert with at least [`MIN_PANEL_COLS`] of them (one
/// panel per `cols` pairs), or 0 for an expert whose pairs run on the other kernels.
fn panels_of(off: &[u32], x: usize, cols: usize) -> usize {
    let n = (off[x + 1] - off[x]) as usize;
    if n >= MIN_PANEL_COLS {
        n.div_ceil(cols)
    } else {
        0
    }
}

/// Phase 0's conversion of `b` when experts may run on panels: each of this thread's
/// rows of `b` (quantised to the dot type of `w`) goes as a column into the panels, at
/// shared byte `poff`, of every expert with panels that a pair reading it goes to (pair
/// `p` of expert `x` at place `c` in its list is column `c % cols` of the expert's panel
/// `c / cols`, the experts' panels one after the other), and, where a pair reading it
/// goes to an expert without panels, into row `r` of the tiles' layout (`packer`, `vrs`
/// bytes a row from `boff`) as `convert_b` would. Each thread sorts the pairs privately
/// into the end of its scratch (the same sort as the shared map's) to find the places.
#[allow(clippy::too_many_arguments)]
fn convert_b_expert_panels(
    c: &NodeCtx<'_>,
    th: &ThreadCtx<'_>,
    w: DType,
    b: TView,
    ids: TView,
    n_as: usize,
    cols: usize,
    poff: usize,
    (boff, vrs, packer): (usize, usize, Option<Packer>),
    private_at: usize,
) -> KResult {
    let k = b.ne[0];
    let (n_used, n_tok, b1) = (ids.ne[0], ids.ne[1], b.ne[1]);
    let n_pairs = n_used * n_tok;
    let vdt = w.vec_dot_type();
    let pbytes = panel_bytes(w, k, cols);
    let (conv, private) = c.scratch_bytes().split_at_mut(private_at);
    let (fpart, qrow) = conv.split_at_mut(4 * (k + 16));
    // SAFETY: the thread scratch is 64-byte aligned; its first 4(k + 16) bytes as f32.
    let sc = unsafe { std::slice::from_raw_parts_mut(fpart.as_mut_ptr() as *mut f32, k + 16) };
    let qrow = &mut qrow[..vdt.row_size(k).unwrap_or(0)];
    let n_words = map_words(n_as, n_pairs) + n_pairs;
    if private.len() < 4 * n_words {
        return Err((
            BackendErrorKind::Device,
            "MUL_MAT_ID scratch too small for the private expert map (bug in ggml-cpu)",
        ));
    }
    // SAFETY: `private_at` is a multiple of 64 (`mul_mat_id_scratch`), so the private area
    // is u32-aligned; it holds the map and the places (length checked above).
    let words =
        unsafe { std::slice::from_raw_parts_mut(private.as_mut_ptr() as *mut u32, n_words) };
    let (map, place) = words.split_at_mut(map_words(n_as, n_pairs));
    group_by_expert(ids, n_as, map)?;
    let (off, rest) = map.split_at_mut(n_as + 1);
    let (first_panel, pairs) = rest.split_at_mut(n_as);
    for (i, &p) in pairs.iter().enumerate() {
        place[p as usize] = i as u32;
    }
    let mut next = 0usize;
    for (x, fp) in first_panel.iter_mut().enumerate() {
        *fp = next as u32;
        next += panels_of(off, x, cols);
    }
    let (r0, r1) = NodeCtx::split(b.nrows(), th.ith, th.nth);
    for r in r0..r1 {
        let (j, t, i3) = b.row_index(r);
        let xr = activation_row(b, (j, t, i3), sc);
        // The pairs of token t whose slot reads row j.
        let (mut quantised, mut packed) = (false, false);
        for e in (j..n_used).step_by(b1) {
            let x = expert_id(ids, e, t) as usize;
            if panels_of(off, x, cols) == 0 {
                if !packed {
                    // SAFETY: row r of the tiles' activation area of the shared scratch,
                    // written by this thread only (rows are split between threads).
                    let out =
                        unsafe { std::slice::from_raw_parts_mut(c.wdata.add(boff + r * vrs), vrs) };
                    convert_row(c, xr, out, vdt, packer);
                    packed = true;
                }
                continue;
            }
            if !quantised {
                (c.k.quantize)(vdt, xr, qrow);
                quantised = true;
            }
            let col = (place[t * n_used + e] - off[x]) as usize;
            let at = poff + (first_panel[x] as usize + col / cols) * pbytes;
            // SAFETY: the panel lies in the panel area of the shared scratch (sized by
            // `mul_mat_id_scratch` for every expert's panels); its column col % cols
            // belongs to pair (e, t) alone, whose row only this thread converts.
            unsafe { scatter_column(w, qrow, k, cols, col % cols, c.wdata.add(at)) };
        }
    }
    Ok(())
}

/// Phase `phase` (0: convert and group, 1: products) of MUL_MAT_ID on this thread.
pub(crate) fn mul_mat_id(c: &NodeCtx<'_>, th: &ThreadCtx<'_>, phase: usize) -> KResult {
    let (dst, a, b, ids) = (c.dst, c.src[0], c.src[1], c.src[2]);
    let k = a.ne[0];
    let (m_all, n_as) = (a.ne[1], a.ne[2]);
    let (n_used, n_tok, b1) = (dst.ne[1], dst.ne[2], b.ne[1]);
    let n_pairs = n_used * n_tok;
    let vdt = a.dtype.vec_dot_type();
    let gemv = if n_tok == 1 {
        (c.k.gemv)(a.dtype)
    } else {
        None
    };
    // Many pairs: experts with enough of them run the level's panel tiles, if it has any.
    let panel = match gemv {
        None if may_use_panels(a.dtype, n_pairs) => (c.k.panel)(a.dtype),
        _ => None,
    };
    let packer = match gemv {
        Some(g) => Some(g.pack),
        None => (c.k.pack)(a.dtype),
    };
    let vrs = match packer {
        Some(p) => (p.row_bytes)(k),
        None => vdt.row_size(k).unwrap_or(0),
    };
    let map_bytes = round64(4 * map_words(n_as, n_pairs));
    let boff = map_bytes;
    let aoff = boff + round64(b.nrows() * vrs);
    let gather = needs_gather(a.dtype, a.ne, a.nb, a.ptr as u64);
    let ars = a.dtype.row_size(k).unwrap_or(0);
    // The experts' panels, after the gathered weights (quantised weights, the only ones
    // with panels, are never gathered).
    let poff = aoff
        + if gather {
            round64(a.ne[1] * a.ne[2] * ars)
        } else {
            0
        };
    if phase == 0 {
        if th.ith == 0 {
            // SAFETY: the map area at the start of the shared scratch (u32-aligned: the
            // scratch is 64-byte aligned); only thread 0 touches it in phase 0.
            let map = unsafe {
                std::slice::from_raw_parts_mut(c.wdata as *mut u32, map_words(n_as, n_pairs))
            };
            group_by_expert(ids, n_as, map)?;
        }
        match panel {
            Some(pn) => {
                let private_at = round64(thread_scratch_of(a.dtype, k));
                let tiles = (boff, vrs, packer);
                convert_b_expert_panels(
                    c, th, a.dtype, b, ids, n_as, pn.cols, poff, tiles, private_at,
                )?;
            }
            None => convert_b(c, th, b, boff, vdt, vrs, packer),
        }
        if gather {
            gather_a(c, th, a, aoff, ars);
        }
        return Ok(());
    }
    let Some(tile) = (c.k.mm)(a.dtype) else {
        return Err((
            BackendErrorKind::UnsupportedOp,
            "no kernel for this weight dtype",
        ));
    };
    // SAFETY: the map written by thread 0 in phase 0 (the barrier after it published
    // it); read-only now.
    let map =
        unsafe { std::slice::from_raw_parts(c.wdata as *const u32, map_words(n_as, n_pairs)) };
    let (off, pairs) = (&map[..n_as + 1], &map[2 * n_as + 1..]);
    // One token: about GEMV_CHUNKS chunks per thread, as mul_mat.
    let mc = if n_tok == 1 {
        ((m_all * n_pairs).div_ceil(th.nth * GEMV_CHUNKS).div_ceil(4) * 4).max(32)
    } else {
        MC
    };
    let m_chunks = m_all.div_ceil(mc);
    let wrow = |x: usize, m: usize| -> *const u8 {
        if gather {
            c.wdata.wrapping_add(aoff + (x * m_all + m) * ars) as *const u8
        } else {
            a.row_ptr(m, x, 0) as *const u8
        }
    };
    let dense = gather || a.nb[1] == ars;
    // Pair `p`'s slot and token `(e, t)`, and the byte offset of its output column
    // `out[:, e, t]`.
    let slot_token = |p: usize| (p % n_used, p / n_used);
    let out_col = |(e, t): (usize, usize)| e * dst.nb[1] + t * dst.nb[2];
    // The converted row of `b` that pair `p` multiplies (on the tiles), and its output
    // column's offset.
    let column = |p: usize| -> (&[u8], usize) {
        let (e, t) = slot_token(p);
        let row = t * b1 + e % b1;
        // SAFETY: row `row` of the converted activations written in phase 0 (published
        // by the barrier; a pair on the tiles had its row converted); read-only now.
        let y = unsafe { std::slice::from_raw_parts(c.wdata.add(boff + row * vrs), vrs) };
        (y, out_col((e, t)))
    };
    // Weight rows unpacked once per chunk for experts with enough pairs, as mul_mat.
    let unpacked = if gemv.is_none() {
        (c.k.unpacked)(a.dtype)
    } else {
        None
    };
    let pairs_of = |x: usize| (off[x + 1] - off[x]) as usize;
    let panel_cols = panel.map_or(1, |pn| pn.cols);
    let panel_expert = |x: usize| panel.is_some() && panels_of(off, x, panel_cols) > 0;
    let unpack_expert = |x: usize| unpacked.is_some() && pairs_of(x) >= MIN_UNPACKED_COLS;
    // A chunk's pairs: up to NC for the tiles (NC_UNPACKED with unpacked weight rows,
    // NC_PANEL with panels), one for the matrix × vector kernel.
    let nc_of = |x: usize| {
        if gemv.is_some() {
            1
        } else if panel_expert(x) {
            NC_PANEL
        } else if unpack_expert(x) {
            NC_UNPACKED
        } else {
            NC
        }
    };
    let chunks_of = |x: usize| m_chunks * pairs_of(x).div_ceil(nc_of(x));
    let urb = crate::simd::unpacked_row_bytes(a.dtype, k);
    let uscratch: &mut [u8] = match (unpacked, panel) {
        (None, None) => &mut [],
        _ => c.scratch_bytes(),
    };
    let mut out = [0f32; 16];
    // Chunks go by expert, then block of its pairs, then block of weight rows; `x`,
    // `base` (its first chunk) and `first_panel` (its first panel) follow the expert of
    // the chunks this thread takes, whose numbers only grow.
    let (mut x, mut base, mut first_panel) = (0usize, 0usize, 0usize);
    // One token: each thread streams its own run of chunks (see `crate::runs`), as dense
    // matrix × vector products do; the chunks of one expert's pair are its weight rows in
    // order, so a run's prefetch goes on from one chunk into the next.
    let total: usize = (0..n_as).map(chunks_of).sum();
    let mut runs = gemv.is_some().then(|| c.runs.take(total, th.ith));
    // The prefetch's next address, kept across the chunks of this thread's own run.
    let mut pf = 0usize;
    loop {
        let (ch, own_end) = match runs.as_mut() {
            Some(r) => match r.next() {
                Some(t) => (t.chunk, t.own_end),
                None => break,
            },
            None => match c.chunk.fetch_add(1, Ordering::Relaxed) {
                ch if ch < total => (ch, None),
                _ => break,
            },
        };
        // A chunk taken from the back of another thread's run can lie before the last.
        if ch < base {
            (x, base, first_panel) = (0, 0, 0);
        }
        let mut n_x = chunks_of(x);
        while ch >= base + n_x && x + 1 < n_as {
            base += n_x;
            first_panel += panels_of(off, x, panel_cols);
            x += 1;
            n_x = chunks_of(x);
        }
        let nc = nc_of(x);
        let local = ch - base;
        let (mi, ni) = (local % m_chunks, local / m_chunks);
        let p0 = off[x] as usize + ni * nc;
        let p1 = (p0 + nc).min(off[x + 1] as usize);
        let (m0, m1) = (mi * mc, ((mi + 1) * mc).min(m_all));
        // Keep the next PF_DIST bytes of the chunk's weight rows in flight while the
        // first block of columns runs, as mul_mat does: up to the chunk's end, or for a
        // chunk of this thread's own run, up to where that run leaves these rows.
        let run_end = match own_end {
            Some(e) if e - 1 < base + n_x && (e - 1 - base) / m_chunks == ni => {
                ((e - 1 - base) % m_chunks + 1) * mc
            }
            Some(_) => m_all,
            None => m1,
        };
        let (start, pf_end) = (wrow(x, m0) as usize, wrow(x, run_end.min(m_all)) as usize);
        if !(start..=pf_end).contains(&pf) {
            pf = start;
        }
        // Before rows `.. m_end` run: keep the next PF_DIST bytes after them in flight.
        let mut prefetch_past = |m_end: usize| {
            if dense {
                let want = (wrow(x, m_end) as usize + PF_DIST).min(pf_end);
                while pf < want {
                    prefetch(pf as *const u8);
                    pf += 64;
                }
            }
        };
        // Weight rows `m .. m + nrows` of expert `x`.
        let weight_rows = |m: usize, nrows: usize| -> [&[u8]; 4] {
            let mut rows: [&[u8]; 4] = [&[]; 4];
            for (rr, row) in rows.iter_mut().enumerate().take(nrows) {
                // SAFETY: a dense weight row of `ars` bytes: in the resolved weight
                // tensor, or gathered in phase 0; nobody writes it now.
                *row = unsafe { std::slice::from_raw_parts(wrow(x, m + rr), ars) };
            }
            rows
        };
        // The converted rows and output offsets of pairs `q .. q + ncols` of the chunk.
        let columns = |q: usize, ncols: usize| -> ([&[u8]; 4], [usize; 4]) {
            let mut brows: [&[u8]; 4] = [&[]; 4];
            let mut cols = [0usize; 4];
            for cc in 0..ncols {
                (brows[cc], cols[cc]) = column(pairs[q + cc] as usize);
            }
            (brows, cols)
        };
        let store = |out: &[f32; 16], m: usize, nrows: usize, cols: &[usize]| {
            for rr in 0..nrows {
                for (cc, col) in cols.iter().enumerate() {
                    let o = dst.ptr.wrapping_add((m + rr) * dst.nb[0] + col);
                    // SAFETY: output element (m + rr, e, t) of column cc's pair: inside
                    // the resolved destination, written only by the thread owning this
                    // chunk.
                    unsafe { (o as *mut f32).write_unaligned(out[rr * 4 + cc]) };
                }
            }
        };
        if let (Some(pn), true) = (panel, panel_expert(x)) {
            // As mul_mat's panels: each group of 4 weight rows is unpacked once, then runs
            // against every panel of the chunk, 2 panels at a time.
            let cols = pn.cols;
            let pbytes = panel_bytes(a.dtype, k, cols);
            let panel_at = |q: usize| -> &[u8] {
                let at = poff + (first_panel + q) * pbytes;
                // SAFETY: panel q of expert x, written in phase 0 (the barrier after it
                // published it); read-only now.
                unsafe { std::slice::from_raw_parts(c.wdata.add(at), pbytes) }
            };
            let weight_row = |r: usize| -> &[u8] {
                // SAFETY: a dense weight row of `ars` bytes in the resolved weight tensor;
                // nobody writes it now.
                unsafe { std::slice::from_raw_parts(wrow(x, r), ars) }
            };
            // The chunk's columns: its places in the expert's list of pairs.
            let chunk = PanelChunk {
                rows: (m0, m1),
                cols: (p0 - off[x] as usize, p1 - off[x] as usize),
            };
            // The output columns' offsets, one division each per chunk.
            let mut col_off = [0usize; NC_PANEL];
            let first = off[x] as usize + chunk.cols.0;
            for (i, o) in col_off.iter_mut().enumerate().take(p1 - p0) {
                *o = out_col(slot_token(pairs[first + i] as usize));
            }
            let c0 = chunk.cols.0;
            panel_chunk(
                pn,
                a.dtype,
                k,
                chunk,
                weight_row,
                panel_at,
                uscratch,
                &mut prefetch_past,
                |m, nrows, c, v| {
                    let col = dst.ptr.wrapping_add(m * dst.nb[0] + col_off[c - c0]);
                    // SAFETY: output elements (m .. m + nrows, e, t) of the column's pair:
                    // inside the resolved destination, written only by the thread owning
                    // this chunk.
                    unsafe { store_rows(col, dst.nb[0], &v[..nrows]) };
                },
            );
            continue;
        }
        if let (Some(u), true) = (unpacked, unpack_expert(x)) {
            // Each group of 4 weight rows is unpacked once, then runs against every
            // pair of the chunk.
            let mut m = m0;
            while m < m1 {
                let nrows = (m1 - m).min(4);
                prefetch_past(m + nrows);
                let src = weight_rows(m, nrows);
                let arows = unpack_rows(u, a.dtype, k, &src[..nrows], uscratch, urb);
                let mut q = p0;
                while q < p1 {
                    let ncols = (p1 - q).min(4);
                    let (brows, cols) = columns(q, ncols);
                    (u.tile)(a.dtype, k, &arows[..nrows], &brows[..ncols], &mut out);
                    store(&out, m, nrows, &cols[..ncols]);
                    q += ncols;
                }
                m += nrows;
            }
            continue;
        }
        let mut q = p0;
        while q < p1 {
            let ncols = (p1 - q).min(4);
            let (brows, cols) = columns(q, ncols);
            let mut m = m0;
            while m < m1 {
                let nrows = (m1 - m).min(4);
                prefetch_past(m + nrows);
                let arows = weight_rows(m, nrows);
                block(
                    gemv,
                    tile,
                    a.dtype,
                    k,
                    &arows[..nrows],
                    &brows[..ncols],
                    &mut out,
                );
                store(&out, m, nrows, &cols[..ncols]);
                m += nrows;
            }
            q += ncols;
        }
    }
    Ok(())
}

/// A key whose ascending order is [`r::top_k_order`]: larger numbers first, `-0` and
/// `+0` equal, NaN (any payload) last.
#[inline]
fn top_k_key(v: f32) -> u32 {
    if v.is_nan() {
        return u32::MAX;
    }
    // Adding +0 turns -0 into +0 and changes nothing else.
    let b = (v + 0.0).to_bits();
    let ascending = if b >> 31 == 1 { !b } else { b | 1 << 31 };
    // At most !0x007f_ffff (for -inf), below the NaN key.
    !ascending
}

/// ARGSORT_TOP_K: each row's `(key, index)` pairs as u64, partially selected and sorted.
/// The pairs are distinct, so any (unstable) algorithm gives the reference's stable order.
pub(crate) fn argsort_top_k(c: &NodeCtx<'_>, th: &ThreadCtx<'_>, k: usize) -> KResult {
    let (dst, a) = (c.dst, c.src[0]);
    let n = a.ne[0];
    let sc = c.scratch_f32();
    let (kbuf, rest) = sc.split_at_mut(2 * n);
    let xs = &mut rest[..n];
    // SAFETY: every bit pattern is a valid u64; the thread scratch is 64-byte aligned, so
    // the first 2n f32 are n aligned u64 (checked by align_to_mut's split).
    let (pre, keys, _) = unsafe { kbuf.align_to_mut::<u64>() };
    if !pre.is_empty() || keys.len() < n {
        return Err((
            BackendErrorKind::Device,
            "misaligned scratch (bug in ggml-cpu)",
        ));
    }
    let keys = &mut keys[..n];
    let (r0, r1) = NodeCtx::split(dst.nrows(), th.ith, th.nth);
    for row in r0..r1 {
        let (i1, i2, i3) = dst.row_index(row);
        // SAFETY: a row of the resolved source, which nobody writes during this node
        // unless it shares bytes with the destination (then it is copied first).
        let x: &[f32] = match unsafe { a.row_f32(i1, i2, i3) } {
            Some(s) if !c.alias[0] => s,
            _ => {
                unsafe { a.read_row(i1, i2, i3, xs) };
                xs
            }
        };
        for (i, (kk, &v)) in keys.iter_mut().zip(x).enumerate() {
            *kk = (u64::from(top_k_key(v)) << 32) | i as u64;
        }
        if k < n {
            keys.select_nth_unstable(k - 1);
        }
        keys[..k].sort_unstable();
        let out = dst.row_ptr(i1, i2, i3);
        for (j, &kk) in keys[..k].iter().enumerate() {
            let p = out.wrapping_add(j * dst.nb[0]);
            // SAFETY: element j of this thread's destination row (I32, resolved).
            unsafe { (p as *mut i32).write_unaligned(kk as u32 as i32) };
        }
    }
    Ok(())
}

/// SUM_ROWS: [`r::sum_row`] of each row (an f64 running sum, so no vector lanes).
pub(crate) fn sum_rows(c: &NodeCtx<'_>, th: &ThreadCtx<'_>) -> KResult {
    for_each_row_of_src0(c, th, |x, out| {
        let v = r::sum_row(x);
        // SAFETY: element 0 of this thread's row of the resolved F32 destination.
        unsafe { c.dst.set(out, 0, v) };
    });
    Ok(())
}

/// Calls `f` with each of this thread's rows of source 0 as f32 (read into the thread's
/// scratch where it is not contiguous F32 or shares bytes with the destination) and
/// the start of the destination row at the same index.
fn for_each_row_of_src0(c: &NodeCtx<'_>, th: &ThreadCtx<'_>, mut f: impl FnMut(&[f32], *mut u8)) {
    let (dst, a) = (c.dst, c.src[0]);
    let xs = c.scratch_f32();
    let (r0, r1) = NodeCtx::split(dst.nrows(), th.ith, th.nth);
    for row in r0..r1 {
        let (i1, i2, i3) = dst.row_index(row);
        // SAFETY: a row of the resolved source, which nobody writes during this node
        // unless it shares bytes with the destination (then it is copied first).
        let x: &[f32] = match unsafe { a.row_f32(i1, i2, i3) } {
            Some(s) if !c.alias[0] => s,
            _ => {
                unsafe { a.read_row(i1, i2, i3, xs) };
                &xs[..a.ne[0]]
            }
        };
        f(x, dst.row_ptr(i1, i2, i3));
    }
}

/// Lanes of [`argmax_lanes`]: element `i` is scanned by lane `i % ARGMAX_LANES`.
const ARGMAX_LANES: usize = 8;

/// Whether candidate `(v, i)` beats `(bv, bi)` in [`r::argmax_row`]'s order: a larger
/// value, or an equal one at a lower index. NaN compares false, so it never beats
/// anything; `-0 == +0`, so zeros of both signs tie.
#[inline]
fn argmax_beats(v: f32, i: usize, bv: f32, bi: usize) -> bool {
    v > bv || (v == bv && i < bi)
}

/// [`r::argmax_row`] with [`ARGMAX_LANES`] independent lanes, then a combine. Every
/// non-NaN element is a candidate and the order of [`argmax_beats`] is total on
/// them, so the winner is the lowest index of the maximum whatever the combine order:
/// the scan's result unless `x[0]` is NaN (then the scan never moves: 0).
pub(crate) fn argmax_lanes(x: &[f32]) -> i32 {
    let mut bv = [f32::NEG_INFINITY; ARGMAX_LANES];
    let mut bi = [usize::MAX; ARGMAX_LANES];
    let mut chunks = x.chunks_exact(ARGMAX_LANES);
    for (c, chunk) in chunks.by_ref().enumerate() {
        for l in 0..ARGMAX_LANES {
            let i = c * ARGMAX_LANES + l;
            if argmax_beats(chunk[l], i, bv[l], bi[l]) {
                (bv[l], bi[l]) = (chunk[l], i);
            }
        }
    }
    let tail0 = x.len() - chunks.remainder().len();
    for (l, &v) in chunks.remainder().iter().enumerate() {
        if argmax_beats(v, tail0 + l, bv[l], bi[l]) {
            (bv[l], bi[l]) = (v, tail0 + l);
        }
    }
    let (mut v, mut i) = (bv[0], bi[0]);
    for l in 1..ARGMAX_LANES {
        if argmax_beats(bv[l], bi[l], v, i) {
            (v, i) = (bv[l], bi[l]);
        }
    }
    // No candidate (all NaN) or a NaN first element: the scan stays at 0.
    if i == usize::MAX || x.first().is_some_and(|f| f.is_nan()) {
        0
    } else {
        i as i32
    }
}

/// ARGMAX: [`argmax_lanes`] of each row into the I32 column.
pub(crate) fn argmax(c: &NodeCtx<'_>, th: &ThreadCtx<'_>) -> KResult {
    for_each_row_of_src0(c, th, |x, out| {
        let v = argmax_lanes(x);
        // SAFETY: element 0 of this thread's row of the resolved I32 destination.
        unsafe { (out as *mut i32).write_unaligned(v) };
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The u64 keys order every pair of values as the reference's comparator does.
    #[test]
    fn top_k_key_is_the_reference_order() {
        let mut v = vec![
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xffff_ffff),
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            -f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::from_bits(0x8000_0001),
            0.0,
            -0.0,
            1.0,
            -1.0,
            1.5,
            0.25,
        ];
        v.extend((0..200).map(|i| (i as f32 - 100.0) * 0.37));
        for &a in &v {
            for &b in &v {
                assert_eq!(
                    top_k_key(a).cmp(&top_k_key(b)),
                    r::top_k_order(a, b),
                    "{a:e} vs {b:e}"
                );
            }
        }
    }
}
