//! The forward pass on one device (or split by layers) as a ggml-core graph.

use ggml_core::{Context, DType, Graph, Tensor, TensorFlags, TensorId, MAX_SRC};

use super::blocks::{self, Nodes};
use super::{HParams, Model};
use crate::error::Result;

/// Tensors of one layer's KV cache as they appear in a graph.
#[derive(Clone, Copy, Debug)]
pub struct KvTensors {
    /// Keys: F16 `[n_embd_kv, kv_size]`.
    pub k: TensorId,
    /// Values: F16 `[n_embd_kv, kv_size]`.
    pub v: TensorId,
}

/// What a forward graph needs besides the weights: the batch geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchShape {
    /// Tokens in the batch.
    pub n_tokens: usize,
    /// KV cells attended (a multiple of [`crate::batch::KV_PAD`] covering every cell in use).
    pub n_kv: usize,
    /// Rows of logits computed (the tokens whose outputs are requested).
    pub n_outputs: usize,
}

/// A forward graph over one batch: tensors, execution order and the ids of its inputs
/// and output.
#[derive(Clone, Debug)]
pub struct ForwardGraph {
    /// Every tensor descriptor (weights first, then KV cache, inputs and results).
    pub tensors: Vec<Tensor>,
    /// Nodes in execution order.
    pub nodes: Vec<TensorId>,
    /// Leaves (weights, KV cache, inputs).
    pub leafs: Vec<TensorId>,
    /// I32 `[n_tokens]` token ids.
    pub inp_tokens: TensorId,
    /// I32 `[n_tokens]` positions.
    pub inp_pos: TensorId,
    /// I32 `[n_tokens]` KV cell each token's key and value go to.
    pub inp_kv_idxs: TensorId,
    /// F16 `[n_kv, n_tokens]` attention mask (0 or −∞).
    pub kq_mask: TensorId,
    /// F16 `[n_kv, n_tokens]` mask of the sliding-window layers (models with some).
    pub kq_mask_swa: Option<TensorId>,
    /// I32 `[n_outputs]` rows whose logits are computed.
    pub inp_out_ids: TensorId,
    /// F32 `[n_vocab, n_outputs]` logits.
    pub logits: TensorId,
    /// I32 `[1, n_outputs]`: each row's highest logit, the first on ties (greedy
    /// sampling's token), where the graph computes it ([`ForwardGraph::with_argmax`]).
    pub argmax: Option<TensorId>,
    /// Per layer: the first tensor of the layer (for assigning layers to devices).
    pub layer_first: Vec<TensorId>,
    /// Nodes that must run on a given device (tensor parallelism), by device index.
    pub pins: Vec<(TensorId, usize)>,
    /// The batch geometry this graph was built for.
    pub shape: BatchShape,
}

/// Room for one forward graph: weights, cache and about 50 tensors per layer.
fn capacity(model: &Model) -> usize {
    model.weights.len() + 2 * model.hp.n_layer + 80 * (model.hp.n_layer + 1) + 64
}

/// Names nodes `{what}-{il}` inside layer `il`, `{what}` outside layers.
struct Single<'c, 'a> {
    ctx: &'c mut Context<'a>,
    layer: Option<usize>,
}

impl<'a> Nodes<'a> for Single<'_, 'a> {
    fn ctx(&mut self) -> &mut Context<'a> {
        self.ctx
    }

    fn node(&mut self, id: TensorId, name: &str) -> Result<TensorId> {
        match self.layer {
            Some(il) => self.ctx.set_name(id, &format!("{name}-{il}"))?,
            None => self.ctx.set_name(id, name)?,
        }
        Ok(id)
    }
}

/// Builds the forward graph of `model` for a batch of `shape`. `kv` gives each layer's
/// cache tensors (leaves with data) as descriptors to copy into the graph. The layers
/// follow the architecture's [`Features`](super::Features).
pub fn build_forward(
    model: &Model,
    kv: &[(Tensor, Tensor)],
    shape: BatchShape,
) -> Result<ForwardGraph> {
    let hp = &model.hp;
    let cap = capacity(model);
    let mut storage = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).expect("1 element"); cap];
    let mut ctx = Context::new(&mut storage);

    // Weights keep their ids: they are pushed in the model's order.
    for w in &model.weights {
        ctx.push(*w)?;
    }
    let mut caches = Vec::with_capacity(hp.n_layer);
    for (k, v) in kv {
        caches.push(KvTensors {
            k: ctx.push(*k)?,
            v: ctx.push(*v)?,
        });
    }
    let n = shape.n_tokens;
    let inp = Inputs::push(&mut ctx, shape, hp.n_swa > 0)?;
    let kv_row = DType::F16
        .row_size(hp.n_embd_kv())
        .expect("F16 rows always fit");
    let head_bytes = DType::F16
        .row_size(hp.head_dim)
        .expect("F16 rows always fit");

    let mut b = Single {
        ctx: &mut ctx,
        layer: None,
    };
    let mut x = blocks::embeddings(&mut b, hp, model.tok_embd, inp.tokens)?;
    let mut anchors = Vec::with_capacity(10 * hp.n_layer);
    let mut layer_first = Vec::with_capacity(hp.n_layer);
    for (il, (lw, cache)) in model.layers.iter().zip(&caches).enumerate() {
        b.layer = Some(il);
        let (first, cur) = blocks::norm(&mut b, x, lw.attn_norm, hp.rms_eps, "norm", "attn_norm")?;
        layer_first.push(first);

        let q_cur = b.ctx.mul_mat(lw.wq, cur)?;
        let q_cur = b.node(q_cur, "Qcur")?;
        let k_cur = b.ctx.mul_mat(lw.wk, cur)?;
        let k_cur = b.node(k_cur, "Kcur")?;
        let v_cur = b.ctx.mul_mat(lw.wv, cur)?;
        let v = b.node(v_cur, "Vcur")?;
        let q = b.ctx.reshape(q_cur, [hp.head_dim, hp.n_head, n, 1])?;
        let k = b.ctx.reshape(k_cur, [hp.head_dim, hp.n_head_kv, n, 1])?;
        let norms = (lw.attn_q_norm, lw.attn_k_norm);
        let (q, k, attn) = blocks::prepare_qk(&mut b, hp, il, (q, k), norms, inp.pos)?;

        // Write this batch's keys and values into the F16 cache, at cells given at run
        // time (so one graph serves every micro-batch).
        let k_flat = b.ctx.reshape(k, [hp.n_embd_kv(), n, 1, 1])?;
        let k_write = b.ctx.set_rows(cache.k, k_flat, inp.kv_idxs)?;
        let k_write = b.node(k_write, "k_cache_write")?;
        let v_write = b.ctx.set_rows(cache.v, v, inp.kv_idxs)?;
        let v_write = b.node(v_write, "v_cache_write")?;
        anchors.extend(attention_inputs(b.ctx, [q_cur, k_cur, v_cur], q, k)?);
        anchors.extend([k_write, v_write]);

        // Attention over the first n_kv cells, heads as dimension 2.
        let qp = b.ctx.permute(q, [0, 2, 1, 3])?;
        let kv_view = |ctx: &mut Context<'_>, cache: TensorId| -> Result<TensorId> {
            Ok(ctx.view(
                cache,
                [hp.head_dim, shape.n_kv, hp.n_head_kv, 1],
                [2, kv_row, head_bytes, kv_row * shape.n_kv],
                0,
            )?)
        };
        let kc = kv_view(b.ctx, cache.k)?;
        let vc = kv_view(b.ctx, cache.v)?;
        let o = b
            .ctx
            .flash_attn_ext(qp, kc, vc, Some(inp.mask_of(hp, il)), attn)?;
        let o = b.node(o, "attn_out")?;
        let o = b.ctx.reshape(o, [hp.n_embd_q(), n, 1, 1])?;
        let o = b.ctx.mul_mat(lw.wo, o)?;
        let o = b.node(o, "attn_proj")?;
        let o = blocks::post_norm(&mut b, o, lw.attn_post_norm, hp.rms_eps, "attn_post_norm")?;
        let ffn_inp = b.ctx.add(o, x)?;
        let ffn_inp = b.node(ffn_inp, "ffn_inp")?;

        let (_, cur) = blocks::norm(
            &mut b,
            ffn_inp,
            lw.ffn_norm,
            hp.rms_eps,
            "ffn_rms",
            "ffn_norm",
        )?;
        let d = match lw.ffn_gate_inp {
            None => {
                let g = b.ctx.mul_mat(lw.ffn_gate, cur)?;
                let g = b.node(g, "ffn_gate")?;
                let u = b.ctx.mul_mat(lw.ffn_up, cur)?;
                let u = b.node(u, "ffn_up")?;
                let h = blocks::ffn_act(&mut b, hp.features.ffn_act, g, u)?;
                let d = b.ctx.mul_mat(lw.ffn_down, h)?;
                b.node(d, "ffn_out")?
            }
            Some(router) => {
                let r = blocks::moe_route(&mut b, hp, cur, router)?;
                let exps = (lw.ffn_gate, lw.ffn_up);
                let h = blocks::moe_gate_up(&mut b, hp.features.ffn_act, cur, exps, &r)?;
                let d = b.ctx.mul_mat_id(lw.ffn_down, h, r.ids)?;
                let d = b.node(d, "ffn_moe_down")?;
                blocks::moe_combine(&mut b, d, &r)?
            }
        };
        let d = blocks::post_norm(&mut b, d, lw.ffn_post_norm, hp.rms_eps, "ffn_post_norm")?;
        x = b.ctx.add(d, ffn_inp)?;
        x = b.node(x, "l_out")?;
    }
    b.layer = None;
    let cur = b.ctx.get_rows(x, inp.out_ids)?;
    let cur = b.node(cur, "result_rows")?;
    let (_, cur) = blocks::norm(
        &mut b,
        cur,
        model.output_norm,
        hp.rms_eps,
        "result_rms",
        "result_norm",
    )?;
    let logits = b.ctx.mul_mat(model.output, cur)?;
    let logits = b.node(logits, "result_output")?;
    ctx.set_flags(logits, TensorFlags::OUTPUT)?;

    let ordered = order(ctx, &anchors, logits, cap)?;
    Ok(ForwardGraph::assemble(
        storage,
        ordered,
        &inp,
        logits,
        layer_first,
        Vec::new(),
        shape,
    ))
}

impl ForwardGraph {
    /// The graph from its tensor storage and [`order`]'s result.
    pub(super) fn assemble(
        mut storage: Vec<Tensor>,
        (nodes, leafs, len): (Vec<TensorId>, Vec<TensorId>, usize),
        inp: &Inputs,
        logits: TensorId,
        layer_first: Vec<TensorId>,
        pins: Vec<(TensorId, usize)>,
        shape: BatchShape,
    ) -> ForwardGraph {
        storage.truncate(len);
        ForwardGraph {
            tensors: storage,
            nodes,
            leafs,
            inp_tokens: inp.tokens,
            inp_pos: inp.pos,
            inp_kv_idxs: inp.kv_idxs,
            kq_mask: inp.mask,
            kq_mask_swa: inp.mask_swa,
            inp_out_ids: inp.out_ids,
            logits,
            argmax: None,
            layer_first,
            pins,
            shape,
        }
    }

    /// The graph with one more node, ARGMAX of the logits (an output), so that greedy
    /// generation reads back 4 bytes per token instead of a row of logits. Its value is
    /// `generate::argmax` of each row exactly (the op's definition).
    pub fn with_argmax(mut self) -> Result<ForwardGraph> {
        if self.argmax.is_some() {
            return Ok(self);
        }
        let mut storage = self.tensors.clone();
        storage.push(self.tensors[self.logits.index()]);
        let mut ctx = Context::new(&mut storage);
        for t in &self.tensors {
            ctx.push(*t)?;
        }
        let best = ctx.argmax(self.logits)?;
        ctx.set_name(best, "result_argmax")?;
        ctx.set_flags(best, TensorFlags::OUTPUT)?;
        self.tensors = storage;
        self.nodes.push(best);
        self.argmax = Some(best);
        Ok(self)
    }
}

/// The input tensors of a forward graph.
pub(super) struct Inputs {
    pub tokens: TensorId,
    pub pos: TensorId,
    pub kv_idxs: TensorId,
    pub mask: TensorId,
    pub mask_swa: Option<TensorId>,
    pub out_ids: TensorId,
}

impl Inputs {
    /// Creates the named input tensors of a graph for a batch of `shape` (with a second
    /// mask for sliding-window layers when `swa`).
    pub fn push(ctx: &mut Context<'_>, shape: BatchShape, swa: bool) -> Result<Inputs> {
        let n = shape.n_tokens;
        let mut new = |dtype: DType, ne: [usize; 2], name: &str| -> Result<TensorId> {
            let t = ctx.new_tensor_2d(dtype, ne[0], ne[1])?;
            ctx.set_name(t, name)?;
            ctx.set_flags(t, TensorFlags::INPUT)?;
            Ok(t)
        };
        Ok(Inputs {
            tokens: new(DType::I32, [n, 1], "inp_tokens")?,
            pos: new(DType::I32, [n, 1], "inp_pos")?,
            kv_idxs: new(DType::I32, [n, 1], "inp_kv_idxs")?,
            mask: new(DType::F16, [shape.n_kv, n], "kq_mask")?,
            mask_swa: match swa {
                true => Some(new(DType::F16, [shape.n_kv, n], "kq_mask_swa")?),
                false => None,
            },
            out_ids: new(DType::I32, [shape.n_outputs, 1], "inp_out_ids")?,
        })
    }
}

impl Inputs {
    /// The mask layer `il` attends with.
    pub fn mask_of(&self, hp: &HParams, il: usize) -> TensorId {
        match self.mask_swa {
            Some(m) if hp.is_swa(il) => m,
            _ => self.mask,
        }
    }
}

/// The nodes that put a layer's attention inputs in llama.cpp's order when expanded in
/// turn before its cache writes: the Q, K and V products, then Q's and K's inputs to RoPE
/// (their norms, where the architecture has them), then the roped Q (`q` is the roped
/// Q, or its scaling). So the products sit side by side, and so do the two ropes and
/// the two cache writes (one launch each where the CUDA backend fuses them).
fn attention_inputs(
    ctx: &Context<'_>,
    products: [TensorId; 3],
    q: TensorId,
    k_rope: TensorId,
) -> Result<[TensorId; 6]> {
    let src0 = |id: TensorId| -> Result<TensorId> {
        Ok(ctx.get(id)?.src[0].expect("rope and scale have a source"))
    };
    let q_rope = match ctx.get(q)?.op {
        ggml_core::Op::Scale { .. } => src0(q)?,
        _ => q,
    };
    let [q_cur, k_cur, v_cur] = products;
    Ok([q_cur, k_cur, v_cur, src0(q_rope)?, src0(k_rope)?, q_rope])
}

/// Orders the graph: the `anchors` first, in turn (each layer's cache writes among them,
/// so that its attention comes after its write), then the logits. Returns the nodes, the
/// sorted leaves and the number of tensors.
pub(super) fn order(
    ctx: Context<'_>,
    anchors: &[TensorId],
    logits: TensorId,
    cap: usize,
) -> Result<(Vec<TensorId>, Vec<TensorId>, usize)> {
    let mut ids = vec![TensorId(0); cap];
    let mut marks = vec![0u64; Graph::marks_len(cap)];
    let mut graph = Graph::new(&mut ids, &mut marks);
    for w in anchors {
        graph.build_forward_expand(&ctx, *w)?;
    }
    graph.build_forward_expand(&ctx, logits)?;
    let nodes = graph.nodes().to_vec();
    let mut leafs: Vec<TensorId> = graph.leafs().collect();
    leafs.sort();
    debug_assert!(ctx.tensors().iter().all(|t| t.src.len() == MAX_SRC));
    Ok((nodes, leafs, ctx.len()))
}
