//! The forward pass cut over devices by [`TpShards`] (`--split-mode tensor`), following
//! the architecture's [`Features`](super::Features) like the single-device builder.

use ggml_core::{Context, DType, Tensor, TensorFlags, TensorId};

use super::blocks::{self, Nodes};
use super::graph::{order, Inputs};
use super::tp::TpShards;
use super::{BatchShape, ForwardGraph, Model};
use crate::error::Result;

/// Room for the graph: weights, caches and about 60 tensors per layer and device.
fn capacity(model: &Model, n_dev: usize) -> usize {
    model.weights.len() + 2 * model.hp.n_layer * n_dev + 100 * n_dev * (model.hp.n_layer + 1) + 64
}

/// Node builder that pins every node it makes to the current device.
struct Pinned<'c, 'a> {
    ctx: &'c mut Context<'a>,
    pins: Vec<(TensorId, usize)>,
    dev: usize,
    /// The layer being built (names of block nodes get `-{layer}`).
    layer: Option<usize>,
    /// Gathers that feed a product run chunk by chunk ([`TpShards::ring`]).
    ring: bool,
    /// Nodes to expand, in this order, before the logits: the cache writes and, with
    /// `ring`, every chunk's product (so that the graph runs chunk-major across devices
    /// and chunk c + 1's copies overlap chunk c's products).
    anchors: Vec<TensorId>,
}

impl<'a> Nodes<'a> for Pinned<'_, 'a> {
    fn ctx(&mut self) -> &mut Context<'a> {
        self.ctx
    }

    fn node(&mut self, id: TensorId, name: &str) -> Result<TensorId> {
        match self.layer {
            Some(il) => self.pin(id, &format!("{name}-{il}")),
            None => self.pin(id, name),
        }
    }
}

impl Pinned<'_, '_> {
    fn pin(&mut self, id: TensorId, name: &str) -> Result<TensorId> {
        self.ctx.set_name(id, &format!("{name}#{}", self.dev))?;
        self.pins.push((id, self.dev));
        Ok(id)
    }

    /// The slices of all devices joined along dimension 0 on the current device.
    fn gather(&mut self, parts: &[TensorId], name: &str) -> Result<TensorId> {
        let mut acc = parts[0];
        for &p in &parts[1..] {
            let c = self.ctx.concat(acc, p, 0)?;
            acc = self.pin(c, name)?;
        }
        Ok(acc)
    }

    /// The exact row-split product on `nd` devices: each all-gathers `parts` (named
    /// `names[0]`), multiplies by its rows of the weight `rows(d)` (`names[1]`), and the
    /// products are all-gathered again (`names[2]`); returns the result per device.
    fn row_split_mul_mat(
        &mut self,
        parts: &[TensorId],
        nd: usize,
        rows: impl Fn(usize) -> TensorId,
        names: &[String; 3],
    ) -> Result<Vec<TensorId>> {
        let n_tokens = self.ctx.get(parts[0])?.ne[1];
        if self.ring && n_tokens > 1 && nd > 1 {
            return self.ring_mul_mat(parts, nd, rows, names);
        }
        let mut products = Vec::with_capacity(nd);
        for d in 0..nd {
            self.dev = d;
            let x = self.gather(parts, &names[0])?;
            let p = self.ctx.mul_mat(rows(d), x)?;
            products.push(self.pin(p, &names[1])?);
        }
        let mut full = Vec::with_capacity(nd);
        for d in 0..nd {
            self.dev = d;
            full.push(self.gather(&products, &names[2])?);
        }
        Ok(full)
    }
}

impl Pinned<'_, '_> {
    /// [`Pinned::row_split_mul_mat`] pipelined by tokens: the tokens are cut into (at
    /// most) `nd` chunks; for each chunk every device gathers the chunk's slices and
    /// multiplies them, so the copies of chunk c + 1 run while chunk c is multiplied.
    /// Each device then joins its chunk products along the tokens. Bit-identical to the
    /// whole gather: a product's column depends only on its own input column.
    fn ring_mul_mat(
        &mut self,
        parts: &[TensorId],
        nd: usize,
        rows: impl Fn(usize) -> TensorId,
        names: &[String; 3],
    ) -> Result<Vec<TensorId>> {
        let t0 = *self.ctx.get(parts[0])?;
        let chunks = super::tp::even_ranges(t0.ne[1], nd.min(t0.ne[1]));
        let mut per_dev: Vec<Vec<TensorId>> = vec![Vec::with_capacity(chunks.len()); nd];
        let mut products = vec![TensorId(0); nd];
        for (ci, r) in chunks.iter().enumerate() {
            let mut pieces = Vec::with_capacity(parts.len());
            for &p in parts {
                let t = *self.ctx.get(p)?;
                if t.ne[2] != 1 || t.ne[3] != 1 {
                    return Err(crate::error::ModelError::Usage(format!(
                        "ring all-gather of '{}': expected a matrix, got {:?}",
                        t.name, t.ne
                    )));
                }
                pieces.push(
                    self.ctx
                        .view_2d(p, t.ne[0], r.len(), t.nb[1], r.start * t.nb[1])?,
                );
            }
            for (d, out) in per_dev.iter_mut().enumerate() {
                self.dev = d;
                let x = self.gather(&pieces, &names[0])?;
                let y = self.ctx.mul_mat(rows(d), x)?;
                let y = self.pin(y, &names[1])?;
                self.anchors.push(y);
                out.push(y);
                if ci + 1 == chunks.len() {
                    // Joined right after the last chunk, in the same split.
                    let mut acc = out[0];
                    for &y in &out[1..] {
                        let j = self.ctx.concat(acc, y, 1)?;
                        acc = self.pin(j, &format!("{}.join", names[1]))?;
                    }
                    self.anchors.push(acc);
                    products[d] = acc;
                }
            }
        }
        let mut full = Vec::with_capacity(nd);
        for d in 0..nd {
            self.dev = d;
            full.push(self.gather(&products, &names[2])?);
        }
        Ok(full)
    }
}

/// Adds up the partial sums `parts` (device, tensor) so that every one of the `nd`
/// devices can read the total: returns per device the tensor holding it there (or on
/// another device, from which ops pinned to this one copy it). Every device sees the same
/// bits: two partials are exchanged and added on both sides (addition commutes); more go
/// round a ring in chunks of rows, each chunk summed once on its way and then gathered
/// by all. Partials of at least `bf16_min` bytes travel as BF16, and the sum stays F32;
/// the values every device adds are the rounded ones, its own included.
fn all_reduce(
    b: &mut Pinned<'_, '_>,
    parts: &[(usize, TensorId)],
    nd: usize,
    bf16_min: Option<usize>,
    name: &str,
) -> Result<Vec<TensorId>> {
    let t0 = *b.ctx.get(parts[0].1)?;
    let compress = bf16_min.is_some_and(|m| t0.nbytes() >= m);
    // The value as it leaves device `d`: itself, or rounded to BF16 there.
    let wire = |b: &mut Pinned<'_, '_>, d: usize, t: TensorId| -> Result<TensorId> {
        if !compress {
            return Ok(t);
        }
        b.dev = d;
        let w = b.ctx.cont_as(t, DType::BF16)?;
        b.pin(w, &format!("{name}.bf16"))
    };
    // The rounded value back in F32 on device `d` (for the values a device adds itself).
    let unwire = |b: &mut Pinned<'_, '_>, d: usize, w: TensorId| -> Result<TensorId> {
        if !compress {
            return Ok(w);
        }
        b.dev = d;
        let f = b.ctx.cont_as(w, DType::F32)?;
        b.pin(f, &format!("{name}.f32"))
    };
    let k = parts.len();
    if k == 1 {
        return Ok(vec![parts[0].1; nd]);
    }
    if k == 2 {
        let (d0, p0) = parts[0];
        let (d1, p1) = parts[1];
        let (w0, w1) = (wire(b, d0, p0)?, wire(b, d1, p1)?);
        let own0 = unwire(b, d0, w0)?;
        let own1 = unwire(b, d1, w1)?;
        b.dev = d0;
        let s0 = b.ctx.add(own0, w1)?;
        let s0 = b.pin(s0, name)?;
        b.dev = d1;
        let s1 = b.ctx.add(own1, w0)?;
        let s1 = b.pin(s1, name)?;
        return Ok((0..nd).map(|d| if d == d1 { s1 } else { s0 }).collect());
    }
    // Ring: chunk c starts at holder c + 1, picks up every holder's share on its way
    // round and ends, summed, at holder c; then every device gathers the chunks.
    let rows = super::tp::even_ranges(t0.ne[0], k);
    let chunk =
        |b: &mut Pinned<'_, '_>, p: TensorId, r: &std::ops::Range<usize>| -> Result<TensorId> {
            Ok(b.ctx
                .view_2d(p, r.len(), t0.ne[1], t0.nb[1], r.start * t0.nb[0])?)
        };
    let mut done = Vec::with_capacity(k);
    for (c, r) in rows.iter().enumerate() {
        let (d_first, p_first) = parts[(c + 1) % k];
        b.dev = d_first;
        let v = chunk(b, p_first, r)?;
        let mut acc = if compress {
            let w = b.ctx.cont_as(v, DType::BF16)?;
            b.pin(w, &format!("{name}.bf16"))?
        } else {
            let w = b.ctx.cont(v)?;
            b.pin(w, name)?
        };
        let mut from = d_first;
        for s in 2..=k {
            let (d, p) = parts[(c + s) % k];
            let sent = if s == 2 { acc } else { wire(b, from, acc)? };
            b.dev = d;
            let own = chunk(b, p, r)?;
            let own = if compress {
                let w = b.ctx.cont_as(own, DType::BF16)?;
                let w = b.pin(w, &format!("{name}.bf16"))?;
                unwire(b, d, w)?
            } else {
                own
            };
            let sum = b.ctx.add(own, sent)?;
            acc = b.pin(sum, name)?;
            from = d;
        }
        // The summed chunk as every device will read it.
        let fin = wire(b, from, acc)?;
        done.push((from, fin));
    }
    let mut out = Vec::with_capacity(nd);
    for d in 0..nd {
        let pieces: Vec<TensorId> = done
            .iter()
            .map(|&(_, t)| unwire(b, d, t))
            .collect::<Result<_>>()?;
        b.dev = d;
        out.push(b.gather(&pieces, &format!("{name}.gather"))?);
    }
    Ok(out)
}

/// The down projection of a mixture of experts cut over devices, from each device's
/// activations `h[d]` (its rows of `n_ff` for every chosen expert) and its own copy of
/// the routing: returns the FFN output per device.
///
/// Exact (`tensor`): the activations are all-gathered, each device computes its rows of
/// `n_embd` for every chosen expert, weights and sums them, and the rows are gathered.
/// `tensor-reduce`: each device multiplies its columns of the down matrices, which leaves
/// a partial sum; the weighting and the sum over experts are linear, so the partial
/// crosses devices once, after the sum (`n_embd × n_tokens`, not once per expert).
fn moe_down(
    b: &mut Pinned<'_, '_>,
    tp: &TpShards,
    il: usize,
    h: &[TensorId],
    routing: &[blocks::Routing],
) -> Result<Vec<TensorId>> {
    let nd = tp.n_dev;
    let name = |what: &str| format!("{what}-{il}");
    let mut outs = Vec::with_capacity(nd);
    for (d, r) in routing.iter().enumerate() {
        b.dev = d;
        b.layer = Some(il);
        let x = match tp.reduce {
            true => h[d],
            false => b.gather(h, &name("ffn_moe_gather"))?,
        };
        let e = b.ctx.mul_mat_id(tp.layers[il][d].ffn_down, x, r.ids)?;
        let e = b.pin(e, &name("ffn_moe_down"))?;
        outs.push((d, blocks::moe_combine(b, e, r)?));
    }
    if tp.reduce {
        return all_reduce(b, &outs, nd, tp.bf16_min, &name("ffn_reduce"));
    }
    let rows: Vec<TensorId> = outs.iter().map(|&(_, o)| o).collect();
    (0..nd)
        .map(|d| {
            b.dev = d;
            b.gather(&rows, &name("out_gather"))
        })
        .collect()
}

/// Builds the forward graph of `model` cut over devices as `tp` says, for a batch of
/// `shape`. `kv[l][d]` are layer `l`'s key and value cache tensors on device `d` (its KV
/// heads only; empty tensors are never read for devices without heads). With
/// `tp.reduce`, partial sums of at least `tp.bf16_min` bytes cross devices as BF16.
pub fn build_forward_tp(
    model: &Model,
    tp: &TpShards,
    kv: &[Vec<(Tensor, Tensor)>],
    shape: BatchShape,
) -> Result<ForwardGraph> {
    let bf16_min = tp.bf16_min;
    let hp = &model.hp;
    let nd = tp.n_dev;
    let cap = capacity(model, nd);
    let mut storage = vec![Tensor::contiguous(DType::F32, [1, 1, 1, 1]).expect("1 element"); cap];
    let mut ctx = Context::new(&mut storage);
    for w in &model.weights {
        ctx.push(*w)?;
    }
    let mut caches = Vec::with_capacity(hp.n_layer);
    for per_dev in kv {
        let mut row = Vec::with_capacity(nd);
        for (k, v) in per_dev {
            row.push((ctx.push(*k)?, ctx.push(*v)?));
        }
        caches.push(row);
    }
    let n = shape.n_tokens;
    let inp = Inputs::push(&mut ctx, shape, hp.n_swa > 0)?;
    let head_bytes = DType::F16.row_size(hp.head_dim).expect("F16 rows fit");
    let group = hp.n_head / hp.n_head_kv;

    let mut b = Pinned {
        ctx: &mut ctx,
        pins: Vec::new(),
        dev: 0,
        layer: None,
        ring: tp.ring && !tp.reduce,
        anchors: Vec::new(),
    };
    let embd = blocks::embeddings(&mut b, hp, model.tok_embd, inp.tokens)?;
    // The residual stream, replicated: x[d] lives on device d.
    let mut x = vec![embd; nd];
    let mut layer_first = Vec::with_capacity(hp.n_layer);
    for (il, layer_caches) in caches.iter().enumerate() {
        let name = |what: &str| format!("{what}-{il}");
        let mut attn_out = Vec::with_capacity(nd);
        for d in 0..nd {
            b.dev = d;
            b.layer = Some(il);
            let s = tp.layers[il][d];
            let (first, cur) =
                blocks::norm(&mut b, x[d], s.attn_norm, hp.rms_eps, "norm", "attn_norm")?;
            if d == 0 {
                layer_first.push(first);
            }
            let (Some(wq), Some(wk), Some(wv)) = (s.wq, s.wk, s.wv) else {
                continue;
            };
            let nkv = tp.kv_heads[d].len();
            let nh = nkv * group;
            let q = b.ctx.mul_mat(wq, cur)?;
            let q = b.pin(q, &name("Qcur"))?;
            let k = b.ctx.mul_mat(wk, cur)?;
            let k = b.pin(k, &name("Kcur"))?;
            let v = b.ctx.mul_mat(wv, cur)?;
            let v = b.pin(v, &name("Vcur"))?;
            let q = b.ctx.reshape(q, [hp.head_dim, nh, n, 1])?;
            let k = b.ctx.reshape(k, [hp.head_dim, nkv, n, 1])?;
            let norms = (s.attn_q_norm, s.attn_k_norm);
            let (q, k, attn) = blocks::prepare_qk(&mut b, hp, il, (q, k), norms, inp.pos)?;
            let (ck, cv) = layer_caches[d];
            let k_flat = b.ctx.reshape(k, [hp.head_dim * nkv, n, 1, 1])?;
            let kw = b.ctx.set_rows(ck, k_flat, inp.kv_idxs)?;
            let kw = b.pin(kw, &name("k_cache_write"))?;
            b.anchors.push(kw);
            let vw = b.ctx.set_rows(cv, v, inp.kv_idxs)?;
            let vw = b.pin(vw, &name("v_cache_write"))?;
            b.anchors.push(vw);
            let kv_row = head_bytes * nkv;
            let ne = [hp.head_dim, shape.n_kv, nkv, 1];
            let nb = [2, kv_row, head_bytes, kv_row * shape.n_kv];
            let kc = b.ctx.view(ck, ne, nb, 0)?;
            let vc = b.ctx.view(cv, ne, nb, 0)?;
            let qp = b.ctx.permute(q, [0, 2, 1, 3])?;
            let o = b
                .ctx
                .flash_attn_ext(qp, kc, vc, Some(inp.mask_of(hp, il)), attn)?;
            let o = b.pin(o, &name("attn_out"))?;
            attn_out.push((d, b.ctx.reshape(o, [hp.head_dim * nh, n, 1, 1])?));
        }
        let attn_full = if tp.reduce {
            // Each device projects its heads (its columns of wo): partial sums, reduced.
            let mut partial = Vec::with_capacity(attn_out.len());
            for &(d, o) in &attn_out {
                b.dev = d;
                let wo = tp.layers[il][d]
                    .wo
                    .expect("devices with heads have columns of wo");
                let p = b.ctx.mul_mat(wo, o)?;
                partial.push((d, b.pin(p, &name("attn_proj"))?));
            }
            all_reduce(&mut b, &partial, nd, bf16_min, &name("attn_reduce"))?
        } else {
            // All-gather the heads, project by output rows, all-gather the rows.
            let heads: Vec<TensorId> = attn_out.iter().map(|&(_, o)| o).collect();
            let wo = |d: usize| tp.layers[il][d].wo.expect("every device has rows of wo");
            let names = [name("attn_gather"), name("attn_proj"), name("proj_gather")];
            b.row_split_mul_mat(&heads, nd, wo, &names)?
        };
        let mut gate_up = Vec::with_capacity(nd);
        let mut routing = Vec::new();
        let mut ffn_inp = Vec::with_capacity(nd);
        for (d, &xd) in x.iter().enumerate() {
            b.dev = d;
            let s = tp.layers[il][d];
            let a = blocks::post_norm(
                &mut b,
                attn_full[d],
                s.attn_post_norm,
                hp.rms_eps,
                "attn_post_norm",
            )?;
            let fi = b.ctx.add(a, xd)?;
            let fi = b.pin(fi, &name("ffn_inp"))?;
            ffn_inp.push(fi);
            let (_, cur) = blocks::norm(&mut b, fi, s.ffn_norm, hp.rms_eps, "ffn_rms", "ffn_norm")?;
            if let Some(router) = s.ffn_gate_inp {
                let r = blocks::moe_route(&mut b, hp, cur, router)?;
                let exps = (s.ffn_gate, s.ffn_up);
                gate_up.push(blocks::moe_gate_up(
                    &mut b,
                    hp.features.ffn_act,
                    cur,
                    exps,
                    &r,
                )?);
                routing.push(r);
                continue;
            }
            let g = b.ctx.mul_mat(s.ffn_gate, cur)?;
            let g = b.pin(g, &name("ffn_gate"))?;
            let u = b.ctx.mul_mat(s.ffn_up, cur)?;
            let u = b.pin(u, &name("ffn_up"))?;
            gate_up.push(blocks::ffn_act(&mut b, hp.features.ffn_act, g, u)?);
        }
        let out_full = if !routing.is_empty() {
            moe_down(&mut b, tp, il, &gate_up, &routing)?
        } else if tp.reduce {
            let mut partial = Vec::with_capacity(nd);
            for (d, &h) in gate_up.iter().enumerate() {
                b.dev = d;
                let o = b.ctx.mul_mat(tp.layers[il][d].ffn_down, h)?;
                partial.push((d, b.pin(o, &name("ffn_out"))?));
            }
            all_reduce(&mut b, &partial, nd, bf16_min, &name("ffn_reduce"))?
        } else {
            let down = |d: usize| tp.layers[il][d].ffn_down;
            let names = [name("ffn_gather"), name("ffn_out"), name("out_gather")];
            b.row_split_mul_mat(&gate_up, nd, down, &names)?
        };
        for d in 0..nd {
            b.dev = d;
            let post = tp.layers[il][d].ffn_post_norm;
            let o = blocks::post_norm(&mut b, out_full[d], post, hp.rms_eps, "ffn_post_norm")?;
            let l = b.ctx.add(o, ffn_inp[d])?;
            x[d] = b.pin(l, &name("l_out"))?;
        }
    }
    b.dev = 0;
    b.layer = None;
    let cur = b.ctx.get_rows(x[0], inp.out_ids)?;
    let cur = b.pin(cur, "result_rows")?;
    let cur = b.ctx.rms_norm(cur, hp.rms_eps)?;
    let cur = b.pin(cur, "result_rms")?;
    let cur = b.ctx.mul(cur, model.output_norm)?;
    let cur = b.pin(cur, "result_norm")?;
    let logits = b.ctx.mul_mat(model.output, cur)?;
    let logits = b.pin(logits, "result_output")?;
    b.ctx.set_flags(logits, TensorFlags::OUTPUT)?;
    let pins = b.pins;
    // Without chunks the anchors are the cache writes (the order of the concat graph).
    let anchors = b.anchors;

    let ordered = order(ctx, &anchors, logits, cap)?;
    Ok(ForwardGraph::assemble(
        storage,
        ordered,
        &inp,
        logits,
        layer_first,
        pins,
        shape,
    ))
}
