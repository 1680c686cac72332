//! The llama forward pass as a ggml-core graph.

use ggml_core::{
    AttnParams, Context, DType, Graph, RopeParams, Tensor, TensorFlags, TensorId, MAX_SRC,
};

use super::{LayerWeights, Model};
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
    /// KV cells attended (a multiple of 256 covering every cell in use).
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
    /// I32 `[n_outputs]` rows whose logits are computed.
    pub inp_out_ids: TensorId,
    /// F32 `[n_vocab, n_outputs]` logits.
    pub logits: TensorId,
    /// Per layer: the first tensor of the layer (for assigning layers to devices).
    pub layer_first: Vec<TensorId>,
    /// Nodes that must run on a given device (tensor parallelism), by device index.
    pub pins: Vec<(TensorId, usize)>,
    /// The batch geometry this graph was built for.
    pub shape: BatchShape,
}

/// Room for one forward graph: weights, cache and about 40 tensors per layer.
fn capacity(model: &Model) -> usize {
    model.weights.len() + 2 * model.hp.n_layer + 64 * (model.hp.n_layer + 1) + 64
}

/// Builds the forward graph of `model` for a batch of `shape`. `kv` gives each layer's
/// cache tensors (leaves with data) as descriptors to copy into the graph.
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
    let inp = Inputs::push(&mut ctx, shape)?;
    let (inp_tokens, inp_pos, inp_kv_idxs, kq_mask, inp_out_ids) =
        (inp.tokens, inp.pos, inp.kv_idxs, inp.mask, inp.out_ids);

    let rope = RopeParams::llama(hp.head_dim as u32, hp.rope_freq_base);
    let attn = AttnParams::scaled(1.0 / (hp.head_dim as f32).sqrt());
    let kv_row = DType::F16
        .row_size(hp.n_embd_kv())
        .expect("F16 rows always fit");
    let head_bytes = DType::F16
        .row_size(hp.head_dim)
        .expect("F16 rows always fit");

    let mut x = ctx.get_rows(model.tok_embd, inp_tokens)?;
    ctx.set_name(x, "inp_embd")?;
    let mut kv_writes = Vec::with_capacity(2 * hp.n_layer);
    let mut layer_first = Vec::with_capacity(hp.n_layer);
    for (il, (lw, cache)) in model.layers.iter().zip(&caches).enumerate() {
        let LayerWeights {
            attn_norm,
            wq,
            wk,
            wv,
            wo,
            ffn_norm,
            ffn_gate,
            ffn_up,
            ffn_down,
        } = *lw;
        let named = |ctx: &mut Context<'_>, id: TensorId, what: &str| -> Result<TensorId> {
            ctx.set_name(id, &format!("{what}-{il}"))?;
            Ok(id)
        };
        let cur = ctx.rms_norm(x, hp.rms_eps)?;
        layer_first.push(cur);
        named(&mut ctx, cur, "norm")?;
        let cur = ctx.mul(cur, attn_norm)?;
        named(&mut ctx, cur, "attn_norm")?;

        let q = ctx.mul_mat(wq, cur)?;
        named(&mut ctx, q, "Qcur")?;
        let k = ctx.mul_mat(wk, cur)?;
        named(&mut ctx, k, "Kcur")?;
        let v = ctx.mul_mat(wv, cur)?;
        named(&mut ctx, v, "Vcur")?;
        let q = ctx.reshape(q, [hp.head_dim, hp.n_head, n, 1])?;
        let k = ctx.reshape(k, [hp.head_dim, hp.n_head_kv, n, 1])?;
        let q = ctx.rope(q, inp_pos, rope)?;
        named(&mut ctx, q, "Qrope")?;
        let k = ctx.rope(k, inp_pos, rope)?;
        named(&mut ctx, k, "Krope")?;

        // Write this batch's keys and values into the F16 cache, at cells given at run
        // time (so one graph serves every micro-batch).
        let k_flat = ctx.reshape(k, [hp.n_embd_kv(), n, 1, 1])?;
        let k_write = ctx.set_rows(cache.k, k_flat, inp_kv_idxs)?;
        named(&mut ctx, k_write, "k_cache_write")?;
        let v_write = ctx.set_rows(cache.v, v, inp_kv_idxs)?;
        named(&mut ctx, v_write, "v_cache_write")?;
        kv_writes.push(k_write);
        kv_writes.push(v_write);

        // Attention over the first n_kv cells, heads as dimension 2.
        let qp = ctx.permute(q, [0, 2, 1, 3])?;
        let kv_view = |ctx: &mut Context<'_>, cache: TensorId| -> Result<TensorId> {
            Ok(ctx.view(
                cache,
                [hp.head_dim, shape.n_kv, hp.n_head_kv, 1],
                [2, kv_row, head_bytes, kv_row * shape.n_kv],
                0,
            )?)
        };
        let kc = kv_view(&mut ctx, cache.k)?;
        let vc = kv_view(&mut ctx, cache.v)?;
        let o = ctx.flash_attn_ext(qp, kc, vc, Some(kq_mask), attn)?;
        named(&mut ctx, o, "attn_out")?;
        let o = ctx.reshape(o, [hp.n_embd, n, 1, 1])?;
        let o = ctx.mul_mat(wo, o)?;
        named(&mut ctx, o, "attn_proj")?;
        let ffn_inp = ctx.add(o, x)?;
        named(&mut ctx, ffn_inp, "ffn_inp")?;

        let cur = ctx.rms_norm(ffn_inp, hp.rms_eps)?;
        let cur = ctx.mul(cur, ffn_norm)?;
        named(&mut ctx, cur, "ffn_norm")?;
        let g = ctx.mul_mat(ffn_gate, cur)?;
        named(&mut ctx, g, "ffn_gate")?;
        let u = ctx.mul_mat(ffn_up, cur)?;
        named(&mut ctx, u, "ffn_up")?;
        let h = ctx.swiglu(g, u)?;
        named(&mut ctx, h, "ffn_swiglu")?;
        let d = ctx.mul_mat(ffn_down, h)?;
        named(&mut ctx, d, "ffn_out")?;
        x = ctx.add(d, ffn_inp)?;
        named(&mut ctx, x, "l_out")?;
    }
    let cur = ctx.get_rows(x, inp_out_ids)?;
    let cur = ctx.rms_norm(cur, hp.rms_eps)?;
    let cur = ctx.mul(cur, model.output_norm)?;
    ctx.set_name(cur, "result_norm")?;
    let logits = ctx.mul_mat(model.output, cur)?;
    ctx.set_name(logits, "result_output")?;
    ctx.set_flags(logits, TensorFlags::OUTPUT)?;

    let ordered = order(ctx, &kv_writes, logits, cap)?;
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
            inp_out_ids: inp.out_ids,
            logits,
            layer_first,
            pins,
            shape,
        }
    }
}

/// The input tensors of a forward graph.
pub(super) struct Inputs {
    pub tokens: TensorId,
    pub pos: TensorId,
    pub kv_idxs: TensorId,
    pub mask: TensorId,
    pub out_ids: TensorId,
}

impl Inputs {
    /// Creates the named input tensors of a graph for a batch of `shape`.
    pub fn push(ctx: &mut Context<'_>, shape: BatchShape) -> Result<Inputs> {
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
            out_ids: new(DType::I32, [shape.n_outputs, 1], "inp_out_ids")?,
        })
    }
}

/// Orders the graph: the cache writes first, layer by layer (so that each layer's
/// attention comes after its write), then the logits. Returns the nodes, the sorted
/// leaves and the number of tensors.
pub(super) fn order(
    ctx: Context<'_>,
    kv_writes: &[TensorId],
    logits: TensorId,
    cap: usize,
) -> Result<(Vec<TensorId>, Vec<TensorId>, usize)> {
    let mut ids = vec![TensorId(0); cap];
    let mut marks = vec![0u64; Graph::marks_len(cap)];
    let mut graph = Graph::new(&mut ids, &mut marks);
    for w in kv_writes {
        graph.build_forward_expand(&ctx, *w)?;
    }
    graph.build_forward_expand(&ctx, logits)?;
    let nodes = graph.nodes().to_vec();
    let mut leafs: Vec<TensorId> = graph.leafs().collect();
    leafs.sort();
    debug_assert!(ctx.tensors().iter().all(|t| t.src.len() == MAX_SRC));
    Ok((nodes, leafs, ctx.len()))
}
