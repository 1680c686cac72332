//! Byte-level BPE: GPT-2's byte-to-character mapping, and merging a piece's bytes.
//!
//! Vocabulary and merges are written in GPT-2's "byte characters": each byte is one
//! printable character (`' '` is `'Ġ'`, `'\n'` is `'Ċ'`). The mapping is one to one, so
//! this module translates vocabulary and merges back to raw bytes once, and merges raw
//! bytes; a token or merge holding a character outside the mapping can never match a
//! piece (llama.cpp only ever looks up mapped text) and is left out.
//!
//! Every string BPE can form is a single byte or the result of a merge, so all of them
//! are interned up front as "symbols" (ids 0..256 are the single bytes), and a merge is a
//! lookup of a symbol pair.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Whether GPT-2 maps byte `b` to the character with the same code point.
const fn maps_to_itself(b: u32) -> bool {
    (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
}

/// The bytes that GPT-2 maps to U+0100, U+0101, ... in that order.
const REMAPPED: [u8; 68] = {
    let mut out = [0u8; 68];
    let mut n = 0;
    let mut b = 0;
    while b < 256 {
        if !maps_to_itself(b) {
            out[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    assert!(n == 68);
    out
};

/// GPT-2's character for byte `b` (`' '` is `'Ġ'`, `'a'` is `'a'`).
pub fn byte_to_char(b: u8) -> char {
    if maps_to_itself(b as u32) {
        return b as char;
    }
    // REMAPPED is sorted, so the position is the count of remapped bytes before `b`.
    let n = REMAPPED.partition_point(|&r| r < b) as u32;
    char::from_u32(0x100 + n).unwrap_or(char::REPLACEMENT_CHARACTER)
}

/// The byte that GPT-2 maps to character `c`, if any.
pub fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 0x100 {
        return maps_to_itself(cp).then_some(cp as u8);
    }
    REMAPPED.get((cp - 0x100) as usize).copied()
}

/// The raw bytes that a GPT-2 mapped string stands for, if every character is mapped.
pub(crate) fn unmap(text: &str) -> Option<Vec<u8>> {
    text.chars().map(char_to_byte).collect()
}

/// No token, no symbol, no neighbour.
const NONE: u32 = u32::MAX;

/// A queued merge of two adjacent symbols. Ordered by rank, then by position: the
/// smallest is llama.cpp's next merge.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    rank: u32,
    left: u32,
    right: u32,
    /// Symbols of the two sides when queued: the candidate is stale if either changed.
    left_sym: u32,
    right_sym: u32,
    merged: u32,
}

/// Interned byte strings, merges between them, and their token ids.
#[derive(Clone)]
pub(crate) struct Bpe {
    /// Bytes of every symbol, concatenated; symbol `s` is `bytes[starts[s]..starts[s+1]]`.
    bytes: Vec<u8>,
    starts: Vec<u32>,
    /// Token id of every symbol ([`NONE`] if the vocabulary lacks it).
    token: Vec<u32>,
    /// `(left, right)` symbol pair to `(rank, merged symbol)`.
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// Token of a single byte looked up as llama.cpp's fallback does (see [`Bpe::encode`]).
    byte_fallback: [u32; 256],
}

impl Bpe {
    /// Builds the tables. `lookup` gives the token id of a raw byte string (a token
    /// whose text is entirely GPT-2 mapped); `merges` are `(left, right)` raw byte
    /// strings in rank order (`None` for one that can never match, which keeps its
    /// rank), where the first of duplicate pairs counts.
    pub(crate) fn new(
        lookup: &HashMap<Vec<u8>, u32>,
        merges: impl IntoIterator<Item = Option<(Vec<u8>, Vec<u8>)>>,
    ) -> Bpe {
        let mut interned: HashMap<Vec<u8>, u32> = HashMap::new();
        let mut bpe = Bpe {
            bytes: Vec::new(),
            starts: vec![0],
            token: Vec::new(),
            merges: HashMap::new(),
            byte_fallback: [NONE; 256],
        };
        let mut intern = |bpe: &mut Bpe, s: &[u8]| -> u32 {
            if let Some(&id) = interned.get(s) {
                return id;
            }
            let id = bpe.token.len() as u32;
            bpe.bytes.extend_from_slice(s);
            bpe.starts.push(bpe.bytes.len() as u32);
            bpe.token.push(lookup.get(s).copied().unwrap_or(NONE));
            interned.insert(s.to_vec(), id);
            id
        };
        for b in 0..=255u8 {
            intern(&mut bpe, &[b]);
        }
        for (rank, pair) in merges.into_iter().enumerate() {
            let Some((left, right)) = pair else { continue };
            let l = intern(&mut bpe, &left);
            let r = intern(&mut bpe, &right);
            let mut joined = left;
            joined.extend_from_slice(&right);
            let m = intern(&mut bpe, &joined);
            bpe.merges.entry((l, r)).or_insert((rank as u32, m));
        }
        // llama.cpp looks up each *byte of the mapped text* of an unknown symbol as a
        // one-byte string: only bytes that map to themselves in ASCII can be tokens.
        for b in 0x21..=0x7Eu8 {
            bpe.byte_fallback[b as usize] = lookup.get(&[b][..]).copied().unwrap_or(NONE);
        }
        bpe
    }

    fn symbol_bytes(&self, s: u32) -> &[u8] {
        let s = s as usize;
        &self.bytes[self.starts[s] as usize..self.starts[s + 1] as usize]
    }

    /// Appends the tokens of one pre-token piece.
    ///
    /// Merges like llama.cpp's `llm_tokenizer_bpe_session`: repeatedly the adjacent pair
    /// with the lowest merge rank, the leftmost first among equal ranks. A final symbol
    /// that is no token is replaced by the tokens of its printable ASCII bytes (each
    /// looked up alone); its other bytes are dropped, as llama.cpp drops them.
    pub(crate) fn encode(&self, piece: &[u8], out: &mut Vec<u32>) {
        #[derive(Clone, Copy)]
        struct Sym {
            id: u32,
            prev: u32,
            next: u32,
        }
        let n = piece.len();
        if n == 0 {
            return;
        }
        let mut syms: Vec<Sym> = piece
            .iter()
            .enumerate()
            .map(|(i, &b)| Sym {
                id: b as u32,
                prev: if i == 0 { NONE } else { i as u32 - 1 },
                next: if i + 1 == n { NONE } else { i as u32 + 1 },
            })
            .collect();

        let mut heap: BinaryHeap<Reverse<Candidate>> = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<_>, syms: &[Sym], l: u32, r: u32| {
            if l == NONE || r == NONE {
                return;
            }
            let (ls, rs) = (syms[l as usize].id, syms[r as usize].id);
            if let Some(&(rank, merged)) = self.merges.get(&(ls, rs)) {
                heap.push(Reverse(Candidate {
                    rank,
                    left: l,
                    right: r,
                    left_sym: ls,
                    right_sym: rs,
                    merged,
                }));
            }
        };
        for i in 1..n as u32 {
            push(&mut heap, &syms, i - 1, i);
        }
        while let Some(Reverse(c)) = heap.pop() {
            let (l, r, ls, rs) = (c.left, c.right, c.left_sym, c.right_sym);
            let (li, ri) = (l as usize, r as usize);
            // stale: a side was merged away or grew since the pair was queued
            if syms[li].id != ls || syms[ri].id != rs || syms[li].next != r {
                continue;
            }
            let after = syms[ri].next;
            syms[li].id = c.merged;
            syms[li].next = after;
            syms[ri].id = NONE;
            syms[ri].next = NONE;
            if after != NONE {
                syms[after as usize].prev = l;
            }
            push(&mut heap, &syms, syms[li].prev, l);
            push(&mut heap, &syms, l, after);
        }

        let mut i = 0u32;
        while i != NONE {
            let sym = syms[i as usize];
            let token = self.token[sym.id as usize];
            if token != NONE {
                out.push(token);
            } else {
                out.extend(
                    self.symbol_bytes(sym.id)
                        .iter()
                        .map(|&b| self.byte_fallback[b as usize])
                        .filter(|&t| t != NONE),
                );
            }
            i = sym.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_mapping_is_gpt2s() {
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(b'!'), '!');
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'\t'), 'ĉ');
        assert_eq!(byte_to_char(0), 'Ā');
        assert_eq!(byte_to_char(0x7F), 'ġ');
        assert_eq!(byte_to_char(0xA0), 'ł');
        assert_eq!(byte_to_char(0xAD), 'Ń');
        assert_eq!(byte_to_char(0xC3), 'Ã');
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c));
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(char_to_byte(' '), None);
        assert_eq!(char_to_byte('\n'), None);
        assert_eq!(char_to_byte('\u{144}'), None);
        assert_eq!(char_to_byte('é'), Some(0xE9));
        assert_eq!(unmap("Ġhello"), Some(b" hello".to_vec()));
        assert_eq!(unmap("a b"), None);
    }
}
