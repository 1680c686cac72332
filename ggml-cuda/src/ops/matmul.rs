//! Matrix products (`MUL_MAT`, `MUL_MAT_ID`): the kernel class per shape and dtype, the
//! Q8_1 activations in scratch, the launches.

use ggml_core::{BackendErrorKind, BackendResult, Op, Tensor, TensorId};

use super::{dims, float_code, is_float_weight, src, strides, Ctx};
use crate::kernels::KernelId;
use crate::launch::{self, Args, MulMatClass};
use crate::qmm;
use crate::reference::{is_kernel_quant, Q8_1_BLOCK};

/// Bytes of scratch that [`run`](super::run) asks for node `id` (the Q8_1 activations of a quantised
/// product), so that `graph_compute` can size the scratch for a whole split before it
/// launches or captures anything. Must cover every `scratch` request of `run` and
/// `run_fused` (a shortfall fails the split's CUDA graph capture).
pub(crate) fn scratch_need(tensors: &[Tensor], id: TensorId) -> usize {
    let Some(t) = tensors.get(id.index()) else {
        return 0;
    };
    let (Ok(w), Ok(x)) = (src(tensors, t, 0), src(tensors, t, 1)) else {
        return 0;
    };
    if is_float_weight(w.dtype) || !is_kernel_quant(w.dtype) {
        return 0;
    }
    let row = w.ne[0] / 32 * Q8_1_BLOCK;
    match t.op {
        // qnb[2] * b3 of mul_mat.
        Op::MulMat => row * t.ne[1] * t.ne[2] * t.ne[3],
        // qnb[2] of mul_mat_id: [K/32 blocks, B1, T].
        Op::MulMatId => row * x.ne[1] * t.ne[2],
        _ => 0,
    }
}

pub(super) fn mul_mat(c: &mut Ctx<'_>, t: &Tensor) -> BackendResult<()> {
    mul_mat_on(c, t, None, None)
}

/// A residual ADD that `qgemm` computes in its epilogue: `e = out + res`.
#[derive(Clone, Copy, Debug)]
pub(super) struct ResidualAdd {
    /// The residual's address and column byte stride.
    pub res: (u64, usize),
    /// The ADD output's address and column byte stride.
    pub e: (u64, usize),
}

/// Product `t`; for a 2-D product of the tiled class on the current kernels, `shared` is
/// its activation already quantised to Q8_1 in scratch (address and strides, by
/// [`quantize_shared`] for an earlier product of the same activation), else `None`.
/// `add`: the residual ADD after it, for a product that runs on `qgemm` only (an
/// internal error otherwise).
pub(super) fn mul_mat_on(
    c: &mut Ctx<'_>,
    t: &Tensor,
    shared: Option<(u64, [usize; 3])>,
    add: Option<ResidualAdd>,
) -> BackendResult<()> {
    let w = c.src(0)?;
    let x = c.src(1)?;
    let (m, n, b2, b3) = (t.ne[0], t.ne[1], t.ne[2], t.ne[3]);
    let (r2, r3) = ((b2 / w.ne[2]) as u32, (b3 / w.ne[3]) as u32);
    let batch = b2 * b3;
    let (wa, xa, ta) = (c.addr(&w)?, c.addr(&x)?, c.addr(t)?);
    if is_float_weight(w.dtype) {
        let d = dims(launch::mul_mat(None, m, n, batch), c)?;
        let mut a = Args::new();
        a.u64(wa)
            .u64(xa)
            .u64(ta)
            .u32(float_code(w.dtype).unwrap_or(0));
        a.u32(w.ne[0] as u32)
            .u32(m as u32)
            .u32(b2 as u32)
            .u32(r2)
            .u32(r3);
        strides(&mut a, &w.nb[1..]);
        strides(&mut a, &x.nb);
        strides(&mut a, &t.nb[1..]);
        return c.launch(KernelId::MulMatF, d, &mut a);
    }
    let class = launch::mul_mat_class(n);
    // 2-D products of the tiled class: qgemm, qmm's bits with the integer dots on tensor
    // cores (the activations quantised once, as for qmm's tiles below).
    let plain_2d = batch == 1 && w.ne[2] == 1 && w.ne[3] == 1;
    if !c.st.tuning.legacy_products && c.st.tuning.qgemm && class == MulMatClass::Mmq && plain_2d {
        check_weight_alignment(c, &w, wa)?;
        let (xq, qnb) = match shared {
            Some(q) => q,
            None => quantize_to_scratch(c, &x, xa, [n, 1, 1])?,
        };
        launch_qgemm(c, &[(w, wa, *t, ta)], (xq, qnb), add)?;
        c.be.count_class(class);
        return Ok(());
    }
    if add.is_some() {
        return Err(c.fail(
            BackendErrorKind::InvalidArgument,
            "a fused residual add on a product that does not run on qgemm",
        ));
    }
    if !c.st.tuning.legacy_products {
        // The tiled class takes the activations quantised once by quantize_q8_1 (a
        // block of it would quantise all its columns again, once per block of rows);
        // the matrix-vector class quantises them in each block's prologue.
        let (xq, nbx, prequant) = match class {
            MulMatClass::Mmq => {
                let (scratch, qnb) = match shared {
                    Some(q) if plain_2d => q,
                    _ => quantize_to_scratch(c, &x, xa, [n, b2, b3])?,
                };
                (scratch, qnb, true)
            }
            MulMatClass::Mmvq => (xa, [x.nb[1], x.nb[2], x.nb[3]], false),
        };
        let call = qmm::Call {
            x: xq,
            nbx,
            prequant,
            k: w.ne[0],
            n,
            b2,
            r2: r2 as usize,
            r3: r3 as usize,
            ny: n.div_ceil(launch::qmm_columns(n)),
            nz: batch,
            mats: one_matrix(&w, wa, m, t, ta),
            nbwb: [w.nb[2], w.nb[3]],
            nbdb: [t.nb[2], t.nb[3]],
            norm: None,
            epi: qmm::Epilogue::None,
            ids: None,
            rope: None,
        };
        check_weight_alignment(c, &w, wa)?;
        c.launch_qmm(&call)?;
        c.be.count_class(class);
        return Ok(());
    }
    // First generation: quantise the activations to Q8_1 in scratch, then the dp4a
    // kernel.
    let k = w.ne[0];
    let nchunks = k / 32;
    let (scratch, qnb) = quantize_to_scratch(c, &x, xa, [n, b2, b3])?;

    let d = dims(launch::mul_mat(Some(class), m, n, batch), c)?;
    let mut a = Args::new();
    a.u64(wa)
        .u64(scratch)
        .u64(ta)
        .u32(w.dtype.ggml_id())
        .u32(nchunks as u32);
    a.u32(m as u32).u32(n as u32).u32(b2 as u32).u32(r2).u32(r3);
    strides(&mut a, &w.nb[1..]);
    strides(&mut a, &qnb);
    strides(&mut a, &t.nb[1..]);
    let kid = match class {
        MulMatClass::Mmvq => KernelId::Mmvq,
        MulMatClass::Mmq => KernelId::Mmq,
    };
    c.launch(kid, d, &mut a)?;
    c.be.count_class(class);
    Ok(())
}

/// Quantises the f32 activations `x` (at `xa`, rows of K = `x.ne[0]` values, `rows`
/// = [N, B2, B3] of them) to Q8_1 in scratch with `quantize_q8_1`: the scratch address
/// and its byte strides of dims 1..3.
/// `qgemm` for up to 3 products `(weights, their address, output, its address)` of one
/// activation, already quantised to Q8_1 at `xq` (address and strides), in one launch:
/// blocks of the first matrix's rows, then the second's, then the third's. `add`: a
/// residual ADD of a single product's output (an internal error with more).
pub(super) fn launch_qgemm(
    c: &mut Ctx<'_>,
    mats: &[(Tensor, u64, Tensor, u64)],
    (xq, qnb): (u64, [usize; 3]),
    add: Option<ResidualAdd>,
) -> BackendResult<()> {
    let Some((w0, _, t0, _)) = mats.first() else {
        return Err(c.fail(BackendErrorKind::InvalidArgument, "qgemm without a matrix"));
    };
    if mats.len() > 3 || (add.is_some() && mats.len() > 1) {
        return Err(c.fail(
            BackendErrorKind::InvalidArgument,
            "qgemm takes 3 matrices at most, and a residual add with one only",
        ));
    }
    let (k, n) = (w0.ne[0], t0.ne[1]);
    // Each matrix's first block: the running sum of their row-block counts.
    let mut starts = [0u32; 4];
    for (i, (w, ..)) in mats.iter().enumerate() {
        let blocks = dims(launch::qgemm(w.ne[1], n, k / 32), c)?.grid.0;
        starts[i + 1] = starts[i]
            .checked_add(blocks)
            .ok_or_else(|| c.fail(BackendErrorKind::InvalidArgument, "qgemm grid too large"))?;
    }
    let total = starts[mats.len()];
    let mut d = dims(launch::qgemm(w0.ne[1], n, k / 32), c)?;
    d.grid.0 = total;
    let mut a = Args::new();
    a.u64(xq).usize(qnb[0]).u32((k / 32) as u32).u32(n as u32);
    let matrix = |a: &mut Args, (w, wa, t, ta): &(Tensor, u64, Tensor, u64)| {
        a.u64(*wa)
            .u32(w.dtype.ggml_id() | (w.dtype.type_size() as u32) << 8)
            .u32(w.ne[1] as u32)
            .usize(w.nb[1]);
        a.u64(*ta).usize(t.nb[1]);
    };
    matrix(&mut a, &mats[0]);
    let add = add.map_or([(0, 0); 2], |r| [r.res, r.e]);
    for (addr, stride) in add {
        a.u64(addr).usize(stride);
    }
    // Matrices 1 and 2 start at their first block (the grid's end when absent).
    a.u32(if mats.len() > 1 { starts[1] } else { total });
    a.u32(if mats.len() > 2 { starts[2] } else { total });
    for i in 1..3 {
        match mats.get(i) {
            Some(m) => matrix(&mut a, m),
            None => {
                a.u64(0).u32(0).u32(0).usize(0);
                a.u64(0).usize(0);
            }
        }
    }
    c.launch(KernelId::Qgemm, d, &mut a)
}

/// The activation (operand 1) of the product `c` names quantised to Q8_1 in scratch, as
/// [`mul_mat_on`] does for a 2-D product of the tiled class: for the other products of a
/// run that read the same activation.
pub(super) fn quantize_shared(c: &mut Ctx<'_>) -> BackendResult<(u64, [usize; 3])> {
    let x = c.src(1)?;
    let xa = c.addr(&x)?;
    quantize_to_scratch(c, &x, xa, [x.ne[1], 1, 1])
}

/// Scratch for the Q8_1 blocks of a `[k, n, b2, b3]` activation, the rows packed: its
/// address and the byte strides of dims 1..3, as `mul_mat_on` takes them.
pub(super) fn q8_1_scratch(
    c: &mut Ctx<'_>,
    k: usize,
    [n, b2, b3]: [usize; 3],
) -> BackendResult<(u64, [usize; 3])> {
    let row = k / 32 * Q8_1_BLOCK;
    let qnb = [row, row * n, row * n * b2];
    let scratch = c.be.scratch(c.st, qnb[2] * b3)?;
    Ok((scratch, qnb))
}

fn quantize_to_scratch(
    c: &mut Ctx<'_>,
    x: &Tensor,
    xa: u64,
    [n, b2, b3]: [usize; 3],
) -> BackendResult<(u64, [usize; 3])> {
    let k = x.ne[0];
    let nchunks = k / 32;
    let (scratch, qnb) = q8_1_scratch(c, k, [n, b2, b3])?;
    let dq = dims(launch::quantize_q8_1(k, n, b2 * b3), c)?;
    let mut a = Args::new();
    a.u64(xa).u64(scratch).u32(nchunks as u32).u32(b2 as u32);
    strides(&mut a, &x.nb[1..]);
    strides(&mut a, &qnb);
    c.launch(KernelId::QuantizeQ8_1, dq, &mut a)?;
    Ok((scratch, qnb))
}

/// The matrices of a product call with one weight matrix: the `m` rows of `w` (at
/// `wa`) into `t` (at `ta`).
fn one_matrix(w: &Tensor, wa: u64, m: usize, t: &Tensor, ta: u64) -> [Option<qmm::Matrix>; 3] {
    let mat = qmm::Matrix {
        w: wa,
        dtype: w.dtype,
        m,
        nbw: w.nb[1],
        d: ta,
        nbd: t.nb[1],
    };
    [Some(mat), None, None]
}

/// `qmm` reads weight rows with loads as wide as their block size allows: their address
/// and strides must be multiples of it (GGUF and every ggml allocator align far more).
pub(super) fn check_weight_alignment(c: &Ctx<'_>, w: &Tensor, addr: u64) -> BackendResult<()> {
    let a = qmm::weight_alignment(w.dtype);
    let ok = addr % a as u64 == 0 && w.nb[1..].iter().all(|s| s % a == 0);
    if ok {
        Ok(())
    } else {
        Err(c.fail(
            BackendErrorKind::InvalidArgument,
            "quantised weight rows are not aligned to their block size (up to 16 bytes)",
        ))
    }
}

/// MUL_MAT_ID: for quantised experts the activation rows are quantised to Q8_1 as
/// mul_mat does (one row per (e mod B1, t)), then `mmvq_id`; float experts go straight
/// to `mul_mat_f_id`. Both compute every output with mul_mat's own per-row dot, so a
/// token's result is the mul_mat of its expert bit for bit. Each warp reads its id and
/// checks it against n_as on the GPU: a bad id sets this launch's error word (no
/// read outside the experts, nothing written for it) and the next `synchronize` returns
/// `BadData` naming the node. That costs one load and compare per warp, and no host
/// round trip.
pub(super) fn mul_mat_id(c: &mut Ctx<'_>, t: &Tensor) -> BackendResult<()> {
    let w = c.src(0)?;
    let x = c.src(1)?;
    let ids = c.src(2)?;
    let (m, n_used, tokens) = (t.ne[0], t.ne[1], t.ne[2]);
    let (b1, n_as) = (x.ne[1], w.ne[2]);
    let d = dims(launch::mul_mat_id(m, n_used, tokens), c)?;
    let (wa, xa, ia, ta) = (c.addr(&w)?, c.addr(&x)?, c.addr(&ids)?, c.addr(t)?);
    let err_word = c.be.err_slot(c.st, t.op.name(), t.name);
    if is_float_weight(w.dtype) {
        let mut a = Args::new();
        a.u64(wa).u64(xa).u64(ia).u64(ta).u64(err_word);
        a.u32(float_code(w.dtype).unwrap_or(0))
            .u32(w.ne[0] as u32)
            .u32(m as u32)
            .u32(n_as as u32)
            .u32(b1 as u32);
        strides(&mut a, &w.nb[1..3]);
        strides(&mut a, &x.nb[..3]);
        strides(&mut a, &ids.nb[..2]);
        strides(&mut a, &t.nb[1..3]);
        return c.launch(KernelId::MulMatFId, d, &mut a);
    }
    if !c.st.tuning.legacy_products {
        // From MMQ_MIN_N tokens on, quantise the activation rows once (as the tiled
        // MUL_MAT does) rather than in each block of rows of each slot.
        let (xq, nbx, prequant) = if tokens >= launch::MMQ_MIN_N {
            let (scratch, qnb) = quantize_to_scratch(c, &x, xa, [b1, tokens, 1])?;
            (scratch, qnb, true)
        } else {
            (xa, [x.nb[1], x.nb[2], 0], false)
        };
        let call = qmm::Call {
            x: xq,
            nbx,
            prequant,
            k: w.ne[0],
            n: 1,
            b2: b1,
            r2: 1,
            r3: 1,
            ny: n_used,
            nz: tokens,
            mats: one_matrix(&w, wa, m, t, ta),
            nbwb: [w.nb[2], 0],
            nbdb: [t.nb[2], 0],
            norm: None,
            epi: qmm::Epilogue::None,
            ids: Some(qmm::Ids {
                ids: ia,
                nb: [ids.nb[0], ids.nb[1]],
                n_as,
                err: err_word,
            }),
            rope: None,
        };
        check_weight_alignment(c, &w, wa)?;
        return c.launch_qmm(&call);
    }
    // First generation: activations to Q8_1 in scratch: [K/32 blocks, B1, T].
    let k = w.ne[0];
    let nchunks = k / 32;
    let (scratch, qnb) = q8_1_scratch(c, k, [b1, tokens, 1])?;
    let dq = dims(launch::quantize_q8_1(k, b1, tokens), c)?;
    let mut a = Args::new();
    a.u64(xa)
        .u64(scratch)
        .u32(nchunks as u32)
        .u32(tokens as u32);
    strides(&mut a, &x.nb[1..]);
    strides(&mut a, &qnb);
    c.launch(KernelId::QuantizeQ8_1, dq, &mut a)?;

    let mut a = Args::new();
    a.u64(wa).u64(scratch).u64(ia).u64(ta).u64(err_word);
    a.u32(w.dtype.ggml_id())
        .u32(nchunks as u32)
        .u32(m as u32)
        .u32(n_as as u32)
        .u32(b1 as u32);
    strides(&mut a, &w.nb[1..3]);
    strides(&mut a, &qnb[..2]);
    strides(&mut a, &ids.nb[..2]);
    strides(&mut a, &t.nb[1..3]);
    c.launch(KernelId::MmvqId, d, &mut a)
}
