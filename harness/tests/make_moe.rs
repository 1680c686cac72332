//! `make-moe`: sparse upcycling of the synthetic llama (and, when it is cached, SmolLM2)
//! into a Mixtral-layout mixture of experts: shapes, metadata, how far the experts are
//! from the dense FFN and from each other, determinism, errors for bad options and models,
//! and that the result runs.

use std::path::{Path, PathBuf};

use ggml_core::quant::dequantize_row;
use ggml_core::DType;
use ggml_test_kit::TempFile;
use harness::gguf_file::GgufFile;
use harness::make_moe::{make_moe, make_moe_bytes, MoeOptions};
use harness::model::{Arch, Model};
use harness::perplexity::{perplexity, PplSettings};
use harness::session::{RunConfig, Session, SplitMode};

fn dense() -> PathBuf {
    harness::synthetic::cached_model(DType::Q4_1).unwrap()
}

/// The values of `name`'s expert `e` (or of the whole tensor for `e = None`).
fn values(f: &GgufFile, name: &str, e: Option<usize>) -> Vec<f32> {
    let t = f.tensor_info(name).unwrap_or_else(|| panic!("{name}"));
    let (ne0, per) = (t.ne[0], t.ne[0] * t.ne[1]);
    let row = t.dtype.row_size(ne0).unwrap();
    let bytes = &f.bytes()[t.range.clone()];
    let bytes = match e {
        Some(e) => &bytes[e * per / ne0 * row..(e + 1) * per / ne0 * row],
        None => bytes,
    };
    let mut out = vec![0f32; bytes.len() / row * ne0];
    for (src, dst) in bytes.chunks_exact(row).zip(out.chunks_exact_mut(ne0)) {
        dequantize_row(t.dtype, src, dst).unwrap();
    }
    out
}

/// RMS of `a - b` relative to the RMS of `b`.
fn rel_rms(a: &[f32], b: &[f32]) -> f64 {
    let d: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum();
    let n: f64 = b.iter().map(|&y| f64::from(y).powi(2)).sum();
    (d / n).sqrt()
}

fn upcycle(src: &Path, opts: &MoeOptions, name: &str) -> TempFile {
    let out = TempFile::new(name);
    make_moe(src, opts, out.path()).unwrap();
    out
}

#[test]
fn experts_have_mixtral_shapes_and_metadata() {
    let opts = MoeOptions::default();
    let out = upcycle(&dense(), &opts, "shapes.gguf");
    let (d, m) = (
        GgufFile::open(&dense()).unwrap(),
        GgufFile::open(out.path()).unwrap(),
    );
    assert_eq!(m.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(m.get_usize("llama.expert_count").unwrap(), 4);
    assert_eq!(m.get_usize("llama.expert_used_count").unwrap(), 2);
    // Every other key is copied.
    let dg = d.gguf().unwrap();
    let mg = m.gguf().unwrap();
    for (k, v) in dg.metadata() {
        assert_eq!(mg.get(k), Some(v), "{k}");
    }
    assert_eq!(mg.metadata_count(), dg.metadata_count() + 2);
    let (e, ff) = (256, 512);
    for il in 0..4 {
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        for dense in ["ffn_gate", "ffn_up", "ffn_down"] {
            assert!(m.tensor_info(&n(dense)).is_none(), "{dense} is gone");
        }
        let t = |s: &str| m.tensor_info(&n(s)).unwrap().clone();
        assert_eq!(t("ffn_gate_exps").ne, [e, ff, 4, 1]);
        assert_eq!(t("ffn_up_exps").ne, [e, ff, 4, 1]);
        assert_eq!(t("ffn_down_exps").ne, [ff, e, 4, 1]);
        assert_eq!(t("ffn_gate_exps").dtype, DType::Q4_1);
        assert_eq!(t("ffn_down_exps").dtype, DType::Q4_1);
        let router = t("ffn_gate_inp");
        assert_eq!((router.ne, router.dtype), ([e, 4, 1, 1], DType::F32));
        // Everything else is the same bytes.
        let a = d.tensor_info(&n("attn_q")).unwrap();
        let b = m.tensor_info(&n("attn_q")).unwrap();
        assert_eq!(&d.bytes()[a.range.clone()], &m.bytes()[b.range.clone()]);
    }
    assert_eq!(m.tensors().len(), d.tensors().len() + 4);
    let model = Model::from_gguf(&m).unwrap();
    assert_eq!((model.hp.n_expert, model.hp.n_expert_used), (4, 2));
}

#[test]
fn experts_are_small_perturbations_of_the_dense_ffn() {
    let opts = MoeOptions::default();
    let (bytes, summary) = make_moe_bytes(&dense(), &opts).unwrap();
    let out = TempFile::new("close.gguf");
    std::fs::write(out.path(), bytes).unwrap();
    let (d, m) = (
        GgufFile::open(&dense()).unwrap(),
        GgufFile::open(out.path()).unwrap(),
    );
    assert!(
        (0.02..0.15).contains(&summary.rel_rms_change),
        "{}",
        summary.rel_rms_change
    );
    for il in [0, 3] {
        for (dn, en) in [("ffn_gate", "ffn_gate_exps"), ("ffn_down", "ffn_down_exps")] {
            let w = values(&d, &format!("blk.{il}.{dn}.weight"), None);
            let name = format!("blk.{il}.{en}.weight");
            let experts: Vec<Vec<f32>> = (0..4).map(|e| values(&m, &name, Some(e))).collect();
            for (i, x) in experts.iter().enumerate() {
                let r = rel_rms(x, &w);
                assert!((0.01..0.2).contains(&r), "{name} expert {i}: {r}");
                for y in &experts[..i] {
                    let r = rel_rms(x, y);
                    assert!((0.01..0.3).contains(&r), "{name}: experts differ by {r}");
                }
            }
        }
    }
    // The router gives logits of a few units: not uniform, not saturated.
    let r = values(&m, "blk.0.ffn_gate_inp.weight", None);
    let rms = (r.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / r.len() as f64).sqrt();
    let norm = values(&d, "blk.0.ffn_norm.weight", None);
    let norm2: f64 = norm.iter().map(|&x| f64::from(x).powi(2)).sum();
    let logit_sd = rms * norm2.sqrt();
    assert!(
        (logit_sd - f64::from(opts.router_scale)).abs() < 0.2,
        "{logit_sd}"
    );
}

#[test]
fn the_same_inputs_give_the_same_bytes() {
    let opts = MoeOptions::default();
    let a = make_moe_bytes(&dense(), &opts).unwrap();
    let b = make_moe_bytes(&dense(), &opts).unwrap();
    assert!(a.0 == b.0, "deterministic");
    assert_eq!(a.1, b.1);
    let out = upcycle(&dense(), &opts, "det.gguf");
    assert!(
        std::fs::read(out.path()).unwrap() == a.0,
        "the file is the bytes"
    );
    let c = make_moe_bytes(&dense(), &MoeOptions { seed: 2, ..opts }).unwrap();
    assert!(a.0 != c.0, "the seed matters");
    assert_eq!(a.0.len(), c.0.len());
}

#[test]
fn bad_options_and_models_are_refused() {
    let err = |src: &Path, o: MoeOptions| {
        let out = TempFile::new("never.gguf");
        let e = make_moe(src, &o, out.path()).unwrap_err().to_string();
        assert!(!out.path().exists());
        e
    };
    let ok = MoeOptions::default();
    let e = err(&dense(), MoeOptions { used: 5, ..ok });
    assert!(e.contains("--used 5") && e.contains("--experts (4)"), "{e}");
    let e = err(&dense(), MoeOptions { experts: 0, ..ok });
    assert!(e.contains("--experts 0"), "{e}");
    let e = err(&dense(), MoeOptions { noise: 2.0, ..ok });
    assert!(e.contains("--noise 2"), "{e}");
    let moe = harness::synthetic::cached_moe_model(DType::Q4_1).unwrap();
    let e = err(&moe, ok);
    assert!(e.contains("already has experts"), "{e}");
    let gemma = harness::synthetic::cached_model_of(Arch::Gemma3, DType::Q4_1).unwrap();
    let e = err(&gemma, ok);
    assert!(
        e.contains("architecture 'gemma3'") && e.contains("llama"),
        "{e}"
    );
    let e = err(Path::new("/nonexistent/model.gguf"), ok);
    assert!(e.contains("/nonexistent/model.gguf"), "{e}");
}

fn ppl(path: &Path, text: &str, n_ctx: usize, chunks: usize) -> f64 {
    let config = RunConfig::simple("cpu".parse().unwrap(), SplitMode::None, 1, 2);
    let s = Session::open(path, config).unwrap();
    let tokens = s.tokenizer.encode(text);
    let bos = s.tokenizer.add_bos().then(|| s.tokenizer.bos()).flatten();
    let mut kv = s.kv_cache(n_ctx).unwrap();
    let mut exec = s.executor().unwrap();
    let settings = PplSettings {
        n_ctx,
        n_batch: n_ctx,
        max_chunks: Some(chunks),
    };
    perplexity(
        &s.model,
        exec.as_mut(),
        &mut kv,
        &tokens,
        bos,
        settings,
        |_, _, _| {},
    )
    .unwrap()
    .ppl
}

/// The upcycled synthetic model runs and scores close to the dense one, but not equal.
#[test]
fn the_upcycled_model_runs_close_to_the_dense_one() {
    let out = upcycle(&dense(), &MoeOptions::default(), "runs.gguf");
    let text = &harness::default_corpus()[..2000];
    let (a, b) = (ppl(&dense(), text, 64, 3), ppl(out.path(), text, 64, 3));
    assert!(a != b, "the experts change the numbers");
    assert!((b / a - 1.0).abs() < 0.05, "dense {a}, moe {b}");
}

/// The cached upcycled SmolLM2 (when SmolLM2 is cached; skipped otherwise) is built once,
/// loads with its experts and keeps SmolLM2's perplexity within 25 %.
#[test]
fn smollm2_moe_is_built_once_and_speaks_english() {
    // SmolLM2 is downloaded on first use (a failed download fails the test).
    let smollm2 =
        harness::model_path(None).unwrap_or_else(|e| panic!("SmolLM2 could not be fetched: {e}"));
    let p = harness::moe_model_path().unwrap();
    let p2 = harness::model_path(Some(Path::new(harness::MOE_MODEL_NAME))).unwrap();
    assert_eq!(p, p2);
    let m = GgufFile::open(&p).unwrap();
    assert_eq!(m.get_usize("llama.expert_count").unwrap(), 4);
    assert_eq!(m.get_usize("llama.expert_used_count").unwrap(), 2);
    let text = &harness::default_corpus()[..6000];
    let (a, b) = (ppl(&smollm2, text, 256, 2), ppl(&p, text, 256, 2));
    assert!((b / a - 1.0).abs() < 0.25, "dense {a}, moe {b}");
}
