//! Where to all-reduce a partial sum (tensor parallelism with split input columns).
//!
//! A matrix product whose input columns are spread over devices leaves each device with a
//! partial sum; the devices must add them up (all-reduce) before anything non-linear
//! reads the value. Reducing later gives the same value (up to rounding) when only linear
//! ops come between (a row scaling, a view, a row gather), and it can be cheaper (a
//! gather of fewer rows moves less). [`reduce_point`] walks from the partial through its consumers
//! while each is linear in it and returns the last tensor of that chain.
//!
//! The walk follows data, not node order: nodes that do not read the current tensor may
//! sit between it and its consumer (a graph interleaves independent work), and chains of
//! several MULs are followed to their end. llama.cpp's pass once stopped at the first
//! node that was not the consumer and handled one MUL only (PR 22129); the tests below
//! build both cases.

use ggml_core::{Op, Tensor, TensorFlags, TensorId};

/// How an op reads operand `j`, for the walk.
fn linear_in(t: &Tensor, j: usize, partial_like: &dyn Fn(TensorId) -> bool) -> bool {
    match t.op {
        // Reinterpretations and copies of the value.
        Op::View | Op::Reshape | Op::Permute { .. } | Op::Transpose | Op::Cont => j == 0,
        // A copy that rounds (to F16, a quant type) is not linear.
        Op::Cpy => j == 0 && t.dtype == ggml_core::DType::F32,
        Op::Scale { .. } => j == 0,
        // Row selection.
        Op::GetRows => j == 0,
        // Scaling by a factor that is the same on every device.
        Op::Mul => {
            let other = t.src[1 - j];
            other.is_some_and(|o| !partial_like(o))
        }
        _ => false,
    }
}

/// The tensor at which to all-reduce the partial sum `partial`: the end of the chain of
/// consumers that are linear in it, each the only reader of the one before. `nodes` is the
/// graph in execution order; tensors flagged OUTPUT end the walk (the caller reads them
/// whole). `depends_on_partial(x)` says whether `x` carries a partial value (so that
/// `MUL(partial, partial)`, which is not linear, stops the walk).
pub fn reduce_point(
    tensors: &[Tensor],
    nodes: &[TensorId],
    partial: TensorId,
    depends_on_partial: &dyn Fn(TensorId) -> bool,
) -> TensorId {
    let mut cur = partial;
    let mut from = nodes.iter().position(|&n| n == partial).unwrap_or(0);
    loop {
        if tensors[cur.index()].flags.contains(TensorFlags::OUTPUT) {
            return cur;
        }
        // Every later node that reads `cur`, whatever sits in between.
        let readers: Vec<(usize, TensorId)> = nodes
            .iter()
            .enumerate()
            .skip(from + 1)
            .filter(|(_, &n)| {
                let t = &tensors[n.index()];
                t.src.iter().flatten().any(|&s| s == cur)
            })
            .map(|(i, &n)| (i, n))
            .collect();
        let [(at, next)] = readers[..] else {
            return cur;
        };
        let t = &tensors[next.index()];
        let j = t.src.iter().position(|s| *s == Some(cur)).unwrap_or(0);
        let is_partial = |x: TensorId| x == cur || depends_on_partial(x);
        if !linear_in(t, j, &is_partial) {
            return cur;
        }
        cur = next;
        from = at;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_core::{Context, DType, Graph};

    struct G {
        tensors: Vec<Tensor>,
        nodes: Vec<TensorId>,
    }

    fn graph(f: impl FnOnce(&mut Context<'_>) -> Vec<TensorId>) -> G {
        let mut storage = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).unwrap(); 64];
        let mut ctx = Context::new(&mut storage);
        let outs = f(&mut ctx);
        let mut ids = vec![TensorId(0); 64];
        let mut marks = vec![0u64; Graph::marks_len(64)];
        let mut g = Graph::new(&mut ids, &mut marks);
        for o in outs {
            g.build_forward_expand(&ctx, o).unwrap();
        }
        G {
            nodes: g.nodes().to_vec(),
            tensors: ctx.tensors().to_vec(),
        }
    }

    /// `w`: a column slice of a weight; `x`: this device's input slice; `partial = w·x`.
    fn partial(ctx: &mut Context<'_>) -> (TensorId, TensorId) {
        let w = ctx.new_tensor_2d(DType::F32, 8, 16).unwrap();
        let x = ctx.new_tensor_2d(DType::F32, 8, 4).unwrap();
        let p = ctx.mul_mat(w, x).unwrap();
        ctx.set_name(p, "partial").unwrap();
        (p, x)
    }

    fn point(g: &G, p: TensorId) -> &str {
        let deps = |_: TensorId| false;
        g.tensors[reduce_point(&g.tensors, &g.nodes, p, &deps).index()]
            .name
            .as_str()
    }

    #[test]
    fn a_residual_add_is_not_linear() {
        let mut p = TensorId(0);
        let g = graph(|ctx| {
            let (pp, _) = partial(ctx);
            p = pp;
            let res = ctx.new_tensor_2d(DType::F32, 16, 4).unwrap();
            vec![ctx.add(pp, res).unwrap()]
        });
        assert_eq!(point(&g, p), "partial");
    }

    #[test]
    fn a_chain_of_muls_is_followed_to_its_end() {
        let mut p = TensorId(0);
        let g = graph(|ctx| {
            let (pp, _) = partial(ctx);
            p = pp;
            let a = ctx.new_tensor_1d(DType::F32, 16).unwrap();
            let b = ctx.new_tensor_2d(DType::F32, 16, 4).unwrap();
            let m1 = ctx.mul(pp, a).unwrap();
            let m2 = ctx.mul(b, m1).unwrap(); // partial as the second operand
            let m3 = ctx.scale(m2, 0.5).unwrap();
            ctx.set_name(m3, "scaled").unwrap();
            let res = ctx.new_tensor_2d(DType::F32, 16, 4).unwrap();
            vec![ctx.add(m3, res).unwrap()]
        });
        assert_eq!(point(&g, p), "scaled");
    }

    #[test]
    fn nodes_between_that_do_not_read_it_are_skipped() {
        let mut p = TensorId(0);
        let g = graph(|ctx| {
            let (pp, x) = partial(ctx);
            p = pp;
            // Independent work the graph orders between the product and its consumer.
            let other = ctx.rms_norm(x, 1e-5).unwrap();
            let other = ctx.scale(other, 3.0).unwrap();
            let a = ctx.new_tensor_1d(DType::F32, 16).unwrap();
            let m = ctx.mul(pp, a).unwrap();
            ctx.set_name(m, "mul").unwrap();
            let s = ctx.silu(m).unwrap();
            // Expanded in this order, the product comes first and `other` sits between.
            vec![pp, other, s]
        });
        let at = |name: &str| {
            g.nodes
                .iter()
                .position(|n| g.tensors[n.index()].name.as_str() == name)
                .unwrap()
        };
        let p_at = g.nodes.iter().position(|&n| n == p).unwrap();
        assert!(at("mul") > p_at + 1, "the test needs nodes in between");
        assert_eq!(point(&g, p), "mul");
    }

    #[test]
    fn stops_at_a_second_reader_a_square_and_an_output() {
        let mut ids = [TensorId(0); 3];
        let g = graph(|ctx| {
            let (p0, _) = partial(ctx);
            let a = ctx.new_tensor_1d(DType::F32, 16).unwrap();
            let r1 = ctx.mul(p0, a).unwrap();
            let r2 = ctx.silu(p0).unwrap();
            let (p1, _) = partial(ctx);
            let sq = ctx.mul(p1, p1).unwrap();
            let (p2, _) = partial(ctx);
            ctx.set_flags(p2, TensorFlags::OUTPUT).unwrap();
            let after = ctx.scale(p2, 2.0).unwrap();
            ids = [p0, p1, p2];
            vec![r1, r2, sq, after]
        });
        for p in ids {
            assert_eq!(reduce_point(&g.tensors, &g.nodes, p, &|_| false), p);
        }
    }

    #[test]
    fn views_and_row_gathers_are_linear() {
        let mut p = TensorId(0);
        let g = graph(|ctx| {
            let (pp, _) = partial(ctx);
            p = pp;
            let r = ctx.reshape(pp, [16, 2, 2, 1]).unwrap();
            let r = ctx.reshape(r, [16, 4, 1, 1]).unwrap();
            let idx = ctx.new_tensor_1d(DType::I32, 2).unwrap();
            let rows = ctx.get_rows(r, idx).unwrap();
            ctx.set_name(rows, "rows").unwrap();
            vec![ctx.silu(rows).unwrap()]
        });
        assert_eq!(point(&g, p), "rows");
    }
}
