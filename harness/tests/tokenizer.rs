//! Tokenizer tests: llama.cpp's ids for the GPL-3 corpus with the real SmolLM2 vocabulary
//! (skipped without the model), and behaviour on tiny synthetic vocabularies.

use std::time::Instant;

use ggml_core::gguf::Gguf;
use harness::tokenizer::{
    gpt2_byte_to_char, Tokenizer, TokenizerError, TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL,
    TOKEN_TYPE_UNUSED, TOKEN_TYPE_USER_DEFINED,
};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------
// The real model

const MODEL_SIZE: u64 = 98_362_432;
const CORPUS: &str = include_str!("../data/gpl-3.txt");
const REFERENCE_IDS: &str = include_str!("../data/gpl-3.smollm2.tokens.txt");

/// The model's bytes (downloaded into the cache on first use; a failed download fails).
fn model_bytes() -> Vec<u8> {
    let path =
        harness::model_path(None).unwrap_or_else(|e| panic!("SmolLM2 could not be fetched: {e}"));
    let bytes = std::fs::read(&path).expect("reading the model");
    assert_eq!(bytes.len() as u64, MODEL_SIZE, "{}", path.display());
    bytes
}

fn smollm2() -> Tokenizer {
    let bytes = model_bytes();
    let gguf = Gguf::parse(&bytes).expect("parsing the model");
    Tokenizer::from_gguf(&gguf).expect("tokenizer from the model")
}

#[test]
fn smollm2_encodes_the_corpus_like_llama_cpp() {
    let tok = smollm2();
    let want: Vec<u32> = REFERENCE_IDS
        .lines()
        .map(|l| l.parse().expect("reference id"))
        .collect();
    assert_eq!(want.len(), 7639);

    let start = Instant::now();
    let got = tok.encode(CORPUS);
    let took = start.elapsed();
    println!(
        "encoded {} bytes into {} tokens in {took:?}",
        CORPUS.len(),
        got.len()
    );

    if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
        let around = |ids: &[u32]| -> Vec<String> {
            ids[i.saturating_sub(3)..(i + 4).min(ids.len())]
                .iter()
                .map(|&t| format!("{t}:{:?}", tok.token_text(t).unwrap_or("?")))
                .collect()
        };
        panic!(
            "first difference at token {i}: got {:?}, llama.cpp {:?}",
            around(&got),
            around(&want)
        );
    }
    assert_eq!(got.len(), want.len());
    assert_eq!(tok.decode(&got), CORPUS);
}

#[test]
fn smollm2_metadata_and_special_tokens() {
    let tok = smollm2();
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    assert!(!tok.add_bos());
    assert!(!tok.add_eos());
    assert_eq!(tok.token_text(0), Some("<|endoftext|>"));
    assert_eq!(tok.token_type(1), Some(TOKEN_TYPE_CONTROL));

    let chat = "<|im_start|>user\nHi there!<|im_end|>\n";
    let ids = tok.encode(chat);
    assert_eq!(ids[0], 1);
    assert_eq!(&ids[ids.len() - 2..], &[2, tok.token_id("Ċ").unwrap()]);
    assert_eq!(tok.decode(&ids), chat);
    // the corpus without its final newline ends one token earlier
    let trimmed = tok.encode(CORPUS.strip_suffix('\n').unwrap());
    assert_eq!(trimmed.len(), 7638);
    assert_eq!(tok.decode(&trimmed), CORPUS.strip_suffix('\n').unwrap());
}

#[test]
fn smollm2_round_trips_assorted_text() {
    let tok = smollm2();
    for text in [
        "",
        " ",
        "Hello, world! It's 2024-05-01; naïve café, Привет, 日本語, 😀 🇫🇷.",
        "tabs\tand\r\nCRLF  \n\n\n   trailing   ",
        "e\u{301} \u{a0}\u{3000}\u{200b} \u{10D40} \u{2EBF0}",
        "<|endoftext|><|endoftext|> <repo_name>x</file_sep>",
    ] {
        assert_eq!(tok.decode(&tok.encode(text)), text, "{text:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Synthetic vocabularies

/// The GPT-2 text of raw bytes.
fn mapped(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| gpt2_byte_to_char(b)).collect()
}

/// A byte-complete vocabulary: ids 0..256 are the bytes, then one token per merge result
/// (in merge order, if new), then `extra` tokens with their types.
fn vocab(merges: &[&str], extra: &[(&str, i32)]) -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = (0..=255u8)
        .map(|b| gpt2_byte_to_char(b).to_string())
        .collect();
    let mut types = vec![TOKEN_TYPE_NORMAL; 256];
    for m in merges {
        let joined = m.replacen(' ', "", 1);
        if !tokens.contains(&joined) {
            tokens.push(joined);
            types.push(TOKEN_TYPE_NORMAL);
        }
    }
    for (text, ty) in extra {
        tokens.push(text.to_string());
        types.push(*ty);
    }
    (
        tokens,
        types,
        merges.iter().map(|m| m.to_string()).collect(),
    )
}

fn synthetic(merges: &[&str], extra: &[(&str, i32)]) -> Tokenizer {
    let (tokens, types, merges) = vocab(merges, extra);
    Tokenizer::new(tokens, types, merges, None, None, false).expect("synthetic vocabulary")
}

/// The token texts of encoding `text`.
fn texts(tok: &Tokenizer, text: &str) -> Vec<String> {
    let ids = tok.encode(text);
    assert_eq!(tok.decode(&ids), text, "round trip of {text:?}");
    ids.iter()
        .map(|&id| tok.token_text(id).unwrap().to_owned())
        .collect()
}

#[test]
fn merges_apply_in_rank_order() {
    assert_eq!(texts(&synthetic(&["a b", "b c"], &[]), "abc"), ["ab", "c"]);
    assert_eq!(texts(&synthetic(&["b c", "a b"], &[]), "abc"), ["a", "bc"]);
    // rank beats position: "a a" (rank 0) at the right before "aa a" (rank 1) at the left
    let tok = synthetic(&["a a", "aa a"], &[]);
    assert_eq!(texts(&tok, "aaa"), ["aaa"]);
    assert_eq!(texts(&tok, "aaaa"), ["aa", "aa"]);
    // among equal ranks the leftmost merges first
    assert_eq!(texts(&synthetic(&["a a"], &[]), "aaa"), ["aa", "a"]);
    let tok = synthetic(
        &["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or"],
        &[],
    );
    assert_eq!(texts(&tok, "hello world"), ["hello", "Ġwor", "l", "d"]);
    assert_eq!(texts(&tok, "hellhole"), ["hell", "h", "o", "l", "e"]);
}

#[test]
fn digits_are_pieces_of_their_own() {
    let tok = synthetic(&["1 2", "Ġ 1", "a 1", "Ġ Ġ"], &[]);
    assert_eq!(texts(&tok, "12"), ["1", "2"]);
    assert_eq!(texts(&tok, " 1"), ["Ġ", "1"]);
    assert_eq!(texts(&tok, "a1"), ["a", "1"]);
    // the space run before a digit ends its piece, so it stays whole
    assert_eq!(texts(&tok, "a  1"), ["a", "ĠĠ", "1"]);
}

#[test]
fn contractions() {
    let tok = synthetic(&["i t", "' s", "t '", "' re", "r e", "D '"], &[]);
    assert_eq!(texts(&tok, "it's"), ["it", "'s"]);
    assert_eq!(texts(&tok, "t're"), ["t", "'re"]);
    // upper case is no contraction, and "D" "'" are separate pieces: "D '" never applies
    assert_eq!(texts(&tok, "D'S"), ["D", "'", "S"]);
}

#[test]
fn whitespace_runs_and_the_lookahead() {
    let tok = synthetic(&["Ġ Ġ", "ĠĠ Ġ", "Ġ b", "Ċ Ċ", "Ġ Ċ", "ĉ ĉ", "a Ġ"], &[]);
    // \s+(?!\S): the run's last space goes with the next word
    assert_eq!(texts(&tok, "a  b"), ["a", "Ġ", "Ġb"]);
    assert_eq!(texts(&tok, "a   b"), ["a", "ĠĠ", "Ġb"]);
    assert_eq!(texts(&tok, "a    b"), ["a", "ĠĠĠ", "Ġb"]);
    assert_eq!(texts(&tok, "a b"), ["a", "Ġb"]);
    // trailing whitespace is one piece
    assert_eq!(texts(&tok, "a   "), ["a", "ĠĠĠ"]);
    assert_eq!(texts(&tok, "a \n"), ["a", "ĠĊ"]);
    // newlines
    assert_eq!(texts(&tok, "a\n\n"), ["a", "ĊĊ"]);
    assert_eq!(texts(&tok, "a\n\nb"), ["a", "Ċ", "Ċ", "b"]);
    assert_eq!(texts(&tok, "a\n\n\nb"), ["a", "ĊĊ", "Ċ", "b"]);
    assert_eq!(texts(&tok, "a \nb"), ["a", "Ġ", "Ċ", "b"]);
    assert_eq!(texts(&tok, "\t\tx"), ["ĉ", "ĉ", "x"]);
    assert_eq!(texts(&tok, "   "), ["ĠĠĠ"]);
}

#[test]
fn unicode_letters_marks_and_emoji() {
    let e_acute = mapped("é".as_bytes());
    let a_grave = mapped("à".as_bytes());
    let m1 = format!("{} {}", &e_acute[..2], &e_acute[2..]);
    let m2 = format!("{} {}", &a_grave[..2], &a_grave[2..]);
    let m3 = format!("Ġ {e_acute}");
    let tok = synthetic(&[&m1, &m2, &m3, "c a", "ca f", "Ġ c"], &[]);
    assert_eq!(texts(&tok, "caf\u{e9}"), ["caf", e_acute.as_str()]);
    assert_eq!(
        texts(&tok, " \u{e9}\u{e0}"),
        [format!("Ġ{e_acute}"), a_grave]
    );
    // a combining mark is not a letter: "e" + U+0301 are two pieces
    let mark = mapped("\u{301}".as_bytes());
    let first = mark.chars().next().unwrap();
    let tok = synthetic(&[&format!("e {first}")], &[]);
    assert_eq!(texts(&tok, "e\u{301}").len(), 3);
    // emoji (4 bytes) and a flag (two regional indicators)
    let tok = synthetic(&[], &[]);
    assert_eq!(tok.encode("😀"), [0xF0, 0x9F, 0x98, 0x80]);
    assert_eq!(tok.encode(" 🇫🇷!").len(), 1 + 8 + 1);
    assert_eq!(tok.decode(&tok.encode(" 🇫🇷!")), " 🇫🇷!");
}

#[test]
fn special_tokens_are_matched_first() {
    let tok = synthetic(
        &["< |", "e n"],
        &[
            ("<|endoftext|>", TOKEN_TYPE_CONTROL),
            ("<|im_start|>", TOKEN_TYPE_CONTROL),
            ("<user>", TOKEN_TYPE_USER_DEFINED),
            ("<a>", TOKEN_TYPE_CONTROL),
            ("<a>b", TOKEN_TYPE_USER_DEFINED),
        ],
    );
    let id = |t: &str| tok.token_id(t).unwrap();
    assert_eq!(
        tok.encode("x<|endoftext|>y"),
        [b'x' as u32, id("<|endoftext|>"), b'y' as u32]
    );
    assert_eq!(
        tok.encode("<|im_start|><|endoftext|><user>"),
        [id("<|im_start|>"), id("<|endoftext|>"), id("<user>")]
    );
    // longest first
    assert_eq!(tok.encode("<a>b<a>"), [id("<a>b"), id("<a>")]);
    // text around a special token is pre-tokenized on its own: no space joins "en"
    assert_eq!(
        texts(&tok, "en <user> en"),
        ["en", "Ġ", "<user>", "Ġ", "en"]
    );
    // a broken special token is plain text
    assert_eq!(
        texts(&tok, "<|endoftext"),
        ["<|", "en", "d", "o", "f", "t", "e", "x", "t"]
    );
    assert_eq!(tok.decode(&[id("<|endoftext|>")]), "<|endoftext|>");
}

#[test]
fn bytes_missing_from_the_vocabulary() {
    // a merge whose result is no token: the symbol's printable ASCII bytes are looked
    // up one by one
    let (mut tokens, types, merges) = vocab(&["x y"], &[]);
    tokens[256] = "not-xy".into();
    let tok = Tokenizer::new(tokens, types, merges, None, None, false).unwrap();
    assert_eq!(tok.encode("xy"), [b'x' as u32, b'y' as u32]);

    // other bytes of an unknown symbol are dropped, like llama.cpp drops them
    let e_acute = mapped("é".as_bytes());
    let (mut tokens, types, merges) =
        vocab(&[&format!("{} {}", &e_acute[..2], &e_acute[2..])], &[]);
    tokens[256] = "not-e-acute".into();
    let tok = Tokenizer::new(tokens.clone(), types.clone(), merges, None, None, false).unwrap();
    assert_eq!(tok.encode("aé"), [b'a' as u32]);

    // a byte without a token is dropped
    tokens[0xC3] = "no-C3".into();
    let tok = Tokenizer::new(tokens, types, vec![], None, None, false).unwrap();
    assert_eq!(tok.encode("é"), [0xA9]);
}

#[test]
fn bos_eos_and_empty_text() {
    let (tokens, types, merges) = vocab(
        &[],
        &[("<s>", TOKEN_TYPE_CONTROL), ("</s>", TOKEN_TYPE_CONTROL)],
    );
    let tok = Tokenizer::new(
        tokens.clone(),
        types.clone(),
        merges.clone(),
        Some(256),
        Some(257),
        true,
    )
    .unwrap();
    assert!(tok.add_bos());
    assert_eq!(tok.encode(""), [256]);
    assert_eq!(tok.encode("a"), [256, b'a' as u32]);
    assert_eq!(tok.encode_with("a", false), [b'a' as u32]);
    let tok = tok.with_add_eos(true).unwrap();
    assert_eq!(tok.encode("a"), [256, b'a' as u32, 257]);
    assert_eq!(tok.decode(&tok.encode("a")), "<s>a</s>");

    let tok = Tokenizer::new(tokens, types, merges, None, None, false).unwrap();
    assert!(tok.encode("").is_empty());
    assert_eq!(tok.bos(), None);
    assert!(matches!(
        tok.with_add_eos(true),
        Err(TokenizerError::MissingSpecial { which: "eos" })
    ));
}

#[test]
fn decode_of_unusual_ids() {
    let tok = synthetic(
        &[],
        &[
            ("<unused>", TOKEN_TYPE_UNUSED),
            ("raw\ntext", TOKEN_TYPE_NORMAL),
        ],
    );
    let unused = tok.token_id("<unused>").unwrap();
    let raw = tok.token_id("raw\ntext").unwrap();
    assert_eq!(tok.decode(&[b'a' as u32, unused, b'b' as u32]), "ab");
    assert_eq!(tok.decode(&[b'a' as u32, 1_000_000]), "a");
    // characters outside the byte mapping decode as themselves
    assert_eq!(tok.decode(&[raw]), "raw\ntext");
    // half a character
    assert_eq!(tok.decode(&[0xC3]), "\u{FFFD}");
    assert_eq!(tok.decode_bytes(&[0xC3]), [0xC3]);
}

#[test]
fn bad_vocabularies_are_errors() {
    let (tokens, types, merges) = vocab(&["a b"], &[]);
    let new = |tokens: Vec<String>, types: Vec<i32>, merges: Vec<String>| {
        Tokenizer::new(tokens, types, merges, None, None, false).unwrap_err()
    };
    assert_eq!(new(vec![], vec![], vec![]), TokenizerError::EmptyVocab);
    assert!(matches!(
        new(tokens.clone(), types[1..].to_vec(), merges.clone()),
        TokenizerError::TokenTypeCount {
            tokens: 257,
            types: 256
        }
    ));
    let mut dup = tokens.clone();
    dup[5] = "a".into();
    assert!(matches!(
        new(dup, types.clone(), merges.clone()),
        TokenizerError::DuplicateToken {
            id: 97,
            first: 5,
            ..
        }
    ));
    for bad in ["ab", "", " ab"] {
        assert!(matches!(
            new(
                tokens.clone(),
                types.clone(),
                vec!["a b".into(), bad.into()]
            ),
            TokenizerError::MalformedMerge { index: 1, .. }
        ));
    }
    let err = Tokenizer::new(
        tokens.clone(),
        types.clone(),
        merges.clone(),
        Some(257),
        None,
        false,
    )
    .unwrap_err();
    assert_eq!(
        err,
        TokenizerError::SpecialIdOutOfRange {
            which: "BOS",
            id: 257,
            n_vocab: 257
        }
    );
    assert_eq!(
        err.to_string(),
        "BOS token id 257 is out of range for a vocabulary of 257 tokens"
    );
    let err = Tokenizer::new(tokens, types, merges, None, None, true).unwrap_err();
    assert_eq!(err, TokenizerError::MissingSpecial { which: "bos" });
}

#[test]
fn odd_but_accepted_vocabularies() {
    // empty texts are renamed like llama.cpp does; merges with characters outside the
    // byte mapping never match; duplicate merges keep their first rank
    let (mut tokens, types, _) = vocab(&["a b", "b c"], &[]);
    tokens[0] = String::new();
    let merges = vec!["x y z".into(), "b c".into(), "a b".into(), "b c".into()];
    let tok = Tokenizer::new(tokens, types, merges, None, None, false).unwrap();
    assert_eq!(tok.token_text(0), Some("[EMPTY_0]"));
    assert_eq!(texts(&tok, "abc"), ["a", "bc"]);
    assert_eq!(tok.encode("\0"), Vec::<u32>::new());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn decode_inverts_encode(parts in prop::collection::vec(
        prop_oneof![
            any::<String>(),
            "[a-c 0-9'\\n\\t]{0,12}",
            Just("<|endoftext|>".to_string()),
            Just("<user>".to_string()),
            Just("  ".to_string()),
        ],
        0..6,
    )) {
        let tok = round_trip_tokenizer();
        let text: String = parts.concat();
        let ids = tok.encode(&text);
        prop_assert_eq!(tok.decode(&ids), text);
    }
}

fn round_trip_tokenizer() -> &'static Tokenizer {
    static TOK: std::sync::OnceLock<Tokenizer> = std::sync::OnceLock::new();
    TOK.get_or_init(|| {
        synthetic(
            &[
                "a b", "ab c", "Ġ a", "Ġ Ġ", "Ċ Ċ", "' s", "1 2", "Ã ©", "ð Ł",
            ],
            &[
                ("<|endoftext|>", TOKEN_TYPE_CONTROL),
                ("<user>", TOKEN_TYPE_USER_DEFINED),
            ],
        )
    })
}

// ---------------------------------------------------------------------------------------
// GGUF metadata

/// The metadata values these tests write (the model crate's GGUF writer's).
use harness::gguf_writer::MetaValue as Meta;

/// A GGUF file with the metadata `kvs` and no tensors.
fn gguf_file(kvs: &[(&str, Meta)]) -> Vec<u8> {
    let mut w = harness::gguf_writer::GgufWriter::new();
    for (key, value) in kvs {
        w.meta(key, value.clone());
    }
    w.to_bytes().expect("a valid GGUF")
}

fn tokenizer_metadata(pre: &str) -> Vec<(&'static str, Meta)> {
    let (tokens, types, merges) = vocab(&["a b"], &[("<s>", TOKEN_TYPE_CONTROL)]);
    vec![
        ("tokenizer.ggml.model", Meta::Str("gpt2".into())),
        ("tokenizer.ggml.pre", Meta::Str(pre.into())),
        ("tokenizer.ggml.tokens", Meta::StrArray(tokens)),
        ("tokenizer.ggml.token_type", Meta::I32Array(types)),
        ("tokenizer.ggml.merges", Meta::StrArray(merges)),
        ("tokenizer.ggml.bos_token_id", Meta::U32(257)),
        ("tokenizer.ggml.eos_token_id", Meta::U32(257)),
    ]
}

fn from_metadata(kvs: &[(&str, Meta)]) -> Result<Tokenizer, TokenizerError> {
    let bytes = gguf_file(kvs);
    let gguf = Gguf::parse(&bytes).expect("valid GGUF");
    Tokenizer::from_gguf(&gguf)
}

#[test]
fn from_gguf_reads_the_tokenizer_keys() {
    let mut kvs = tokenizer_metadata("smollm");
    let tok = from_metadata(&kvs).unwrap();
    assert_eq!(tok.vocab_size(), 258);
    assert_eq!(
        (tok.bos(), tok.eos(), tok.add_bos(), tok.add_eos()),
        (Some(257), Some(257), false, false)
    );
    assert_eq!(tok.encode("ab<s>"), [256, 257]);

    kvs.push(("tokenizer.ggml.add_bos_token", Meta::Bool(true)));
    kvs.push(("tokenizer.ggml.add_eos_token", Meta::Bool(true)));
    let tok = from_metadata(&kvs).unwrap();
    assert_eq!(tok.encode("ab"), [257, 256, 257]);

    // without token types every token is normal: "<s>" is then plain text
    let kvs: Vec<_> = tokenizer_metadata("smollm")
        .into_iter()
        .filter(|(k, _)| *k != "tokenizer.ggml.token_type")
        .collect();
    let tok = from_metadata(&kvs).unwrap();
    assert_eq!(tok.encode("<s>").len(), 3);
}

#[test]
fn from_gguf_errors_name_the_problem() {
    let err = from_metadata(&tokenizer_metadata("llama3")).unwrap_err();
    assert_eq!(
        err,
        TokenizerError::UnsupportedPreTokenizer("llama3".into())
    );
    assert_eq!(
        err.to_string(),
        "pre-tokenizer \"llama3\" is not supported: only \"smollm\" is"
    );

    let mut kvs = tokenizer_metadata("smollm");
    kvs[0].1 = Meta::Str("bert".into());
    assert_eq!(
        from_metadata(&kvs).unwrap_err(),
        TokenizerError::UnsupportedModel("bert".into())
    );

    for missing in [
        "tokenizer.ggml.model",
        "tokenizer.ggml.pre",
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
    ] {
        let kvs: Vec<_> = tokenizer_metadata("smollm")
            .into_iter()
            .filter(|(k, _)| *k != missing)
            .collect();
        assert_eq!(
            from_metadata(&kvs).unwrap_err(),
            TokenizerError::MissingKey { key: missing }
        );
    }

    let mut kvs = tokenizer_metadata("smollm");
    kvs[2].1 = Meta::I32Array(vec![1, 2]);
    assert!(matches!(
        from_metadata(&kvs).unwrap_err(),
        TokenizerError::WrongType {
            key: "tokenizer.ggml.tokens",
            ..
        }
    ));
    let mut kvs = tokenizer_metadata("smollm");
    kvs[3].1 = Meta::StrArray(vec!["1".into()]);
    assert!(matches!(
        from_metadata(&kvs).unwrap_err(),
        TokenizerError::WrongType {
            key: "tokenizer.ggml.token_type",
            ..
        }
    ));
    let mut kvs = tokenizer_metadata("smollm");
    kvs[5].1 = Meta::Str("1".into());
    assert!(matches!(
        from_metadata(&kvs).unwrap_err(),
        TokenizerError::WrongType {
            key: "tokenizer.ggml.bos_token_id",
            ..
        }
    ));
    let mut kvs = tokenizer_metadata("smollm");
    kvs.push(("tokenizer.ggml.add_bos_token", Meta::U32(1)));
    assert!(matches!(
        from_metadata(&kvs).unwrap_err(),
        TokenizerError::WrongType {
            key: "tokenizer.ggml.add_bos_token",
            ..
        }
    ));
    let mut kvs = tokenizer_metadata("smollm");
    kvs[5].1 = Meta::U32(9999);
    assert!(matches!(
        from_metadata(&kvs).unwrap_err(),
        TokenizerError::SpecialIdOutOfRange {
            which: "BOS",
            id: 9999,
            ..
        }
    ));
}
