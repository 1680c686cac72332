//! SentencePiece-style tokenization of one plain stretch of text, as llama.cpp's
//! `llm_tokenizer_spm_session` does it (the vocabulary type `LLAMA_VOCAB_TYPE_SPM`,
//! GGUF `tokenizer.ggml.model = "llama"`).
//!
//! The caller has already replaced every space with `'▁'` (U+2581) and, where the
//! vocabulary asks for it, put one `'▁'` in front (see [`escape_whitespace`]). Then:
//!
//! 1. **Symbols.** The text is split into its UTF-8 characters, one symbol each.
//! 2. **Bigrams.** Every pair of adjacent symbols whose concatenated text is a token of
//!    the vocabulary (of any type) is queued with that token's score.
//! 3. **Merging.** The queued pair with the highest score is taken, the leftmost (by the
//!    position of its left symbol in the original text) among equal scores, and its two
//!    symbols become one; the new symbol's pairs with its neighbours are queued. A
//!    queued pair whose symbols changed since (one was merged away, or the size no
//!    longer matches) is stale and skipped. This repeats until the queue is empty.
//! 4. **Output.** Each remaining symbol that is a token gives its id. One that is not
//!    (a single character missing from the vocabulary) falls back to its bytes: the
//!    token `<0xXX>` (upper-case hex) of each byte.
//!
//! Two llama.cpp details that never show for valid UTF-8 input, and are therefore not
//! written out here:
//!
//! * llama.cpp resegments a final symbol that is not a token through its `rev_merge`
//!   table before falling back to bytes. Every merged symbol is a token by construction
//!   (a pair is only queued if its text is one), so only unmerged single characters can
//!   miss the vocabulary, and `rev_merge` is keyed by texts of at least two characters:
//!   the lookup always fails and the bytes are used.
//! * When `<0xXX>` is missing, llama.cpp tries the byte alone as a token text. For a
//!   byte below 0x80 that is the one-character text that was just found missing; a byte
//!   from 0x80 up is no valid UTF-8 text: the lookup cannot succeed either.
//!
//! Where llama.cpp then throws (`std::out_of_range`, aborting the program), a byte with
//! no `<0xXX>` token becomes the unknown token here, or is dropped if the vocabulary
//! has none. Gemma's vocabulary has all 256 byte tokens, so it never gets there.
//!
//! Scores are compared like llama.cpp's comparator (`<` on `f32`), so `-0.0` equals
//! `0.0`; a NaN score compares equal to everything (llama.cpp's order is then
//! unspecified too).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// No token.
const NONE: u32 = u32::MAX;
/// No symbol.
const END: usize = usize::MAX;

/// The character that stands for a space in SentencePiece vocabularies: `'▁'` (U+2581).
pub const SPACE_MARK: char = '\u{2581}';

/// Appends `text` to `out` with every space replaced by [`SPACE_MARK`] (llama.cpp's
/// `llama_escape_whitespace`; only U+0020, not tabs or other white space).
pub(crate) fn escape_whitespace(text: &str, out: &mut String) {
    let mut rest = text;
    while let Some(at) = rest.find(' ') {
        out.push_str(&rest[..at]);
        out.push(SPACE_MARK);
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
}

/// The byte that a byte token's text `<0xXX>` stands for (either case of hex digit).
pub(crate) fn byte_token_value(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// The tables SentencePiece tokenization needs besides the text-to-id map (which the
/// tokenizer owns and passes in): scores, byte tokens and the unknown token.
#[derive(Clone)]
pub(crate) struct Spm {
    /// Score of every token (`tokenizer.ggml.scores`).
    scores: Vec<f32>,
    /// Token `<0xXX>` of every byte, [`NONE`] if the vocabulary lacks it.
    byte_tokens: [u32; 256],
    /// What a byte without a byte token becomes (see the module docs).
    unk: Option<u32>,
    /// Whether a text stretch at the start or right after a special token gets a
    /// leading space (`tokenizer.ggml.add_space_prefix`).
    pub(crate) add_space_prefix: bool,
}

/// A symbol: a byte range of the escaped text, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    /// Length in bytes; 0 once merged into the symbol on its left.
    len: usize,
    /// Neighbours, [`END`] if none.
    prev: usize,
    next: usize,
    /// Token id if the symbol came from a merge (the token that allowed it), else
    /// [`NONE`] (looked up at the end).
    token: u32,
}

/// A queued merge of two adjacent symbols. The greatest is llama.cpp's next merge:
/// highest score first, then the smallest left index.
#[derive(Clone, Copy)]
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// Byte length of the merged text when queued: the pair is stale if it changed.
    size: usize,
    token: u32,
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

/// Buffers reused across the stretches of one `encode` call.
#[derive(Default)]
pub(crate) struct Scratch {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
    /// The escaped text of the current stretch.
    pub(crate) text: String,
}

impl Spm {
    /// Builds the tables: `lookup` is the vocabulary's text-to-id map, `scores` one per
    /// token, `unk` the unknown token.
    pub(crate) fn new(
        lookup: &HashMap<String, u32>,
        scores: Vec<f32>,
        unk: Option<u32>,
        add_space_prefix: bool,
    ) -> Spm {
        let mut byte_tokens = [NONE; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            if let Some(&id) = lookup.get(format!("<0x{b:02X}>").as_str()) {
                *slot = id;
            }
        }
        Spm {
            scores,
            byte_tokens,
            unk,
            add_space_prefix,
        }
    }

    /// Appends the tokens of `scratch.text`, an escaped stretch of plain text (see the
    /// module docs). `lookup` must be the map `new` got.
    pub(crate) fn encode(
        &self,
        lookup: &HashMap<String, u32>,
        scratch: &mut Scratch,
        out: &mut Vec<u32>,
    ) {
        let Scratch {
            symbols,
            queue,
            text,
        } = scratch;
        let text = text.as_str();
        symbols.clear();
        queue.clear();
        if text.is_empty() {
            return;
        }
        let n = text.chars().count();
        symbols.extend(
            text.char_indices()
                .enumerate()
                .map(|(i, (start, c))| Symbol {
                    start,
                    len: c.len_utf8(),
                    prev: if i == 0 { END } else { i - 1 },
                    next: if i + 1 == n { END } else { i + 1 },
                    token: NONE,
                }),
        );

        let try_add =
            |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], left: usize, right: usize| {
                if left == END || right == END {
                    return;
                }
                let (l, r) = (symbols[left], symbols[right]);
                let size = l.len + r.len;
                let merged = &text[l.start..l.start + size];
                if let Some(&token) = lookup.get(merged) {
                    queue.push(Bigram {
                        score: self.scores[token as usize],
                        left,
                        right,
                        size,
                        token,
                    });
                }
            };

        for i in 1..n {
            try_add(queue, symbols, i - 1, i);
        }
        while let Some(bigram) = queue.pop() {
            let (li, ri) = (bigram.left, bigram.right);
            let (l, r) = (symbols[li], symbols[ri]);
            if l.len == 0 || r.len == 0 || l.len + r.len != bigram.size {
                continue;
            }
            symbols[li].len = bigram.size;
            symbols[li].token = bigram.token;
            symbols[li].next = r.next;
            symbols[ri].len = 0;
            if r.next != END {
                symbols[r.next].prev = li;
            }
            try_add(queue, symbols, l.prev, li);
            try_add(queue, symbols, li, r.next);
        }

        // symbol 0 is never merged away (it has no left neighbour): it heads the chain
        let mut i = 0;
        while i != END {
            let sym = symbols[i];
            let piece = &text[sym.start..sym.start + sym.len];
            let token = match sym.token {
                NONE => lookup.get(piece).copied(),
                t => Some(t),
            };
            match token {
                Some(t) => out.push(t),
                None => {
                    for b in piece.bytes() {
                        match self.byte_tokens[b as usize] {
                            NONE => out.extend(self.unk),
                            t => out.push(t),
                        }
                    }
                }
            }
            i = sym.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_replaces_only_spaces() {
        let mut s = String::from("x");
        escape_whitespace(" a  b\tc\n ", &mut s);
        assert_eq!(s, "x▁a▁▁b\tc\n▁");
        let mut s = String::new();
        escape_whitespace("", &mut s);
        assert_eq!(s, "");
    }

    #[test]
    fn byte_token_texts() {
        assert_eq!(byte_token_value("<0x41>"), Some(0x41));
        assert_eq!(byte_token_value("<0xff>"), Some(0xFF));
        assert_eq!(byte_token_value("<0x0A>"), Some(0x0A));
        for bad in ["<0x4>", "<0x411>", "0x41", "<0xZZ>", "<0x+1>", "<0X41>"] {
            assert_eq!(byte_token_value(bad), None, "{bad}");
        }
    }

    #[test]
    fn bigram_order_is_score_then_leftmost() {
        let b = |score, left| Bigram {
            score,
            left,
            right: left + 1,
            size: 2,
            token: 0,
        };
        let mut heap: BinaryHeap<Bigram> = [b(1.0, 5), b(2.0, 9), b(2.0, 3), b(-0.0, 0), b(0.0, 1)]
            .into_iter()
            .collect();
        let order: Vec<(f32, usize)> =
            std::iter::from_fn(|| heap.pop().map(|b| (b.score, b.left))).collect();
        assert_eq!(order, [(2.0, 3), (2.0, 9), (1.0, 5), (-0.0, 0), (0.0, 1)]);
    }
}
