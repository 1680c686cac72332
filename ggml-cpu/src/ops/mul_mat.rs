//! MUL_MAT: F32, F16, BF16 and block-quantised weights times F32 activations.
//!
//! Phase 0 converts every activation row to the weights' dot type (`vec_dot_type`:
//! Q8_0, Q8_1, Q8_K, F16, BF16 or F32) into shared scratch, and gathers weights whose
//! rows are not dense into dense rows; it does nothing where the product before left
//! the same activations converted for the same weight dtype there (Q, K and V of one
//! norm, gate and up: `NodeCtx::converted`). Phase 1 hands out chunks of the output (weight
//! rows × activation rows × batch) through an atomic counter; each chunk runs tiles of
//! up to 4 × 4 dot products. With at least 16 activation columns and quantised weights,
//! a level with panel tiles ([`crate::simd::panel`]: AVX-512 VNNI, AVX2) gets the
//! activations as panels of 16 (AVX2: 8) interleaved columns instead, and runs
//! outer-product tiles of 4 weight rows (unpacked once per chunk) × 2 panels. A single activation column runs
//! the level's matrix × vector kernel (`gemv`, with its own activation layout) where it
//! has one, on up to 4 rows at a time, and each thread takes a contiguous run of the
//! chunks ([`crate::runs`]) so that its prefetch streams the weights without a restart
//! at every chunk. Every dot product has the same operations whatever the kernel, tile,
//! chunk or thread (see [`crate::reference`]), so the split never shows in the result.

use std::sync::atomic::Ordering;

use ggml_core::{DType, Tensor};

use crate::exec::{KResult, NodeCtx, TView};
use crate::pool::ThreadCtx;
use crate::reference::f32_to_bf16;
use crate::simd::panel::{kp_row_bytes, panel_bytes, scatter_column, Panel, PANEL_ROWS};
use crate::simd::{Gemv, MmTile, Unpacked};

/// Weight rows per chunk.
pub(crate) const MC: usize = 64;
/// Activation rows per chunk.
pub(crate) const NC: usize = 16;
/// Activation rows per chunk when the weight rows are unpacked first: more columns share
/// each unpacking.
pub(crate) const NC_UNPACKED: usize = 128;
/// Fewest activation rows for which weight rows are unpacked first.
pub(crate) const MIN_UNPACKED_COLS: usize = 8;
/// Activation rows per chunk with panel tiles (16 panels of 16, or 32 of 8 columns): each
/// group of weight rows is unpacked once per chunk.
pub(crate) const NC_PANEL: usize = 256;
/// Fewest activation rows for which the level's panel tiles run (a panel of 16 columns
/// costs the same whatever number of them are real).
pub(crate) const MIN_PANEL_COLS: usize = 16;
/// Chunks per thread when there is one activation column.
pub(crate) const GEMV_CHUNKS: usize = 8;

/// Whether quantised weights of `d` are supported.
pub(crate) fn quant_supported(d: DType) -> bool {
    d.is_weight_quant()
}

/// Whether float weights must be gathered into dense, aligned rows first.
pub(crate) fn needs_gather(dtype: DType, ne: [usize; 4], nb: [usize; 4], addr: u64) -> bool {
    if dtype.is_quantized() {
        return false;
    }
    let ts = dtype.type_size();
    (ne[0] > 1 && nb[0] != ts)
        || !addr.is_multiple_of(ts as u64)
        || nb[1..].iter().any(|&s| !s.is_multiple_of(ts))
}

/// The address of a tensor's first byte as far as the graph knows it (a view's root's
/// address plus its offset), or 1 (misaligned for every float dtype, so that scratch for
/// a gather is reserved) where no address is set yet.
pub(crate) fn data_addr(t: &Tensor, tensors: &[Tensor]) -> u64 {
    let own = t.data.map(|d| d.addr);
    let view = || {
        let root = tensors.get(t.view_src?.index())?.data?;
        root.addr.checked_add(t.view_offs as u64)
    };
    own.or_else(view).unwrap_or(1)
}

pub(crate) fn round64(n: usize) -> usize {
    n.div_ceil(64) * 64
}

/// Shared scratch bytes for the activations `b` in either layout (standard or packed) of
/// the dot products with weights `a`, and for `a`'s rows where they must be gathered.
pub(crate) fn operand_scratch(a: &Tensor, b: &Tensor, tensors: &[Tensor]) -> usize {
    let k = a.ne[0];
    let vrs = a
        .dtype
        .vec_dot_type()
        .row_size(k)
        .unwrap_or(0)
        .max(crate::simd::packed_row_bytes(k));
    let mut wb = round64(b.nrows() * vrs);
    if a.dtype.is_weight_quant() {
        // Activation panels (`crate::simd::panel`), for levels with panel tiles.
        wb = wb.max(round64(panels_bytes(a.dtype, b.ne, k, MIN_PANEL_COLS)));
    }
    let wa = if needs_gather(a.dtype, a.ne, a.nb, data_addr(a, tensors)) {
        round64(a.nrows() * a.dtype.row_size(k).unwrap_or(0))
    } else {
        0
    };
    wb + wa
}

/// Scratch `(shared, per thread)` bytes.
pub(crate) fn scratch(t: &Tensor, tensors: &[Tensor], _nth: usize) -> (usize, usize) {
    let (Some(a), Some(b)) = (t.src[0], t.src[1]) else {
        return (0, 0);
    };
    let (a, b) = (&tensors[a.index()], &tensors[b.index()]);
    (operand_scratch(a, b, tensors), thread_scratch(a))
}

/// Per-thread scratch bytes of a product with weights `a`: a row of f32 for conversions
/// (and, for quantised weights, its quantised row on the way into a panel), or 4 unpacked
/// weight rows.
pub(crate) fn thread_scratch(a: &Tensor) -> usize {
    thread_scratch_of(a.dtype, a.ne[0])
}

/// [`thread_scratch`] for weights of dtype `w` and rows of `k` values.
pub(crate) fn thread_scratch_of(w: DType, k: usize) -> usize {
    let mut unpacked = if w.is_quantized() {
        4 * crate::simd::unpacked_row_bytes(w, k)
    } else {
        0
    };
    if w.is_weight_quant() {
        let convert = 4 * (k + 16) + w.vec_dot_type().row_size(k).unwrap_or(0);
        unpacked = unpacked.max(PANEL_ROWS * kp_row_bytes(w, k)).max(convert);
    }
    (4 * (k + 16)).max(unpacked)
}

/// Bytes of the activation panels of `cols` columns of activations of shape `ne` (rows of
/// `k` values) for weights of dtype `w`: a whole number of panels per matrix (at most
/// `cols = MIN_PANEL_COLS`, the widest, wastes the most).
pub(crate) fn panels_bytes(w: DType, ne: [usize; 4], k: usize, cols: usize) -> usize {
    ne[1].div_ceil(cols) * ne[2] * ne[3] * panel_bytes(w, k, cols)
}

pub(crate) fn run(c: &NodeCtx<'_>, th: &ThreadCtx<'_>, phase: usize) -> KResult {
    let (dst, a, b) = (c.dst, c.src[0], c.src[1]);
    let k = a.ne[0];
    let vdt = a.dtype.vec_dot_type();
    // A single activation column uses the matrix × vector kernel where there is one.
    let gemv = if dst.ne[1] == 1 {
        (c.k.gemv)(a.dtype)
    } else {
        None
    };
    // Many activation columns: the level's outer-product panel tiles where it has them.
    let panel = if gemv.is_none() && dst.ne[1] >= MIN_PANEL_COLS {
        (c.k.panel)(a.dtype)
    } else {
        None
    };
    let packer = match gemv {
        Some(g) => Some(g.pack),
        None => (c.k.pack)(a.dtype),
    };
    let vrs = match packer {
        Some(p) => (p.row_bytes)(k),
        None => vdt.row_size(k).unwrap_or(0),
    };
    let wb = match panel {
        Some(pn) => round64(panels_bytes(a.dtype, b.ne, k, pn.cols)),
        None => round64(b.nrows() * vrs),
    };
    let gather = needs_gather(a.dtype, a.ne, a.nb, a.ptr as u64);
    let ars = a.dtype.row_size(k).unwrap_or(0);
    if phase == 0 {
        // Unless the product before converted the same activations for the same weight
        // dtype (NodeCtx::converted): the scratch holds these bytes already.
        if !c.converted {
            match panel {
                Some(pn) => convert_b_panels(c, th, a.dtype, b, pn.cols),
                None => convert_b(c, th, b, 0, vdt, vrs, packer),
            }
        }
        if gather {
            gather_a(c, th, a, wb, ars);
        }
        return Ok(());
    }
    let Some(tile) = (c.k.mm)(a.dtype) else {
        return Err((
            ggml_core::BackendErrorKind::UnsupportedOp,
            "no kernel for this weight dtype",
        ));
    };
    let (m_all, n_all) = (dst.ne[0], dst.ne[1]);
    let batches = dst.ne[2] * dst.ne[3];
    let (r2, r3) = (b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]);
    // One column: about GEMV_CHUNKS chunks per thread, so that few chunks start with
    // weights that the prefetch (which stays inside a chunk) has not brought in yet.
    let mc = if n_all == 1 {
        (m_all.div_ceil(th.nth * GEMV_CHUNKS).div_ceil(4) * 4).max(32)
    } else {
        MC
    };
    // Several columns: weight rows unpacked once per chunk where the level can.
    // Not for a few columns: unpacking a row costs about as much as one column's dots
    // (Gemma 3's K-quant products at generation ran 22 % slower with it on 1 thread).
    let unpacked = if gemv.is_none() && panel.is_none() && n_all >= MIN_UNPACKED_COLS {
        (c.k.unpacked)(a.dtype)
    } else {
        None
    };
    let nc = match (panel, unpacked) {
        (Some(_), _) => NC_PANEL,
        (None, Some(_)) => NC_UNPACKED,
        (None, None) => NC,
    };
    let (m_chunks, n_chunks) = (m_all.div_ceil(mc), n_all.div_ceil(nc));
    let total = m_chunks * n_chunks * batches;
    let mut out = [0f32; 16];
    let urb = crate::simd::unpacked_row_bytes(a.dtype, k);
    let uscratch: &mut [u8] = match (panel, unpacked) {
        (None, None) => &mut [],
        _ => c.scratch_bytes(),
    };
    // One column: each thread streams its own run of chunks (see `crate::runs`).
    let mut runs = (n_all == 1).then(|| c.runs.take(total, th.ith));
    // The prefetch's next address; it runs on across chunks of this thread's own run.
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
        let mi = ch % m_chunks;
        let ni = (ch / m_chunks) % n_chunks;
        let bi = ch / (m_chunks * n_chunks);
        let (i2, i3) = (bi % dst.ne[2], bi / dst.ne[2]);
        let (a2, a3) = (i2 / r2, i3 / r3);
        let (m0, m1) = (mi * mc, ((mi + 1) * mc).min(m_all));
        let (n0, n1) = (ni * nc, ((ni + 1) * nc).min(n_all));
        // When the chunk's weight rows are contiguous, keep the next PF_DIST bytes of
        // them in flight while the first block of columns runs (the later blocks find
        // them in the caches).
        let wrow = |m: usize| -> *const u8 {
            if gather {
                let row = (a3 * a.ne[2] + a2) * a.ne[1] + m;
                c.wdata.wrapping_add(wb + row * ars) as *const u8
            } else {
                a.row_ptr(m, a2, a3) as *const u8
            }
        };
        let dense = gather || a.nb[1] == ars;
        // The prefetch stops at the chunk's end, or for a chunk of this thread's own run
        // at that run's end in this batch.
        let run_end = match own_end {
            Some(e) if (e - 1) / (m_chunks * n_chunks) == bi => ((e - 1) % m_chunks + 1) * mc,
            Some(_) => m_all,
            None => m1,
        };
        let (start, pf_end) = (wrow(m0) as usize, wrow(run_end.min(m_all)) as usize);
        if !(start..=pf_end).contains(&pf) {
            pf = start;
        }
        // Before rows `.. m_end` run: keep the next PF_DIST bytes after them in flight.
        let mut prefetch_past = |m_end: usize| {
            if dense && PREFETCHES {
                let want = (wrow(m_end) as usize + PF_DIST).min(pf_end);
                while pf < want {
                    prefetch(pf as *const u8);
                    pf += 64;
                }
            }
        };
        let base = dst.ptr.wrapping_add(i2 * dst.nb[2] + i3 * dst.nb[3]);
        let store = |out: &[f32; 16], m: usize, nrows: usize, n: usize, ncols: usize| {
            for cc in 0..ncols {
                let col = base.wrapping_add(m * dst.nb[0] + (n + cc) * dst.nb[1]);
                if nrows == 4 && dst.nb[0] == 4 {
                    // The column's 4 results are adjacent: one 16-byte store.
                    let v = [out[cc], out[4 + cc], out[8 + cc], out[12 + cc]];
                    // SAFETY: output elements (m..m+4, n+cc, i2, i3): inside the resolved
                    // destination, written only by the thread owning this chunk.
                    unsafe { (col as *mut [f32; 4]).write_unaligned(v) };
                    continue;
                }
                for r in 0..nrows {
                    let p = col.wrapping_add(r * dst.nb[0]);
                    // SAFETY: output element (m+r, n+cc, i2, i3): as above.
                    unsafe { (p as *mut f32).write_unaligned(out[r * 4 + cc]) };
                }
            }
        };
        let brow = |n: usize| -> &[u8] {
            let row = (i3 * b.ne[2] + i2) * b.ne[1] + n;
            // SAFETY: row `row` of the converted activations written in phase 0 (the
            // barrier after it published them); read-only now.
            unsafe { std::slice::from_raw_parts(c.wdata.add(row * vrs), vrs) }
        };
        if let Some(pn) = panel {
            // Each group of 4 weight rows is unpacked once, then runs against every
            // panel of the chunk, 2 panels at a time.
            let cols = pn.cols;
            let pbytes = panel_bytes(a.dtype, k, cols);
            let ppb = b.ne[1].div_ceil(cols);
            let panel_at = |p: usize| -> &[u8] {
                let at = ((i3 * b.ne[2] + i2) * ppb + p) * pbytes;
                // SAFETY: panel p of this matrix's activations, written in phase 0 (the
                // barrier after it published them); read-only now.
                unsafe { std::slice::from_raw_parts(c.wdata.add(at), pbytes) }
            };
            let weight_row = |r: usize| -> &[u8] {
                // SAFETY: as `arows` below: a dense weight row of `ars` bytes that nobody
                // writes now.
                unsafe { std::slice::from_raw_parts(wrow(r), ars) }
            };
            let chunk = PanelChunk {
                rows: (m0, m1),
                cols: (n0, n1),
            };
            panel_chunk(
                pn,
                a.dtype,
                k,
                chunk,
                weight_row,
                panel_at,
                uscratch,
                &mut prefetch_past,
                |m, nrows, n, v| {
                    let col = base.wrapping_add(m * dst.nb[0] + n * dst.nb[1]);
                    // SAFETY: output elements (m..m+nrows, n, i2, i3): inside the resolved
                    // destination, written only by this chunk's thread.
                    unsafe { store_rows(col, dst.nb[0], &v[..nrows]) };
                },
            );
            continue;
        }
        if let Some(u) = unpacked {
            // Each group of 4 weight rows is unpacked once, then runs against every
            // column of the chunk.
            let mut m = m0;
            while m < m1 {
                let nrows = (m1 - m).min(4);
                prefetch_past(m + nrows);
                let mut src: [&[u8]; 4] = [&[]; 4];
                for (r, row) in src.iter_mut().enumerate().take(nrows) {
                    // SAFETY: as `arows` below: a dense weight row of `ars` bytes that
                    // nobody writes now.
                    *row = unsafe { std::slice::from_raw_parts(wrow(m + r), ars) };
                }
                let arows = unpack_rows(u, a.dtype, k, &src[..nrows], uscratch, urb);
                let mut n = n0;
                while n < n1 {
                    let ncols = (n1 - n).min(4);
                    let mut brows: [&[u8]; 4] = [&[]; 4];
                    for (cc, br) in brows.iter_mut().enumerate().take(ncols) {
                        *br = brow(n + cc);
                    }
                    (u.tile)(a.dtype, k, &arows[..nrows], &brows[..ncols], &mut out);
                    store(&out, m, nrows, n, ncols);
                    n += ncols;
                }
                m += nrows;
            }
            continue;
        }
        let mut n = n0;
        while n < n1 {
            let ncols = (n1 - n).min(4);
            let mut brows: [&[u8]; 4] = [&[]; 4];
            for (cc, br) in brows.iter_mut().enumerate().take(ncols) {
                *br = brow(n + cc);
            }
            let mut m = m0;
            while m < m1 {
                let nrows = (m1 - m).min(4);
                prefetch_past(m + nrows);
                let mut arows: [&[u8]; 4] = [&[]; 4];
                for (r, ar) in arows.iter_mut().enumerate().take(nrows) {
                    let p = wrow(m + r);
                    // SAFETY: a dense weight row of `ars` bytes: in the resolved weight
                    // tensor, or gathered in phase 0; nobody writes it now.
                    *ar = unsafe { std::slice::from_raw_parts(p, ars) };
                }
                block(
                    gemv,
                    tile,
                    a.dtype,
                    k,
                    &arows[..nrows],
                    &brows[..ncols],
                    &mut out,
                );
                store(&out, m, nrows, n, ncols);
                m += nrows;
            }
            n += ncols;
        }
    }
    Ok(())
}

/// Unpacks the weight rows `src` (at most 4, of dtype `w`, `k` values each) with `u` into
/// `scratch`, `urb` (`unpacked_row_bytes(w, k)`) bytes each, and gives them as the rows of
/// an unpacked tile.
pub(super) fn unpack_rows<'s>(
    u: Unpacked,
    w: DType,
    k: usize,
    src: &[&[u8]],
    scratch: &'s mut [u8],
    urb: usize,
) -> [&'s [u8]; 4] {
    for (row, out) in src.iter().zip(scratch.chunks_exact_mut(urb)) {
        (u.unpack)(w, k, row, out);
    }
    let scratch: &'s [u8] = scratch;
    let mut rows: [&[u8]; 4] = [&[]; 4];
    for (r, u) in rows
        .iter_mut()
        .zip(scratch.chunks_exact(urb))
        .take(src.len())
    {
        *r = u;
    }
    rows
}

/// Unpacks `nrows` (1 to 4) weight rows `src(r)` for the panel tiles into `scratch`, `krb`
/// ([`kp_row_bytes`]) bytes each; a short group repeats its first row (whose results
/// are not stored).
fn unpack_panel_rows<'s, 'w>(
    pn: Panel,
    w: DType,
    k: usize,
    nrows: usize,
    src: impl Fn(usize) -> &'w [u8],
    scratch: &'s mut [u8],
    krb: usize,
) -> [&'s [u8]; PANEL_ROWS] {
    for (r, out) in scratch.chunks_exact_mut(krb).take(nrows).enumerate() {
        (pn.unpack)(w, k, src(r), out);
    }
    let scratch: &'s [u8] = scratch;
    std::array::from_fn(|r| {
        let r = if r < nrows { r } else { 0 };
        &scratch[r * krb..(r + 1) * krb]
    })
}

/// The weight rows `rows.0 .. rows.1` and panel columns `cols.0 .. cols.1` of a chunk
/// for [`panel_chunk`] (the columns start at a panel's first).
pub(super) struct PanelChunk {
    pub rows: (usize, usize),
    pub cols: (usize, usize),
}

/// Runs the panel tiles of `pn` over a chunk: each group of up to 4 weight rows
/// (`weight_row(m)`, dtype `w`, `k` values) is unpacked once into `scratch`, then runs
/// against every panel of the chunk (`panel_at(q)`: columns `q·cols ..`), 2 panels at a
/// time. `prefetch_past(m_end)` runs before rows `.. m_end`; `store(m, nrows, n, v)` gets
/// the results of rows `m .. m + nrows` and column `n` (`v[r]` for row `m + r`).
#[allow(clippy::too_many_arguments)]
pub(super) fn panel_chunk<'w, 'p>(
    pn: Panel,
    w: DType,
    k: usize,
    chunk: PanelChunk,
    weight_row: impl Fn(usize) -> &'w [u8],
    panel_at: impl Fn(usize) -> &'p [u8],
    scratch: &mut [u8],
    prefetch_past: &mut impl FnMut(usize),
    mut store: impl FnMut(usize, usize, usize, &[f32]),
) {
    let (cols, krb) = (pn.cols, kp_row_bytes(w, k));
    let ((m0, m1), (n0, n1)) = (chunk.rows, chunk.cols);
    let (q0, q1) = (n0 / cols, n1.div_ceil(cols));
    // Every tile writes all the entries it is read back at.
    let mut pout = [0f32; 128];
    let mut m = m0;
    while m < m1 {
        let nrows = (m1 - m).min(PANEL_ROWS);
        prefetch_past(m + nrows);
        let rows = unpack_panel_rows(pn, w, k, nrows, |r| weight_row(m + r), scratch, krb);
        let mut q = q0;
        while q < q1 {
            let np = (q1 - q).min(2);
            let ps = [panel_at(q), panel_at(q + np - 1)];
            (pn.tile)(w, k, &rows, &ps[..np], &mut pout);
            for pp in 0..np {
                let col0 = (q + pp) * cols;
                for cc in 0..cols.min(n1 - col0) {
                    store(m, nrows, col0 + cc, &pout[(pp * cols + cc) * 4..][..4]);
                }
            }
            q += np;
        }
        m += nrows;
    }
}

/// Writes `v[r]` as f32 at `col + r·nb0`: one 16-byte store for 4 adjacent values.
///
/// # Safety
/// Each `col + r·nb0` (r < `v.len()`) is a writable f32 that no one else accesses now.
#[inline]
pub(super) unsafe fn store_rows(col: *mut u8, nb0: usize, v: &[f32]) {
    if v.len() == 4 && nb0 == 4 {
        // SAFETY: caller's contract (the 4 values are adjacent).
        unsafe { (col as *mut [f32; 4]).write_unaligned([v[0], v[1], v[2], v[3]]) };
        return;
    }
    for (r, &x) in v.iter().enumerate() {
        // SAFETY: caller's contract.
        unsafe { (col.wrapping_add(r * nb0) as *mut f32).write_unaligned(x) };
    }
}

/// Converts the rows of `b` (split between threads) to the dot type of weights `w` and
/// writes each as its column of the activation panels of `cols` columns
/// (`crate::simd::panel`): matrix `(i2, i3)`'s row `i1` is column `i1 % cols` of its
/// panel `i1 / cols`, the matrices' panels one after the other.
fn convert_b_panels(c: &NodeCtx<'_>, th: &ThreadCtx<'_>, w: DType, b: TView, cols: usize) {
    let k = b.ne[0];
    let vdt = w.vec_dot_type();
    let (pbytes, ppb) = (panel_bytes(w, k, cols), b.ne[1].div_ceil(cols));
    let (r0, r1) = NodeCtx::split(b.nrows(), th.ith, th.nth);
    let (fpart, qrow) = c.scratch_bytes().split_at_mut(4 * (k + 16));
    // SAFETY: the thread scratch is 64-byte aligned; its first 4(k + 16) bytes as f32.
    let sc = unsafe { std::slice::from_raw_parts_mut(fpart.as_mut_ptr() as *mut f32, k + 16) };
    let qrow = &mut qrow[..vdt.row_size(k).unwrap_or(0)];
    for r in r0..r1 {
        let (i1, i2, i3) = b.row_index(r);
        let x = activation_row(b, (i1, i2, i3), sc);
        (c.k.quantize)(vdt, x, qrow);
        let at = ((i3 * b.ne[2] + i2) * ppb + i1 / cols) * pbytes;
        // SAFETY: the panel lies in the activation area of the shared scratch
        // (`panels_bytes`); column i1 % cols of it belongs to row r, which only this thread
        // converts.
        unsafe { scatter_column(w, qrow, k, cols, i1 % cols, c.wdata.add(at)) };
    }
}

/// `out[r * 4 + c] = dot(arows[r], brows[c])`: by the matrix × vector kernel when there is
/// one (a single activation column), else by the tile kernel.
pub(super) fn block(
    gemv: Option<Gemv>,
    tile: MmTile,
    w: DType,
    k: usize,
    arows: &[&[u8]],
    brows: &[&[u8]],
    out: &mut [f32; 16],
) {
    match gemv {
        Some(g) => {
            let mut o = [0f32; 4];
            (g.rows)(k, arows, brows[0], &mut o);
            for (r, v) in o.iter().enumerate() {
                out[r * 4] = *v;
            }
        }
        None => tile(w, k, arows, brows, out),
    }
}

/// Whether [`prefetch`] does anything on this target (elsewhere the prefetch loop is
/// skipped: counting addresses for a no-op cost aarch64 a tenth of a generated token's
/// instructions).
const PREFETCHES: bool = cfg!(target_arch = "x86_64");

/// Bytes of weights prefetched ahead of the tile being computed.
pub(crate) const PF_DIST: usize = 4096;

/// Hints the CPU to bring the cache line at `p` into the caches.
///
/// The hint is T1 (L2 and outer levels), not T0: weights are streamed from DRAM once per
/// token, and a T0 prefetch holds one of the core's few L1 miss buffers for the whole
/// DRAM latency; the kernels stalled on the prefetch itself. On Zen 4, SmolLM2 Q4_1 tg128
/// with 2 threads went from about 130 to 146 tokens/s (same run, alternated), while a
/// matrix × vector product alone (the criterion benches) stays within ±6 %; 1, 2, 6, 8
/// and 16 KiB distances, the T2 hint and no prefetch at all were no better (issue 22).
#[inline(always)]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint; it never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T1)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Converts the rows of `b` (split between threads) to the dot type's layout: row `r`
/// at scratch byte `off + r * vrs`.
pub(crate) fn convert_b(
    c: &NodeCtx<'_>,
    th: &ThreadCtx<'_>,
    b: TView,
    off: usize,
    vdt: DType,
    vrs: usize,
    packer: Option<crate::simd::Packer>,
) {
    let (r0, r1) = NodeCtx::split(b.nrows(), th.ith, th.nth);
    let sc = c.scratch_f32();
    for r in r0..r1 {
        let x = activation_row(b, b.row_index(r), sc);
        // SAFETY: row r of the activation area of the shared scratch, written by this
        // thread only (rows are split between threads).
        let out = unsafe { std::slice::from_raw_parts_mut(c.wdata.add(off + r * vrs), vrs) };
        convert_row(c, x, out, vdt, packer);
    }
}

/// One activation row `x` in the dot type `vdt` (or `packer`'s layout, if given) into
/// `out`.
pub(super) fn convert_row(
    c: &NodeCtx<'_>,
    x: &[f32],
    out: &mut [u8],
    vdt: DType,
    packer: Option<crate::simd::Packer>,
) {
    if let Some(p) = packer {
        (p.pack)(x, out);
        return;
    }
    match vdt {
        DType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        DType::F16 => {
            // SAFETY: scratch rows are 2-byte aligned (64-byte base, even row size).
            let o16 =
                unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u16, x.len()) };
            (c.k.f32_to_f16)(x, o16);
        }
        DType::BF16 => {
            for (o, &v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&f32_to_bf16(v).to_le_bytes());
            }
        }
        _ => (c.k.quantize)(vdt, x, out),
    }
}

/// Row `(i1, i2, i3)` of the activations `b` as f32: in place where it is dense f32, else
/// converted into `sc` (at least `b.ne[0]` values).
pub(super) fn activation_row(
    b: TView,
    (i1, i2, i3): (usize, usize, usize),
    sc: &mut [f32],
) -> &[f32] {
    // SAFETY: a row of the resolved activations; the result never aliases them (it is a
    // fresh tensor) and phase 0 writes only scratch.
    match unsafe { b.row_f32(i1, i2, i3) } {
        Some(s) => s,
        None => {
            // SAFETY: as above; `sc` holds the row.
            unsafe { b.read_row(i1, i2, i3, sc) };
            &sc[..b.ne[0]]
        }
    }
}

/// Copies the weight rows of `a` (split between threads) into dense rows of `ars` bytes:
/// row `r` (in [`TView::row_index`] order) at scratch byte `wb + r * ars`.
pub(crate) fn gather_a(c: &NodeCtx<'_>, th: &ThreadCtx<'_>, a: TView, wb: usize, ars: usize) {
    let ts = a.dtype.type_size();
    let (r0, r1) = NodeCtx::split(a.nrows(), th.ith, th.nth);
    for r in r0..r1 {
        let (i1, i2, i3) = a.row_index(r);
        let src = a.row_ptr(i1, i2, i3);
        let dst = c.wdata.wrapping_add(wb + r * ars);
        for i0 in 0..a.ne[0] {
            // SAFETY: one element of the resolved weights into row r of the gather area of
            // the scratch, written by this thread only.
            unsafe { std::ptr::copy_nonoverlapping(src.add(i0 * a.nb[0]), dst.add(i0 * ts), ts) };
        }
    }
}
