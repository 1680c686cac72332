//! Launching a run of prompt-class products that read one activation
//! ([`SharedAct`](crate::fusion::SharedAct)): the activation quantised to Q8_1 once (by
//! `quantize_q8_1`, by `rms_norm_q8_1` with the norm and its weight, or by `swiglu_q8_1`
//! with the SwiGLU), then the
//! products on those blocks: on `qgemm` in one launch (a single one with a residual ADD
//! in its epilogue), on `qmm` one launch each.

use ggml_core::{BackendResult, Op, Tensor, TensorId};

use super::matmul::{
    check_weight_alignment, launch_qgemm, mul_mat_on, q8_1_scratch, quantize_shared, ResidualAdd,
};
use super::{check, dims, run, Ctx};
use crate::backend::{CudaBackend, State};
use crate::fusion::{other_operand, SharedAct};
use crate::kernels::KernelId;
use crate::launch::MulMatClass;
use crate::launch::{self, Args};

/// Enqueues run `r` of `nodes`, or node by node where a node is not supported, a tensor
/// is outside this backend's memory, or an output overlaps bytes the run reads or writes
/// elsewhere (a product over the activation, which the unfused nodes after it would read
/// changed and quantise again: the run must compute what they compute).
pub(crate) fn run_shared_act(
    be: &CudaBackend,
    st: &mut State,
    tensors: &[Tensor],
    nodes: &[TensorId],
    r: SharedAct,
) -> BackendResult<()> {
    let node = |o: u8| &tensors[nodes[o as usize].index()];
    if !fusable(be, st, tensors, nodes, r) {
        return nodes.iter().try_for_each(|&id| run(be, st, tensors, id));
    }
    let first = node(r.products[0]);
    let q = match (r.norm, r.glu) {
        (Some((ro, mo)), _) => norm_q8_1(be, st, tensors, nodes[ro as usize], node(mo))?,
        (None, Some(go)) => swiglu_q8_1(be, st, tensors, node(go))?,
        (None, None) => quantize_shared(&mut Ctx {
            be,
            st,
            tensors,
            node: first,
        })?,
    };
    let products = &r.products[..r.n as usize];
    if st.tuning.qgemm && products.len() > 1 {
        // On qgemm the products go as one launch, each matrix's row blocks in turn.
        let mut c = Ctx {
            be,
            st,
            tensors,
            node: first,
        };
        let mut mats = Vec::with_capacity(products.len());
        for &o in products {
            let p = node(o);
            let w = c.src_of(p, 0)?;
            let wa = c.addr(&w)?;
            check_weight_alignment(&c, &w, wa)?;
            mats.push((w, wa, *p, c.addr(p)?));
        }
        launch_qgemm(&mut c, &mats, q, None)?;
        // A recorded launch counts the multiply-adds of every product it computes.
        if let Some(l) = c.st.recorded.as_mut().and_then(|r| r.last_mut()) {
            l.macs = mats
                .iter()
                .map(|(_, _, p, _)| crate::replay::node_macs(tensors, p, KernelId::Qgemm))
                .sum();
        }
        for _ in products {
            be.count_class(MulMatClass::Mmq);
        }
        return Ok(());
    }
    for &o in products {
        let p = node(o);
        let mut c = Ctx {
            be,
            st,
            tensors,
            node: p,
        };
        let add = match r.add {
            Some(ao) => {
                let e = node(ao);
                let res = other_of(tensors, e, nodes[o as usize]);
                Some(ResidualAdd {
                    res: (c.addr(&res)?, res.nb[1]),
                    e: (c.addr(e)?, e.nb[1]),
                })
            }
            None => None,
        };
        mul_mat_on(&mut c, p, Some(q), add)?;
    }
    Ok(())
}

/// `rms_norm_q8_1`: RMS_NORM `rms_id` and MUL `mul` written, and the MUL's output
/// quantised to Q8_1 in scratch: the scratch's address and strides as `mul_mat_on` takes
/// them.
fn norm_q8_1(
    be: &CudaBackend,
    st: &mut State,
    tensors: &[Tensor],
    rms_id: TensorId,
    mul: &Tensor,
) -> BackendResult<(u64, [usize; 3])> {
    let rms = &tensors[rms_id.index()];
    let mut c = Ctx {
        be,
        st,
        tensors,
        node: rms,
    };
    let Op::RmsNorm { eps } = rms.op else {
        unreachable!("the matcher checked the norm's op")
    };
    let x = c.src(0)?;
    let w = other_of(tensors, mul, rms_id);
    let (k, n) = (rms.ne[0], rms.ne[1]);
    let (scratch, qnb) = q8_1_scratch(&mut c, k, [n, 1, 1])?;
    let d = dims(launch::rms_norm_q8_1(n, k), &c)?;
    let mut a = Args::new();
    a.u64(c.addr(&x)?)
        .u64(c.addr(rms)?)
        .u64(c.addr(&w)?)
        .u64(c.addr(mul)?)
        .u64(scratch);
    a.u32(k as u32).u32(n as u32).f32(eps);
    a.usize(x.nb[1])
        .usize(rms.nb[1])
        .usize(mul.nb[1])
        .usize(qnb[0]);
    c.launch(KernelId::RmsNormQ8_1, d, &mut a)?;
    Ok((scratch, qnb))
}

/// `swiglu_q8_1`: SWIGLU `glu` written, and its output quantised to Q8_1 in scratch: the
/// scratch's address and strides as `mul_mat_on` takes them.
fn swiglu_q8_1(
    be: &CudaBackend,
    st: &mut State,
    tensors: &[Tensor],
    glu: &Tensor,
) -> BackendResult<(u64, [usize; 3])> {
    let mut c = Ctx {
        be,
        st,
        tensors,
        node: glu,
    };
    let (a, b) = (c.src(0)?, c.src(1)?);
    let (k, n) = (glu.ne[0], glu.ne[1]);
    let (scratch, qnb) = q8_1_scratch(&mut c, k, [n, 1, 1])?;
    // The grid and block of `quantize_q8_1`: a warp per Q8_1 block.
    let d = dims(launch::quantize_q8_1(k, n, 1), &c)?;
    let mut args = Args::new();
    args.u64(c.addr(&a)?)
        .u64(c.addr(&b)?)
        .u64(c.addr(glu)?)
        .u64(scratch);
    args.u32((k / 32) as u32);
    args.usize(a.nb[1])
        .usize(b.nb[1])
        .usize(glu.nb[1])
        .usize(qnb[0]);
    c.launch(KernelId::SwigluQ8_1, d, &mut args)?;
    Ok((scratch, qnb))
}

/// The operand of binary node `t` other than `id` (a norm's weight, a product's
/// residual), which the matcher found.
fn other_of(tensors: &[Tensor], t: &Tensor, id: TensorId) -> Tensor {
    let other = other_operand(t, id).expect("the matcher checked the operands");
    tensors[other.index()]
}

/// Whether every node passes the support check, every tensor is in this backend's
/// memory, and the bytes allow the run: the SwiGLU's output apart from its operands; the
/// norm's two outputs apart from each other and from what the norm reads; the products'
/// outputs apart from the shared activation, from each other and from the weights; the
/// ADD's as its comment below says.
fn fusable(
    be: &CudaBackend,
    st: &State,
    tensors: &[Tensor],
    nodes: &[TensorId],
    r: SharedAct,
) -> bool {
    let span = |t: &Tensor| {
        be.tensor_range(st, t, 0, t.nbytes())
            .ok()
            .map(|a| (a, a + t.nbytes() as u64))
    };
    let apart = |a: (u64, u64), b: (u64, u64)| a.1 <= b.0 || b.1 <= a.0;
    let id = |o: u8| nodes[o as usize];
    let node = |o: u8| &tensors[id(o).index()];
    let products = &r.products[..r.n as usize];
    let Some(act) = node(products[0]).src[1].and_then(|a| span(&tensors[a.index()])) else {
        return false;
    };
    // The SwiGLU's output apart from both operands (each lane reads its own element before
    // writing it, but a shifted overlap would let one warp read what another wrote).
    let glu_ok = match r.glu {
        None => true,
        Some(go) => {
            let g = node(go);
            let operand = |i: usize| g.src[i].and_then(|x| span(&tensors[x.index()]));
            match (span(g), operand(0), operand(1)) {
                (Some(gs), Some(a), Some(b)) => {
                    check(tensors, id(go)).is_ok() && apart(gs, a) && apart(gs, b)
                }
                _ => false,
            }
        }
    };
    let norm_ok = match r.norm {
        None => true,
        Some((ro, mo)) => {
            let (rms, mul) = (node(ro), node(mo));
            let x = rms.src[0].and_then(|x| span(&tensors[x.index()]));
            let w = span(&other_of(tensors, mul, id(ro)));
            match (span(rms), span(mul), x, w) {
                (Some(rs), Some(ms), Some(x), Some(w)) => {
                    check(tensors, id(ro)).is_ok()
                        && check(tensors, id(mo)).is_ok()
                        && [rs, ms].iter().all(|&o| apart(o, x) && apart(o, w))
                        && apart(rs, ms)
                }
                _ => false,
            }
        }
    };
    // The ADD's output is written while the product's blocks still read the weights, and
    // after its own block wrote the product: apart from both and from the residual, which
    // the product must not overwrite either (the unfused ADD reads it afterwards).
    let add_ok = match r.add {
        None => true,
        Some(ao) => {
            let p = node(products[0]);
            let e = node(ao);
            let res = span(&other_of(tensors, e, id(products[0])));
            let w = p.src[0].and_then(|w| span(&tensors[w.index()]));
            match (span(p), span(e), res, w) {
                (Some(ps), Some(es), Some(rs), Some(ws)) => {
                    check(tensors, id(ao)).is_ok()
                        && apart(es, ps)
                        && apart(es, rs)
                        && apart(es, ws)
                        && apart(ps, rs)
                }
                _ => false,
            }
        }
    };
    // The products' outputs: apart from the activation, from each other and from every
    // product's weights (one launch writes them all while its blocks still read).
    let outs: Option<Vec<(u64, u64)>> = products.iter().map(|&o| span(node(o))).collect();
    let weights: Option<Vec<(u64, u64)>> = products
        .iter()
        .map(|&o| node(o).src[0].and_then(|w| span(&tensors[w.index()])))
        .collect();
    let products_ok = match (outs, weights) {
        (Some(outs), Some(weights)) => outs.iter().enumerate().all(|(i, &o)| {
            apart(o, act)
                && outs[i + 1..].iter().all(|&p| apart(o, p))
                && weights.iter().all(|&w| apart(o, w))
        }),
        _ => false,
    };
    glu_ok
        && norm_ok
        && add_ok
        && products_ok
        && products.iter().all(|&o| check(tensors, id(o)).is_ok())
}
