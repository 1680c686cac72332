//! Launching a fused run of decode-class quantised products
//! ([`ProductRun`](crate::fusion::ProductRun)) as one `qmm`.

use ggml_core::{BackendResult, Op, Tensor, TensorId};

use super::matmul::check_weight_alignment;
use super::{run, Ctx};
use crate::backend::{CudaBackend, State};
use crate::fusion::{ProductRun, Tail};
use crate::launch::MulMatClass;
use crate::qmm;

/// Enqueues `nodes` (a run the planner matched as `r`) as one `qmm` launch, or node by
/// node when the tensors' bytes do not allow one: a tensor outside this backend's memory,
/// or an output over bytes the launch reads or writes elsewhere (bytes a later node of
/// the run reuses from an earlier one, say, which sequential kernels allow).
pub(crate) fn run_products(
    be: &CudaBackend,
    st: &mut State,
    tensors: &[Tensor],
    nodes: &[TensorId],
    r: ProductRun,
) -> BackendResult<()> {
    match plan(be, st, tensors, nodes, r) {
        Some((call, first)) => {
            let mut c = Ctx {
                be,
                st,
                tensors,
                node: &tensors[first.index()],
            };
            for m in r.products[..r.n as usize].iter() {
                let p = &tensors[nodes[*m as usize].index()];
                let w = c.src_of(p, 0)?;
                check_weight_alignment(&c, &w, c.addr(&w)?)?;
            }
            c.launch_qmm(&call)?;
            for _ in 0..r.n {
                be.count_class(MulMatClass::Mmvq);
            }
            Ok(())
        }
        None => nodes.iter().try_for_each(|&id| run(be, st, tensors, id)),
    }
}

/// Half-open byte ranges of tensors.
fn span(addr: u64, t: &Tensor) -> (u64, u64) {
    (addr, addr + t.nbytes() as u64)
}

fn overlap(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// The launch of run `r`, and the node that names it in errors; `None` where the run must
/// go node by node.
fn plan(
    be: &CudaBackend,
    st: &State,
    tensors: &[Tensor],
    nodes: &[TensorId],
    r: ProductRun,
) -> Option<(qmm::Call, TensorId)> {
    let t = |o: u8| tensors.get(nodes.get(o as usize)?.index()).copied();
    let src = |t: &Tensor, i: usize| tensors.get(t.src[i]?.index()).copied();
    let addr = |t: &Tensor| be.tensor_range(st, t, 0, t.nbytes()).ok();
    let mut reads = Vec::new();
    let mut writes = Vec::new();

    let p0 = t(r.products[0])?;
    let act = src(&p0, 1)?;
    let (x, norm) = match r.norm {
        Some((ro, mo)) => {
            let rms = t(ro)?;
            let mul = t(mo)?;
            let Op::RmsNorm { eps } = rms.op else {
                return None;
            };
            let x = src(&rms, 0)?;
            let w = if mul.src[0] == Some(nodes[ro as usize]) {
                src(&mul, 1)?
            } else {
                src(&mul, 0)?
            };
            let (ra, ma, wa) = (addr(&rms)?, addr(&mul)?, addr(&w)?);
            writes.push(span(ra, &rms));
            writes.push(span(ma, &mul));
            reads.push(span(wa, &w));
            let norm = qmm::Norm {
                weight: wa,
                eps,
                rms: ra,
                mul: ma,
                nb1: rms.nb[1],
            };
            (x, Some(norm))
        }
        None => (act, None),
    };
    let xa = addr(&x)?;
    reads.push(span(xa, &x));

    let mut order: Vec<u8> = r.products[..r.n as usize].to_vec();
    if let Tail::Glu {
        gate_first: false, ..
    } = r.tail
    {
        order.swap(0, 1);
    }
    let mut mats = [None; 3];
    for (slot, &o) in mats.iter_mut().zip(&order) {
        let p = t(o)?;
        let w = src(&p, 0)?;
        let (wa, pa) = (addr(&w)?, addr(&p)?);
        reads.push(span(wa, &w));
        writes.push(span(pa, &p));
        *slot = Some(qmm::Matrix {
            w: wa,
            dtype: w.dtype,
            m: w.ne[1],
            nbw: w.nb[1],
            d: pa,
            nbd: p.nb[1],
        });
    }
    let epi = match r.tail {
        Tail::None => qmm::Epilogue::None,
        Tail::Add(o) => {
            let add = t(o)?;
            let p = nodes[r.products[0] as usize];
            let res = if add.src[0] == Some(p) {
                src(&add, 1)?
            } else {
                src(&add, 0)?
            };
            let (resa, ea) = (addr(&res)?, addr(&add)?);
            reads.push(span(resa, &res));
            writes.push(span(ea, &add));
            qmm::Epilogue::Add {
                res: resa,
                nbres: res.nb[1],
                e: ea,
                nbe: add.nb[1],
            }
        }
        Tail::Glu { at, .. } => {
            let g = t(at)?;
            let ga = addr(&g)?;
            writes.push(span(ga, &g));
            qmm::Epilogue::Glu {
                geglu: g.op == Op::Geglu,
                e: ga,
                nbe: g.nb[1],
            }
        }
    };
    for (i, w) in writes.iter().enumerate() {
        let clash = writes[i + 1..]
            .iter()
            .chain(&reads)
            .any(|o| overlap(*w, *o));
        if clash {
            return None;
        }
    }
    let call = qmm::Call {
        x: xa,
        nbx: [x.nb[1], x.nb[2], x.nb[3]],
        prequant: false,
        k: act.ne[0],
        n: act.ne[1],
        b2: 1,
        r2: 1,
        r3: 1,
        ny: 1,
        nz: 1,
        mats,
        nbwb: [0, 0],
        nbdb: [0, 0],
        norm,
        epi,
        ids: None,
    };
    Some((call, nodes[r.products[0] as usize]))
}
