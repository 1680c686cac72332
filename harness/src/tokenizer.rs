//! GPT-2 byte-level BPE with the "smollm" pre-tokenizer, giving exactly llama.cpp's
//! token ids (as `llama-tokenize` prints them with its default options).
//!
//! [`Tokenizer::encode`] works like llama.cpp's `llama_tokenize(text, add_special =
//! true, parse_special = true)`:
//!
//! 1. **Special tokens.** Tokens of type control (3), user-defined (4) or unknown (2)
//!    that occur literally in the text become their own id; the text between them is
//!    tokenized as usual. Like llama.cpp, the special tokens are searched one after
//!    another, longest text first (ties by id), each splitting every plain stretch left
//!    by the ones before at its leftmost non-overlapping occurrences.
//! 2. **Pre-tokenization** of each plain stretch (`pretokenize.rs`): every digit alone,
//!    then GPT-2's expression `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
//!    ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+` on what is between.
//! 3. **BPE** of each piece's bytes with the merges in rank order (see `bpe.rs`).
//! 4. A BOS token first if `add_bos`, an EOS token last if `add_eos` (never for
//!    SmolLM2).
//!
//! Bytes that BPE leaves as a symbol missing from the vocabulary are handled like
//! llama.cpp: the symbol's printable ASCII bytes become their one-character tokens (if
//! present), any other byte is silently dropped. A byte-complete vocabulary (all 256
//! byte characters as tokens, as in SmolLM2's) never gets there.
//!
//! [`Tokenizer::decode`] maps ids back to bytes: normal tokens through the inverse byte
//! mapping, control, user-defined and unknown tokens as their literal text (so that
//! decoding what `encode` found in the text gives the text back); unused and undefined
//! tokens give nothing.

mod bpe;
mod pretokenize;
mod unicode_tables;

use std::collections::HashMap;
use std::fmt;

use bpe::Bpe;
use ggml_core::gguf::Gguf;

pub use bpe::{byte_to_char as gpt2_byte_to_char, char_to_byte as gpt2_char_to_byte};
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
    /// A BOS or EOS id beyond the vocabulary.
    #[error("{which} token id {id} is out of range for a vocabulary of {n_vocab} tokens")]
    SpecialIdOutOfRange {
        /// `"BOS"` or `"EOS"`.
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
    /// `tokenizer.ggml.model` is not byte-level BPE.
    #[error("tokenizer model {0:?} is not supported: only \"gpt2\" (byte-level BPE) is")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer other than smollm.
    #[error("pre-tokenizer {0:?} is not supported: only \"smollm\" is")]
    UnsupportedPreTokenizer(String),
}

/// A GPT-2 byte-level BPE tokenizer with the smollm pre-tokenizer.
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
    bpe: Bpe,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    add_eos: bool,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.texts.len())
            .field("special_tokens", &self.specials.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
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

/// One stretch of the input: plain text (a byte range) or a special token.
#[derive(Clone, Copy, Debug)]
enum Fragment {
    Text(usize, usize),
    Token(u32),
}

impl Tokenizer {
    /// Builds a tokenizer from `tokenizer.ggml.*` data: token texts (GPT-2 byte
    /// characters), their types (1 normal, 2 unknown, 3 control, 4 user-defined,
    /// 5 unused, 6 byte), merges `"left right"` in rank order, the BOS and EOS ids, and
    /// whether `encode` starts with BOS.
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
        for (which, id) in [("BOS", bos), ("EOS", eos)] {
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
        if add_bos && bos.is_none() {
            return Err(TokenizerError::MissingSpecial { which: "bos" });
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
        let mut raw_to_id: HashMap<Vec<u8>, u32> = HashMap::with_capacity(n);
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
            // What BPE can look up: texts made only of byte characters, any type.
            if let Some(raw) = bpe::unmap(text) {
                raw_to_id.insert(raw, id);
            }
        }

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

        let mut pieces = Vec::new();
        let mut piece_starts = Vec::with_capacity(n + 1);
        piece_starts.push(0);
        for (text, &ty) in texts.iter().zip(&token_types) {
            match ty {
                TOKEN_TYPE_NORMAL | TOKEN_TYPE_BYTE => {
                    for c in text.chars() {
                        match bpe::char_to_byte(c) {
                            Some(b) => pieces.push(b),
                            // not a byte character: kept as it is
                            None => pieces.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                }
                t if is_special_type(t) => pieces.extend_from_slice(text.as_bytes()),
                _ => {}
            }
            piece_starts.push(pieces.len());
        }

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&id| is_special_type(token_types[id as usize]))
            .collect();
        specials.sort_by_key(|&id| (std::cmp::Reverse(texts[id as usize].len()), id));

        Ok(Tokenizer {
            texts,
            types: token_types,
            pieces,
            piece_starts,
            text_to_id,
            specials,
            bpe,
            bos,
            eos,
            add_bos,
            add_eos: false,
        })
    }

    /// Builds the tokenizer of a GGUF model: `tokenizer.ggml.tokens`, `token_type` (all
    /// normal if absent), `merges`, `bos_token_id` and `eos_token_id` (none if absent),
    /// `add_bos_token` and `add_eos_token` (false if absent, llama.cpp's default for
    /// BPE vocabularies). `tokenizer.ggml.model` must be `"gpt2"` and
    /// `tokenizer.ggml.pre` `"smollm"`: other pre-tokenizers split text differently.
    pub fn from_gguf(gguf: &Gguf<'_>) -> Result<Tokenizer, TokenizerError> {
        const MODEL: &str = "tokenizer.ggml.model";
        const PRE: &str = "tokenizer.ggml.pre";
        const TOKENS: &str = "tokenizer.ggml.tokens";
        const TYPES: &str = "tokenizer.ggml.token_type";
        const MERGES: &str = "tokenizer.ggml.merges";
        const BOS: &str = "tokenizer.ggml.bos_token_id";
        const EOS: &str = "tokenizer.ggml.eos_token_id";
        const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
        const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";

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
        let flag = |key: &'static str| -> Result<bool, TokenizerError> {
            gguf.get(key).map_or(Ok(false), |v| {
                v.as_bool().ok_or(TokenizerError::WrongType {
                    key,
                    expected: "a bool",
                })
            })
        };

        let model = string(MODEL)?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(model.to_owned()));
        }
        let pre = string(PRE)?;
        if pre != "smollm" {
            return Err(TokenizerError::UnsupportedPreTokenizer(pre.to_owned()));
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
        let merges = strings(MERGES)?;
        let tokenizer = Tokenizer::new(tokens, types, merges, id(BOS)?, id(EOS)?, flag(ADD_BOS)?)?;
        tokenizer.with_add_eos(flag(ADD_EOS)?)
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

    /// The text of token `id` as in the vocabulary (GPT-2 byte characters).
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
                    self.bpe.encode(piece.as_bytes(), &mut cached);
                    (at, cached.len() - at)
                });
                out.extend_from_slice(&cached[at..at + len]);
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Splits `text` at the special tokens in it (llama.cpp's `tokenizer_st_partition`).
    fn partition(&self, text: &str) -> Vec<Fragment> {
        let mut fragments = Vec::new();
        if text.is_empty() {
            return fragments;
        }
        fragments.push(Fragment::Text(0, text.len()));
        let mut next = Vec::new();
        for &id in &self.specials {
            let special = self.texts[id as usize].as_str();
            if !text.contains(special) {
                continue;
            }
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

    /// Decodes `ids` to text: normal tokens through GPT-2's byte mapping, control,
    /// user-defined and unknown tokens as their text, unused ones as nothing, ids
    /// outside the vocabulary skipped. Bytes that are not valid UTF-8 (a character cut
    /// between tokens that are not all there) become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        match String::from_utf8(self.decode_bytes(ids)) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }
}
