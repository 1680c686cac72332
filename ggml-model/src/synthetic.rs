//! Synthetic models: tiny, seeded, one variant per architecture and weight dtype, written
//! as GGUF so that every test runs the real loading path without a download.

use std::path::Path;

use ggml_core::quant::quantize_row;
use ggml_core::DType;

use crate::error::ModelError;
use crate::gguf_writer::{GgufWriter, MetaValue};
use crate::model::Arch;
use crate::tokenizer::gpt2_byte_to_char;

/// Shape of a synthetic model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SyntheticSpec {
    /// Architecture (llama: byte-level BPE vocabulary; gemma3: SentencePiece vocabulary
    /// with byte fallback, q/k and post norms, GeGLU, sliding-window layers).
    pub arch: Arch,
    /// Width of one attention head (llama: `n_embd / n_head`).
    pub head_dim: usize,
    /// Sliding window of the local layers (gemma3; 0: every layer global).
    pub n_swa: usize,
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
    /// Experts of each feed-forward block (0: dense); llama only, Mixtral's layout.
    pub n_expert: usize,
    /// Experts each token uses.
    pub n_expert_used: usize,
}

impl SyntheticSpec {
    /// A 4-layer, 256-wide model with GQA (4 heads, 2 KV heads) whose matrices are `dtype`.
    pub fn tiny(dtype: DType) -> SyntheticSpec {
        SyntheticSpec {
            arch: Arch::Llama,
            head_dim: 64,
            n_swa: 0,
            n_layer: 4,
            n_embd: 256,
            n_head: 4,
            n_head_kv: 2,
            n_ff: 512,
            dtype,
            embd_dtype: DType::Q8_0,
            seed: 42,
            n_expert: 0,
            n_expert_used: 0,
        }
    }

    /// [`tiny`](SyntheticSpec::tiny) with a mixture of 4 experts per FFN, 2 used per
    /// token, and a router strong enough that the choice differs between tokens.
    pub fn tiny_moe(dtype: DType) -> SyntheticSpec {
        SyntheticSpec {
            n_expert: 4,
            n_expert_used: 2,
            ..SyntheticSpec::tiny(dtype)
        }
    }
}

impl SyntheticSpec {
    /// A 6-layer Gemma 3 (five local layers with a window of 8 positions, so windows
    /// matter in short tests, then one global), 256 wide, 4 heads of 128 (queries 512
    /// wide, unlike `n_embd`) sharing one KV head, matrices `dtype`.
    pub fn tiny_gemma3(dtype: DType) -> SyntheticSpec {
        SyntheticSpec {
            arch: Arch::Gemma3,
            head_dim: 128,
            n_swa: 8,
            n_layer: 6,
            n_head_kv: 1,
            ..SyntheticSpec::tiny(dtype)
        }
    }

    /// The tiny spec of `arch`.
    pub fn tiny_of(arch: Arch, dtype: DType) -> SyntheticSpec {
        match arch {
            Arch::Llama => SyntheticSpec::tiny(dtype),
            Arch::Gemma3 => SyntheticSpec::tiny_gemma3(dtype),
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

/// Writes the model of `spec` to `path` (creating its folder) unless the file there
/// already holds exactly these bytes: the generator is deterministic, so a model can be
/// kept in a cache and rewritten only when the generator changed. The bytes are written
/// aside (a name of this process and thread) and renamed, so a concurrent reader never
/// sees half a file.
pub fn write_synthetic(spec: &SyntheticSpec, path: &Path) -> crate::error::Result<()> {
    let bytes = synthetic_gguf(spec);
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    let io = |p: &Path| {
        let path = p.display().to_string();
        move |source| ModelError::Io { path, source }
    };
    let name = path
        .file_name()
        .ok_or_else(|| ModelError::Usage(format!("{}: not a file name", path.display())))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let tmp = path.with_file_name(format!(
        "{}.{}.{:?}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::write(&tmp, &bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))?;
    Ok(())
}

/// splitmix64: a tiny, well-distributed seeded generator (the synthetic weights', the
/// sampler's and the harness's MoE upcycling's). The field is the state: `Rng(seed)`.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
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

/// The GGUF bytes of a synthetic model: llama with a byte-level BPE vocabulary of 256
/// tokens plus BOS/EOS, or Gemma 3 with a SentencePiece vocabulary (control tokens, the
/// 256 byte tokens, printable ASCII and a few merges), so any text tokenizes.
pub fn synthetic_gguf(spec: &SyntheticSpec) -> Vec<u8> {
    let mut rng = Rng(spec.seed);
    let mut w = GgufWriter::new();
    let u = |v: usize| MetaValue::U32(v as u32);
    let a = spec.arch.name();
    let key = |k: &str| format!("{a}.{k}");
    w.meta("general.architecture", MetaValue::Str(a.into()))
        .meta(
            "general.name",
            MetaValue::Str(match spec.arch {
                Arch::Llama => format!("synthetic-{}", spec.dtype),
                _ => format!("synthetic-{a}-{}", spec.dtype),
            }),
        )
        .meta(&key("block_count"), u(spec.n_layer))
        .meta(&key("context_length"), u(4096))
        .meta(&key("embedding_length"), u(spec.n_embd))
        .meta(&key("feed_forward_length"), u(spec.n_ff))
        .meta(&key("attention.head_count"), u(spec.n_head))
        .meta(&key("attention.head_count_kv"), u(spec.n_head_kv))
        .meta(
            &key("rope.freq_base"),
            MetaValue::F32(match spec.arch {
                Arch::Llama => 10_000.0,
                _ => 1_000_000.0,
            }),
        )
        .meta(
            &key("attention.layer_norm_rms_epsilon"),
            MetaValue::F32(1e-5),
        );
    if spec.n_expert > 0 {
        w.meta(&key("expert_count"), u(spec.n_expert))
            .meta(&key("expert_used_count"), u(spec.n_expert_used));
    }
    let n_vocab = match spec.arch {
        Arch::Llama => byte_bpe_vocab(&mut w),
        Arch::Gemma3 => {
            w.meta(&key("attention.key_length"), u(spec.head_dim))
                .meta(&key("attention.value_length"), u(spec.head_dim))
                .meta(&key("attention.sliding_window"), u(spec.n_swa));
            spm_vocab(&mut w)
        }
    };

    let e = spec.n_embd;
    let q = spec.n_head * spec.head_dim;
    let kv = spec.head_dim * spec.n_head_kv;
    // Matrices are uniform in [-a, a); norms (a = 0) are 1 +- 0.1.
    // A stack of `nx` matrices (experts) when `nx > 1`.
    let mut matrix = |w: &mut GgufWriter,
                      name: &str,
                      dtype: DType,
                      (ne0, ne1, nx): (usize, usize, usize),
                      a: f32| {
        let vals: Vec<f32> = (0..ne0 * ne1 * nx)
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
        match nx {
            1 => w.tensor(name, dtype, &[ne0 as u64, ne1 as u64], data),
            _ => w.tensor(name, dtype, &[ne0 as u64, ne1 as u64, nx as u64], data),
        };
    };
    let scale = 1.0 / (e as f32).sqrt() * 1.7;
    // Gemma scales embeddings by sqrt(n_embd); its table is that much smaller, so the
    // tied output gives logits of the same spread.
    let embd_scale = match spec.arch {
        Arch::Llama => scale,
        Arch::Gemma3 => scale / (e as f32).sqrt() * 4.0,
    };
    matrix(
        &mut w,
        "token_embd.weight",
        spec.embd_dtype,
        (e, n_vocab, 1),
        // Tied with the output: logits of a unit-RMS state then have a standard
        // deviation near 1, so the model is random but not absurdly confident.
        embd_scale,
    );
    let gemma = spec.arch == Arch::Gemma3;
    for il in 0..spec.n_layer {
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        matrix(&mut w, &n("attn_norm"), DType::F32, (e, 1, 1), 0.0);
        matrix(&mut w, &n("attn_q"), spec.dtype, (e, q, 1), scale);
        matrix(&mut w, &n("attn_k"), spec.dtype, (e, kv, 1), scale);
        matrix(&mut w, &n("attn_v"), spec.dtype, (e, kv, 1), scale);
        let o_scale = 1.0 / (q as f32).sqrt() * 1.7;
        matrix(&mut w, &n("attn_output"), spec.dtype, (q, e, 1), o_scale);
        if gemma {
            matrix(
                &mut w,
                &n("attn_q_norm"),
                DType::F32,
                (spec.head_dim, 1, 1),
                0.0,
            );
            matrix(
                &mut w,
                &n("attn_k_norm"),
                DType::F32,
                (spec.head_dim, 1, 1),
                0.0,
            );
            matrix(
                &mut w,
                &n("post_attention_norm"),
                DType::F32,
                (e, 1, 1),
                0.0,
            );
            matrix(&mut w, &n("post_ffw_norm"), DType::F32, (e, 1, 1), 0.0);
        }
        matrix(&mut w, &n("ffn_norm"), DType::F32, (e, 1, 1), 0.0);
        let (ff, nx) = (spec.n_ff, spec.n_expert.max(1));
        let down_scale = 1.0 / (ff as f32).sqrt() * 1.7;
        if spec.n_expert > 0 {
            // A router of the same spread as the matrices gives logits of standard
            // deviation near 1.7: tokens disagree on their experts.
            matrix(&mut w, &n("ffn_gate_inp"), DType::F32, (e, nx, 1), scale);
            matrix(&mut w, &n("ffn_gate_exps"), spec.dtype, (e, ff, nx), scale);
            matrix(&mut w, &n("ffn_up_exps"), spec.dtype, (e, ff, nx), scale);
            matrix(
                &mut w,
                &n("ffn_down_exps"),
                spec.dtype,
                (ff, e, nx),
                down_scale,
            );
        } else {
            matrix(&mut w, &n("ffn_gate"), spec.dtype, (e, ff, 1), scale);
            matrix(&mut w, &n("ffn_up"), spec.dtype, (e, ff, 1), scale);
            matrix(&mut w, &n("ffn_down"), spec.dtype, (ff, e, 1), down_scale);
        }
    }
    matrix(&mut w, "output_norm.weight", DType::F32, (e, 1, 1), 0.0);
    w.to_bytes()
        .expect("the synthetic model's metadata is valid GGUF metadata")
}

/// A byte-level BPE vocabulary: the 256 byte characters, BOS and EOS. Returns its size.
fn byte_bpe_vocab(w: &mut GgufWriter) -> usize {
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| gpt2_byte_to_char(b).to_string())
        .collect();
    tokens.push("<|bos|>".into());
    tokens.push("<|eos|>".into());
    let mut types = vec![1i32; 256];
    types.extend([3, 3]);
    let n = tokens.len();
    let u = |v: usize| MetaValue::U32(v as u32);
    w.meta("tokenizer.ggml.model", MetaValue::Str("gpt2".into()))
        .meta("tokenizer.ggml.pre", MetaValue::Str("smollm".into()))
        .meta("tokenizer.ggml.tokens", MetaValue::StrArray(tokens))
        .meta("tokenizer.ggml.token_type", MetaValue::I32Array(types))
        .meta("tokenizer.ggml.merges", MetaValue::StrArray(Vec::new()))
        .meta("tokenizer.ggml.bos_token_id", u(256))
        .meta("tokenizer.ggml.eos_token_id", u(257))
        .meta("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));
    n
}

/// A SentencePiece vocabulary laid out like Gemma's: `<pad>`, `<eos>`, `<bos>`, `<unk>`
/// (control), the byte tokens `<0x00>`..`<0xFF>`, then `▁`, printable ASCII and a few
/// merges, scored so that longer pieces win. BOS is added, no space prefix. Returns its
/// size.
fn spm_vocab(w: &mut GgufWriter) -> usize {
    let mut tokens: Vec<String> = ["<pad>", "<eos>", "<bos>", "<unk>"]
        .map(String::from)
        .to_vec();
    let mut types = vec![3i32, 3, 3, 2];
    let mut scores = vec![0f32; 4];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    let mut normal: Vec<String> = vec!["\u{2581}".into()];
    normal.extend((b'!'..=b'~').map(|c| (c as char).to_string()));
    for m in [
        "\u{2581}t",
        "he",
        "\u{2581}the",
        "in",
        "er",
        "an",
        "on",
        "\u{2581}a",
    ] {
        normal.push(m.into());
    }
    for (i, t) in normal.into_iter().enumerate() {
        // Longer pieces score higher; among equals, earlier ones.
        scores.push(t.chars().count() as f32 - i as f32 * 1e-3);
        tokens.push(t);
        types.push(1);
    }
    let n = tokens.len();
    let u = |v: usize| MetaValue::U32(v as u32);
    w.meta("tokenizer.ggml.model", MetaValue::Str("llama".into()))
        .meta("tokenizer.ggml.pre", MetaValue::Str("default".into()))
        .meta("tokenizer.ggml.tokens", MetaValue::StrArray(tokens))
        .meta("tokenizer.ggml.scores", MetaValue::F32Array(scores))
        .meta("tokenizer.ggml.token_type", MetaValue::I32Array(types))
        .meta("tokenizer.ggml.bos_token_id", u(2))
        .meta("tokenizer.ggml.eos_token_id", u(1))
        .meta("tokenizer.ggml.unknown_token_id", u(3))
        .meta("tokenizer.ggml.padding_token_id", u(0))
        .meta("tokenizer.ggml.add_bos_token", MetaValue::Bool(true))
        .meta("tokenizer.ggml.add_space_prefix", MetaValue::Bool(false));
    n
}
