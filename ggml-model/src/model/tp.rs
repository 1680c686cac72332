//! Exact tensor parallelism (`--split-mode tensor`): every layer's matrices cut by output
//! rows over the devices, activations all-gathered, no partial sums between devices.
//!
//! Attention is cut by whole KV heads, each with its query heads (GQA groups stay
//! together), so each device attends its heads over its own slice of the KV cache. The
//! attention output projection and the feed-forward matrices are cut by output rows; the
//! next op needs the full vector, so the slices are concatenated on every device (an
//! all-gather made of the scheduler's cross-device copies). Every output element is
//! computed by the same kernel over the same inputs as without the split, so the logits
//! are bit-identical to split mode none on the same kind of backend.

use std::ops::Range;

use ggml_core::TensorId;

use super::Model;
use crate::error::{ModelError, Result};

/// One device's shards of one layer (ids into [`Model::weights`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceShard {
    /// This device's copy of the attention norm.
    pub attn_norm: TensorId,
    /// Query rows of its heads (`None` when it has no heads).
    pub wq: Option<TensorId>,
    /// Key rows of its KV heads.
    pub wk: Option<TensorId>,
    /// Value rows of its KV heads.
    pub wv: Option<TensorId>,
    /// Its output rows of the attention projection (`tensor`), or the input columns of
    /// its heads (`tensor-reduce`; `None` when it has no heads).
    pub wo: Option<TensorId>,
    /// This device's copy of the feed-forward norm.
    pub ffn_norm: TensorId,
    /// Its rows of the gate matrix (of every expert's, with experts).
    pub ffn_gate: TensorId,
    /// Its rows of the up matrix (of every expert's, with experts).
    pub ffn_up: TensorId,
    /// Its output rows of the down matrix (`tensor`), or its input columns, the rows of
    /// `n_ff` it computes (`tensor-reduce`).
    pub ffn_down: TensorId,
    /// This device's copy of the router (mixtures of experts: every device routes every
    /// token itself, with the same bits).
    pub ffn_gate_inp: Option<TensorId>,
    /// This device's copy of the query head norm (architectures with one, devices with
    /// heads).
    pub attn_q_norm: Option<TensorId>,
    /// This device's copy of the key head norm (as `attn_q_norm`).
    pub attn_k_norm: Option<TensorId>,
    /// This device's copy of the attention post-norm (architectures with one).
    pub attn_post_norm: Option<TensorId>,
    /// This device's copy of the feed-forward post-norm (architectures with one).
    pub ffn_post_norm: Option<TensorId>,
}

/// How the model is cut over `n_dev` devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TpShards {
    /// Devices.
    pub n_dev: usize,
    /// Megatron style (`tensor-reduce`): the attention projection and the down matrix
    /// cut by input columns, their partial sums all-reduced.
    pub reduce: bool,
    /// With `reduce`: partial sums of at least this many bytes cross devices as BF16
    /// (summation stays F32); `None`: always F32.
    pub bf16_min: Option<usize>,
    /// Exact split (`--all-gather ring`): every all-gather that feeds a matrix product
    /// is cut into token chunks, and each device multiplies chunk c while chunk c + 1
    /// is still crossing (on copy engines, round the ring); `false` gathers whole
    /// tensors first.
    pub ring: bool,
    /// Per device: its KV heads (query heads are `n_head / n_head_kv` times these).
    pub kv_heads: Vec<Range<usize>>,
    /// Per device: its rows of `n_embd` (outputs of the attention projection and of the
    /// down matrix).
    pub embd_rows: Vec<Range<usize>>,
    /// Per device: its rows of `n_ff`.
    pub ff_rows: Vec<Range<usize>>,
    /// Per layer, per device.
    pub layers: Vec<Vec<DeviceShard>>,
    /// Device of each weight of the model (`None`: not used by the tensor-parallel graph
    /// and not placed).
    pub weight_device: Vec<Option<usize>>,
}

/// `n` units cut into `parts` contiguous ranges as evenly as possible, the first ranges
/// taking the remainder.
pub fn even_ranges(n: usize, parts: usize) -> Vec<Range<usize>> {
    let (q, r) = (n / parts, n % parts);
    let mut at = 0;
    (0..parts)
        .map(|i| {
            let len = q + usize::from(i < r);
            let range = at..at + len;
            at += len;
            range
        })
        .collect()
}

impl Model {
    /// Rows `rows` of matrix `id` (of each matrix of a stack of experts) as a new weight
    /// descriptor (a view of the same bytes).
    fn row_shard(&mut self, id: TensorId, rows: Range<usize>, tag: &str) -> TensorId {
        let w = self.weights[id.index()];
        let mut t = w;
        t.ne[1] = rows.len();
        t.name = ggml_core::Name::new(&format!("{}{tag}", w.name.as_str()));
        let start = self.file_ranges[id.index()].start + rows.start * w.nb[1];
        self.weights.push(t);
        let len = (w.ne[2] - 1) * w.nb[2] + rows.len() * w.nb[1];
        self.file_ranges.push(start..start + len);
        TensorId(self.weights.len() as u32 - 1)
    }

    /// Columns `cols` of matrix `id` (every row's slice; rows keep their stride).
    fn col_shard(&mut self, id: TensorId, cols: Range<usize>, tag: &str) -> Result<TensorId> {
        let w = self.weights[id.index()];
        let bs = w.dtype.block_size();
        if cols.start % bs != 0 || cols.end % bs != 0 {
            return Err(ModelError::Usage(format!(
                "--split-mode tensor-reduce: columns {cols:?} of '{}' do not fall on {bs}-element blocks",
                w.name.as_str()
            )));
        }
        let mut t = w;
        t.ne[0] = cols.len();
        t.name = ggml_core::Name::new(&format!("{}{tag}", w.name.as_str()));
        let skip = cols.start / bs * w.dtype.type_size();
        let start = self.file_ranges[id.index()].start + skip;
        let row = w
            .dtype
            .row_size(cols.len())
            .expect("a slice of a valid row");
        self.weights.push(t);
        let len = (w.ne[2] - 1) * w.nb[2] + (w.ne[1] - 1) * w.nb[1] + row;
        self.file_ranges.push(start..start + len);
        Ok(TensorId(self.weights.len() as u32 - 1))
    }

    /// A second descriptor of weight `id` (for a device that needs its own copy).
    fn replica(&mut self, id: TensorId, tag: &str) -> TensorId {
        self.row_shard(id, 0..self.weights[id.index()].ne[1], tag)
    }

    /// Cuts every layer over `n_dev` devices for `--split-mode tensor` (or
    /// `tensor-reduce` with `reduce`); appends the shards to the model's weights.
    pub fn shard(&mut self, n_dev: usize, reduce: bool) -> Result<TpShards> {
        let hp = self.hp.clone();
        if n_dev == 0 {
            return Err(ModelError::Usage("tensor split over no devices".into()));
        }
        let group = hp.n_head / hp.n_head_kv;
        let kv_heads = even_ranges(hp.n_head_kv, n_dev);
        let embd_rows = even_ranges(hp.n_embd, n_dev);
        let ff_rows = even_ranges(hp.n_ff, n_dev);
        if embd_rows.iter().chain(&ff_rows).any(|r| r.is_empty()) {
            return Err(ModelError::Usage(format!(
                "--split-mode tensor over {n_dev} devices: some device would get no rows"
            )));
        }
        let n_before = self.weights.len();
        let hd = hp.head_dim;
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let lw = self.layers[il];
            let mut devs = Vec::with_capacity(n_dev);
            for d in 0..n_dev {
                let tag = format!("#tp{d}");
                let kvh = kv_heads[d].clone();
                let (wq, wk, wv) = if kvh.is_empty() {
                    (None, None, None)
                } else {
                    let q_rows = kvh.start * group * hd..kvh.end * group * hd;
                    let kv_rows = kvh.start * hd..kvh.end * hd;
                    (
                        Some(self.row_shard(lw.wq, q_rows, &tag)),
                        Some(self.row_shard(lw.wk, kv_rows.clone(), &tag)),
                        Some(self.row_shard(lw.wv, kv_rows, &tag)),
                    )
                };
                let (wo, ffn_down) = if reduce {
                    let head_cols = kvh.start * group * hd..kvh.end * group * hd;
                    let wo = match kvh.is_empty() {
                        true => None,
                        false => Some(self.col_shard(lw.wo, head_cols, &tag)?),
                    };
                    (wo, self.col_shard(lw.ffn_down, ff_rows[d].clone(), &tag)?)
                } else {
                    (
                        Some(self.row_shard(lw.wo, embd_rows[d].clone(), &tag)),
                        self.row_shard(lw.ffn_down, embd_rows[d].clone(), &tag),
                    )
                };
                let has_heads = !kvh.is_empty();
                let mut copy = |id: Option<TensorId>, wanted: bool| {
                    id.filter(|_| wanted).map(|id| self.replica(id, &tag))
                };
                let attn_q_norm = copy(lw.attn_q_norm, has_heads);
                let attn_k_norm = copy(lw.attn_k_norm, has_heads);
                let attn_post_norm = copy(lw.attn_post_norm, true);
                let ffn_gate_inp = copy(lw.ffn_gate_inp, true);
                let ffn_post_norm = copy(lw.ffn_post_norm, true);
                devs.push(DeviceShard {
                    attn_norm: self.replica(lw.attn_norm, &tag),
                    wq,
                    wk,
                    wv,
                    wo,
                    ffn_norm: self.replica(lw.ffn_norm, &tag),
                    ffn_gate: self.row_shard(lw.ffn_gate, ff_rows[d].clone(), &tag),
                    ffn_up: self.row_shard(lw.ffn_up, ff_rows[d].clone(), &tag),
                    ffn_down,
                    ffn_gate_inp,
                    attn_q_norm,
                    attn_k_norm,
                    attn_post_norm,
                    ffn_post_norm,
                });
            }
            layers.push(devs);
        }
        // Devices: the shards where they were cut for; embedding, output norm and output
        // on device 0; the uncut layer matrices nowhere.
        let mut weight_device: Vec<Option<usize>> = (0..self.weights.len())
            .map(|i| (self.layer_of(TensorId(i as u32)).is_none()).then_some(0))
            .collect();
        for devs in &layers {
            for (d, s) in devs.iter().enumerate() {
                let ids = [
                    Some(s.attn_norm),
                    s.wq,
                    s.wk,
                    s.wv,
                    s.wo,
                    Some(s.ffn_norm),
                    Some(s.ffn_gate),
                    Some(s.ffn_up),
                    Some(s.ffn_down),
                    s.ffn_gate_inp,
                    s.attn_q_norm,
                    s.attn_k_norm,
                    s.attn_post_norm,
                    s.ffn_post_norm,
                ];
                for id in ids.into_iter().flatten() {
                    weight_device[id.index()] = Some(d);
                }
            }
        }
        debug_assert!(weight_device[n_before..].iter().all(Option::is_some));
        Ok(TpShards {
            n_dev,
            reduce,
            bf16_min: None,
            ring: false,
            kv_heads,
            embd_rows,
            ff_rows,
            layers,
            weight_device,
        })
    }
}

/// One all-reduce of `tensor-reduce` as the placement pass puts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReducePoint {
    /// Layer.
    pub layer: usize,
    /// The node that leaves the partial sums (`attn_proj-3`, `ffn_moe_down-3`).
    pub partial: String,
    /// The node after which the partial sums are added up (`ffn_moe_out-3`).
    pub at: String,
    /// Bytes per token each device holds at the partial (F32).
    pub bytes_at_partial: usize,
    /// Bytes per token each device holds at the reduce point (F32): what crosses devices.
    pub bytes_at_point: usize,
}

/// Where the all-reduce placement pass ([`ggml_sched::reduce::reduce_point`]) puts each
/// partial sum of `tensor-reduce` (the attention projection and the down product of
/// every layer) on the model's unsplit graph.
pub fn reduce_points(model: &Model) -> Result<Vec<ReducePoint>> {
    let hp = &model.hp;
    let cache = ggml_core::Tensor::contiguous(ggml_core::DType::F16, [hp.n_embd_kv(), 256, 1, 1])
        .expect("small cache");
    let shape = super::BatchShape {
        n_tokens: 1,
        n_kv: 256,
        n_outputs: 1,
    };
    let g = super::build_forward(model, &vec![(cache, cache); hp.n_layer], shape)?;
    let find = |name: &str| {
        g.nodes
            .iter()
            .copied()
            .find(|n| g.tensors[n.index()].name.as_str() == name)
            .ok_or_else(|| ModelError::Model(format!("no node '{name}' in the graph")))
    };
    let ffn = if hp.is_moe() {
        "ffn_moe_down"
    } else {
        "ffn_out"
    };
    let mut out = Vec::with_capacity(2 * hp.n_layer);
    for layer in 0..hp.n_layer {
        for what in ["attn_proj", ffn] {
            let partial = format!("{what}-{layer}");
            let p = find(&partial)?;
            let at = ggml_sched::reduce::reduce_point(&g.tensors, &g.nodes, p, &|_| false);
            let (tp, ta) = (&g.tensors[p.index()], &g.tensors[at.index()]);
            out.push(ReducePoint {
                layer,
                partial,
                at: ta.name.as_str().to_string(),
                bytes_at_partial: tp.nbytes(),
                bytes_at_point: ta.nbytes(),
            });
        }
    }
    Ok(out)
}

/// The all-reduces of one `tensor-reduce` pass over `n_tokens` tokens as a table: where
/// each sits, the bytes each device contributes there (F32), and what they would be at the
/// partial product itself; then the totals.
pub fn reduce_table(points: &[ReducePoint], n_tokens: usize) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "all-reduces of tensor-reduce, {n_tokens} tokens (bytes per device, F32):"
    );
    let _ = writeln!(
        s,
        "  {:>5}  {:<18} {:<18} {:>12} {:>14}",
        "layer", "partial", "reduced after", "bytes", "at the partial"
    );
    let (mut at, mut partial) = (0usize, 0usize);
    for p in points {
        let (a, b) = (p.bytes_at_point * n_tokens, p.bytes_at_partial * n_tokens);
        let _ = writeln!(
            s,
            "  {:>5}  {:<18} {:<18} {a:>12} {b:>14}",
            p.layer, p.partial, p.at
        );
        at += a;
        partial += b;
    }
    let _ = writeln!(
        s,
        "  total: {} all-reduces, {at} bytes ({partial} if each were reduced at its partial)",
        points.len()
    );
    s
}

/// Checks that each partial sum of `tensor-reduce` is to be reduced ([`reduce_points`])
/// right where the graph builder reduces it: at the product, since a residual add reads
/// it next; for a mixture of experts, once after the weighted sum of the chosen experts.
pub fn check_reduce_points(model: &Model, tp: &TpShards) -> Result<()> {
    for p in reduce_points(model)? {
        if p.layer >= tp.layers.len() {
            continue;
        }
        let want = match p.partial.starts_with("ffn_moe_down") {
            true => format!("ffn_moe_out-{}", p.layer),
            false => p.partial.clone(),
        };
        if p.at != want {
            return Err(ModelError::Model(format!(
                "the all-reduce of '{}' belongs after '{}', which this graph builder does not do",
                p.partial, p.at
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_ranges_cover_in_order() {
        assert_eq!(even_ranges(3, 2), vec![0..2, 2..3]);
        assert_eq!(even_ranges(3, 4), vec![0..1, 1..2, 2..3, 3..3]);
        assert_eq!(even_ranges(576, 3), vec![0..192, 192..384, 384..576]);
        assert_eq!(
            even_ranges(1536, 4).iter().map(|r| r.len()).sum::<usize>(),
            1536
        );
    }
}
