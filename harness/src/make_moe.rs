//! Sparse upcycling: a dense llama GGUF (such as SmolLM2) turned into a mixture of experts
//! in Mixtral's layout, so that MoE code paths can be tested on a model that speaks
//! English and that llama.cpp loads as is.
//!
//! Every layer's dense `ffn_gate`, `ffn_up` and `ffn_down` become `n_expert` stacked
//! copies (`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`), each the dense matrix plus
//! a little seeded noise, requantised to the dense tensor's dtype, and a seeded random
//! router `ffn_gate_inp` (F32) is added. llama.cpp renormalises the weights of the chosen
//! experts to sum to 1, so the FFN's output stays close to the dense one whichever
//! experts the router picks, while the router's choice still changes the numbers.
//!
//! The output is a pure function of the input file and [`MoeOptions`]: the noise of each
//! (layer, matrix, expert) comes from its own stream of the seed, and the Gaussian-like
//! draws use integer and basic float arithmetic only (no `ln`/`cos`), so the bytes are
//! the same on every machine.

use std::path::Path;

use ggml_core::gguf::{Gguf, Value, ValueType};
use ggml_core::quant::{dequantize_row, quantize_row};
use ggml_core::DType;

use crate::error::{HarnessError, ModelError, Result};
use crate::gguf_file::GgufFile;
use crate::gguf_writer::{GgufWriter, MetaValue};
use crate::synthetic::Rng;

/// Default relative noise of the experts: each weight moves by 0.075 × its row's RMS (one
/// standard deviation) before requantisation. Measured with llama.cpp on SmolLM2 Q4_1
/// (GPL-3 text, `-c 512`): perplexity 18.39 dense, 20.03 upcycled (+9 %), while routing
/// every token to the same two experts instead moves the logits by a mean KL divergence
/// of 0.13 (same top token 80 %): routing mistakes show clearly. 0.05 gave +3 % but a
/// KLD of only 0.04 for wrong routing; 0.1 gave +18 %; 0.15 gave +49 %.
pub const DEFAULT_NOISE: f32 = 0.075;

/// Default standard deviation of the router's logits for a typical hidden state: 2.0, so
/// that the softmax over 4 experts usually puts well over half its mass on one or two
/// of them (routing matters) yet varies from token to token.
pub const DEFAULT_ROUTER_SCALE: f32 = 2.0;

/// The most experts llama.cpp accepts (`LLAMA_MAX_EXPERTS`).
pub const MAX_EXPERTS: usize = 1024;

/// Bumped whenever the bytes [`make_moe`] writes for the same inputs change, so that
/// cached upcycled models are rebuilt (see [`crate::moe_model_path`]).
pub const MAKE_MOE_VERSION: u32 = 1;

/// How to upcycle a dense model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeOptions {
    /// Experts per FFN (default 4; at least 2, as llama.cpp treats 1 as dense).
    pub experts: usize,
    /// Experts each token uses (default 2; `1..=experts`).
    pub used: usize,
    /// Seed of the noise and the router (default 1).
    pub seed: u64,
    /// Standard deviation of each expert's noise relative to the RMS of the weight's row
    /// (default [`DEFAULT_NOISE`]; finite, `0 <= noise <= 1`).
    pub noise: f32,
    /// Standard deviation of the router's logits for a hidden state of unit RMS after
    /// `ffn_norm` (default [`DEFAULT_ROUTER_SCALE`]; finite, `>= 0`; 0 gives a router of
    /// zeros, which picks the first experts for every token).
    pub router_scale: f32,
}

impl Default for MoeOptions {
    fn default() -> Self {
        MoeOptions {
            experts: 4,
            used: 2,
            seed: 1,
            noise: DEFAULT_NOISE,
            router_scale: DEFAULT_ROUTER_SCALE,
        }
    }
}

impl MoeOptions {
    /// Checks the options; the error names the option and its valid range.
    pub fn validate(&self) -> Result<()> {
        let bad = |s: String| Err(HarnessError::Usage(s));
        if !(2..=MAX_EXPERTS).contains(&self.experts) {
            return bad(format!(
                "--experts {}: must be in 2..={MAX_EXPERTS} (llama.cpp treats 1 expert as a dense FFN)",
                self.experts
            ));
        }
        if !(1..=self.experts).contains(&self.used) {
            return bad(format!(
                "--used {}: must be in 1..=--experts ({})",
                self.used, self.experts
            ));
        }
        if !(self.noise.is_finite() && (0.0..=1.0).contains(&self.noise)) {
            return bad(format!("--noise {}: must be in 0..=1", self.noise));
        }
        if !(self.router_scale.is_finite() && self.router_scale >= 0.0) {
            return bad(format!(
                "--router-scale {}: must be finite and >= 0",
                self.router_scale
            ));
        }
        Ok(())
    }
}

/// What [`make_moe`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeSummary {
    /// Layers converted.
    pub n_layer: usize,
    /// Experts per FFN.
    pub n_expert: usize,
    /// Experts used per token.
    pub n_expert_used: usize,
    /// dtypes of the expert tensors (those of the dense FFN matrices), without repeats.
    pub dtypes: Vec<DType>,
    /// Tensors in the output file.
    pub n_tensors: usize,
    /// Size of the output file in bytes.
    pub bytes: u64,
    /// RMS over all expert weights of (expert − dense), relative to the RMS of the dense
    /// weights, after requantisation: how far the experts are from the dense FFN.
    pub rel_rms_change: f64,
}

impl std::fmt::Display for MoeSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dtypes: Vec<&str> = self.dtypes.iter().map(|d| d.name()).collect();
        write!(
            f,
            "{} layers, {} experts ({} used per token), experts {}, {} tensors, {} bytes; experts differ from the dense FFN by {:.2}% RMS",
            self.n_layer,
            self.n_expert,
            self.n_expert_used,
            dtypes.join("/"),
            self.n_tensors,
            self.bytes,
            100.0 * self.rel_rms_change
        )
    }
}

/// The three dense FFN matrices of a llama layer and the names of their expert stacks.
const FFN: [(&str, &str); 3] = [
    ("ffn_gate", "ffn_gate_exps"),
    ("ffn_up", "ffn_up_exps"),
    ("ffn_down", "ffn_down_exps"),
];

/// `blk.N.<kind>.<suffix>` split into `(N, kind, suffix)`.
fn layer_tensor(name: &str) -> Option<(usize, &str, &str)> {
    let rest = name.strip_prefix("blk.")?;
    let (n, rest) = rest.split_once('.')?;
    let (kind, suffix) = rest.split_once('.')?;
    Some((n.parse().ok()?, kind, suffix))
}

/// A seeded stream for one (layer, matrix, expert): the seed and the tag mixed through
/// splitmix64, so that streams do not overlap and do not depend on the order of work.
fn stream(seed: u64, layer: usize, what: u64, expert: usize) -> Rng {
    let mut r = Rng(seed ^ 0x6d6f_652d_7570_6379); // "moe-upcy"
    let a = r.next_u64();
    let tag = ((layer as u64) << 32) ^ (what << 24) ^ expert as u64;
    let mut r = Rng(a ^ tag.wrapping_mul(0xD6E8_FEB8_6659_FD93));
    r.next_u64();
    r
}

/// A Gaussian-like draw of mean 0 and variance 1: the sum of four uniforms on [-1, 1)
/// (Irwin–Hall), scaled. Only integer and basic float arithmetic, so it is the same
/// everywhere; bounded by ±2√3.
fn gaussianish(r: &mut Rng) -> f32 {
    let mut s = 0.0f32;
    for _ in 0..4 {
        let u = (r.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        s += 2.0 * u - 1.0;
    }
    s * 0.866_025_4 // sqrt(3/4): each uniform has variance 1/3
}

/// Copies one metadata value into the writer's form, or says why it cannot.
fn meta_value(key: &str, v: &Value<'_>) -> Result<MetaValue> {
    let unsupported = |t: String| {
        HarnessError::Model(format!(
            "metadata key '{key}' has type {t}, which make-moe cannot write"
        ))
    };
    Ok(match *v {
        Value::U32(x) => MetaValue::U32(x),
        Value::I32(x) => MetaValue::I32(x),
        Value::F32(x) => MetaValue::F32(x),
        Value::Bool(x) => MetaValue::Bool(x),
        Value::String(s) => MetaValue::Str(s.to_string()),
        Value::Array(a) => {
            let broken =
                || HarnessError::Model(format!("metadata key '{key}': array cannot be read"));
            match a.elem_type() {
                ValueType::String => {
                    let xs: Vec<String> = a
                        .strings()
                        .ok_or_else(broken)?
                        .map(str::to_string)
                        .collect();
                    if xs.len() != a.len() {
                        return Err(broken());
                    }
                    MetaValue::StrArray(xs)
                }
                ValueType::I32 => {
                    MetaValue::I32Array(a.numbers::<i32>().ok_or_else(broken)?.collect())
                }
                ValueType::F32 => {
                    MetaValue::F32Array(a.numbers::<f32>().ok_or_else(broken)?.collect())
                }
                t => return Err(unsupported(format!("array of {t}"))),
            }
        }
        ref other => return Err(unsupported(other.value_type().to_string())),
    })
}

/// The bytes of tensor `name` with its dtype and dims (innermost first).
fn tensor_bytes<'a>(g: &Gguf<'a>, name: &str) -> Result<(DType, Vec<u64>, &'a [u8])> {
    let t = g
        .tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
    let data = g
        .tensor_data(&t)
        .ok_or_else(|| HarnessError::Model(format!("tensor '{name}': data outside the file")))?;
    Ok((t.dtype(), t.dims().to_vec(), data))
}

/// All values of a tensor as f32, row by row.
fn dequantize(name: &str, dtype: DType, ne0: usize, data: &[u8]) -> Result<Vec<f32>> {
    let row = dtype
        .row_size(ne0)
        .filter(|&r| r > 0 && data.len() % r == 0)
        .ok_or_else(|| {
            HarnessError::Model(format!(
                "tensor '{name}': rows of {ne0} values do not fit {dtype}"
            ))
        })?;
    let mut out = vec![0f32; data.len() / row * ne0];
    for (src, dst) in data.chunks_exact(row).zip(out.chunks_exact_mut(ne0)) {
        dequantize_row(dtype, src, dst)
            .map_err(|e| HarnessError::Model(format!("tensor '{name}': {e}")))?;
    }
    Ok(out)
}

/// Running sums of the experts' distance from the dense weights.
#[derive(Default)]
struct Change {
    diff2: f64,
    dense2: f64,
}

/// The expert stack of one dense matrix: `n_expert` noisy copies, requantised to `dtype`,
/// expert-major (`[ne0, ne1, n_expert]`).
fn expert_stack(
    name: &str,
    dtype: DType,
    ne0: usize,
    dense: &[f32],
    opts: &MoeOptions,
    mut rng_of: impl FnMut(usize) -> Rng,
    change: &mut Change,
) -> Result<Vec<u8>> {
    let row = dtype.row_size(ne0).expect("checked by dequantize");
    let n_rows = dense.len() / ne0;
    let rms: Vec<f32> = dense
        .chunks_exact(ne0)
        .map(|r| {
            let s: f64 = r.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
            (s / ne0 as f64).sqrt() as f32
        })
        .collect();
    let mut out = vec![0u8; row * n_rows * opts.experts];
    let mut noisy = vec![0f32; ne0];
    let mut back = vec![0f32; ne0];
    let q = |e: ggml_core::quant::QuantError| HarnessError::Model(format!("tensor '{name}': {e}"));
    for e in 0..opts.experts {
        let mut rng = rng_of(e);
        let expert = &mut out[e * row * n_rows..(e + 1) * row * n_rows];
        for ((src, &rms), dst) in dense
            .chunks_exact(ne0)
            .zip(&rms)
            .zip(expert.chunks_exact_mut(row))
        {
            let sd = opts.noise * rms;
            for (y, &x) in noisy.iter_mut().zip(src) {
                *y = x + sd * gaussianish(&mut rng);
            }
            quantize_row(dtype, &noisy, dst).map_err(q)?;
            dequantize_row(dtype, dst, &mut back).map_err(q)?;
            for (&b, &x) in back.iter().zip(src) {
                let d = f64::from(b) - f64::from(x);
                change.diff2 += d * d;
                change.dense2 += f64::from(x) * f64::from(x);
            }
        }
    }
    Ok(out)
}

/// Upcycles the dense llama model at `src` into a mixture of `opts.experts` experts and
/// writes it to `out` (written aside and renamed, so a reader never sees half a file).
///
/// Errors: bad options ([`HarnessError::Usage`]); a model that is not `llama`, already
/// has experts, lacks a layer's FFN matrix or has FFN biases ([`HarnessError::Model`],
/// [`ModelError::MissingTensor`]); metadata of a type the writer cannot copy; I/O.
pub fn make_moe(src: &Path, opts: &MoeOptions, out: &Path) -> Result<MoeSummary> {
    let (bytes, summary) = make_moe_bytes(src, opts)?;
    write_atomically(out, &bytes)?;
    Ok(summary)
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |p: &Path| {
        let path = p.display().to_string();
        move |source| HarnessError::Io { path, source }
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "out".into());
    let tmp = path.with_file_name(format!(
        ".{name}.{}.{:?}.tmp",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(path)(e)
    })
}

/// [`make_moe`] without the file: the GGUF bytes and the summary.
pub fn make_moe_bytes(src: &Path, opts: &MoeOptions) -> Result<(Vec<u8>, MoeSummary)> {
    opts.validate()?;
    let file = GgufFile::open(src)?;
    let g = file.gguf()?;
    let path = src.display();
    let arch = file.get_str("general.architecture")?;
    if arch != "llama" {
        return Err(HarnessError::Model(format!(
            "{path}: architecture '{arch}'; make-moe upcycles llama models only"
        )));
    }
    let n_layer = file.get_usize("llama.block_count")?;
    let n_embd = file.get_usize("llama.embedding_length")?;
    let existing = match g.get("llama.expert_count") {
        Some(v) => v.to_usize().unwrap_or(1),
        None => 0,
    };
    if existing > 0 || g.tensors().any(|t| t.name().contains("_exps")) {
        return Err(HarnessError::Model(format!(
            "{path}: the model already has experts (llama.expert_count {existing}); make-moe upcycles dense models"
        )));
    }
    for t in g.tensors() {
        if let Some((il, kind, suffix)) = layer_tensor(t.name()) {
            if il >= n_layer {
                return Err(HarnessError::Model(format!(
                    "{path}: tensor '{}' is beyond llama.block_count {n_layer}",
                    t.name()
                )));
            }
            if suffix != "weight" && FFN.iter().any(|(d, _)| *d == kind) {
                return Err(HarnessError::Model(format!(
                    "{path}: tensor '{}': make-moe cannot convert FFN biases or scales",
                    t.name()
                )));
            }
        }
    }
    for il in 0..n_layer {
        for (dense, _) in FFN {
            let name = format!("blk.{il}.{dense}.weight");
            let (dtype, dims, _) = tensor_bytes(&g, &name)?;
            if dims.len() != 2 || dtype == DType::I32 {
                return Err(HarnessError::Model(format!(
                    "{path}: tensor '{name}' is {dtype} {dims:?}; expected a 2-D weight matrix"
                )));
            }
        }
    }

    let mut w = GgufWriter::new();
    for (key, v) in g.metadata() {
        if key == "llama.expert_count" || key == "llama.expert_used_count" {
            continue;
        }
        w.meta(key, meta_value(key, &v)?);
    }
    w.meta("llama.expert_count", MetaValue::U32(opts.experts as u32))
        .meta("llama.expert_used_count", MetaValue::U32(opts.used as u32));

    let mut change = Change::default();
    let mut dtypes: Vec<DType> = Vec::new();
    let mut n_tensors = 0usize;
    for t in g.tensors() {
        let name = t.name();
        let ffn = layer_tensor(name).and_then(|(il, kind, _)| {
            FFN.iter()
                .position(|(d, _)| *d == kind)
                .map(|which| (il, which))
        });
        let Some((il, which)) = ffn else {
            let (dtype, dims, data) = tensor_bytes(&g, name)?;
            w.tensor(name, dtype, &dims, data.to_vec());
            n_tensors += 1;
            continue;
        };
        if which == 0 {
            // The router sits before the experts, as in converted Mixtral files.
            router(&g, il, n_embd, opts, &mut w)?;
            n_tensors += 1;
        }
        let (dtype, dims, data) = tensor_bytes(&g, name)?;
        let (ne0, ne1) = (dims[0] as usize, dims[1] as usize);
        let dense = dequantize(name, dtype, ne0, data)?;
        if dense.len() != ne0 * ne1 {
            return Err(HarnessError::Model(format!(
                "{path}: tensor '{name}': {} values for dims {dims:?}",
                dense.len()
            )));
        }
        let stack = expert_stack(
            name,
            dtype,
            ne0,
            &dense,
            opts,
            |e| stream(opts.seed, il, which as u64 + 1, e),
            &mut change,
        )?;
        let exps = format!("blk.{il}.{}.weight", FFN[which].1);
        w.tensor(
            &exps,
            dtype,
            &[dims[0], dims[1], opts.experts as u64],
            stack,
        );
        n_tensors += 1;
        if !dtypes.contains(&dtype) {
            dtypes.push(dtype);
        }
    }
    let bytes = w
        .to_bytes()
        .map_err(|e| HarnessError::Model(format!("{path}: cannot write the MoE model: {e}")))?;
    let summary = MoeSummary {
        n_layer,
        n_expert: opts.experts,
        n_expert_used: opts.used,
        dtypes,
        n_tensors,
        bytes: bytes.len() as u64,
        rel_rms_change: if change.dense2 > 0.0 {
            (change.diff2 / change.dense2).sqrt()
        } else {
            0.0
        },
    };
    Ok((bytes, summary))
}

/// Adds layer `il`'s router: F32 `[n_embd, n_expert]` of Gaussian-like values scaled so
/// that the logits of a hidden state with unit RMS before `ffn_norm` have standard
/// deviation `router_scale` (the scale divides by the norm of `ffn_norm`'s weights).
fn router(
    g: &Gguf<'_>,
    il: usize,
    n_embd: usize,
    opts: &MoeOptions,
    w: &mut GgufWriter,
) -> Result<()> {
    let norm_name = format!("blk.{il}.ffn_norm.weight");
    let norm2 = match tensor_bytes(g, &norm_name) {
        Ok((dtype, dims, data)) if dims.first() == Some(&(n_embd as u64)) => {
            let v = dequantize(&norm_name, dtype, n_embd, data)?;
            v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>()
        }
        _ => n_embd as f64,
    };
    let scale = if norm2 > 0.0 {
        (f64::from(opts.router_scale) / norm2.sqrt()) as f32
    } else {
        0.0
    };
    let mut data = Vec::with_capacity(n_embd * opts.experts * 4);
    for e in 0..opts.experts {
        let mut rng = stream(opts.seed, il, 0, e);
        for _ in 0..n_embd {
            data.extend_from_slice(&(scale * gaussianish(&mut rng)).to_le_bytes());
        }
    }
    w.tensor(
        &format!("blk.{il}.ffn_gate_inp.weight"),
        DType::F32,
        &[n_embd as u64, opts.experts as u64],
        data,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaussianish_has_unit_variance() {
        let mut r = Rng(7);
        let n = 200_000;
        let (mut s, mut s2) = (0f64, 0f64);
        for _ in 0..n {
            let x = f64::from(gaussianish(&mut r));
            s += x;
            s2 += x * x;
        }
        let mean = s / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.01, "variance {var}");
    }

    #[test]
    fn streams_differ_by_layer_matrix_and_expert() {
        let first = |l, w, e| stream(1, l, w, e).next_u64();
        let a = first(0, 1, 0);
        assert_ne!(a, first(1, 1, 0));
        assert_ne!(a, first(0, 2, 0));
        assert_ne!(a, first(0, 1, 1));
        assert_ne!(a, stream(2, 0, 1, 0).next_u64());
        assert_eq!(a, first(0, 1, 0));
    }

    #[test]
    fn layer_tensor_names_split() {
        assert_eq!(
            layer_tensor("blk.12.ffn_up.weight"),
            Some((12, "ffn_up", "weight"))
        );
        assert_eq!(layer_tensor("output_norm.weight"), None);
        assert_eq!(layer_tensor("blk.x.ffn_up.weight"), None);
    }

    #[test]
    fn options_are_checked() {
        let ok = MoeOptions::default();
        assert!(ok.validate().is_ok());
        for (o, what) in [
            (MoeOptions { experts: 0, ..ok }, "--experts 0"),
            (
                MoeOptions {
                    experts: 1,
                    used: 1,
                    ..ok
                },
                "--experts 1",
            ),
            (MoeOptions { used: 5, ..ok }, "--used 5"),
            (MoeOptions { used: 0, ..ok }, "--used 0"),
            (MoeOptions { noise: -0.1, ..ok }, "--noise"),
            (
                MoeOptions {
                    noise: f32::NAN,
                    ..ok
                },
                "--noise",
            ),
            (
                MoeOptions {
                    router_scale: f32::INFINITY,
                    ..ok
                },
                "--router-scale",
            ),
        ] {
            let e = o.validate().unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        }
    }
}
