//! llama.cpp's tokenizers for the two vocabulary types this crate runs, giving exactly
//! its token ids (as `llama-tokenize` prints them with its default options):
//!
//! * **GPT-2 byte-level BPE** with the "smollm" pre-tokenizer (`tokenizer.ggml.model =
//!   "gpt2"`, SmolLM2), and
//! * **SentencePiece** (`tokenizer.ggml.model = "llama"`, llama.cpp's
//!   `LLAMA_VOCAB_TYPE_SPM`, Gemma 3): score-driven merging of UTF-8 characters with
//!   byte fallback (see `spm.rs`).
//!
//! [`Tokenizer::encode`] works like llama.cpp's `llama_tokenize(text, add_special =
//! true, parse_special = true)`:
//!
//! 1. **Special tokens** (both types). Tokens of type control (3), user-defined (4) or
//!    unknown (2) that occur literally in the text become their own id; the text between
//!    them is tokenized as usual. Like llama.cpp, the special tokens are searched one
//!    after another, longest text first (ties by id), each splitting every plain stretch
//!    left by the ones before at its leftmost non-overlapping occurrences (which of
//!    them occur at all is found first, in one pass over a trie). (Gemma's 165
//!    user-defined tokens include runs of 1 to 31 newlines or tabs and of 2 to 31
//!    spaces: such runs never reach the SentencePiece merging.)
//! 2. BPE: **pre-tokenization** of each plain stretch (`pretokenize.rs`): every digit
//!    alone, then GPT-2's expression `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
//!    ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+` on what is between; then **BPE** of each
//!    piece's bytes with the merges in rank order (see `bpe.rs`).
//!
//!    SentencePiece: each plain stretch gets a leading space if the vocabulary says
//!    `add_space_prefix` and it is the first stretch or follows a special token; its
//!    spaces become `'▁'` (U+2581, [`SPACE_MARK`]); then the whole stretch is merged as
//!    `spm.rs` describes (no pre-tokenization).
//! 3. A BOS token first if `add_bos`, an EOS token last if `add_eos` (neither for
//!    SmolLM2; BOS only for Gemma 3).
//!
//! BPE bytes that are left as a symbol missing from the vocabulary are handled like
//! llama.cpp: the symbol's printable ASCII bytes become their one-character tokens (if
//! present), any other byte is silently dropped. A byte-complete vocabulary (all 256
//! byte characters as tokens, as in SmolLM2's) never gets there. SentencePiece falls
//! back to the byte tokens `<0xXX>`; see `spm.rs` for a vocabulary without them.
//!
//! [`Tokenizer::decode`] maps ids back to bytes, token by token (llama.cpp's
//! `token_to_piece` with `special = true`): normal tokens through the inverse byte
//! mapping (BPE) or with `'▁'` as a space (SentencePiece), byte tokens (type 6) as
//! their byte, control, user-defined and unknown tokens as their literal text (so that
//! decoding what `encode` found in the text gives the text back); unused and undefined
//! tokens give nothing. Unlike llama.cpp's `llama_detokenize`, decoding does not remove
//! the space that `add_space_prefix` put in front. What decodes back to the text: all
//! text for SmolLM2's and Gemma's vocabularies, except that a literal `'▁'` in the text
//! decodes as a space with SentencePiece.

mod bpe;
mod pretokenize;
mod spm;
mod unicode_tables;

use std::collections::HashMap;
use std::fmt;

use bpe::Bpe;
use ggml_core::gguf::Gguf;
use spm::Spm;

pub use bpe::{byte_to_char as gpt2_byte_to_char, char_to_byte as gpt2_char_to_byte};
pub use spm::SPACE_MARK;
pub use unicode_tables::UNICODE_VERSION;

/// Token type of a normal token (`tokenizer.ggml.token_type`).
pub const TOKEN_TYPE_NORMAL: i32 = 1;
/// Token type of the unknown token.
pub const TOKEN_TYPE_UNKNOWN: i32 = 2;
/// Token type of a control token (`<|im_start|>`, ...).
pub const TOKEN_TYPE_CONTROL: i32 = 3;
/// Token type of a user-defined token.
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;
/// Token type of an unused token.
pub const TOKEN_TYPE_UNUSED: i32 = 5;
/// Token type of a byte token.
pub const TOKEN_TYPE_BYTE: i32 = 6;

/// Why a tokenizer could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenizerError {
    /// No tokens at all.
    #[error("the vocabulary has no tokens")]
    EmptyVocab,
    /// More tokens than ids fit `u32`.
    #[error("the vocabulary has {0} tokens, more than token ids can number")]
    VocabTooLarge(usize),
    /// `token_types` does not have one entry per token.
    #[error("{types} token types for {tokens} tokens")]
    TokenTypeCount {
        /// Number of tokens.
        tokens: usize,
        /// Number of token types.
        types: usize,
    },
    /// Two tokens with the same text.
    #[error("token {id} has the same text as token {first}: {text:?}")]
    DuplicateToken {
        /// The later token.
        id: u32,
        /// The earlier token.
        first: u32,
        /// Their text.
        text: String,
    },
    /// A merge that is not two parts separated by a space.
    #[error("merge {index} is not two parts separated by a space: {merge:?}")]
    MalformedMerge {
        /// Position in the merge list (its rank).
        index: usize,
        /// The merge.
        merge: String,
    },
    /// `scores` does not have one entry per token (SentencePiece).
    #[error("{scores} token scores for {tokens} tokens")]
    ScoreCount {
        /// Number of tokens.
        tokens: usize,
        /// Number of scores.
        scores: usize,
    },
    /// A BOS, EOS or unknown-token id beyond the vocabulary.
    #[error("{which} token id {id} is out of range for a vocabulary of {n_vocab} tokens")]
    SpecialIdOutOfRange {
        /// `"BOS"`, `"EOS"` or `"UNK"`.
        which: &'static str,
        /// The id.
        id: u32,
        /// Vocabulary size.
        n_vocab: usize,
    },
    /// Adding BOS (or EOS) was asked for without a BOS (or EOS) token.
    #[error("add_{which} is set but the vocabulary has no {which} token")]
    MissingSpecial {
        /// `"bos"` or `"eos"`.
        which: &'static str,
    },
    /// A required GGUF metadata key is absent.
    #[error("GGUF metadata key {key} is missing")]
    MissingKey {
        /// The key.
        key: &'static str,
    },
    /// A GGUF metadata value of the wrong type.
    #[error("GGUF metadata key {key} should be {expected}")]
    WrongType {
        /// The key.
        key: &'static str,
        /// What it should be.
        expected: &'static str,
    },
    /// `tokenizer.ggml.model` is neither byte-level BPE nor SentencePiece.
    #[error(
        "tokenizer model {0:?} is not supported: only \"gpt2\" (byte-level BPE) and \"llama\" \
         (SentencePiece) are"
    )]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer other than smollm (BPE only).
    #[error("pre-tokenizer {0:?} is not supported: only \"smollm\" is")]
    UnsupportedPreTokenizer(String),
}

/// Which of llama.cpp's tokenizers a [`Tokenizer`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenizerKind {
    /// GPT-2 byte-level BPE with the smollm pre-tokenizer (`tokenizer.ggml.model =
    /// "gpt2"`, llama.cpp's `LLAMA_VOCAB_TYPE_BPE`).
    Bpe,
    /// SentencePiece (`tokenizer.ggml.model = "llama"`, llama.cpp's
    /// `LLAMA_VOCAB_TYPE_SPM`).
    SentencePiece,
}

/// Settings of a SentencePiece vocabulary besides its tokens, types and scores (see
/// [`Tokenizer::new_spm`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpmOptions {
    /// The BOS token.
    pub bos: Option<u32>,
    /// The EOS token.
    pub eos: Option<u32>,
    /// The unknown token: what a byte without a `<0xXX>` token becomes (llama.cpp
    /// aborts there); such bytes are dropped without one.
    pub unk: Option<u32>,
    /// Whether `encode` starts with BOS.
    pub add_bos: bool,
    /// Whether `encode` ends with EOS.
    pub add_eos: bool,
    /// Whether a plain stretch at the start of the text or right after a special token
    /// gets a leading space before tokenization (`tokenizer.ggml.add_space_prefix`).
    pub add_space_prefix: bool,
}

impl Default for SpmOptions {
    /// llama.cpp's defaults for a SentencePiece vocabulary whose GGUF file does not say
    /// otherwise: BOS 1, EOS 2, unknown 0, BOS added, no EOS, a space prefix.
    fn default() -> Self {
        SpmOptions {
            bos: Some(1),
            eos: Some(2),
            unk: Some(0),
            add_bos: true,
            add_eos: false,
            add_space_prefix: true,
        }
    }
}

/// The model-specific part of a tokenizer.
#[derive(Clone)]
enum Model {
    Bpe(Bpe),
    Spm(Spm),
}

/// One of llama.cpp's tokenizers: GPT-2 byte-level BPE with the smollm pre-tokenizer,
/// or SentencePiece (see the module docs).
#[derive(Clone)]
pub struct Tokenizer {
    /// Token texts, as in the vocabulary (empty ones renamed like llama.cpp does).
    texts: Vec<String>,
    types: Vec<i32>,
    /// Decoded bytes of every token, concatenated; token `t` is
    /// `pieces[piece_starts[t]..piece_starts[t + 1]]`.
    pieces: Vec<u8>,
    piece_starts: Vec<usize>,
    text_to_id: HashMap<String, u32>,
    /// Control, user-defined and unknown tokens: longest text first, then by id.
    specials: Vec<u32>,
    /// Their texts as a trie, to find in one pass which of them occur in a text.
    special_trie: SpecialTrie,
    model: Model,
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    add_bos: bool,
    add_eos: bool,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind())
            .field("vocab_size", &self.texts.len())
            .field("special_tokens", &self.specials.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("unk", &self.unk)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .finish_non_exhaustive()
    }
}

fn is_special_type(t: i32) -> bool {
    matches!(
        t,
        TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED | TOKEN_TYPE_UNKNOWN
    )
}

/// Byte strings (the special tokens' texts) as a trie.
#[derive(Clone, Default)]
struct SpecialTrie {
    /// Children of every node, sorted by byte; node 0 is the root.
    children: Vec<Vec<(u8, u32)>>,
    /// The string (by its index in the list `new` got) that ends at every node, if any.
    ends: Vec<Option<u32>>,
    /// Number of strings.
    len: usize,
}

impl SpecialTrie {
    fn new<'a>(strings: impl IntoIterator<Item = &'a str>) -> SpecialTrie {
        let mut trie = SpecialTrie {
            children: vec![Vec::new()],
            ends: vec![None],
            len: 0,
        };
        for (index, s) in strings.into_iter().enumerate() {
            trie.len = index + 1;
            let mut node = 0usize;
            for &b in s.as_bytes() {
                let kids = &trie.children[node];
                node = match kids.binary_search_by_key(&b, |&(k, _)| k) {
                    Ok(i) => kids[i].1 as usize,
                    Err(i) => {
                        let new = trie.ends.len();
                        trie.children[node].insert(i, (b, new as u32));
                        trie.children.push(Vec::new());
                        trie.ends.push(None);
                        new
                    }
                };
            }
            trie.ends[node].get_or_insert(index as u32);
        }
        trie
    }

    /// Which of the strings occur in `text` (by index), found by walking the trie from
    /// every byte of it.
    fn occurring(&self, text: &[u8]) -> Vec<bool> {
        let mut present = vec![false; self.len];
        if self.len == 0 {
            return present;
        }
        for start in 0..text.len() {
            let mut node = 0usize;
            for &b in &text[start..] {
                let kids = &self.children[node];
                match kids.binary_search_by_key(&b, |&(k, _)| k) {
                    Ok(i) => node = kids[i].1 as usize,
                    Err(_) => break,
                }
                if let Some(index) = self.ends[node] {
                    present[index as usize] = true;
                }
            }
        }
        present
    }
}

/// One stretch of the input: plain text (a byte range) or a special token.
#[derive(Clone, Copy, Debug)]
enum Fragment {
    Text(usize, usize),
    Token(u32),
}

/// What every vocabulary has, checked and indexed.
struct Vocab {
    texts: Vec<String>,
    types: Vec<i32>,
    text_to_id: HashMap<String, u32>,
}

/// Checks the parts shared by both tokenizer kinds (see [`Tokenizer::new`]'s errors),
/// renames empty token texts like llama.cpp and indexes the texts.
fn vocab(
    tokens: Vec<String>,
    token_types: Vec<i32>,
    special_ids: &[(&'static str, Option<u32>)],
) -> Result<Vocab, TokenizerError> {
    let n = tokens.len();
    if n == 0 {
        return Err(TokenizerError::EmptyVocab);
    }
    if u32::try_from(n).is_err() || n == u32::MAX as usize {
        return Err(TokenizerError::VocabTooLarge(n));
    }
    if token_types.len() != n {
        return Err(TokenizerError::TokenTypeCount {
            tokens: n,
            types: token_types.len(),
        });
    }
    for &(which, id) in special_ids {
        if let Some(id) = id {
            if id as usize >= n {
                return Err(TokenizerError::SpecialIdOutOfRange {
                    which,
                    id,
                    n_vocab: n,
                });
            }
        }
    }

    let texts: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            if t.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                t
            }
        })
        .collect();

    let mut text_to_id = HashMap::with_capacity(n);
    for (id, text) in texts.iter().enumerate() {
        let id = id as u32;
        if let Some(&first) = text_to_id.get(text.as_str()) {
            return Err(TokenizerError::DuplicateToken {
                id,
                first,
                text: text.clone(),
            });
        }
        text_to_id.insert(text.clone(), id);
    }
    Ok(Vocab {
        texts,
        types: token_types,
        text_to_id,
    })
}

/// The decoded bytes of every token, concatenated, and where each starts (one more
/// entry than tokens): `normal` writes those of a normal or byte token (given its text
/// and type), control, user-defined and unknown tokens give their literal text, the
/// other types nothing.
fn pieces(vocab: &Vocab, mut normal: impl FnMut(&str, i32, &mut Vec<u8>)) -> (Vec<u8>, Vec<usize>) {
    let mut pieces = Vec::new();
    let mut piece_starts = Vec::with_capacity(vocab.texts.len() + 1);
    piece_starts.push(0);
    for (text, &ty) in vocab.texts.iter().zip(&vocab.types) {
        match ty {
            TOKEN_TYPE_NORMAL | TOKEN_TYPE_BYTE => normal(text, ty, &mut pieces),
            t if is_special_type(t) => pieces.extend_from_slice(text.as_bytes()),
            _ => {}
        }
        piece_starts.push(pieces.len());
    }
    (pieces, piece_starts)
}

impl Tokenizer {
    /// Builds a GPT-2 byte-level BPE tokenizer from `tokenizer.ggml.*` data: token
    /// texts (GPT-2 byte characters), their types (1 normal, 2 unknown, 3 control,
    /// 4 user-defined, 5 unused, 6 byte), merges `"left right"` in rank order, the BOS
    /// and EOS ids, and whether `encode` starts with BOS.
    ///
    /// Like llama.cpp, an empty token text is renamed `[EMPTY_<id>]`, the first of
    /// duplicate merges counts, and merges or tokens with characters outside the GPT-2
    /// byte mapping are kept but can never match. Errors: an empty vocabulary, a type
    /// count other than the token count, duplicate token texts, a merge without a space
    /// separator (after its first byte), BOS/EOS out of range, `add_bos` without BOS.
    pub fn new(
        tokens: Vec<String>,
        token_types: Vec<i32>,
        merges: Vec<String>,
        bos: Option<u32>,
        eos: Option<u32>,
        add_bos: bool,
    ) -> Result<Tokenizer, TokenizerError> {
        let vocab = vocab(tokens, token_types, &[("BOS", bos), ("EOS", eos)])?;
        if add_bos && bos.is_none() {
            return Err(TokenizerError::MissingSpecial { which: "bos" });
        }

        // What BPE can look up: texts made only of byte characters, any type.
        let raw_to_id: HashMap<Vec<u8>, u32> = vocab
            .texts
            .iter()
            .enumerate()
            .filter_map(|(id, text)| Some((bpe::unmap(text)?, id as u32)))
            .collect();

        let mut pairs = Vec::with_capacity(merges.len());
        for (index, merge) in merges.iter().enumerate() {
            // llama.cpp splits at the first space after the first byte.
            let split = merge.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1);
            let Some(at) = split else {
                return Err(TokenizerError::MalformedMerge {
                    index,
                    merge: merge.clone(),
                });
            };
            let (left, right) = (&merge[..at], &merge[at + 1..]);
            // a pair that cannot match still holds its rank
            match (bpe::unmap(left), bpe::unmap(right)) {
                (Some(l), Some(r)) => pairs.push(Some((l, r))),
                _ => pairs.push(None),
            }
        }
        let bpe = Bpe::new(&raw_to_id, pairs);

        let (pieces, piece_starts) = pieces(&vocab, |text, _, out| {
            for c in text.chars() {
                match bpe::char_to_byte(c) {
                    Some(b) => out.push(b),
                    // not a byte character: kept as it is
                    None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                }
            }
        });
        Ok(Tokenizer::assemble(
            vocab,
            pieces,
            piece_starts,
            Model::Bpe(bpe),
            (bos, eos, None),
            add_bos,
            false,
        ))
    }

    /// Builds a SentencePiece tokenizer (llama.cpp's `LLAMA_VOCAB_TYPE_SPM`) from token
    /// texts (spaces written `'▁'`, byte tokens `<0xXX>`), their types (as for
    /// [`new`](Self::new)), one score per token (a higher score merges first) and
    /// `options` (BOS, EOS, unknown token, whether to add BOS/EOS and a space prefix).
    ///
    /// Any token can be the result of a merge, whatever its type; the types decide only
    /// the special-token partition and decoding. Errors: as for `new` (the unknown
    /// token is checked like BOS and EOS), and a score count other than the token count.
    pub fn new_spm(
        tokens: Vec<String>,
        token_types: Vec<i32>,
        scores: Vec<f32>,
        options: SpmOptions,
    ) -> Result<Tokenizer, TokenizerError> {
        let SpmOptions {
            bos,
            eos,
            unk,
            add_bos,
            add_eos,
            add_space_prefix,
        } = options;
        let vocab = vocab(
            tokens,
            token_types,
            &[("BOS", bos), ("EOS", eos), ("UNK", unk)],
        )?;
        if scores.len() != vocab.texts.len() {
            return Err(TokenizerError::ScoreCount {
                tokens: vocab.texts.len(),
                scores: scores.len(),
            });
        }
        if add_bos && bos.is_none() {
            return Err(TokenizerError::MissingSpecial { which: "bos" });
        }
        if add_eos && eos.is_none() {
            return Err(TokenizerError::MissingSpecial { which: "eos" });
        }
        let spm = Spm::new(&vocab.text_to_id, scores, unk, add_space_prefix);
        // Normal tokens: '▁' is a space. Byte tokens: their byte (a malformed byte
        // token's text is kept as it is).
        let (pieces, piece_starts) = pieces(&vocab, |text, ty, out| {
            if ty == TOKEN_TYPE_BYTE {
                match spm::byte_token_value(text) {
                    Some(b) => out.push(b),
                    None => out.extend_from_slice(text.as_bytes()),
                }
                return;
            }
            let mut rest = text;
            while let Some(at) = rest.find(SPACE_MARK) {
                out.extend_from_slice(&rest.as_bytes()[..at]);
                out.push(b' ');
                rest = &rest[at + SPACE_MARK.len_utf8()..];
            }
            out.extend_from_slice(rest.as_bytes());
        });
        Ok(Tokenizer::assemble(
            vocab,
            pieces,
            piece_starts,
            Model::Spm(spm),
            (bos, eos, unk),
            add_bos,
            add_eos,
        ))
    }

    fn assemble(
        vocab: Vocab,
        pieces: Vec<u8>,
        piece_starts: Vec<usize>,
        model: Model,
        (bos, eos, unk): (Option<u32>, Option<u32>, Option<u32>),
        add_bos: bool,
        add_eos: bool,
    ) -> Tokenizer {
        let Vocab {
            texts,
            types,
            text_to_id,
        } = vocab;
        let mut specials: Vec<u32> = (0..texts.len() as u32)
            .filter(|&id| is_special_type(types[id as usize]))
            .collect();
        specials.sort_by_key(|&id| (std::cmp::Reverse(texts[id as usize].len()), id));
        let special_trie = SpecialTrie::new(specials.iter().map(|&id| texts[id as usize].as_str()));
        Tokenizer {
            texts,
            types,
            pieces,
            piece_starts,
            text_to_id,
            specials,
            special_trie,
            model,
            bos,
            eos,
            unk,
            add_bos,
            add_eos,
        }
    }

    /// Builds the tokenizer of a GGUF model, by `tokenizer.ggml.model`:
    ///
    /// * `"gpt2"`: byte-level BPE from `tokenizer.ggml.tokens`, `token_type` (all normal
    ///   if absent), `merges`, `bos_token_id` and `eos_token_id` (none if absent),
    ///   `add_bos_token` and `add_eos_token` (false if absent, llama.cpp's default for
    ///   BPE vocabularies). `tokenizer.ggml.pre` must be `"smollm"`: other
    ///   pre-tokenizers split text differently.
    /// * `"llama"`: SentencePiece from `tokenizer.ggml.tokens`, `token_type` (all normal
    ///   if absent), `scores` (`f32`, or `i32` as llama.cpp also takes; all 0 if
    ///   absent), and llama.cpp's defaults ([`SpmOptions::default`]) for what is absent
    ///   of `bos_token_id`, `eos_token_id`, `unknown_token_id`, `add_bos_token`,
    ///   `add_eos_token` and `add_space_prefix`. A default id beyond the vocabulary
    ///   means none, as in llama.cpp; a stated one is an error.
    ///   `tokenizer.ggml.pre` is not read (llama.cpp uses its default pre-tokenizer).
    pub fn from_gguf(gguf: &Gguf<'_>) -> Result<Tokenizer, TokenizerError> {
        const MODEL: &str = "tokenizer.ggml.model";
        const PRE: &str = "tokenizer.ggml.pre";
        const TOKENS: &str = "tokenizer.ggml.tokens";
        const TYPES: &str = "tokenizer.ggml.token_type";
        const MERGES: &str = "tokenizer.ggml.merges";
        const SCORES: &str = "tokenizer.ggml.scores";
        const BOS: &str = "tokenizer.ggml.bos_token_id";
        const EOS: &str = "tokenizer.ggml.eos_token_id";
        const UNK: &str = "tokenizer.ggml.unknown_token_id";
        const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
        const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
        const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";

        let string = |key: &'static str| -> Result<&str, TokenizerError> {
            let value = gguf.get(key).ok_or(TokenizerError::MissingKey { key })?;
            value.as_str().ok_or(TokenizerError::WrongType {
                key,
                expected: "a string",
            })
        };
        let strings = |key: &'static str| -> Result<Vec<String>, TokenizerError> {
            let wrong = TokenizerError::WrongType {
                key,
                expected: "an array of strings",
            };
            let value = gguf.get(key).ok_or(TokenizerError::MissingKey { key })?;
            let array = value.as_array().ok_or(wrong.clone())?;
            let out: Vec<String> = array
                .strings()
                .ok_or(wrong.clone())?
                .map(String::from)
                .collect();
            if out.len() != array.len() {
                return Err(wrong);
            }
            Ok(out)
        };
        let id = |key: &'static str| -> Result<Option<u32>, TokenizerError> {
            gguf.get(key)
                .map(|v| {
                    v.to_u32().ok_or(TokenizerError::WrongType {
                        key,
                        expected: "a token id (an integer in u32 range)",
                    })
                })
                .transpose()
        };
        let flag = |key: &'static str| -> Result<Option<bool>, TokenizerError> {
            gguf.get(key)
                .map(|v| {
                    v.as_bool().ok_or(TokenizerError::WrongType {
                        key,
                        expected: "a bool",
                    })
                })
                .transpose()
        };

        let model = string(MODEL)?;
        if model != "gpt2" && model != "llama" {
            return Err(TokenizerError::UnsupportedModel(model.to_owned()));
        }
        if model == "gpt2" {
            let pre = string(PRE)?;
            if pre != "smollm" {
                return Err(TokenizerError::UnsupportedPreTokenizer(pre.to_owned()));
            }
        }
        let tokens = strings(TOKENS)?;
        let types = match gguf.get(TYPES) {
            None => vec![TOKEN_TYPE_NORMAL; tokens.len()],
            Some(value) => {
                let wrong = TokenizerError::WrongType {
                    key: TYPES,
                    expected: "an array of i32",
                };
                let array = value.as_array().ok_or(wrong.clone())?;
                array.numbers::<i32>().ok_or(wrong)?.collect()
            }
        };

        if model == "gpt2" {
            let merges = strings(MERGES)?;
            let tokenizer = Tokenizer::new(
                tokens,
                types,
                merges,
                id(BOS)?,
                id(EOS)?,
                flag(ADD_BOS)?.unwrap_or(false),
            )?;
            return tokenizer.with_add_eos(flag(ADD_EOS)?.unwrap_or(false));
        }

        let scores = match gguf.get(SCORES) {
            None => vec![0.0; tokens.len()],
            Some(value) => {
                let wrong = TokenizerError::WrongType {
                    key: SCORES,
                    expected: "an array of f32 or i32",
                };
                let array = value.as_array().ok_or(wrong.clone())?;
                match (array.numbers::<f32>(), array.numbers::<i32>()) {
                    (Some(f), _) => f.collect(),
                    (None, Some(i)) => i.map(|i| i as f32).collect(),
                    (None, None) => return Err(wrong),
                }
            }
        };
        let defaults = SpmOptions::default();
        let n = tokens.len();
        // a default id beyond the vocabulary is none; a stated one must be in range
        let special = |key, default: Option<u32>| -> Result<Option<u32>, TokenizerError> {
            Ok(id(key)?.or(default.filter(|&d| (d as usize) < n)))
        };
        let options = SpmOptions {
            bos: special(BOS, defaults.bos)?,
            eos: special(EOS, defaults.eos)?,
            unk: special(UNK, defaults.unk)?,
            add_bos: flag(ADD_BOS)?.unwrap_or(defaults.add_bos),
            add_eos: flag(ADD_EOS)?.unwrap_or(defaults.add_eos),
            add_space_prefix: flag(ADD_SPACE_PREFIX)?.unwrap_or(defaults.add_space_prefix),
        };
        Tokenizer::new_spm(tokens, types, scores, options)
    }

    /// Also end `encode`'s output with EOS (`tokenizer.ggml.add_eos_token`); an error
    /// if there is no EOS token.
    pub fn with_add_eos(mut self, add_eos: bool) -> Result<Tokenizer, TokenizerError> {
        if add_eos && self.eos.is_none() {
            return Err(TokenizerError::MissingSpecial { which: "eos" });
        }
        self.add_eos = add_eos;
        Ok(self)
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.texts.len()
    }

    /// The BOS token, if any.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The EOS token, if any.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Whether [`encode`](Self::encode) starts with BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether [`encode`](Self::encode) ends with EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// The unknown token, if any (SentencePiece only; see [`SpmOptions::unk`]).
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }

    /// Whether a SentencePiece tokenizer puts a space before the text (see
    /// [`SpmOptions::add_space_prefix`]); false for BPE.
    pub fn add_space_prefix(&self) -> bool {
        match &self.model {
            Model::Bpe(_) => false,
            Model::Spm(spm) => spm.add_space_prefix,
        }
    }

    /// Which tokenizer this is.
    pub fn kind(&self) -> TokenizerKind {
        match self.model {
            Model::Bpe(_) => TokenizerKind::Bpe,
            Model::Spm(_) => TokenizerKind::SentencePiece,
        }
    }

    /// The text of token `id` as in the vocabulary (GPT-2 byte characters for BPE,
    /// `'▁'` for a space and `<0xXX>` for byte tokens in SentencePiece).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The type of token `id` (see the `TOKEN_TYPE_*` constants).
    pub fn token_type(&self, id: u32) -> Option<i32> {
        self.types.get(id as usize).copied()
    }

    /// The id of the token whose vocabulary text is `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.text_to_id.get(text).copied()
    }

    /// The bytes token `id` decodes to (see [`decode`](Self::decode)).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let (start, end) = (*self.piece_starts.get(i)?, *self.piece_starts.get(i + 1)?);
        Some(&self.pieces[start..end])
    }

    /// Tokenizes `text` like llama.cpp with special tokens parsed and added: BOS first
    /// if [`add_bos`](Self::add_bos), EOS last if [`add_eos`](Self::add_eos).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.encode_with(text, true)
    }

    /// Tokenizes `text`; with `add_special` false neither BOS nor EOS is added (what
    /// `llama-tokenize` does when the model does not ask for BOS).
    pub fn encode_with(&self, text: &str, add_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match &self.model {
            Model::Bpe(bpe) => self.encode_bpe(bpe, text, &mut out),
            Model::Spm(spm) => self.encode_spm(spm, text, &mut out),
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// The BPE tokens of `text` (special tokens included).
    fn encode_bpe(&self, bpe: &Bpe, text: &str, out: &mut Vec<u32>) {
        let mut pieces = Vec::new();
        let mut cache: HashMap<&str, (usize, usize)> = HashMap::new();
        let mut cached: Vec<u32> = Vec::new();
        for fragment in self.partition(text) {
            let (start, end) = match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    continue;
                }
                Fragment::Text(start, end) => (start, end),
            };
            pieces.clear();
            pretokenize::split_smollm(&text[start..end], &mut pieces);
            for &piece in &pieces {
                let (at, len) = *cache.entry(piece).or_insert_with(|| {
                    let at = cached.len();
                    bpe.encode(piece.as_bytes(), &mut cached);
                    (at, cached.len() - at)
                });
                out.extend_from_slice(&cached[at..at + len]);
            }
        }
    }

    /// The SentencePiece tokens of `text` (special tokens included), as the
    /// `LLAMA_VOCAB_TYPE_SPM` case of llama.cpp's `llama_vocab::impl::tokenize`: each
    /// plain stretch is escaped (with a leading space if `add_space_prefix` and it comes
    /// first or after a special token) and tokenized on its own.
    fn encode_spm(&self, spm: &Spm, text: &str, out: &mut Vec<u32>) {
        let mut scratch = spm::Scratch::default();
        let mut is_prev_special = true;
        for fragment in self.partition(text) {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    is_prev_special = true;
                }
                Fragment::Text(start, end) => {
                    scratch.text.clear();
                    if spm.add_space_prefix && is_prev_special {
                        scratch.text.push(SPACE_MARK);
                    }
                    spm::escape_whitespace(&text[start..end], &mut scratch.text);
                    spm.encode(&self.text_to_id, &mut scratch, out);
                    is_prev_special = false;
                }
            }
        }
    }

    /// Splits `text` at the special tokens in it (llama.cpp's `tokenizer_st_partition`).
    fn partition(&self, text: &str) -> Vec<Fragment> {
        let mut fragments = Vec::new();
        if text.is_empty() {
            return fragments;
        }
        fragments.push(Fragment::Text(0, text.len()));
        let mut next = Vec::new();
        let present = self.special_trie.occurring(text.as_bytes());
        for (&id, _) in self.specials.iter().zip(present).filter(|(_, p)| *p) {
            let special = self.texts[id as usize].as_str();
            next.clear();
            for &fragment in &fragments {
                let Fragment::Text(mut start, end) = fragment else {
                    next.push(fragment);
                    continue;
                };
                while let Some(found) = text[start..end].find(special) {
                    let at = start + found;
                    if at > start {
                        next.push(Fragment::Text(start, at));
                    }
                    next.push(Fragment::Token(id));
                    start = at + special.len();
                }
                if start < end {
                    next.push(Fragment::Text(start, end));
                }
            }
            std::mem::swap(&mut fragments, &mut next);
        }
        fragments
    }

    /// The bytes of `ids` concatenated (see [`decode`](Self::decode)); ids outside the
    /// vocabulary are skipped.
    pub fn decode_bytes(&self, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        for &id in ids {
            if let Some(bytes) = self.token_bytes(id) {
                out.extend_from_slice(bytes);
            }
        }
        out
    }

    /// Decodes `ids` to text: normal tokens through GPT-2's byte mapping (BPE) or with
    /// `'▁'` as a space (SentencePiece), byte tokens as their byte, control,
    /// user-defined and unknown tokens as their text, unused ones as nothing, ids
    /// outside the vocabulary skipped. No space prefix is removed (see the module
    /// docs). Bytes that are not valid UTF-8 (a character cut between tokens that are
    /// not all there) become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        match String::from_utf8(self.decode_bytes(ids)) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }
}
