//! The "smollm" pre-tokenizer: text to the pieces that BPE then encodes one by one.
//!
//! llama.cpp (`LLAMA_VOCAB_PRE_TYPE_SMOLLM`) applies two expressions in turn, each to
//! the pieces the previous one left:
//!
//! 1. `\p{N}`: every number code point becomes a piece of its own;
//! 2. GPT-2's `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`,
//!    which llama.cpp runs through a hand-written matcher (`\s+(?!\S)` needs a
//!    lookahead that the `regex` crate lacks). This module writes that matcher again.
//!
//! Two consequences of the piecewise application that a single regex would not show:
//! a whitespace run right before a digit ends its piece, so it is matched as "followed
//! by nothing" (`"a  1"` gives `"a"`, `"  "`, `"1"`), and a space never joins the digit
//! after it (`" 1"` gives `" "`, `"1"`).
//!
//! Character classes are llama.cpp's: `\p{L}` and `\p{N}` from the general categories of
//! Unicode 15.1.0 (the version its `unicode-data.cpp` was generated from; see
//! [`super::unicode_tables`]), and `\s` the 25 code points of the `White_Space`
//! property. Code points unassigned in Unicode 15.1 count as "other", i.e. they match
//! `[^\s\p{L}\p{N}]` as in llama.cpp.

use super::unicode_tables::CLASS_RANGES;

/// What the GPT-2 expression distinguishes about a code point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Class {
    /// `\p{L}`.
    Letter,
    /// `\p{N}`.
    Number,
    /// `\s`.
    Whitespace,
    /// Anything else: punctuation, symbols, marks, controls, unassigned.
    Other,
}

/// `\s` as llama.cpp defines it: the `White_Space` property (a closed list).
pub(crate) fn is_whitespace(c: char) -> bool {
    matches!(
        c as u32,
        0x09..=0x0D
            | 0x20
            | 0x85
            | 0xA0
            | 0x1680
            | 0x2000..=0x200A
            | 0x2028
            | 0x2029
            | 0x202F
            | 0x205F
            | 0x3000
    )
}

/// The class of a code point (whitespace first: no whitespace is a letter or number).
pub(crate) fn classify(c: char) -> Class {
    if is_whitespace(c) {
        return Class::Whitespace;
    }
    if c.is_ascii() {
        return if c.is_ascii_alphabetic() {
            Class::Letter
        } else if c.is_ascii_digit() {
            Class::Number
        } else {
            Class::Other
        };
    }
    let cp = c as u32;
    // CLASS_RANGES starts at 0, so at least one entry precedes any code point.
    let i = CLASS_RANGES.partition_point(|&(start, _)| start <= cp);
    CLASS_RANGES[i - 1].1
}

#[derive(Clone, Copy, Debug)]
struct Cp {
    ch: char,
    class: Class,
}

/// Splits `text` into smollm pre-tokens, appended to `out` in order; their
/// concatenation is `text`, and none is empty.
pub(crate) fn split_smollm<'t>(text: &'t str, out: &mut Vec<&'t str>) {
    let mut offsets = Vec::with_capacity(text.len() + 1);
    let mut cps = Vec::with_capacity(text.len());
    for (at, ch) in text.char_indices() {
        offsets.push(at);
        cps.push(Cp {
            ch,
            class: classify(ch),
        });
    }
    offsets.push(text.len());

    let n = cps.len();
    let mut i = 0;
    while i < n {
        if cps[i].class == Class::Number {
            out.push(&text[offsets[i]..offsets[i + 1]]);
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < n && cps[j].class != Class::Number {
            j += 1;
        }
        split_gpt2(&cps[i..j], |start, end| {
            out.push(&text[offsets[i + start]..offsets[i + end]]);
        });
        i = j;
    }
}

/// GPT-2's expression on one piece, as llama.cpp's `unicode_regex_split_custom_gpt2`
/// matches it: calls `emit(start, end)` (code point indices into `cs`) for each match.
fn split_gpt2(cs: &[Cp], mut emit: impl FnMut(usize, usize)) {
    let end = cs.len();
    let class_at = |p: usize| cs.get(p).map(|c| c.class);
    let mut pos = 0;
    while pos < end {
        let start = pos;
        let c = cs[pos].ch;

        // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive)
        if c == '\'' && pos + 1 < end {
            let n1 = cs[pos + 1].ch;
            if matches!(n1, 's' | 't' | 'm' | 'd') {
                pos += 2;
                emit(start, pos);
                continue;
            }
            if pos + 2 < end {
                let n2 = cs[pos + 2].ch;
                if matches!((n1, n2), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
                    pos += 3;
                    emit(start, pos);
                    continue;
                }
            }
        }

        // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': the class after an optional
        // leading space (nothing if the space ends the piece).
        let lead = if c == ' ' {
            class_at(pos + 1)
        } else {
            Some(cs[pos].class)
        };
        if let Some(class @ (Class::Letter | Class::Number | Class::Other)) = lead {
            if c == ' ' {
                pos += 1;
            }
            while class_at(pos) == Some(class) {
                pos += 1;
            }
            emit(start, pos);
            continue;
        }

        let mut n_ws = 0;
        while class_at(pos + n_ws) == Some(Class::Whitespace) {
            n_ws += 1;
        }
        if n_ws > 1 && pos + n_ws < end {
            // \s+(?!\S): the run but its last character, which goes with what follows
            pos += n_ws - 1;
        } else if n_ws > 0 {
            // \s+
            pos += n_ws;
        } else {
            // unreachable for real code points; llama.cpp emits one code point
            pos += 1;
        }
        emit(start, pos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        split_smollm(text, &mut out);
        out
    }

    #[test]
    fn whitespace_is_the_white_space_property() {
        for cp in 0..=0x10FFFFu32 {
            if let Some(c) = char::from_u32(cp) {
                assert_eq!(is_whitespace(c), c.is_whitespace(), "U+{cp:04X}");
            }
        }
    }

    #[test]
    fn classes() {
        assert_eq!(classify('a'), Class::Letter);
        assert_eq!(classify('Z'), Class::Letter);
        assert_eq!(classify('7'), Class::Number);
        assert_eq!(classify('_'), Class::Other);
        assert_eq!(classify(' '), Class::Whitespace);
        assert_eq!(classify('\u{a0}'), Class::Whitespace);
        assert_eq!(classify('\u{3000}'), Class::Whitespace);
        assert_eq!(classify('é'), Class::Letter);
        assert_eq!(classify('ß'), Class::Letter);
        assert_eq!(classify('Ж'), Class::Letter);
        assert_eq!(classify('中'), Class::Letter);
        assert_eq!(classify('ª'), Class::Letter); // Lo
        assert_eq!(classify('ʰ'), Class::Letter); // Lm
        assert_eq!(classify('²'), Class::Number); // No
        assert_eq!(classify('Ⅻ'), Class::Number); // Nl
        assert_eq!(classify('٣'), Class::Number); // Nd, Arabic-Indic
        assert_eq!(classify('\u{301}'), Class::Other); // Mn
        assert_eq!(classify('€'), Class::Other);
        assert_eq!(classify('😀'), Class::Other);
        assert_eq!(classify('\u{85}'), Class::Whitespace);
        // U+200B is Cf, not White_Space
        assert_eq!(classify('\u{200b}'), Class::Other);
        // CJK extension I, new in Unicode 15.1: a letter for llama.cpp
        assert_eq!(classify('\u{2EBF0}'), Class::Letter);
        assert_eq!(classify('\u{10D30}'), Class::Number); // Hanifi Rohingya digit
                                                          // Garay digit zero: Nd since Unicode 16 (so `is_numeric` for std), but
                                                          // unassigned in 15.1, so "other" for llama.cpp
        assert_eq!(classify('\u{10D40}'), Class::Other);
        assert_eq!(classify('\u{10FFFF}'), Class::Other);
    }

    #[test]
    fn table_is_sorted_and_starts_at_zero() {
        assert_eq!(CLASS_RANGES[0].0, 0);
        assert!(CLASS_RANGES
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 != w[1].1));
        assert_eq!(super::super::unicode_tables::UNICODE_VERSION, "15.1.0");
    }

    #[test]
    fn words_and_spaces() {
        assert_eq!(split("Hello world"), ["Hello", " world"]);
        assert_eq!(split("Hello, world!"), ["Hello", ",", " world", "!"]);
        assert_eq!(split(" leading"), [" leading"]);
        assert_eq!(split("trailing "), ["trailing", " "]);
        assert_eq!(split("trailing   "), ["trailing", "   "]);
        assert_eq!(split("a  b"), ["a", " ", " b"]);
        assert_eq!(split("a   b"), ["a", "  ", " b"]);
        assert_eq!(split("a \n b"), ["a", " \n", " b"]);
        assert_eq!(split("a\n\nb"), ["a", "\n", "\n", "b"]);
        assert_eq!(split("a\n\n\nb"), ["a", "\n\n", "\n", "b"]);
        assert_eq!(split("a\n"), ["a", "\n"]);
        assert_eq!(split("a\n\n"), ["a", "\n\n"]);
        assert_eq!(split("\tx"), ["\t", "x"]);
        assert_eq!(split("a \tb"), ["a", " ", "\t", "b"]);
        assert_eq!(split(" "), [" "]);
        assert_eq!(split(""), Vec::<&str>::new());
    }

    #[test]
    fn punctuation_runs() {
        assert_eq!(split("x...y"), ["x", "...", "y"]);
        assert_eq!(split("x ...y"), ["x", " ...", "y"]);
        assert_eq!(split("(a)"), ["(", "a", ")"]);
        assert_eq!(split("\"quoted\" text"), ["\"", "quoted", "\"", " text"]);
        assert_eq!(split("a-b_c"), ["a", "-", "b", "_", "c"]);
        assert_eq!(split("<|im_start|>"), ["<|", "im", "_", "start", "|>"]);
    }

    #[test]
    fn digits_are_split_alone() {
        assert_eq!(split("2024"), ["2", "0", "2", "4"]);
        assert_eq!(split("v1.25"), ["v", "1", ".", "2", "5"]);
        assert_eq!(split("a 1"), ["a", " ", "1"]);
        assert_eq!(split("a  1"), ["a", "  ", "1"]);
        assert_eq!(split("x1y"), ["x", "1", "y"]);
        assert_eq!(split("²³"), ["²", "³"]);
        assert_eq!(split("3 apples"), ["3", " apples"]);
    }

    #[test]
    fn contractions() {
        assert_eq!(split("don't"), ["don", "'t"]);
        assert_eq!(
            split("we're we've I'm he'll she'd it's"),
            ["we", "'re", " we", "'ve", " I", "'m", " he", "'ll", " she", "'d", " it", "'s"]
        );
        // case-sensitive, like the GPT-2 expression
        assert_eq!(split("DON'T"), ["DON", "'", "T"]);
        assert_eq!(split("'"), ["'"]);
        assert_eq!(split("x'"), ["x", "'"]);
        assert_eq!(split("''s"), ["''", "s"]);
        assert_eq!(split("'re"), ["'re"]);
        assert_eq!(split("'r"), ["'", "r"]);
    }

    #[test]
    fn unicode_letters_marks_and_emoji() {
        assert_eq!(split("naïve café"), ["naïve", " café"]);
        // combining acute accent (Mn) is not a letter
        assert_eq!(split("cafe\u{301} ok"), ["cafe", "\u{301}", " ok"]);
        assert_eq!(split("Привет мир"), ["Привет", " мир"]);
        assert_eq!(split("日本語テキスト"), ["日本語テキスト"]);
        assert_eq!(split("hi 😀😀!"), ["hi", " 😀😀!"]);
        assert_eq!(split("a\u{a0}b"), ["a", "\u{a0}", "b"]);
        assert_eq!(split("a\u{a0} b"), ["a", "\u{a0}", " b"]);
        assert_eq!(split("٣٤"), ["٣", "٤"]);
    }
}
