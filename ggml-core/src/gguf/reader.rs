//! A bounds-checked little-endian cursor over the file, and the field-less error it
//! returns (the caller adds the field).

use super::error::{ArrayPath, ErrorKind, Field, GgufError};

/// An error found by the cursor, before the caller says which field it was reading.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Raw {
    pub kind: ErrorKind,
    pub offset: u64,
    pub path: ArrayPath,
}

impl Raw {
    pub fn new(kind: ErrorKind, offset: usize) -> Raw {
        Raw {
            kind,
            offset: offset as u64,
            path: ArrayPath::default(),
        }
    }

    /// The full error for `field`.
    pub fn at(self, field: Field) -> GgufError {
        GgufError::new(self.kind, field, self.offset)
    }
}

/// A position in `buf`; `pos <= buf.len()` always.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8], pos: usize) -> Cursor<'a> {
        Cursor {
            buf,
            pos: pos.min(buf.len()),
        }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn buf(&self) -> &'a [u8] {
        self.buf
    }

    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], Raw> {
        let end = self.pos.checked_add(n);
        match end.and_then(|end| self.buf.get(self.pos..end).map(|s| (end, s))) {
            Some((end, s)) => {
                self.pos = end;
                Ok(s)
            }
            None => Err(Raw::new(
                ErrorKind::Truncated {
                    needed: n as u64,
                    available: self.remaining() as u64,
                },
                self.pos,
            )),
        }
    }

    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], Raw> {
        let s = self.take(N)?;
        match s.first_chunk::<N>() {
            Some(a) => Ok(*a),
            None => Err(Raw::new(
                ErrorKind::Truncated {
                    needed: N as u64,
                    available: s.len() as u64,
                },
                self.pos,
            )),
        }
    }

    pub fn u8(&mut self) -> Result<u8, Raw> {
        Ok(self.array::<1>()?[0])
    }

    pub fn u32(&mut self) -> Result<u32, Raw> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Result<u64, Raw> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A GGUF string: u64 length, then that many bytes of UTF-8. `max_len` bounds the
    /// length beyond the remaining bytes.
    pub fn string(&mut self, max_len: u64) -> Result<&'a str, Raw> {
        let len_at = self.pos;
        let len = self.u64()?;
        let limit = (self.remaining() as u64).min(max_len);
        if len > limit {
            return Err(Raw::new(
                ErrorKind::StringTooLong { len, max: limit },
                len_at,
            ));
        }
        let start = self.pos;
        // `len <= remaining`, so it fits usize.
        let bytes = self.take(len as usize)?;
        core::str::from_utf8(bytes).map_err(|e| {
            Raw::new(
                ErrorKind::InvalidUtf8 {
                    valid_up_to: e.valid_up_to() as u64,
                },
                start.saturating_add(e.valid_up_to()),
            )
        })
    }

    /// Skips a string whose validity was established before; returns its bytes.
    pub fn string_bytes(&mut self) -> Result<&'a [u8], Raw> {
        let len = self.u64()?;
        let n = usize::try_from(len).unwrap_or(usize::MAX);
        self.take(n)
    }
}
