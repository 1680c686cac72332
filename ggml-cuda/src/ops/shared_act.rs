//! Launching a run of prompt-class products that read one activation
//! ([`SharedAct`](crate::fusion::SharedAct)): one `quantize_q8_1`, then each product on
//! its Q8_1 blocks.

use ggml_core::{BackendResult, Tensor, TensorId};

use super::matmul::{mul_mat_on, quantize_shared};
use super::{check, run, Ctx};
use crate::backend::{CudaBackend, State};
use crate::fusion::SharedAct;

/// Enqueues run `r` of `nodes`, or node by node where a product is not supported or its
/// output overlaps the activation (which the later products would then read changed,
/// while the unfused nodes would quantise it again: the run must see what they see).
pub(crate) fn run_shared_act(
    be: &CudaBackend,
    st: &mut State,
    tensors: &[Tensor],
    nodes: &[TensorId],
    r: SharedAct,
) -> BackendResult<()> {
    let ids: Vec<TensorId> = r.products[..r.n as usize]
        .iter()
        .map(|&o| nodes[o as usize])
        .collect();
    if !fusable(be, st, tensors, &ids) {
        return nodes.iter().try_for_each(|&id| run(be, st, tensors, id));
    }
    let mut c = Ctx {
        be,
        st,
        tensors,
        node: &tensors[ids[0].index()],
    };
    let q = quantize_shared(&mut c)?;
    for id in ids {
        let node = &tensors[id.index()];
        let mut c = Ctx {
            be,
            st,
            tensors,
            node,
        };
        mul_mat_on(&mut c, node, Some(q))?;
    }
    Ok(())
}

/// Whether every product passes the support check, every tensor is in this backend's
/// memory, and no product's output overlaps the activation.
fn fusable(be: &CudaBackend, st: &State, tensors: &[Tensor], ids: &[TensorId]) -> bool {
    let span = |t: &Tensor| {
        be.tensor_range(st, t, 0, t.nbytes())
            .ok()
            .map(|a| (a, a + t.nbytes() as u64))
    };
    let node = |id: TensorId| &tensors[id.index()];
    let Some(x) = node(ids[0]).src[1].and_then(|a| span(&tensors[a.index()])) else {
        return false;
    };
    ids.iter().all(|&id| {
        check(tensors, id).is_ok() && span(node(id)).is_some_and(|o| o.1 <= x.0 || x.1 <= o.0)
    })
}
