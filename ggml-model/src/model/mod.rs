//! A model loaded from GGUF (any supported [`Arch`]): hyperparameters, weight
//! descriptors and their placement in backend memory.

pub mod arch;
mod blocks;
mod graph;
mod graph_tp;
mod hparams;
pub mod tp;

pub use arch::{Arch, Features, FfnAct};
pub use graph::{build_forward, BatchShape, ForwardGraph, KvTensors};
pub use graph_tp::build_forward_tp;
pub use hparams::{HParams, LlamaHParams};
pub use tp::TpShards;

use ggml_core::{DType, Tensor, TensorFlags, TensorId};

use crate::error::{ModelError, Result};
use crate::gguf_file::GgufFile;

/// Weight ids of one transformer block (indices into [`Model::weights`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerWeights {
    /// `blk.N.attn_norm.weight`, F32 `[n_embd]`.
    pub attn_norm: TensorId,
    /// `blk.N.attn_q.weight`, `[n_embd, n_head * head_dim]`.
    pub wq: TensorId,
    /// `blk.N.attn_k.weight`, `[n_embd, n_embd_kv]`.
    pub wk: TensorId,
    /// `blk.N.attn_v.weight`, `[n_embd, n_embd_kv]`.
    pub wv: TensorId,
    /// `blk.N.attn_output.weight`, `[n_head * head_dim, n_embd]`.
    pub wo: TensorId,
    /// `blk.N.ffn_norm.weight`, F32 `[n_embd]`.
    pub ffn_norm: TensorId,
    /// `blk.N.ffn_gate.weight`, `[n_embd, n_ff]`; with experts
    /// `blk.N.ffn_gate_exps.weight`, `[n_embd, n_ff, n_expert]`.
    pub ffn_gate: TensorId,
    /// `blk.N.ffn_up.weight`, `[n_embd, n_ff]`; with experts `blk.N.ffn_up_exps.weight`,
    /// `[n_embd, n_ff, n_expert]`.
    pub ffn_up: TensorId,
    /// `blk.N.ffn_down.weight`, `[n_ff, n_embd]`; with experts
    /// `blk.N.ffn_down_exps.weight`, `[n_ff, n_embd, n_expert]`.
    pub ffn_down: TensorId,
    /// The router of a mixture of experts, `blk.N.ffn_gate_inp.weight`, `[n_embd,
    /// n_expert]` (`None`: a dense FFN).
    pub ffn_gate_inp: Option<TensorId>,
    /// `blk.N.attn_q_norm.weight`, F32 `[head_dim]` (with [`Features::qk_norm`]).
    pub attn_q_norm: Option<TensorId>,
    /// `blk.N.attn_k_norm.weight`, F32 `[head_dim]` (with [`Features::qk_norm`]).
    pub attn_k_norm: Option<TensorId>,
    /// `blk.N.post_attention_norm.weight`, F32 `[n_embd]` (with [`Features::post_norms`]).
    pub attn_post_norm: Option<TensorId>,
    /// `blk.N.post_ffw_norm.weight`, F32 `[n_embd]` (with [`Features::post_norms`]).
    pub ffn_post_norm: Option<TensorId>,
}

/// Weight dtypes accepted for matrices.
pub const MATRIX_DTYPES: [DType; 13] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q2K,
    DType::Q3K,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
];

fn matrix_dtype_ok(d: DType) -> bool {
    MATRIX_DTYPES.contains(&d)
}

/// A model: hyperparameters and weight descriptors (ids are indices into
/// `weights` and stay the same in every forward graph).
#[derive(Clone, Debug)]
pub struct Model {
    /// Hyperparameters.
    pub hp: HParams,
    /// Weight descriptors; `data` is set once placed ([`crate::placement`]).
    pub weights: Vec<Tensor>,
    /// Byte range of each weight in the GGUF file.
    pub file_ranges: Vec<std::ops::Range<usize>>,
    /// `token_embd.weight`, `[n_embd, n_vocab]`.
    pub tok_embd: TensorId,
    /// `output_norm.weight`, F32 `[n_embd]`.
    pub output_norm: TensorId,
    /// `output.weight`. When the output is tied this is a second descriptor of
    /// `token_embd.weight`'s bytes (llama.cpp's TENSOR_DUPLICATED), so that the
    /// embedding lookup can stay on the first device and the output projection on the
    /// last one; on the CPU both read the same mapped file.
    pub output: TensorId,
    /// Per-layer weights.
    pub layers: Vec<LayerWeights>,
}

impl Model {
    /// Reads the hyperparameters and checks every weight's presence, shape and dtype.
    pub fn from_gguf(file: &GgufFile) -> Result<Model> {
        let hp = HParams::from_gguf(file)?;
        let mut m = Model {
            hp: hp.clone(),
            weights: Vec::new(),
            file_ranges: Vec::new(),
            tok_embd: TensorId(0),
            output_norm: TensorId(0),
            output: TensorId(0),
            layers: Vec::with_capacity(hp.n_layer),
        };
        let (e, kv, ff, v) = (hp.n_embd, hp.n_embd_kv(), hp.n_ff, hp.n_vocab);
        let (q, hd, feat) = (hp.n_embd_q(), hp.head_dim, hp.features);
        let (moe, nx) = (hp.is_moe(), hp.n_expert.max(1));
        // Dense FFN matrices, or the stacked experts' (`_exps`, one more dimension).
        let ffn = |what: &str| match moe {
            true => format!("{what}_exps"),
            false => what.to_string(),
        };
        m.tok_embd = m.add(file, "token_embd.weight", [e, v], true)?;
        for il in 0..hp.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}.weight");
            let lw = LayerWeights {
                attn_norm: m.add(file, &n("attn_norm"), [e, 1], false)?,
                wq: m.add(file, &n("attn_q"), [e, q], true)?,
                wk: m.add(file, &n("attn_k"), [e, kv], true)?,
                wv: m.add(file, &n("attn_v"), [e, kv], true)?,
                wo: m.add(file, &n("attn_output"), [q, e], true)?,
                ffn_norm: m.add(file, &n("ffn_norm"), [e, 1], false)?,
                ffn_gate: m.add3(file, &n(&ffn("ffn_gate")), [e, ff, nx], true)?,
                ffn_up: m.add3(file, &n(&ffn("ffn_up")), [e, ff, nx], true)?,
                ffn_down: m.add3(file, &n(&ffn("ffn_down")), [ff, e, nx], true)?,
                ffn_gate_inp: moe
                    .then(|| m.add(file, &n("ffn_gate_inp"), [e, nx], false))
                    .transpose()?,
                attn_q_norm: feat
                    .qk_norm
                    .then(|| m.add(file, &n("attn_q_norm"), [hd, 1], false))
                    .transpose()?,
                attn_k_norm: feat
                    .qk_norm
                    .then(|| m.add(file, &n("attn_k_norm"), [hd, 1], false))
                    .transpose()?,
                attn_post_norm: feat
                    .post_norms
                    .then(|| m.add(file, &n("post_attention_norm"), [e, 1], false))
                    .transpose()?,
                ffn_post_norm: feat
                    .post_norms
                    .then(|| m.add(file, &n("post_ffw_norm"), [e, 1], false))
                    .transpose()?,
            };
            m.layers.push(lw);
        }
        m.output_norm = m.add(file, "output_norm.weight", [e, 1], false)?;
        m.output = if file.tensor_info("output.weight").is_some() {
            m.add(file, "output.weight", [e, v], true)?
        } else {
            let id = m.add(file, "token_embd.weight", [e, v], true)?;
            m.weights[id.index()].name = ggml_core::Name::new("output.weight");
            id
        };
        Ok(m)
    }

    fn add(
        &mut self,
        file: &GgufFile,
        name: &str,
        ne2: [usize; 2],
        matrix: bool,
    ) -> Result<TensorId> {
        self.add3(file, name, [ne2[0], ne2[1], 1], matrix)
    }

    /// [`add`](Model::add) for a weight of up to three dimensions.
    fn add3(
        &mut self,
        file: &GgufFile,
        name: &str,
        ne3: [usize; 3],
        matrix: bool,
    ) -> Result<TensorId> {
        let info = file
            .tensor_info(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let want = [ne3[0], ne3[1], ne3[2], 1];
        if info.ne != want {
            return Err(ModelError::Model(format!(
                "tensor '{name}' has shape {:?}, expected {want:?}",
                info.ne
            )));
        }
        let ok = if matrix {
            matrix_dtype_ok(info.dtype)
        } else {
            info.dtype == DType::F32
        };
        if !ok {
            return Err(ModelError::Model(format!(
                "tensor '{name}' has unsupported dtype {} ({})",
                info.dtype,
                if matrix {
                    "matrices may be f32, f16, bf16 or a weight quant type"
                } else {
                    "norms must be f32"
                }
            )));
        }
        let mut t = Tensor::contiguous(info.dtype, want).ok_or_else(|| {
            ModelError::Model(format!(
                "tensor '{name}': shape {want:?} does not fit its dtype {}",
                info.dtype
            ))
        })?;
        if t.nbytes() != info.range.len() {
            return Err(ModelError::Model(format!(
                "tensor '{name}': {} bytes in the file, shape needs {}",
                info.range.len(),
                t.nbytes()
            )));
        }
        t.name = ggml_core::Name::new(name);
        t.flags = TensorFlags::WEIGHT;
        self.weights.push(t);
        self.file_ranges.push(info.range.clone());
        Ok(TensorId(self.weights.len() as u32 - 1))
    }

    /// Bytes of weights one generated token reads: every layer's weights, the output
    /// norm and the output matrix whole (a tied output reads the embedding matrix), one
    /// row of the embedding matrix for the lookup, and of each mixture of experts only
    /// the `n_expert_used` experts a token is routed to.
    pub fn weight_bytes_per_token(&self) -> u64 {
        let bytes = |id: TensorId| self.weights[id.index()].nbytes() as u64;
        let embd = &self.weights[self.tok_embd.index()];
        let mut total = bytes(self.output_norm) + bytes(self.output);
        total += embd.nbytes() as u64 / embd.ne[1].max(1) as u64;
        for l in &self.layers {
            let dense = [l.attn_norm, l.wq, l.wk, l.wv, l.wo, l.ffn_norm];
            let optional = [
                l.ffn_gate_inp,
                l.attn_q_norm,
                l.attn_k_norm,
                l.attn_post_norm,
                l.ffn_post_norm,
            ];
            total += dense
                .into_iter()
                .chain(optional.into_iter().flatten())
                .map(bytes)
                .sum::<u64>();
            let ffn: u64 = [l.ffn_gate, l.ffn_up, l.ffn_down]
                .into_iter()
                .map(bytes)
                .sum();
            total += match l.ffn_gate_inp {
                Some(_) => ffn * self.hp.n_expert_used as u64 / self.hp.n_expert.max(1) as u64,
                None => ffn,
            };
        }
        total
    }

    /// The layer a weight belongs to (`None` for embeddings, output norm and output).
    pub fn layer_of(&self, id: TensorId) -> Option<usize> {
        self.weights[id.index()]
            .name
            .as_str()
            .strip_prefix("blk.")
            .and_then(|s| s.split('.').next())
            .and_then(|s| s.parse().ok())
    }
}
