//! KL divergence against llama-perplexity base files: the parser on good, truncated and
//! corrupted files, the statistics on identical and hand-computed logits, and
//! `perplexity_kl` on the synthetic model against a base file of its own logits.

use std::io::Cursor;

use ggml_core::DType;
use harness::batch::Batch;
use harness::kl::{
    compress_row, row_len, rows_per_chunk, write_base, ChunkLogProbs, KlBase, KlRun, KlStats,
};
use harness::perplexity::{perplexity, perplexity_kl, PplSettings};
use harness::session::{RunConfig, Session, SplitMode};
use proptest::prelude::*;

fn open(bytes: Vec<u8>) -> harness::error::Result<KlBase> {
    KlBase::from_source("test.kld", Box::new(Cursor::new(bytes)))
}

/// A small base file: `n_chunk` chunks of `n_ctx` tokens over a vocabulary of `n_vocab`,
/// with seeded logits. Returns the bytes, the tokens and the logits rows per chunk.
fn sample(n_ctx: usize, n_vocab: usize, n_chunk: usize) -> (Vec<u8>, Vec<u32>, Vec<Vec<f32>>) {
    let mut x = 0x1234_5678u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let tokens: Vec<u32> = (0..n_ctx * n_chunk)
        .map(|_| (next() % n_vocab as u64) as u32)
        .collect();
    let logits: Vec<Vec<f32>> = (0..n_chunk)
        .map(|_| {
            (0..rows_per_chunk(n_ctx) * n_vocab)
                .map(|_| (next() % 10_000) as f32 / 1000.0 - 5.0)
                .collect()
        })
        .collect();
    let bytes = write_base(n_ctx, n_vocab, &tokens, &logits);
    (bytes, tokens, logits)
}

#[test]
fn a_written_file_parses_back() {
    let (bytes, tokens, _) = sample(8, 5, 3);
    assert_eq!(bytes.len(), 20 + 4 * 24 + 3 * 3 * row_len(5) * 2);
    let mut base = open(bytes).unwrap();
    assert_eq!((base.n_ctx, base.n_vocab, base.n_chunk), (8, 5, 3));
    assert_eq!(base.tokens, tokens);
    let mut chunk = ChunkLogProbs::default();
    for c in 0..3 {
        base.read_chunk(c, &mut chunk).unwrap();
        assert_eq!(chunk.data.len(), 3 * row_len(5));
    }
    let e = base.read_chunk(3, &mut chunk).unwrap_err().to_string();
    assert!(e.contains("chunk 3"), "{e}");
}

#[test]
fn bad_headers_name_their_field() {
    let (good, _, _) = sample(8, 5, 2);
    let with = |at: usize, v: &[u8]| {
        let mut b = good.clone();
        b[at..at + v.len()].copy_from_slice(v);
        open(b).unwrap_err().to_string()
    };
    assert!(with(0, b"_LOGITS_").contains("magic"));
    assert!(with(8, &0u32.to_le_bytes()).contains("n_ctx 0"));
    assert!(with(12, &(-1i32).to_le_bytes()).contains("n_vocab -1"));
    assert!(with(16, &0i32.to_le_bytes()).contains("n_chunk 0"));
    let e = with(20 + 4 * 3, &7i32.to_le_bytes());
    assert!(e.contains("tokens[3] = 7"), "{e}");
    // A chunk count that does not match the size.
    let e = with(16, &3i32.to_le_bytes());
    assert!(e.contains("truncated"), "{e}");
    let mut longer = good.clone();
    longer.push(0);
    let e = open(longer).unwrap_err().to_string();
    assert!(e.contains("1 bytes after the last chunk"), "{e}");
    for n in [0, 5, 8, 13, 19, 40, good.len() - 1] {
        let e = open(good[..n].to_vec()).unwrap_err().to_string();
        assert!(
            e.starts_with("test.kld: ") && e.contains("truncated"),
            "{n}: {e}"
        );
    }
}

#[test]
fn a_non_finite_scale_is_an_error() {
    let (mut bytes, _, _) = sample(8, 5, 2);
    let row1 = 20 + 4 * 16 + row_len(5) * 2;
    bytes[row1..row1 + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let mut base = open(bytes).unwrap();
    let mut chunk = ChunkLogProbs::default();
    let e = base.read_chunk(0, &mut chunk).unwrap_err().to_string();
    assert!(e.contains("chunk 0, row 1") && e.contains("scale"), "{e}");
}

#[test]
fn runs_must_match_the_base_file() {
    let (bytes, tokens, _) = sample(8, 5, 3);
    let base = open(bytes).unwrap();
    assert_eq!(base.check_run(8, 5, &tokens).unwrap(), 3);
    assert_eq!(base.check_run(8, 5, &tokens[..17]).unwrap(), 2);
    assert!(base
        .check_run(16, 5, &tokens)
        .unwrap_err()
        .to_string()
        .contains("n_ctx 8"));
    assert!(base
        .check_run(8, 6, &tokens)
        .unwrap_err()
        .to_string()
        .contains("vocabulary of 5"));
    let mut other = tokens.clone();
    other[13] = (other[13] + 1) % 5;
    let e = base.check_run(8, 5, &other).unwrap_err().to_string();
    assert!(e.contains("token 13 (chunk 1, position 5)"), "{e}");
}

#[test]
fn identical_logits_have_no_divergence() {
    let (n_ctx, n_vocab) = (16, 300);
    let (bytes, tokens, logits) = sample(n_ctx, n_vocab, 8);
    let mut run = KlRun::new(open(bytes).unwrap());
    let first = n_ctx / 2;
    for (c, rows) in logits.iter().enumerate() {
        run.begin_chunk(c).unwrap();
        for r in 0..rows_per_chunk(n_ctx) {
            let tok = tokens[c * n_ctx + first + r + 1] as usize;
            run.row(r, &rows[r * n_vocab..(r + 1) * n_vocab], tok);
        }
    }
    let k = run.stats.report().unwrap();
    assert_eq!(k.count, 8 * 7);
    assert!(k.kld.0.abs() < 1e-5, "{}", k.kld.0);
    assert!(k.kld_max.abs() < 1e-4 && k.kld_min.abs() < 1e-4);
    assert_eq!(k.same_top.0, 1.0);
    assert!((k.ppl.0 / k.ppl_base.0 - 1.0).abs() < 1e-4);
    assert!(k.p_diff_rms.0 < 1e-4);
    let text = k.to_string();
    assert!(text.contains("Same top p: 100.000 ±"), "{text}");
    assert!(text.contains("====== KL divergence statistics ======"));
}

/// Base probabilities (1/2, 1/2), ours (3/4, 1/4) from logits (ln 3, 0), next token 1:
/// KLD = ½ ln(½/¾) + ½ ln(½/¼) = ½ ln(4/3); nll = ln 4, nll_base = ln 2; Δp = ¼ − ½.
#[test]
fn a_hand_computed_case() {
    let mut base = vec![0u16; row_len(2)];
    compress_row(&[0.0, 0.0], 1, &mut base);
    let mut s = KlStats::default();
    s.add(&[3f32.ln(), 0.0], &base, 1);
    assert_eq!(s.count, 1);
    assert!(
        (s.sum_kld - 0.5 * (4.0f64 / 3.0).ln()).abs() < 1e-6,
        "{}",
        s.sum_kld
    );
    assert!((s.sum_nll - 4f64.ln()).abs() < 1e-6);
    assert!((s.sum_nll_base - 2f64.ln()).abs() < 1e-6);
    assert!((s.sum_p_diff + 0.25).abs() < 1e-6);
    assert_eq!(
        s.n_same_top, 1,
        "ties in the base pick the first token, as ours"
    );
    // Ours now prefers token 1: different top.
    s.add(&[0.0, 1.0], &base, 1);
    assert_eq!((s.count, s.n_same_top), (2, 1));
    let r = s.report().unwrap();
    assert_eq!(r.same_top.0, 0.5);
    assert!(r.kld_max > r.kld_min);
}

#[test]
fn chunk_lines_have_llama_cpp_columns() {
    let mut base = vec![0u16; row_len(2)];
    compress_row(&[0.0, 0.0], 1, &mut base);
    let mut s = KlStats::default();
    for _ in 0..20 {
        s.add(&[3f32.ln(), 0.0], &base, 1);
    }
    let line = s.chunk_line(0);
    assert!(line.starts_with("   1       4.0000 ±"), "{line}");
    assert!(line.contains("0.69315 ±"), "{line}");
    assert!(line.contains("0.14384 ±"), "{line}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Truncated or corrupted files give errors, never panics.
    #[test]
    fn damaged_files_never_panic(cut in 0usize..400, flips in prop::collection::vec((0usize..400, any::<u8>()), 0..6)) {
        let (good, tokens, logits) = sample(6, 7, 3);
        let mut bytes = good.clone();
        for (at, v) in &flips {
            let at = at % bytes.len();
            bytes[at] = *v;
        }
        let truncated = cut < bytes.len();
        bytes.truncate(cut.max(1).min(bytes.len()));
        match open(bytes) {
            Err(e) => prop_assert!(!e.to_string().is_empty()),
            Ok(base) => {
                prop_assert!(!truncated);
                let _ = base.check_run(6, 7, &tokens);
                let mut run = KlRun::new(base);
                // A header corrupted into another consistent shape is read, not scored.
                let same_shape = (run.base.n_ctx, run.base.n_vocab) == (6, 7);
                let n = if same_shape { run.base.n_chunk.min(3) } else { 0 };
                for (c, rows) in logits.iter().enumerate().take(n) {
                    if run.begin_chunk(c).is_ok() {
                        for r in 0..rows_per_chunk(6) {
                            let tok = run.base.tokens[c * 6 + 3 + r + 1] as usize;
                            run.row(r, &rows[r * 7..(r + 1) * 7], tok);
                        }
                    }
                }
                let _ = run.stats.report().map(|r| r.to_string());
            }
        }
    }
}

/// `perplexity_kl` against a base file of the model's own logits: the perplexity is the
/// plain run's, bit for bit, and the divergence is only the base file's rounding.
#[test]
fn perplexity_kl_against_its_own_logits() {
    let path = harness::synthetic::cached_model(DType::Q4_1).unwrap();
    let config = RunConfig::simple("cpu".parse().unwrap(), SplitMode::None, 1, 2);
    let s = Session::open(&path, config).unwrap();
    let tokens = s.tokenizer.encode(&harness::default_corpus()[..1500]);
    let (n_ctx, n_chunk) = (64, 3);
    let n_vocab = s.model.hp.n_vocab;
    let mut kv = s.kv_cache(n_ctx).unwrap();
    let mut exec = s.executor().unwrap();
    // Our logits, chunk by chunk, as perplexity computes them (no BOS: add_bos is false).
    let first = n_ctx / 2;
    let mut logits = Vec::new();
    for c in 0..n_chunk {
        kv.clear();
        let mut b = Batch::default();
        for pos in 0..n_ctx {
            b.push(tokens[c * n_ctx + pos], pos as i32, 0, pos >= first);
        }
        let l = exec.forward(&s.model, &mut kv, &b).unwrap();
        logits.push(l[..rows_per_chunk(n_ctx) * n_vocab].to_vec());
    }
    let bytes = write_base(n_ctx, n_vocab, &tokens[..n_chunk * n_ctx], &logits);
    let settings = PplSettings {
        n_ctx,
        n_batch: n_ctx,
        max_chunks: None,
    };
    let plain = perplexity(
        &s.model,
        exec.as_mut(),
        &mut kv,
        &tokens,
        None,
        PplSettings {
            max_chunks: Some(n_chunk),
            ..settings
        },
        |_, _, _| {},
    )
    .unwrap();
    let mut run = KlRun::new(open(bytes).unwrap());
    let mut lines = Vec::new();
    let r = perplexity_kl(
        &s.model,
        exec.as_mut(),
        &mut kv,
        &tokens,
        None,
        settings,
        &mut run,
        |i, _, _, st| lines.push(st.chunk_line(i)),
    )
    .unwrap();
    assert_eq!(
        r, plain,
        "the KL run scores exactly what the plain run does"
    );
    assert_eq!(lines.len(), n_chunk);
    let k = run.stats.report().unwrap();
    assert_eq!(k.count, n_chunk * rows_per_chunk(n_ctx));
    assert!(k.kld.0.abs() < 1e-5, "{}", k.kld.0);
    assert_eq!(k.same_top.0, 1.0);
    assert!(
        (k.ppl.0 / plain.ppl - 1.0).abs() < 1e-4,
        "{} {}",
        k.ppl.0,
        plain.ppl
    );

    // A base file of other tokens is refused before any work.
    let mut other = tokens[..n_chunk * n_ctx].to_vec();
    other[70] = (other[70] + 1) % n_vocab as u32;
    let mut run = KlRun::new(open(write_base(n_ctx, n_vocab, &other, &logits)).unwrap());
    let e = perplexity_kl(
        &s.model,
        exec.as_mut(),
        &mut kv,
        &tokens,
        None,
        settings,
        &mut run,
        |_, _, _, _| {},
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("token 70 (chunk 1, position 6)"), "{e}");
}

/// A base file llama.cpp itself wrote (harness/tests/data/README.md has the command):
/// the reader takes its header, tokens and log-probs as llama.cpp meant them. Its tokens
/// are the corpus's first 64 as llama.cpp tokenised it, and the perplexity its log-probs
/// give is the one llama-perplexity printed for that run, `[1]20.2320`.
#[test]
fn a_base_file_written_by_llama_cpp() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/smollm2-c64-1chunk.kld");
    let mut base = KlBase::open(&path).unwrap();
    assert_eq!((base.n_ctx, base.n_vocab, base.n_chunk), (64, 49152, 1));
    let reference: Vec<u32> = include_str!("../data/gpl-3.smollm2.tokens.txt")
        .lines()
        .take(64)
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(base.tokens, reference);
    let mut chunk = ChunkLogProbs::default();
    base.read_chunk(0, &mut chunk).unwrap();
    let first = base.n_ctx / 2;
    let rows = rows_per_chunk(base.n_ctx);
    assert_eq!(rows, 31);
    let mut nll = 0.0f64;
    for r in 0..rows {
        let row = chunk.row(r);
        let (scale, min) = harness::kl::row_scale_min(row);
        let next = base.tokens[first + r + 1] as usize;
        nll -= (scale * f32::from(row[4 + next]) + min) as f64;
    }
    let ppl = (nll / rows as f64).exp();
    // llama.cpp prints 4 decimals from full-precision log-probs; the file's are
    // quantised to 16 bits over a 16-nat range (about 2.4e-4 nats a step).
    assert!((ppl - 20.2320).abs() < 5e-3, "derived PPL {ppl}");
}
