//! Zero-copy, allocation-free parser for GGUF files, versions 2 and 3.
//!
//! [`Gguf::parse`] walks the whole header once (every metadata pair, every array
//! element, every tensor info) and refuses anything malformed with a [`GgufError`]
//! naming the field and byte offset. Everything else reads lazily from the borrowed
//! bytes and cannot fail on structure afterwards.
//!
//! Layout (all little-endian):
//!
//! ```text
//! "GGUF" | version u32 | tensor_count u64 | metadata_kv_count u64
//! metadata_kv_count x { key: string, type: u32, value }
//! tensor_count x { name: string, n_dims: u32, dims: u64 x n_dims, type: u32, offset: u64 }
//! padding to `general.alignment` (default 32) | data section
//! ```
//!
//! Rules enforced beyond the format itself:
//! - metadata keys and tensor names are unique; tensor names are at most 63 bytes;
//! - booleans are 0 or 1; arrays nest at most [`MAX_ARRAY_DEPTH`] deep;
//! - `general.alignment`, if present, is a `u32` power of two;
//! - dimensions and their product fit `i64`, `ne[0]` is a multiple of the block size,
//!   the byte size fits `usize`;
//! - every tensor offset is a multiple of the alignment and its data lies in the file.
//!
//! Tensors may overlap or leave gaps: both are memory-safe for read-only slices, and
//! checking overlaps without allocation would cost quadratic time. llama.cpp is
//! stricter (tensors packed in order, each padded to the alignment); call
//! [`Gguf::check_packed_layout`] to require that too.
//!
//! Cost: parsing is linear in the file's header size, plus the duplicate checks. Those
//! use a fixed 4096-bit Bloom filter on the stack and rescan earlier entries only on a
//! filter hit, so they are linear for ordinary files but quadratic in the worst case
//! (many names colliding in the filter). Lookups by key or name are linear scans.

#![deny(
    clippy::indexing_slicing,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::unreachable
)]

mod error;
mod reader;
mod tensor;
mod value;

pub use error::{
    ArrayPath, ErrorKind, ErrorName, Field, GgufError, ERROR_NAME_CAPACITY, MAX_ARRAY_DEPTH,
};
pub use tensor::{TensorInfo, MAX_DIMS, MAX_TENSOR_NAME_LEN};
pub use value::{ArrayElement, ArrayIter, ArrayValue, Numbers, Strings, Value, ValueType};

use core::fmt;

use reader::{Cursor, Raw};
use tensor::MIN_TENSOR_INFO_SIZE;
use value::read_value;

/// The magic bytes a GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";

/// Data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u32 = 32;

/// The metadata key that sets the data alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Fewest bytes a metadata pair takes: key length, value type, a one-byte value.
const MIN_KV_SIZE: usize = 8 + 4 + 1;

/// Offset of the tensor count in the header.
const TENSOR_COUNT_AT: usize = 8;
/// Offset of the metadata count in the header.
const KV_COUNT_AT: usize = 16;

/// A parsed and fully validated GGUF file, borrowing its bytes.
#[derive(Clone, Copy)]
pub struct Gguf<'a> {
    bytes: &'a [u8],
    file_len: u64,
    version: u32,
    n_tensors: usize,
    n_kv: usize,
    kv_start: usize,
    tensors_start: usize,
    data_offset: usize,
    alignment: u32,
}

impl fmt::Debug for Gguf<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("file_len", &self.file_len)
            .field("metadata_count", &self.n_kv)
            .field("tensor_count", &self.n_tensors)
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl<'a> Gguf<'a> {
    /// Parses and validates a whole GGUF file held in `bytes`.
    pub fn parse(bytes: &'a [u8]) -> Result<Gguf<'a>, GgufError> {
        Self::parse_prefix(bytes, bytes.len() as u64)
    }

    /// Parses a file of `file_len` bytes from a prefix of it that holds at least the
    /// whole header (metadata and tensor infos). Tensor data is checked against
    /// `file_len`; read it with [`TensorInfo::data`] from the full file (an mmap, say).
    /// A header that runs past the prefix fails as [`ErrorKind::Truncated`] (or another
    /// bounds error): retry with a longer prefix. Bytes past `file_len` are ignored.
    pub fn parse_prefix(prefix: &'a [u8], file_len: u64) -> Result<Gguf<'a>, GgufError> {
        let bytes = match usize::try_from(file_len) {
            Ok(n) => prefix.get(..n).unwrap_or(prefix),
            Err(_) => prefix,
        };
        let mut cur = Cursor::new(bytes, 0);

        let magic = cur.array::<4>().map_err(|r| r.at(Field::Magic))?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::new(
                ErrorKind::BadMagic { found: magic },
                Field::Magic,
                0,
            ));
        }
        let version = cur.u32().map_err(|r| r.at(Field::Version))?;
        if version != 2 && version != 3 {
            let kind = if matches!(version.swap_bytes(), 2 | 3) {
                ErrorKind::BigEndian { version }
            } else {
                ErrorKind::UnsupportedVersion { version }
            };
            return Err(GgufError::new(kind, Field::Version, 4));
        }
        let n_tensors = cur.u64().map_err(|r| r.at(Field::TensorCount))?;
        let n_kv = cur.u64().map_err(|r| r.at(Field::MetadataCount))?;
        let rest = cur.remaining();
        let n_kv = check_count(n_kv, rest, MIN_KV_SIZE, Field::MetadataCount, KV_COUNT_AT)?;
        check_count(
            n_tensors,
            rest,
            MIN_TENSOR_INFO_SIZE,
            Field::TensorCount,
            TENSOR_COUNT_AT,
        )?;

        // Metadata.
        let kv_start = cur.pos();
        let mut alignment = DEFAULT_ALIGNMENT;
        let mut bloom = Bloom::new();
        for i in 0..n_kv {
            let index = i as u64;
            let key_at = cur.pos();
            let key = cur
                .string(u64::MAX)
                .map_err(|r| r.at(Field::MetadataKey { index }))?;
            let type_at = cur.pos();
            let type_id = cur
                .u32()
                .map_err(|r| r.at(Field::MetadataType { index }).with_name(key))?;
            let ty = ValueType::from_id(type_id).ok_or_else(|| {
                GgufError::new(
                    ErrorKind::BadValueType { type_id },
                    Field::MetadataType { index },
                    type_at as u64,
                )
                .with_name(key)
            })?;
            let value_at = cur.pos();
            let value = read_value(&mut cur, ty, 0).map_err(|r| value_error(r, index, key))?;
            if bloom.insert(key.as_bytes()) {
                let first = Metadata::new(bytes, kv_start, i)
                    .position(|(k, _)| k == key)
                    .map(|j| j as u64);
                if let Some(first_index) = first {
                    return Err(GgufError::new(
                        ErrorKind::DuplicateKey { first_index },
                        Field::MetadataKey { index },
                        key_at as u64,
                    )
                    .with_name(key));
                }
            }
            if key == ALIGNMENT_KEY {
                let err = |kind| {
                    Err(GgufError::new(
                        kind,
                        Field::MetadataValue {
                            index,
                            path: ArrayPath::default(),
                        },
                        value_at as u64,
                    )
                    .with_name(key))
                };
                match value {
                    Value::U32(a) if a.is_power_of_two() => alignment = a,
                    Value::U32(value) => return err(ErrorKind::BadAlignment { value }),
                    other => {
                        return err(ErrorKind::WrongType {
                            expected: ValueType::U32,
                            found: other.value_type(),
                        })
                    }
                }
            }
        }

        // Tensor infos: shapes, types, names, alignment of offsets.
        let tensors_start = cur.pos();
        let n_tensors = check_count(
            n_tensors,
            cur.remaining(),
            MIN_TENSOR_INFO_SIZE,
            Field::TensorCount,
            TENSOR_COUNT_AT,
        )?;
        bloom = Bloom::new();
        for i in 0..n_tensors {
            let name_at = cur.pos();
            let d = tensor::decode(&mut cur, i as u64, alignment)?;
            if bloom.insert(d.name.as_bytes()) {
                let first = TensorNames::new(bytes, tensors_start, i)
                    .position(|n| n == d.name.as_bytes())
                    .map(|j| j as u64);
                if let Some(first_index) = first {
                    return Err(GgufError::new(
                        ErrorKind::DuplicateName { first_index },
                        Field::TensorName { index: i as u64 },
                        name_at as u64,
                    )
                    .with_name(d.name));
                }
            }
        }

        // Data section and the bounds of every tensor's data.
        let header_end = cur.pos();
        let data_offset = align_up(header_end, alignment).ok_or_else(|| {
            GgufError::new(
                ErrorKind::SizeOverflow,
                Field::TensorCount,
                header_end as u64,
            )
        })?;
        let gguf = Gguf {
            bytes,
            file_len,
            version,
            n_tensors,
            n_kv,
            kv_start,
            tensors_start,
            data_offset,
            alignment,
        };
        let mut cur = Cursor::new(bytes, tensors_start);
        for i in 0..n_tensors {
            let d = tensor::decode(&mut cur, i as u64, alignment)?;
            tensor::place(d, i, data_offset, file_len)?;
        }
        Ok(gguf)
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The bytes parsed (the prefix, for [`Gguf::parse_prefix`]).
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Length of the whole file in bytes.
    pub fn file_len(&self) -> u64 {
        self.file_len
    }

    /// Data alignment: `general.alignment`, or 32.
    pub fn alignment(&self) -> u32 {
        self.alignment
    }

    /// Offset of the data section in the file: the end of the tensor infos rounded up
    /// to the alignment. Tensor offsets are relative to it. (For a file without tensor
    /// data it may lie past the end of the file.)
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// Number of metadata pairs.
    pub fn metadata_count(&self) -> usize {
        self.n_kv
    }

    /// Number of tensors.
    pub fn tensor_count(&self) -> usize {
        self.n_tensors
    }

    /// The metadata pairs, in file order.
    pub fn metadata(&self) -> Metadata<'a> {
        Metadata::new(self.bytes, self.kv_start, self.n_kv)
    }

    /// The value of `key` (a linear scan over the metadata).
    pub fn get(&self, key: &str) -> Option<Value<'a>> {
        self.metadata().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// The value of `key` if it is a `u32`.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get(key)?.as_u32()
    }

    /// The value of `key` if it is an `i32`.
    pub fn get_i32(&self, key: &str) -> Option<i32> {
        self.get(key)?.as_i32()
    }

    /// The value of `key` if it is a `u64`.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    /// The value of `key` if it is an `i64`.
    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }

    /// The value of `key` if it is an `f32`.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }

    /// The value of `key` if it is an `f64`.
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }

    /// The value of `key` if it is a `bool`.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    /// The value of `key` if it is a string.
    pub fn get_str(&self, key: &str) -> Option<&'a str> {
        self.get(key)?.as_str()
    }

    /// The value of `key` if it is an array.
    pub fn get_array(&self, key: &str) -> Option<ArrayValue<'a>> {
        self.get(key)?.as_array()
    }

    /// The value of `key` if it is an integer of any type whose value fits `u32`
    /// (llama.cpp accepts `u32` or `i32` for many keys).
    pub fn get_as_u32(&self, key: &str) -> Option<u32> {
        self.get(key)?.to_u32()
    }

    /// The value of `key` if it is an integer of any type whose value fits `i32`.
    pub fn get_as_i32(&self, key: &str) -> Option<i32> {
        self.get(key)?.to_i32()
    }

    /// The value of `key` if it is an integer of any type whose value fits `u64`.
    pub fn get_as_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.to_u64()
    }

    /// The value of `key` if it is an integer of any type whose value fits `i64`.
    pub fn get_as_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.to_i64()
    }

    /// The value of `key` if it is an integer of any type whose value fits `usize`.
    pub fn get_as_usize(&self, key: &str) -> Option<usize> {
        self.get(key)?.to_usize()
    }

    /// The tensor infos, in file order.
    pub fn tensors(&self) -> Tensors<'a> {
        Tensors {
            cur: Cursor::new(self.bytes, self.tensors_start),
            next: 0,
            count: self.n_tensors,
            alignment: self.alignment,
            data_offset: self.data_offset,
            file_len: self.file_len,
        }
    }

    /// The tensor named `name` (a linear scan).
    pub fn tensor(&self, name: &str) -> Option<TensorInfo<'a>> {
        self.tensors().find(|t| t.name() == name)
    }

    /// Tensor number `index` in file order (a linear scan).
    pub fn tensor_at(&self, index: usize) -> Option<TensorInfo<'a>> {
        self.tensors().nth(index)
    }

    /// The bytes of `tensor` if the parsed bytes hold them (always, for
    /// [`Gguf::parse`]; for [`Gguf::parse_prefix`] only if the prefix reaches them).
    pub fn tensor_data(&self, tensor: &TensorInfo<'_>) -> Option<&'a [u8]> {
        self.bytes.get(tensor.byte_range())
    }

    /// Checks llama.cpp's stricter layout: tensors in file order, each starting where
    /// the previous one's data, padded to the alignment, ends (the first at offset 0).
    /// This excludes overlaps and gaps. Fails with [`ErrorKind::UnexpectedOffset`].
    pub fn check_packed_layout(&self) -> Result<(), GgufError> {
        let mut expected: u64 = 0;
        let mut cur = Cursor::new(self.bytes, self.tensors_start);
        for i in 0..self.n_tensors {
            let d = tensor::decode(&mut cur, i as u64, self.alignment)?;
            if d.offset != expected {
                return Err(GgufError::new(
                    ErrorKind::UnexpectedOffset {
                        found: d.offset,
                        expected,
                    },
                    Field::TensorOffset { index: i as u64 },
                    d.offset_at as u64,
                )
                .with_name(d.name));
            }
            // Both terms lie inside the file (checked by `parse`), so no overflow.
            let padded = align_up(d.size, self.alignment).unwrap_or(usize::MAX) as u64;
            expected = expected.saturating_add(padded);
        }
        Ok(())
    }
}

/// Checks `count` items of at least `min_size` bytes can fit in `rest` bytes.
fn check_count(
    count: u64,
    rest: usize,
    min_size: usize,
    field: Field,
    at: usize,
) -> Result<usize, GgufError> {
    let max = (rest / min_size) as u64;
    if count > max {
        return Err(GgufError::new(
            ErrorKind::CountTooLarge { count, max },
            field,
            at as u64,
        ));
    }
    // `count <= rest`, which is a usize.
    Ok(count as usize)
}

fn value_error(mut r: Raw, index: u64, key: &str) -> GgufError {
    let path = core::mem::take(&mut r.path);
    r.at(Field::MetadataValue { index, path }).with_name(key)
}

/// `n` rounded up to a multiple of `alignment` (a power of two).
fn align_up(n: usize, alignment: u32) -> Option<usize> {
    let a = usize::try_from(alignment).ok()?;
    let mask = a.checked_sub(1)?;
    Some(n.checked_add(mask)? & !mask)
}

/// Iterator over the metadata pairs of a validated file, as `(key, value)`.
#[derive(Clone, Debug)]
pub struct Metadata<'a> {
    cur: Cursor<'a>,
    left: usize,
}

impl<'a> Metadata<'a> {
    fn new(bytes: &'a [u8], start: usize, count: usize) -> Metadata<'a> {
        Metadata {
            cur: Cursor::new(bytes, start),
            left: count,
        }
    }

    fn read(&mut self) -> Result<(&'a str, Value<'a>), Raw> {
        let key = self.cur.string(u64::MAX)?;
        let type_id = self.cur.u32()?;
        let ty = ValueType::from_id(type_id).ok_or(Raw::new(
            ErrorKind::BadValueType { type_id },
            self.cur.pos(),
        ))?;
        Ok((key, read_value(&mut self.cur, ty, 0)?))
    }
}

impl<'a> Iterator for Metadata<'a> {
    type Item = (&'a str, Value<'a>);

    fn next(&mut self) -> Option<(&'a str, Value<'a>)> {
        if self.left == 0 {
            return None;
        }
        match self.read() {
            Ok(kv) => {
                self.left -= 1;
                Some(kv)
            }
            Err(_) => {
                self.left = 0;
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Metadata<'_> {}

/// Iterator over the tensor infos of a validated file.
#[derive(Clone, Debug)]
pub struct Tensors<'a> {
    cur: Cursor<'a>,
    next: usize,
    count: usize,
    alignment: u32,
    data_offset: usize,
    file_len: u64,
}

impl<'a> Iterator for Tensors<'a> {
    type Item = TensorInfo<'a>;

    fn next(&mut self) -> Option<TensorInfo<'a>> {
        if self.next >= self.count {
            return None;
        }
        let i = self.next;
        let info = tensor::decode(&mut self.cur, i as u64, self.alignment)
            .and_then(|d| tensor::place(d, i, self.data_offset, self.file_len));
        match info {
            Ok(t) => {
                self.next += 1;
                Some(t)
            }
            Err(_) => {
                self.next = self.count;
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.count.saturating_sub(self.next);
        (n, Some(n))
    }
}

impl ExactSizeIterator for Tensors<'_> {}

/// Names of the first `count` tensor infos of a file whose infos were validated, read
/// without decoding shapes (for the duplicate check).
struct TensorNames<'a> {
    cur: Cursor<'a>,
    left: usize,
}

impl<'a> TensorNames<'a> {
    fn new(bytes: &'a [u8], start: usize, count: usize) -> TensorNames<'a> {
        TensorNames {
            cur: Cursor::new(bytes, start),
            left: count,
        }
    }

    fn read(&mut self) -> Result<&'a [u8], Raw> {
        let name = self.cur.string_bytes()?;
        let n_dims = self.cur.u32()? as usize;
        // dims, type, offset
        self.cur.take(n_dims.min(MAX_DIMS) * 8 + 4 + 8)?;
        Ok(name)
    }
}

impl<'a> Iterator for TensorNames<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        match self.read() {
            Ok(name) => Some(name),
            Err(_) => {
                self.left = 0;
                None
            }
        }
    }
}

/// A fixed-size Bloom filter (4096 bits, two probes) over names, used to skip most
/// rescans in the duplicate checks.
struct Bloom([u64; 64]);

impl Bloom {
    fn new() -> Bloom {
        Bloom([0; 64])
    }

    /// Adds `name`; returns whether it may have been added before.
    fn insert(&mut self, name: &[u8]) -> bool {
        // FNV-1a, 64-bit.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in name {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        let mut seen = true;
        for bit in [h & 4095, (h >> 32) & 4095] {
            let (word, mask) = ((bit >> 6) as usize, 1u64 << (bit & 63));
            if let Some(w) = self.0.get_mut(word) {
                seen &= *w & mask != 0;
                *w |= mask;
            }
        }
        seen
    }
}
