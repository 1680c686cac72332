//! Launching a fused run of decode-class quantised products
//! ([`ProductRun`](crate::fusion::ProductRun)) as one `qmm`.

use ggml_core::{BackendResult, Op, Tensor, TensorId};

use super::matmul::check_weight_alignment;
use super::{run, Ctx};
use crate::backend::{CudaBackend, State};
use crate::fusion::{ProductRun, ProductsRope, RopeStoreParts, Tail};
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
        Some((call, first)) => launch_products(be, st, tensors, nodes, r, &call, first),
        None => nodes.iter().try_for_each(|&id| run(be, st, tensors, id)),
    }
}

/// Launches `call`, the one `qmm` of products run `r`, named by node `first` in errors.
fn launch_products(
    be: &CudaBackend,
    st: &mut State,
    tensors: &[Tensor],
    nodes: &[TensorId],
    r: ProductRun,
    call: &qmm::Call,
    first: TensorId,
) -> BackendResult<()> {
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
    c.launch_qmm(call)?;
    for _ in 0..r.n {
        be.count_class(MulMatClass::Mmvq);
    }
    Ok(())
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
    let b = build(be, st, tensors, nodes, r)?;
    apart(&b.writes, &b.reads).then_some((b.call, b.first))
}

/// Whether no written range overlaps another written range or a read one.
fn apart(writes: &[(u64, u64)], reads: &[(u64, u64)]) -> bool {
    writes
        .iter()
        .enumerate()
        .all(|(i, w)| !writes[i + 1..].iter().chain(reads).any(|o| overlap(*w, *o)))
}

/// A run's launch before its bytes are checked: the call, the node that names it, the
/// byte ranges it reads and writes (the products' outputs at `writes[products]`).
struct Built {
    call: qmm::Call,
    first: TensorId,
    reads: Vec<(u64, u64)>,
    writes: Vec<(u64, u64)>,
    products: std::ops::Range<usize>,
}

fn build(
    be: &CudaBackend,
    st: &State,
    tensors: &[Tensor],
    nodes: &[TensorId],
    r: ProductRun,
) -> Option<Built> {
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
    let first_product = writes.len();
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
    let products = first_product..first_product + order.len();
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
        rope: None,
    };
    Some(Built {
        call,
        first: nodes[r.products[0] as usize],
        reads,
        writes,
        products,
    })
}

/// Enqueues a products run with the RoPE + KV-cache store that reads it (`r`, see
/// `fusion/products_rope.rs`) as one `qmm` launch with the RoPE epilogue, or as the
/// two runs when the bytes do not allow one launch.
pub(crate) fn run_products_rope(
    be: &CudaBackend,
    st: &mut State,
    tensors: &[Tensor],
    nodes: &[TensorId],
    r: ProductsRope,
) -> BackendResult<()> {
    let at = r.rope_at as usize;
    match plan_rope(be, st, tensors, nodes, r) {
        Some((call, first)) => launch_products(be, st, tensors, nodes, r.products, &call, first),
        None => {
            run_products(be, st, tensors, &nodes[..at], r.products)?;
            super::rope_store(be, st, tensors, &nodes[at..], r.rope)
        }
    }
}

/// The launch of `r` with the RoPE epilogue; `None` where its bytes need two launches.
///
/// A product's output that a write of the rope part overlaps is dead (the allocator gave
/// its bytes to a later node of the run, so nothing after the run reads it: the model's
/// roped K takes the bytes of the Q product) and is not written; every other written
/// range must be apart from the others and from what the launch reads.
fn plan_rope(
    be: &CudaBackend,
    st: &mut State,
    tensors: &[Tensor],
    nodes: &[TensorId],
    r: ProductsRope,
) -> Option<(qmm::Call, TensorId)> {
    let at = r.rope_at as usize;
    let roles = crate::fusion::products_rope_roles(tensors, nodes, r)?;
    let Built {
        mut call,
        first,
        mut reads,
        writes,
        products,
    } = build(be, st, tensors, &nodes[..at], r.products)?;
    let parts = RopeStoreParts::of(tensors, nodes, at, r.rope)?;
    let addr = |t: &Tensor| be.tensor_range(st, t, 0, t.nbytes()).ok();
    let (k, _) = parts.k;
    let (ks, _) = parts.k_store;
    let (ka, ksa) = (addr(&k)?, addr(&ks)?);
    let mut rope_writes = vec![span(ka, &k), span(ksa, &ks)];
    let q = match &parts.q {
        Some((q, _)) => {
            let qa = addr(q)?;
            rope_writes.push(span(qa, q));
            (qa, q.nb[2])
        }
        None => (0, 0),
    };
    let v = match &parts.v_store {
        Some((vs, _)) => {
            let va = addr(vs)?;
            rope_writes.push(span(va, vs));
            Some((va, *vs))
        }
        None => None,
    };
    let (pa, ia) = (addr(&parts.pos)?, addr(&parts.idx)?);
    reads.push(span(pa, &parts.pos));
    reads.push(span(ia, &parts.idx));
    // The norm's two outputs come first in `writes` (when there is a norm), then the
    // products'.
    let overwritten = |w: &(u64, u64)| rope_writes.iter().any(|o| overlap(*w, *o));
    let mut dead = [false; 3];
    let mut norm_dead = false;
    let mut live = Vec::with_capacity(writes.len() + rope_writes.len());
    for (i, w) in writes.iter().enumerate() {
        if products.contains(&i) && overwritten(w) {
            dead[i - products.start] = true;
        } else if products.start == 2 && i < 2 && overwritten(w) {
            norm_dead |= i == 0;
            if i == 1 && !norm_dead {
                // The mul's output dead and the norm's not: the kernel writes both or
                // neither (or the norm's into the mul's bytes, below).
                return None;
            }
        } else {
            live.push(*w);
        }
    }
    let mul_dead = products.start == 2 && overwritten(&writes[1]);
    if let Some(norm) = call.norm.as_mut() {
        if norm_dead && !mul_dead {
            // x * scale goes where the mul's output goes next: one thread writes both in
            // that order, so the mul's bytes end as they should.
            norm.rms = norm.mul;
        }
    }
    live.extend(&rope_writes);
    if !apart(&live, &reads) {
        return None;
    }
    let Op::Rope(p) = k.op else {
        return None;
    };
    let rc = crate::reference::RopeConsts::new(&p);
    let store = |t: &Tensor, cache: u64, err: u64| -> Option<qmm::CacheStore> {
        Some(qmm::CacheStore {
            cache,
            nb1: t.nb[1],
            ty: super::float_code(t.dtype)?,
            rows: t.ne[1],
            err,
        })
    };
    let errk = be.err_slot(st, ks.op.name(), ks.name);
    let k_store = store(&ks, ksa, errk)?;
    let v_store = match v {
        Some((va, vs)) => {
            let errv = be.err_slot(st, vs.op.name(), vs.name);
            store(&vs, va, errv)?
        }
        None => qmm::CacheStore {
            cache: 0,
            nb1: 0,
            ty: 0,
            rows: 0,
            err: 0,
        },
    };
    call.rope = Some(qmm::Rope {
        roles,
        dead,
        norm_dead: norm_dead && mul_dead,
        pos: (pa, parts.pos.nb[0]),
        idx: (ia, parts.idx.nb[0]),
        ne0: k.ne[0],
        n_dims: p.n_dims as usize,
        consts: [rc.theta_scale, rc.freq_scale, rc.mscale],
        q,
        k: (ka, k.nb[2]),
        k_store,
        v_store,
    });
    Some((call, first))
}
