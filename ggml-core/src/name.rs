//! Fixed-capacity names for tensors and backends (no allocation).

use core::fmt;

/// Maximum number of bytes in a [`Name`] (ggml's `GGML_MAX_NAME` is 64 including the NUL).
pub const MAX_NAME: usize = 63;

/// A UTF-8 name of at most [`MAX_NAME`] bytes stored inline.
///
/// Longer input is truncated at a character boundary, as ggml truncates tensor names.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Name {
    len: u8,
    bytes: [u8; MAX_NAME],
}

impl Name {
    /// The empty name.
    pub const EMPTY: Name = Name {
        len: 0,
        bytes: [0; MAX_NAME],
    };

    /// A name holding `s`, truncated to [`MAX_NAME`] bytes at a character boundary.
    pub fn new(s: &str) -> Name {
        let mut n = Name::EMPTY;
        n.push_str(s);
        n
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        let bytes = &self.bytes[..self.len as usize];
        // Only whole UTF-8 characters are ever pushed, so this cannot fail; fall back to "" anyway.
        core::str::from_utf8(bytes).unwrap_or("")
    }

    /// Whether the name is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends as much of `s` as fits, stopping at a character boundary.
    pub fn push_str(&mut self, s: &str) {
        let room = MAX_NAME - self.len as usize;
        let mut take = s.len().min(room);
        while !s.is_char_boundary(take) {
            take -= 1;
        }
        let start = self.len as usize;
        self.bytes[start..start + take].copy_from_slice(&s.as_bytes()[..take]);
        self.len += take as u8;
    }
}

impl Default for Name {
    fn default() -> Self {
        Name::EMPTY
    }
}

impl fmt::Write for Name {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push_str(s);
        Ok(())
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Formats into a [`Name`], truncating: `name!("blk.{}.attn_q", il)`.
#[macro_export]
macro_rules! name {
    ($($arg:tt)*) => {{
        let mut n = $crate::Name::EMPTY;
        let _ = core::fmt::Write::write_fmt(&mut n, format_args!($($arg)*));
        n
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_at_char_boundary() {
        let long = "é".repeat(40); // 80 bytes
        let n = Name::new(&long);
        assert_eq!(n.as_str().len(), 62);
        assert_eq!(name!("blk.{}.attn_q", 7).as_str(), "blk.7.attn_q");
    }
}
