//! Synthetic llama models: tiny, seeded, one variant per weight dtype, written as GGUF so
//! that every test runs the real loading path without a download.

use ggml_core::quant::quantize_row;
use ggml_core::DType;

use crate::gguf_writer::{GgufWriter, MetaValue};
use crate::tokenizer::gpt2_byte_to_char;

/// Shape of a synthetic model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SyntheticSpec {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Embedding width (a multiple of 256 so every quant type fits).
    pub n_embd: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Feed-forward width (a multiple of 256).
    pub n_ff: usize,
    /// dtype of every matrix except the token embedding.
    pub dtype: DType,
    /// dtype of the token embedding (also the tied output matrix).
    pub embd_dtype: DType,
    /// Seed of the weights.
    pub seed: u64,
}

impl SyntheticSpec {
    /// A 4-layer, 256-wide model with GQA (4 heads, 2 KV heads) whose matrices are `dtype`.
    pub fn tiny(dtype: DType) -> SyntheticSpec {
        SyntheticSpec {
            n_layer: 4,
            n_embd: 256,
            n_head: 4,
            n_head_kv: 2,
            n_ff: 512,
            dtype,
            embd_dtype: DType::Q8_0,
            seed: 42,
        }
    }
}

/// The dtype named `name` if synthetic weights can have it (every weight dtype of the
/// CPU backend), else an error listing them.
pub fn weight_dtype(name: &str) -> Result<DType, String> {
    DType::from_name(&name.to_ascii_lowercase())
        .filter(|d| !matches!(d, DType::I32 | DType::Q8_1 | DType::Q8K))
        .ok_or_else(|| {
            format!(
                "'{name}' is not a weight dtype (f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k)"
            )
        })
}

/// The file of [`SyntheticSpec::tiny`]`(dtype)` in the model cache
/// (`$GGML_RS_CACHE`, default `~/.cache/ggml-rs`), written there if it is missing or
/// differs (the generator is deterministic, so the bytes are known).
pub fn cached_model(dtype: DType) -> crate::error::Result<std::path::PathBuf> {
    use crate::error::HarnessError;
    let dir = crate::fetch::cache_dir().map_err(|e| HarnessError::Model(e.to_string()))?;
    let path = dir.join(format!("synthetic-{}.gguf", dtype.name()));
    let bytes = synthetic_gguf(&SyntheticSpec::tiny(dtype));
    if std::fs::read(&path).is_ok_and(|old| old == bytes) {
        return Ok(path);
    }
    let io = |p: &std::path::Path| {
        let path = p.display().to_string();
        move |source| HarnessError::Io { path, source }
    };
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    // Written aside (a name of this process and thread) and renamed, so a concurrent
    // reader never sees half a file.
    let tmp = dir.join(format!(
        "synthetic-{}.gguf.{}.{:?}.tmp",
        dtype.name(),
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&tmp, &bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    Ok(path)
}

/// splitmix64: a tiny, well-distributed seeded generator.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[-a, a)`.
    fn uniform(&mut self, a: f32) -> f32 {
        let u = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        (2.0 * u - 1.0) * a
    }
}

fn encode(dtype: DType, values: &[f32]) -> Vec<u8> {
    let row = dtype
        .row_size(values.len())
        .expect("synthetic rows are block aligned");
    let mut out = vec![0u8; row];
    quantize_row(dtype, values, &mut out).expect("sizes match");
    out
}

/// The GGUF bytes of a synthetic llama model with a byte-level vocabulary of 256 tokens
/// (so any text tokenizes) plus BOS/EOS.
pub fn synthetic_gguf(spec: &SyntheticSpec) -> Vec<u8> {
    let mut rng = Rng(spec.seed);
    let n_vocab = 258usize;
    let mut w = GgufWriter::new();
    let u = |v: usize| MetaValue::U32(v as u32);
    w.meta("general.architecture", MetaValue::Str("llama".into()))
        .meta(
            "general.name",
            MetaValue::Str(format!("synthetic-{}", spec.dtype)),
        )
        .meta("llama.block_count", u(spec.n_layer))
        .meta("llama.context_length", u(4096))
        .meta("llama.embedding_length", u(spec.n_embd))
        .meta("llama.feed_forward_length", u(spec.n_ff))
        .meta("llama.attention.head_count", u(spec.n_head))
        .meta("llama.attention.head_count_kv", u(spec.n_head_kv))
        .meta("llama.rope.freq_base", MetaValue::F32(10_000.0))
        .meta(
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-5),
        );
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| gpt2_byte_to_char(b).to_string())
        .collect();
    tokens.push("<|bos|>".into());
    tokens.push("<|eos|>".into());
    let mut types = vec![1i32; 256];
    types.extend([3, 3]);
    w.meta("tokenizer.ggml.model", MetaValue::Str("gpt2".into()))
        .meta("tokenizer.ggml.pre", MetaValue::Str("smollm".into()))
        .meta("tokenizer.ggml.tokens", MetaValue::StrArray(tokens))
        .meta("tokenizer.ggml.token_type", MetaValue::I32Array(types))
        .meta("tokenizer.ggml.merges", MetaValue::StrArray(Vec::new()))
        .meta("tokenizer.ggml.bos_token_id", u(256))
        .meta("tokenizer.ggml.eos_token_id", u(257))
        .meta("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));

    let e = spec.n_embd;
    let kv = spec.n_embd / spec.n_head * spec.n_head_kv;
    // Matrices are uniform in [-a, a); norms (a = 0) are 1 +- 0.1.
    let mut matrix =
        |w: &mut GgufWriter, name: &str, dtype: DType, ne0: usize, ne1: usize, a: f32| {
            let vals: Vec<f32> = (0..ne0 * ne1)
                .map(|_| {
                    if a == 0.0 {
                        1.0 + rng.uniform(0.1)
                    } else {
                        rng.uniform(a)
                    }
                })
                .collect();
            let mut data = Vec::new();
            for r in vals.chunks(ne0) {
                data.extend(encode(dtype, r));
            }
            w.tensor(name, dtype, &[ne0 as u64, ne1 as u64], data);
        };
    let scale = 1.0 / (e as f32).sqrt() * 1.7;
    matrix(
        &mut w,
        "token_embd.weight",
        spec.embd_dtype,
        e,
        n_vocab,
        // Tied with the output: logits of a unit-RMS state then have a standard
        // deviation near 1, so the model is random but not absurdly confident.
        scale,
    );
    for il in 0..spec.n_layer {
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        matrix(&mut w, &n("attn_norm"), DType::F32, e, 1, 0.0);
        matrix(&mut w, &n("attn_q"), spec.dtype, e, e, scale);
        matrix(&mut w, &n("attn_k"), spec.dtype, e, kv, scale);
        matrix(&mut w, &n("attn_v"), spec.dtype, e, kv, scale);
        matrix(&mut w, &n("attn_output"), spec.dtype, e, e, scale);
        matrix(&mut w, &n("ffn_norm"), DType::F32, e, 1, 0.0);
        matrix(&mut w, &n("ffn_gate"), spec.dtype, e, spec.n_ff, scale);
        matrix(&mut w, &n("ffn_up"), spec.dtype, e, spec.n_ff, scale);
        matrix(
            &mut w,
            &n("ffn_down"),
            spec.dtype,
            spec.n_ff,
            e,
            1.0 / (spec.n_ff as f32).sqrt() * 1.7,
        );
    }
    matrix(&mut w, "output_norm.weight", DType::F32, e, 1, 0.0);
    w.to_bytes()
        .expect("the synthetic model's metadata is valid GGUF metadata")
}
