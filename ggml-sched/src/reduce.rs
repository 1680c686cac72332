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
//! build both cases. A value cut into views that are added back together (the selected
//! experts of a mixture, each weighted, then summed) is followed too, so a mixture's FFN
//! is reduced once, after the sum, not once per expert.

use ggml_core::{Op, Tensor, TensorFlags, TensorId};

/// Whether `t` is linear in the partial value, given which of its operands carry it
/// (`in_walk`) and which carry some partial value at all (`partial_like`).
fn linear(
    t: &Tensor,
    in_walk: &dyn Fn(TensorId) -> bool,
    partial_like: &dyn Fn(TensorId) -> bool,
) -> bool {
    let carried = |j: usize| t.src[j].is_some_and(in_walk);
    let others_clean = |j: usize| {
        t.src
            .iter()
            .enumerate()
            .all(|(i, s)| i == j || s.is_none_or(|s| !in_walk(s) && !partial_like(s)))
    };
    match t.op {
        // Reinterpretations and copies of the value.
        Op::View | Op::Reshape | Op::Permute { .. } | Op::Transpose | Op::Cont => carried(0),
        // A copy that rounds (to F16, a quant type) is not linear.
        Op::Cpy => carried(0) && t.dtype == ggml_core::DType::F32,
        Op::Scale { .. } => carried(0),
        // Row selection (the indices are the same on every device).
        Op::GetRows => carried(0) && others_clean(0),
        // Scaling by a factor that is the same on every device.
        Op::Mul => (0..2).any(|j| carried(j) && others_clean(j)),
        // The sum of two parts of the same partial value (the experts of a mixture, say)
        // is a partial of their sum; adding anything else (a residual) is not linear.
        Op::Add => carried(0) && carried(1),
        _ => false,
    }
}

/// The tensor at which to all-reduce the partial sum `partial`.
///
/// Walks the nodes after `partial` in execution order, collecting those that are linear
/// in values already collected (the partial itself first), and stops at the first node
/// that reads a collected value non-linearly, or at a collected tensor flagged OUTPUT
/// (the caller reads it whole). The answer is the latest point of the walk at which the
/// value lives in one tensor: one collected tensor that is still needed (read by a node
/// not yet collected, or an output, or read by nothing) while every other collected
/// tensor has been fully consumed by collected nodes. So a chain of views, row scalings
/// and gathers is followed to its end, and so is a value split into views that are
/// added back together (the weighted experts of a mixture-of-experts FFN summed into
/// one output), while a value two different non-linear ops read stays where it is.
/// `depends_on_partial(x)` says whether `x` carries some other partial value (so that
/// `MUL(partial, partial)`, which is not linear, stops the walk).
pub fn reduce_point(
    tensors: &[Tensor],
    nodes: &[TensorId],
    partial: TensorId,
    depends_on_partial: &dyn Fn(TensorId) -> bool,
) -> TensorId {
    let start = nodes.iter().position(|&n| n == partial).unwrap_or(0);
    let reads = |n: TensorId, x: TensorId| tensors[n.index()].src.iter().flatten().any(|&s| s == x);
    let is_output = |x: TensorId| tensors[x.index()].flags.contains(TensorFlags::OUTPUT);
    let mut walk = vec![partial];
    let mut best = partial;
    if is_output(partial) {
        return partial;
    }
    for &n in &nodes[start + 1..] {
        if !walk.iter().any(|&w| reads(n, w)) {
            continue;
        }
        let in_walk = |x: TensorId| walk.contains(&x);
        if !linear(&tensors[n.index()], &in_walk, depends_on_partial) {
            break;
        }
        walk.push(n);
        // The collected tensors still needed once the walk has taken `n`.
        let mut live = walk.iter().copied().filter(|&w| {
            let readers: Vec<TensorId> = nodes.iter().copied().filter(|&r| reads(r, w)).collect();
            is_output(w) || readers.is_empty() || readers.iter().any(|r| !walk.contains(r))
        });
        if let (Some(one), None) = (live.next(), live.next()) {
            best = one;
        }
        if is_output(n) {
            break;
        }
    }
    best
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

    /// The expert sum of a mixture-of-experts FFN: the partial `[16, 2 experts, 4
    /// tokens]` weighted per (expert, token), cut into one view per expert and added up.
    fn experts(ctx: &mut Context<'_>, n_used: usize) -> (TensorId, Vec<TensorId>) {
        let w = ctx.new_tensor_2d(DType::F32, 8, 16).unwrap();
        let x = ctx.new_tensor(DType::F32, [8, n_used * 4, 1, 1]).unwrap();
        let p = ctx.mul_mat(w, x).unwrap();
        ctx.set_name(p, "partial").unwrap();
        let p3 = ctx.reshape(p, [16, n_used, 4, 1]).unwrap();
        let weights = ctx.new_tensor(DType::F32, [1, n_used, 4, 1]).unwrap();
        let weighted = ctx.mul(p3, weights).unwrap();
        let t = *ctx.get(weighted).unwrap();
        let views = (0..n_used)
            .map(|i| ctx.view_2d(weighted, 16, 4, t.nb[2], i * t.nb[1]).unwrap())
            .collect();
        (p, views)
    }

    #[test]
    fn the_sum_over_experts_is_linear() {
        for n_used in [2, 3] {
            let mut p = TensorId(0);
            let g = graph(|ctx| {
                let (pp, views) = experts(ctx, n_used);
                p = pp;
                let mut acc = views[0];
                for &v in &views[1..] {
                    acc = ctx.add(acc, v).unwrap();
                }
                ctx.set_name(acc, "moe_out").unwrap();
                let res = ctx.new_tensor_2d(DType::F32, 16, 4).unwrap();
                vec![ctx.add(acc, res).unwrap()]
            });
            assert_eq!(point(&g, p), "moe_out", "{n_used} experts");
        }
    }

    #[test]
    fn experts_not_summed_back_stay_partial() {
        // One expert's view also feeds a non-linear op: the value never lives in one
        // tensor after the weighting, so the partial is reduced at the weighting.
        let mut p = TensorId(0);
        let g = graph(|ctx| {
            let (pp, views) = experts(ctx, 2);
            p = pp;
            let sum = ctx.add(views[0], views[1]).unwrap();
            let side = ctx.silu(views[1]).unwrap();
            vec![sum, side]
        });
        let at = reduce_point(&g.tensors, &g.nodes, p, &|_| false);
        assert_eq!(g.tensors[at.index()].op, Op::Mul);
        // Adding a residual to one expert before the sum is not linear either.
        let g = graph(|ctx| {
            let (pp, views) = experts(ctx, 2);
            p = pp;
            let res = ctx.new_tensor_2d(DType::F32, 16, 4).unwrap();
            let r = ctx.add(views[0], res).unwrap();
            vec![ctx.add(r, views[1]).unwrap()]
        });
        let at = reduce_point(&g.tensors, &g.nodes, p, &|_| false);
        assert_eq!(g.tensors[at.index()].op, Op::Mul);
    }
}
