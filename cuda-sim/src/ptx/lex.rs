//! PTX text to tokens with their line numbers.

/// A token.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    /// A word: identifiers, directives (`.reg`), opcodes with modifiers
    /// (`ld.global.f32`, `cp.async.cg.shared.global.L2::128B`), registers (`%r1`,
    /// `%tid.x`) and numbers (`0x1F`, `0f3F800000`).
    Word(String),
    /// One punctuation character: `, ; { } ( ) [ ] + - @ ! : < >`.
    Punct(char),
    /// A string literal without its quotes (`.pragma "nounroll";`).
    Str(String),
}

/// A token and its 1-based line.
#[derive(Clone, Debug)]
pub(crate) struct Token {
    pub tok: Tok,
    pub line: u32,
}

/// Splits `text` into tokens, dropping `//` and `/* */` comments. An unexpected
/// character is an error with its line.
pub(crate) fn lex(text: &str) -> Result<Vec<Token>, (u32, String)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1u32;
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                if b[i] == b'\n' {
                    line += 1;
                }
                i += 1;
            }
            i += 2;
        } else if c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'%' | b'$') {
            let s = i;
            loop {
                if i < b.len()
                    && (b[i].is_ascii_alphanumeric() || matches!(b[i], b'.' | b'_' | b'%' | b'$'))
                {
                    i += 1;
                } else if b.get(i) == Some(&b':')
                    && b.get(i + 1) == Some(&b':')
                    && b.get(i + 2).is_some_and(|c| c.is_ascii_alphanumeric())
                {
                    // A sub-qualifier inside a word: `.shared::cta`, `.L2::128B`. A label
                    // is followed by one colon, never two.
                    i += 2;
                } else {
                    break;
                }
            }
            out.push(Token {
                tok: Tok::Word(text[s..i].to_string()),
                line,
            });
        } else if c == b'"' {
            let s = i + 1;
            i = s;
            while i < b.len() && b[i] != b'"' && b[i] != b'\n' {
                i += 1;
            }
            if b.get(i) != Some(&b'"') {
                return Err((line, "unterminated string literal".into()));
            }
            out.push(Token {
                tok: Tok::Str(text[s..i].to_string()),
                line,
            });
            i += 1;
        } else if b",;{}()[]+-@!:<>|".contains(&c) {
            out.push(Token {
                tok: Tok::Punct(c as char),
                line,
            });
            i += 1;
        } else {
            return Err((line, format!("unexpected character '{}'", c as char)));
        }
    }
    Ok(out)
}
