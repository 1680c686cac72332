//! SentencePiece tokenizer tests: llama.cpp's ids for the GPL-3 corpus and assorted
//! texts with the real Gemma 3 vocabulary (skipped without the model), behaviour on
//! tiny hand-built vocabularies, and properties checked against a naive re-statement of
//! the merge rule.
//!
//! The reference ids (`data/gpl-3.gemma3.tokens.txt`, `data/tokenizer-cases.gemma3.json`)
//! are `llama-tokenize -m gemma-3-270m-q4_k_m.gguf -f FILE --ids --log-disable
//! --no-escape` of each text written byte for byte to FILE (for the corpus: the text as
//! [`harness::corpus_text`] reads it, without its final newline), BOS included as the
//! model asks.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Instant;

use ggml_core::gguf::Gguf;
use harness::gguf_writer::{GgufWriter, MetaValue};
use harness::tokenizer::{
    SpmOptions, Tokenizer, TokenizerError, TokenizerKind, SPACE_MARK, TOKEN_TYPE_BYTE,
    TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_UNUSED,
    TOKEN_TYPE_USER_DEFINED,
};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------
// The real model

const REFERENCE_IDS: &str = include_str!("../data/gpl-3.gemma3.tokens.txt");
const CASES: &str = include_str!("../data/tokenizer-cases.gemma3.json");

/// Gemma 3's tokenizer (the model downloaded into the cache if missing, as CI has it),
/// read once for all tests.
fn gemma3() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = harness::gemma3_model_path().expect("the Gemma 3 model");
        let bytes = std::fs::read(&path).expect("reading the Gemma 3 model");
        let gguf = Gguf::parse(&bytes).expect("parsing the Gemma 3 model");
        let start = Instant::now();
        let tok = Tokenizer::from_gguf(&gguf).expect("tokenizer from the model");
        println!("built the Gemma 3 tokenizer in {:?}", start.elapsed());
        tok
    })
}

/// Panics with the tokens around the first difference of `got` and `want`.
fn assert_same_ids(tok: &Tokenizer, what: &str, got: &[u32], want: &[u32]) {
    let first = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .or((got.len() != want.len()).then(|| got.len().min(want.len())));
    if let Some(i) = first {
        let around = |ids: &[u32]| -> Vec<String> {
            ids[i.saturating_sub(3).min(ids.len())..(i + 4).min(ids.len())]
                .iter()
                .map(|&t| format!("{t}:{:?}", tok.token_text(t).unwrap_or("?")))
                .collect()
        };
        panic!(
            "{what}: first difference at token {i} ({} vs {} tokens): got {:?}, llama.cpp {:?}",
            got.len(),
            want.len(),
            around(got),
            around(want)
        );
    }
}

#[test]
fn gemma3_encodes_the_corpus_like_llama_cpp() {
    let tok = gemma3();
    let corpus = harness::corpus_text(None).expect("the embedded corpus");
    let want: Vec<u32> = REFERENCE_IDS
        .lines()
        .map(|l| l.parse().expect("reference id"))
        .collect();
    assert_eq!(want.len(), 7562);

    let start = Instant::now();
    let got = tok.encode(&corpus);
    let took = start.elapsed();
    let start = Instant::now();
    let again = tok.encode(&corpus);
    let took_again = start.elapsed();
    assert_eq!(again, got);
    println!(
        "encoded {} bytes into {} tokens in {took:?} (again: {took_again:?})",
        corpus.len(),
        got.len()
    );
    assert_same_ids(tok, "GPL-3", &got, &want);
    assert_eq!(tok.decode(&got[1..]), corpus);
    assert_eq!(tok.decode(&got), format!("<bos>{corpus}"));
}

#[test]
fn gemma3_metadata_and_special_tokens() {
    let tok = gemma3();
    assert_eq!(tok.kind(), TokenizerKind::SentencePiece);
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!(
        (tok.bos(), tok.eos(), tok.unk()),
        (Some(2), Some(1), Some(3))
    );
    assert!(tok.add_bos());
    assert!(!tok.add_eos());
    assert!(!tok.add_space_prefix());
    assert_eq!(tok.token_text(2), Some("<bos>"));
    assert_eq!(tok.token_type(2), Some(TOKEN_TYPE_CONTROL));
    assert_eq!(tok.token_text(107), Some("\n"));
    assert_eq!(tok.token_type(107), Some(TOKEN_TYPE_USER_DEFINED));
    assert_eq!(tok.token_text(238), Some("<0x00>"));
    assert_eq!(tok.token_type(238), Some(TOKEN_TYPE_BYTE));
    assert_eq!(tok.token_bytes(238), Some(&[0u8][..]));
    assert_eq!(tok.token_bytes(238 + 0xE9), Some(&[0xE9u8][..]));
    assert_eq!(tok.token_id("▁"), Some(236743));
    assert_eq!(tok.token_bytes(236743), Some(&b" "[..]));
    assert_eq!(tok.token_bytes(2), Some(&b"<bos>"[..]));
    assert_eq!(
        tok.decode(&[2, 9259, 236764, 1902, 236888]),
        "<bos>Hello, world!"
    );
}

#[derive(serde::Deserialize)]
struct Cases {
    cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
struct Case {
    name: String,
    text: String,
    round_trip: bool,
    ids: Vec<u32>,
}

#[test]
fn gemma3_encodes_tricky_texts_like_llama_cpp() {
    let cases: Cases = serde_json::from_str(CASES).expect("the cases file");
    assert!(cases.cases.len() >= 40);
    let tok = gemma3();
    for case in &cases.cases {
        let got = tok.encode(&case.text);
        assert_same_ids(tok, &case.name, &got, &case.ids);
        // without BOS: the same ids after it
        assert_eq!(case.ids[0], 2, "{}", case.name);
        assert_eq!(
            tok.encode_with(&case.text, false),
            case.ids[1..],
            "{}",
            case.name
        );
        let decoded = tok.decode(&got);
        if case.round_trip {
            assert_eq!(decoded, format!("<bos>{}", case.text), "{}", case.name);
        } else {
            assert_eq!(
                decoded,
                format!("<bos>{}", case.text.replace(SPACE_MARK, " ")),
                "{}",
                case.name
            );
        }
    }
}

#[test]
fn gemma3_byte_fallback_and_whitespace_runs() {
    let tok = gemma3();
    // U+20000 has no token: its four bytes are byte tokens
    assert_eq!(
        tok.encode_with("\u{20000}", false),
        [238 + 0xF0, 238 + 0xA0, 238 + 0x80, 238 + 0x80]
    );
    // runs of newlines, tabs and (two or more) spaces are user-defined tokens, longest
    // first: 40 newlines are the 31 run then the 9 run
    let nl = |n: usize| tok.token_id(&"\n".repeat(n)).unwrap();
    assert_eq!(tok.encode_with(&"\n".repeat(40), false), [nl(31), nl(9)]);
    let sp = |n: usize| tok.token_id(&" ".repeat(n)).unwrap();
    assert_eq!(tok.encode_with("a  b", false)[1], sp(2));
    // a single space is no user-defined token: it is '▁' for the merging
    assert_eq!(tok.token_id(" "), None);
}

// ---------------------------------------------------------------------------------------
// Hand-built vocabularies

/// A vocabulary: the 256 byte tokens `<0xXX>` first if `bytes`, then `entries` (text
/// with `' '` written as `'▁'` for normal tokens, score, type).
fn vocab(bytes: bool, entries: &[(&str, f32, i32)]) -> (Vec<String>, Vec<i32>, Vec<f32>) {
    let mut tokens = Vec::new();
    let mut types = Vec::new();
    let mut scores = Vec::new();
    if bytes {
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(TOKEN_TYPE_BYTE);
            scores.push(0.0);
        }
    }
    for &(text, score, ty) in entries {
        tokens.push(text.to_owned());
        types.push(ty);
        scores.push(score);
    }
    (tokens, types, scores)
}

/// Options without BOS, EOS, unknown token or space prefix.
fn plain() -> SpmOptions {
    SpmOptions {
        bos: None,
        eos: None,
        unk: None,
        add_bos: false,
        add_eos: false,
        add_space_prefix: false,
    }
}

fn spm(bytes: bool, entries: &[(&str, f32, i32)], options: SpmOptions) -> Tokenizer {
    let (tokens, types, scores) = vocab(bytes, entries);
    Tokenizer::new_spm(tokens, types, scores, options).expect("synthetic vocabulary")
}

/// Normal tokens with their scores.
fn normal(entries: &[(&'static str, f32)]) -> Vec<(&'static str, f32, i32)> {
    entries
        .iter()
        .map(|&(t, s)| (t, s, TOKEN_TYPE_NORMAL))
        .collect()
}

/// The token texts of encoding `text`.
fn texts(tok: &Tokenizer, text: &str) -> Vec<String> {
    tok.encode(text)
        .iter()
        .map(|&id| tok.token_text(id).unwrap().to_owned())
        .collect()
}

const LETTERS: [(&str, f32); 4] = [("a", -1.0), ("b", -1.0), ("c", -1.0), ("d", -1.0)];

#[test]
fn the_highest_score_merges_first() {
    let mut v = normal(&LETTERS);
    v.extend(normal(&[("ab", -5.0), ("bc", -2.0)]));
    let tok = spm(true, &v, plain());
    assert_eq!(tok.kind(), TokenizerKind::SentencePiece);
    assert_eq!(texts(&tok, "abc"), ["a", "bc"]);

    let mut v = normal(&LETTERS);
    v.extend(normal(&[("ab", -2.0), ("bc", -5.0)]));
    assert_eq!(texts(&spm(true, &v, plain()), "abc"), ["ab", "c"]);

    // a merge needs both halves as tokens: "abcd" alone never forms
    let mut v = normal(&LETTERS);
    v.extend(normal(&[("abcd", 10.0), ("ab", -3.0)]));
    assert_eq!(texts(&spm(true, &v, plain()), "abcd"), ["ab", "c", "d"]);

    // a merged symbol can merge again, with the best of its new neighbours
    let mut v = normal(&LETTERS);
    v.extend(normal(&[
        ("bc", -1.0),
        ("abc", -4.0),
        ("bcd", -3.0),
        ("cd", -9.0),
    ]));
    assert_eq!(texts(&spm(true, &v, plain()), "abcd"), ["a", "bcd"]);
}

#[test]
fn equal_scores_merge_leftmost_first() {
    let mut v = normal(&LETTERS);
    v.push(("aa", -1.0, TOKEN_TYPE_NORMAL));
    let tok = spm(true, &v, plain());
    assert_eq!(texts(&tok, "aaa"), ["aa", "a"]);
    assert_eq!(texts(&tok, "aaaaa"), ["aa", "aa", "a"]);
    // "aa" + "a" = "aaa", queued once the left pair merged: it beats the right "aa"
    v.push(("aaa", -0.5, TOKEN_TYPE_NORMAL));
    let tok = spm(true, &v, plain());
    assert_eq!(texts(&tok, "aaaa"), ["aaa", "a"]);
    // a longer token with a lower score waits for the better pairs: "ab" "ab", never
    // "aba" "b"
    let mut v = normal(&LETTERS);
    v.extend(normal(&[("ab", -1.0), ("ba", -1.0), ("aba", -2.0)]));
    assert_eq!(texts(&spm(true, &v, plain()), "abab"), ["ab", "ab"]);
    assert_eq!(texts(&spm(true, &v, plain()), "baba"), ["ba", "ba"]);
}

#[test]
fn missing_characters_fall_back_to_byte_tokens() {
    let tok = spm(true, &normal(&LETTERS), plain());
    let ids = tok.encode("aé😀b");
    assert_eq!(
        texts(&tok, "aé😀b"),
        ["a", "<0xC3>", "<0xA9>", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>", "b"]
    );
    assert_eq!(tok.decode(&ids), "aé😀b");
    assert_eq!(tok.token_bytes(0xC3), Some(&[0xC3u8][..]));
    // half a character
    assert_eq!(tok.decode(&ids[1..2]), "\u{FFFD}");
    assert_eq!(tok.decode_bytes(&ids[1..2]), [0xC3]);
    // byte tokens are found by text, wherever they are
    let mut v = normal(&LETTERS);
    v.push(("<0x0A>", 0.0, TOKEN_TYPE_BYTE));
    let tok = spm(false, &v, plain());
    assert_eq!(tok.encode("a\nb"), [0, 4, 1]);
}

#[test]
fn bytes_without_byte_tokens_become_the_unknown_token() {
    let mut v = vec![("<unk>", 0.0, TOKEN_TYPE_UNKNOWN)];
    v.extend(normal(&LETTERS));
    let with_unk = SpmOptions {
        unk: Some(0),
        ..plain()
    };
    let tok = spm(false, &v, with_unk);
    assert_eq!(tok.unk(), Some(0));
    assert_eq!(tok.encode("aéb"), [1, 0, 0, 2]);
    assert_eq!(tok.decode(&[1, 0, 0, 2]), "a<unk><unk>b");
    // without an unknown token they are dropped
    let tok = spm(false, &v, plain());
    assert_eq!(tok.encode("aéb"), [1, 2]);
    assert_eq!(tok.encode("é"), Vec::<u32>::new());
}

#[test]
fn space_prefix_on_and_off() {
    let mut v = normal(&LETTERS);
    v.extend(normal(&[("▁", -2.0), ("▁a", -1.0), ("▁b", -1.0)]));
    v.push(("<s>", 0.0, TOKEN_TYPE_CONTROL));
    let off = spm(true, &v, plain());
    assert!(!off.add_space_prefix());
    assert_eq!(texts(&off, "a b"), ["a", "▁b"]);
    assert_eq!(texts(&off, " a"), ["▁a"]);
    assert_eq!(texts(&off, "a<s>b"), ["a", "<s>", "b"]);
    assert_eq!(off.decode(&off.encode("a b")), "a b");

    let prefix = SpmOptions {
        add_space_prefix: true,
        ..plain()
    };
    let on = spm(true, &v, prefix);
    assert!(on.add_space_prefix());
    assert_eq!(texts(&on, "a b"), ["▁a", "▁b"]);
    assert_eq!(texts(&on, " a"), ["▁", "▁a"]);
    // every stretch right after a special token gets one too
    assert_eq!(
        texts(&on, "a<s>b<s><s>a"),
        ["▁a", "<s>", "▁b", "<s>", "<s>", "▁a"]
    );
    // the space is not removed again on decoding
    assert_eq!(on.decode(&on.encode("a b")), " a b");
    assert!(on.encode("").is_empty());

    // with BOS: still a prefix (llama.cpp counts the start as "after a special token")
    let bos = SpmOptions {
        bos: Some(263),
        add_bos: true,
        ..prefix
    };
    let tok = spm(true, &v, bos);
    assert_eq!(texts(&tok, "b"), ["<s>", "▁b"]);
    assert_eq!(tok.encode(""), [263]);
    assert_eq!(tok.encode_with("", false), Vec::<u32>::new());
}

#[test]
fn special_tokens_are_split_off_first_longest_first() {
    let mut v = normal(&LETTERS);
    v.extend(normal(&[("▁", -2.0), ("▁a", -1.0), ("\n", -1.0)]));
    v.extend([
        ("\n\n", 0.0, TOKEN_TYPE_USER_DEFINED),
        ("\n\n\n", 0.0, TOKEN_TYPE_USER_DEFINED),
        ("  ", 0.0, TOKEN_TYPE_USER_DEFINED),
        ("<bos>", 0.0, TOKEN_TYPE_CONTROL),
        ("<unused0>", 0.0, TOKEN_TYPE_UNUSED),
        ("▁▁", 5.0, TOKEN_TYPE_NORMAL),
    ]);
    let tok = spm(true, &v, plain());
    assert_eq!(texts(&tok, "a\n\n\n\n\nb"), ["a", "\n\n\n", "\n\n", "b"]);
    assert_eq!(texts(&tok, "a\nb"), ["a", "\n", "b"]);
    // runs of spaces are cut into the user-defined pairs before '▁' merging could see
    // them; an odd one out is '▁'
    assert_eq!(texts(&tok, "a     a"), ["a", "  ", "  ", "▁a"]);
    assert_eq!(texts(&tok, "a<bos>b"), ["a", "<bos>", "b"]);
    // unused tokens are no special tokens: plain text, split into characters
    assert_eq!(tok.encode("<unused0>").len(), 9);
    // decoding: user-defined and control tokens as their text, unused ones as nothing
    let unused = tok.token_id("<unused0>").unwrap();
    assert_eq!(
        tok.decode(&[tok.token_id("<bos>").unwrap(), unused, 256]),
        "<bos>a"
    );
    for text in [
        "a\n\n\n\n\nb",
        "a     a",
        "a<bos>b",
        "<unused0>",
        " \n \n\n  ",
    ] {
        assert_eq!(tok.decode(&tok.encode(text)), text, "{text:?}");
    }
}

#[test]
fn eos_and_bad_vocabularies() {
    let v = normal(&LETTERS);
    let tok = spm(
        true,
        &v,
        SpmOptions {
            bos: Some(256),
            eos: Some(257),
            add_bos: true,
            add_eos: true,
            ..plain()
        },
    );
    assert_eq!(tok.encode("c"), [256, 258, 257]);
    assert_eq!(tok.encode_with("c", false), [258]);

    let (tokens, types, scores) = vocab(false, &v);
    let err = Tokenizer::new_spm(tokens.clone(), types.clone(), scores[1..].to_vec(), plain())
        .unwrap_err();
    assert_eq!(
        err,
        TokenizerError::ScoreCount {
            tokens: 4,
            scores: 3
        }
    );
    assert_eq!(err.to_string(), "3 token scores for 4 tokens");
    let unk = SpmOptions {
        unk: Some(4),
        ..plain()
    };
    assert_eq!(
        Tokenizer::new_spm(tokens.clone(), types.clone(), scores.clone(), unk).unwrap_err(),
        TokenizerError::SpecialIdOutOfRange {
            which: "UNK",
            id: 4,
            n_vocab: 4
        }
    );
    let add_eos = SpmOptions {
        add_eos: true,
        ..plain()
    };
    assert_eq!(
        Tokenizer::new_spm(tokens.clone(), types.clone(), scores.clone(), add_eos).unwrap_err(),
        TokenizerError::MissingSpecial { which: "eos" }
    );
    let mut dup = tokens.clone();
    dup[3] = "a".into();
    assert!(matches!(
        Tokenizer::new_spm(dup, types, scores, plain()).unwrap_err(),
        TokenizerError::DuplicateToken {
            id: 3,
            first: 0,
            ..
        }
    ));
    assert_eq!(
        Tokenizer::new_spm(vec![], vec![], vec![], plain()).unwrap_err(),
        TokenizerError::EmptyVocab
    );
}

// ---------------------------------------------------------------------------------------
// GGUF metadata

/// An SPM vocabulary: `<unk>`, `<s>`, `</s>`, the byte tokens, then normal tokens.
fn spm_metadata() -> Vec<(&'static str, MetaValue)> {
    let mut entries = vec![
        ("<unk>", 0.0, TOKEN_TYPE_UNKNOWN),
        ("<s>", 0.0, TOKEN_TYPE_CONTROL),
        ("</s>", 0.0, TOKEN_TYPE_CONTROL),
    ];
    let bytes: Vec<String> = (0..=255u8).map(|b| format!("<0x{b:02X}>")).collect();
    entries.extend(bytes.iter().map(|t| (t.as_str(), 0.0, TOKEN_TYPE_BYTE)));
    entries.extend(normal(&[
        ("a", -1.0),
        ("b", -1.0),
        ("▁", -1.0),
        ("▁a", -0.5),
        ("ab", -2.0),
    ]));
    let (tokens, types, scores) = vocab(false, &entries);
    vec![
        ("tokenizer.ggml.model", MetaValue::Str("llama".into())),
        ("tokenizer.ggml.tokens", MetaValue::StrArray(tokens)),
        ("tokenizer.ggml.token_type", MetaValue::I32Array(types)),
        ("tokenizer.ggml.scores", MetaValue::F32Array(scores)),
    ]
}

fn from_metadata(kvs: &[(&str, MetaValue)]) -> Result<Tokenizer, TokenizerError> {
    let mut w = GgufWriter::new();
    for (k, v) in kvs {
        w.meta(k, v.clone());
    }
    let bytes = w.to_bytes().expect("valid metadata");
    let gguf = Gguf::parse(&bytes).expect("valid GGUF");
    Tokenizer::from_gguf(&gguf)
}

fn without(kvs: Vec<(&'static str, MetaValue)>, key: &str) -> Vec<(&'static str, MetaValue)> {
    kvs.into_iter().filter(|(k, _)| *k != key).collect()
}

#[test]
fn from_gguf_reads_spm_vocabularies_with_llama_cpp_defaults() {
    let kvs = spm_metadata();
    let tok = from_metadata(&kvs).unwrap();
    assert_eq!(tok.kind(), TokenizerKind::SentencePiece);
    // absent keys: BOS 1, EOS 2, unknown 0, BOS added, a space prefix
    assert_eq!(
        (tok.bos(), tok.eos(), tok.unk()),
        (Some(1), Some(2), Some(0))
    );
    assert!(tok.add_bos() && !tok.add_eos() && tok.add_space_prefix());
    // "▁a" (-0.5) beats "ab" (-2)
    assert_eq!(texts(&tok, "ab a"), ["<s>", "▁a", "b", "▁a"]);

    let mut kvs = spm_metadata();
    kvs.extend([
        ("tokenizer.ggml.pre", MetaValue::Str("whatever".into())),
        ("tokenizer.ggml.bos_token_id", MetaValue::U32(2)),
        ("tokenizer.ggml.eos_token_id", MetaValue::U32(1)),
        ("tokenizer.ggml.unknown_token_id", MetaValue::U32(3)),
        ("tokenizer.ggml.add_bos_token", MetaValue::Bool(false)),
        ("tokenizer.ggml.add_eos_token", MetaValue::Bool(true)),
        ("tokenizer.ggml.add_space_prefix", MetaValue::Bool(false)),
    ]);
    let tok = from_metadata(&kvs).unwrap();
    assert_eq!(
        (tok.bos(), tok.eos(), tok.unk()),
        (Some(2), Some(1), Some(3))
    );
    assert!(!tok.add_bos() && tok.add_eos() && !tok.add_space_prefix());
    assert_eq!(texts(&tok, "ab a"), ["ab", "▁a", "<s>"]);

    // integer scores are taken too; no scores at all are all 0: ties, leftmost first
    let mut kvs = spm_metadata();
    kvs[3].1 = MetaValue::I32Array(vec![0; 3 + 256 + 5]);
    let tok = from_metadata(&kvs).unwrap();
    assert_eq!(texts(&tok, "ab a"), ["<s>", "▁a", "b", "▁a"]);
    let tok = from_metadata(&without(spm_metadata(), "tokenizer.ggml.scores")).unwrap();
    assert_eq!(texts(&tok, "ab a"), ["<s>", "▁a", "b", "▁a"]);
    // no token types: all normal, so "<s>" is plain text
    let tok = from_metadata(&without(spm_metadata(), "tokenizer.ggml.token_type")).unwrap();
    assert_eq!(tok.encode("<s>").len(), 1 + 4);

    // default ids beyond a tiny vocabulary are none
    let tiny = vec![
        ("tokenizer.ggml.model", MetaValue::Str("llama".into())),
        (
            "tokenizer.ggml.tokens",
            MetaValue::StrArray(vec!["a".into()]),
        ),
        ("tokenizer.ggml.add_bos_token", MetaValue::Bool(false)),
    ];
    let tok = from_metadata(&tiny).unwrap();
    assert_eq!((tok.bos(), tok.eos(), tok.unk()), (None, None, Some(0)));
}

#[test]
fn from_gguf_spm_errors() {
    let mut kvs = spm_metadata();
    kvs[3].1 = MetaValue::StrArray(vec!["1".into()]);
    assert!(matches!(
        from_metadata(&kvs).unwrap_err(),
        TokenizerError::WrongType {
            key: "tokenizer.ggml.scores",
            ..
        }
    ));
    let mut kvs = spm_metadata();
    kvs[3].1 = MetaValue::F32Array(vec![0.0; 3]);
    assert!(matches!(
        from_metadata(&kvs).unwrap_err(),
        TokenizerError::ScoreCount { scores: 3, .. }
    ));
    let mut kvs = spm_metadata();
    kvs.push(("tokenizer.ggml.unknown_token_id", MetaValue::U32(100_000)));
    assert!(matches!(
        from_metadata(&kvs).unwrap_err(),
        TokenizerError::SpecialIdOutOfRange { which: "UNK", .. }
    ));
    let mut kvs = spm_metadata();
    kvs.push(("tokenizer.ggml.add_space_prefix", MetaValue::U32(1)));
    assert!(matches!(
        from_metadata(&kvs).unwrap_err(),
        TokenizerError::WrongType {
            key: "tokenizer.ggml.add_space_prefix",
            ..
        }
    ));
    let mut kvs = spm_metadata();
    kvs[0].1 = MetaValue::Str("bert".into());
    let err = from_metadata(&kvs).unwrap_err();
    assert_eq!(err, TokenizerError::UnsupportedModel("bert".into()));
    assert_eq!(
        err.to_string(),
        "tokenizer model \"bert\" is not supported: only \"gpt2\" (byte-level BPE) and \
         \"llama\" (SentencePiece) are"
    );
    assert_eq!(
        from_metadata(&without(spm_metadata(), "tokenizer.ggml.tokens")).unwrap_err(),
        TokenizerError::MissingKey {
            key: "tokenizer.ggml.tokens"
        }
    );
}

// ---------------------------------------------------------------------------------------
// Properties

/// The merge rule stated naively: among all adjacent pairs whose text is a token, merge
/// the one with the highest score, the leftmost among equals; repeat; then characters
/// without a token become their byte tokens (or nothing). No special tokens, no BOS.
fn naive_spm(text: &str, ids: &HashMap<&str, u32>, scores: &[f32]) -> Vec<u32> {
    let escaped = text.replace(' ', "▁");
    let mut syms: Vec<String> = escaped.chars().map(String::from).collect();
    loop {
        let mut best: Option<(f32, usize)> = None;
        for i in 0..syms.len().saturating_sub(1) {
            let joined = format!("{}{}", syms[i], syms[i + 1]);
            if let Some(&id) = ids.get(joined.as_str()) {
                let s = scores[id as usize];
                if best.is_none_or(|(b, _)| s > b) {
                    best = Some((s, i));
                }
            }
        }
        let Some((_, i)) = best else { break };
        let right = syms.remove(i + 1);
        syms[i].push_str(&right);
    }
    let mut out = Vec::new();
    for s in &syms {
        match ids.get(s.as_str()) {
            Some(&id) => out.push(id),
            None => out.extend(
                s.bytes()
                    .filter_map(|b| ids.get(format!("<0x{b:02X}>").as_str()).copied()),
            ),
        }
    }
    out
}

/// A small vocabulary over "abc▁é", picked pseudo-randomly from `seed`: mostly each of
/// "a", "b", "c" and "▁", never "é" alone (so that byte fallback is needed), and about
/// half of the strings of two or three characters, with scores from a few values so
/// that ties are common; the byte tokens first if `bytes`.
fn random_vocab(seed: u64, bytes: bool) -> (Vec<String>, Vec<i32>, Vec<f32>) {
    let alphabet = ['a', 'b', 'c', '▁', 'é'];
    let mut strings: Vec<String> = alphabet.iter().map(|c| c.to_string()).collect();
    for &x in &alphabet {
        for &y in &alphabet {
            strings.push(format!("{x}{y}"));
            for &z in &alphabet {
                strings.push(format!("{x}{y}{z}"));
            }
        }
    }
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut entries: Vec<(String, f32)> = Vec::new();
    for (i, s) in strings.into_iter().enumerate() {
        let r = next();
        // single letters other than 'é' always, longer strings half the time
        if (i < 4 && r % 8 != 0) || (i >= 5 && r % 2 == 1) {
            entries.push((s, -(((r >> 8) % 4) as f32)));
        }
    }
    let owned: Vec<(&str, f32, i32)> = entries
        .iter()
        .map(|(s, sc)| (s.as_str(), *sc, TOKEN_TYPE_NORMAL))
        .collect();
    vocab(bytes, &owned)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The heap-driven merging agrees with the naive rule on random vocabularies.
    #[test]
    fn merging_agrees_with_the_naive_rule(seed in any::<u64>(), bytes in any::<bool>(),
                                           text in "[abc é▁]{0,24}") {
        let (tokens, types, scores) = random_vocab(seed, bytes);
        let ids: HashMap<&str, u32> =
            tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i as u32)).collect();
        let want = naive_spm(&text, &ids, &scores);
        let tok = Tokenizer::new_spm(tokens.clone(), types, scores.clone(), plain()).unwrap();
        prop_assert_eq!(tok.encode(&text), want);
    }

    /// Any text tokenizes without panicking, with and without byte tokens, unknown
    /// token and space prefix.
    #[test]
    fn encode_never_panics(text in any::<String>(), bytes in any::<bool>(),
                           unk in any::<bool>(), prefix in any::<bool>()) {
        let (mut tokens, mut types, mut scores) = random_vocab(7, bytes);
        tokens.extend(["<unk>".to_string(), "<s>".to_string(), "\n\n".to_string()]);
        types.extend([TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED]);
        scores.extend([0.0, 0.0, 0.0]);
        let n = tokens.len() as u32;
        let options = SpmOptions {
            bos: Some(n - 2),
            eos: Some(n - 2),
            unk: unk.then_some(n - 3),
            add_bos: true,
            add_eos: true,
            add_space_prefix: prefix,
        };
        let tok = Tokenizer::new_spm(tokens, types, scores, options).unwrap();
        let ids = tok.encode(&text);
        prop_assert!(ids.iter().all(|&id| id < n));
        prop_assert_eq!(ids.first(), Some(&(n - 2)));
        let _ = tok.decode(&ids);
    }

    /// With all byte tokens and no space prefix, decoding gives the text back (but for
    /// '▁', which decodes as a space).
    #[test]
    fn decode_inverts_encode(parts in prop::collection::vec(
        prop_oneof![
            any::<String>(),
            "[abc é\\n\\t]{0,12}",
            Just("<s>".to_string()),
            Just("\n\n".to_string()),
            Just("  ".to_string()),
        ],
        0..6,
    )) {
        let text: String = parts.concat().replace('▁', "_");
        let tok = round_trip_tokenizer();
        prop_assert_eq!(tok.decode(&tok.encode(&text)), text);
    }
}

fn round_trip_tokenizer() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let (mut tokens, mut types, mut scores) = random_vocab(11, true);
        tokens.extend(["<s>".to_string(), "\n\n".to_string(), "  ".to_string()]);
        types.extend([
            TOKEN_TYPE_CONTROL,
            TOKEN_TYPE_USER_DEFINED,
            TOKEN_TYPE_USER_DEFINED,
        ]);
        scores.extend([0.0, 0.0, 0.0]);
        Tokenizer::new_spm(tokens, types, scores, plain()).unwrap()
    })
}
