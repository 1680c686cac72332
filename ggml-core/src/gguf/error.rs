//! The error type of the GGUF parser: what went wrong, in which field, at which byte.

use core::fmt;

use super::value::ValueType;

/// Deepest array nesting the parser accepts (an array of arrays has depth 2).
pub const MAX_ARRAY_DEPTH: usize = 8;

/// Longest name (metadata key or tensor name) an error keeps; longer ones are cut.
pub const ERROR_NAME_CAPACITY: usize = 38;

/// Why a GGUF file was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The file does not start with the bytes `GGUF`.
    BadMagic {
        /// The first four bytes found.
        found: [u8; 4],
    },
    /// A version other than 2 or 3 (version 1 used 32-bit counts and is not supported).
    UnsupportedVersion {
        /// The version read.
        version: u32,
    },
    /// The version reads as 2 or 3 only when byte-swapped: a big-endian file.
    BigEndian {
        /// The version as read little-endian.
        version: u32,
    },
    /// The file ends inside a fixed-size field.
    Truncated {
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the file at that point.
        available: u64,
    },
    /// A count (of tensors, metadata pairs or array elements) larger than the rest of
    /// the file could hold even with the smallest possible items.
    CountTooLarge {
        /// The count read.
        count: u64,
        /// The largest count the remaining bytes allow.
        max: u64,
    },
    /// A string whose length prefix exceeds the remaining bytes, or a tensor name longer
    /// than ggml's limit (63 bytes).
    StringTooLong {
        /// The length read.
        len: u64,
        /// The longest length allowed there.
        max: u64,
    },
    /// A string that is not valid UTF-8.
    InvalidUtf8 {
        /// Number of valid bytes before the first invalid one.
        valid_up_to: u64,
    },
    /// A metadata value type id that GGUF does not define.
    BadValueType {
        /// The type id read.
        type_id: u32,
    },
    /// A boolean stored as a byte other than 0 or 1.
    BadBool {
        /// The byte read.
        value: u8,
    },
    /// Arrays nested deeper than [`MAX_ARRAY_DEPTH`].
    NestedTooDeep {
        /// The deepest nesting allowed.
        max_depth: u32,
    },
    /// A tensor with more than 4 dimensions.
    TooManyDims {
        /// The dimension count read.
        n_dims: u32,
        /// The largest count allowed (4).
        max: u32,
    },
    /// A dimension above `i64::MAX`, or an element count that overflows `i64`.
    DimOverflow {
        /// The dimension read.
        dim: u64,
    },
    /// A tensor's byte size or position does not fit `usize`.
    SizeOverflow,
    /// The first dimension is not a multiple of the dtype's block size.
    BadBlockAlignment {
        /// The first dimension (`ne[0]`).
        ne0: u64,
        /// The dtype's block size.
        block_size: u32,
    },
    /// A tensor type id that ggml does not define.
    UnknownDType {
        /// The type id read.
        id: u32,
    },
    /// A ggml tensor type that this crate does not implement.
    UnsupportedDType {
        /// The type id read.
        id: u32,
    },
    /// Tensor data that does not lie inside the file.
    OffsetOutOfBounds {
        /// The tensor's offset, relative to the data section.
        offset: u64,
        /// The tensor's size in bytes.
        size: u64,
    },
    /// A tensor offset that is not a multiple of the file's alignment.
    MisalignedOffset {
        /// The offset read.
        offset: u64,
        /// The alignment in force.
        alignment: u32,
    },
    /// A tensor name used twice.
    DuplicateName {
        /// Index of the first tensor with that name.
        first_index: u64,
    },
    /// A metadata key used twice.
    DuplicateKey {
        /// Index of the first pair with that key.
        first_index: u64,
    },
    /// `general.alignment` that is zero or not a power of two.
    BadAlignment {
        /// The value read.
        value: u32,
    },
    /// A metadata value of the wrong type for a key the parser interprets
    /// (`general.alignment` must be a `u32`).
    WrongType {
        /// The type required.
        expected: ValueType,
        /// The type found.
        found: ValueType,
    },
    /// A tensor not at the offset the packed layout of llama.cpp requires (reported only
    /// by [`Gguf::check_packed_layout`](super::Gguf::check_packed_layout)).
    UnexpectedOffset {
        /// The offset read.
        found: u64,
        /// The offset the previous tensors imply.
        expected: u64,
    },
}

impl ErrorKind {
    /// The variant's name, e.g. `"Truncated"`.
    pub const fn name(&self) -> &'static str {
        match self {
            ErrorKind::BadMagic { .. } => "BadMagic",
            ErrorKind::UnsupportedVersion { .. } => "UnsupportedVersion",
            ErrorKind::BigEndian { .. } => "BigEndian",
            ErrorKind::Truncated { .. } => "Truncated",
            ErrorKind::CountTooLarge { .. } => "CountTooLarge",
            ErrorKind::StringTooLong { .. } => "StringTooLong",
            ErrorKind::InvalidUtf8 { .. } => "InvalidUtf8",
            ErrorKind::BadValueType { .. } => "BadValueType",
            ErrorKind::BadBool { .. } => "BadBool",
            ErrorKind::NestedTooDeep { .. } => "NestedTooDeep",
            ErrorKind::TooManyDims { .. } => "TooManyDims",
            ErrorKind::DimOverflow { .. } => "DimOverflow",
            ErrorKind::SizeOverflow => "SizeOverflow",
            ErrorKind::BadBlockAlignment { .. } => "BadBlockAlignment",
            ErrorKind::UnknownDType { .. } => "UnknownDType",
            ErrorKind::UnsupportedDType { .. } => "UnsupportedDType",
            ErrorKind::OffsetOutOfBounds { .. } => "OffsetOutOfBounds",
            ErrorKind::MisalignedOffset { .. } => "MisalignedOffset",
            ErrorKind::DuplicateName { .. } => "DuplicateName",
            ErrorKind::DuplicateKey { .. } => "DuplicateKey",
            ErrorKind::BadAlignment { .. } => "BadAlignment",
            ErrorKind::WrongType { .. } => "WrongType",
            ErrorKind::UnexpectedOffset { .. } => "UnexpectedOffset",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ErrorKind::BadMagic { found } => {
                write!(f, "bad magic {found:02x?}, expected \"GGUF\"")
            }
            ErrorKind::UnsupportedVersion { version } => {
                write!(f, "unsupported version {version} (only 2 and 3 are)")
            }
            ErrorKind::BigEndian { version } => write!(
                f,
                "big-endian file (version {} byte-swapped), only little-endian is supported",
                version.swap_bytes()
            ),
            ErrorKind::Truncated { needed, available } => write!(
                f,
                "file truncated: field needs {needed} bytes, {available} left"
            ),
            ErrorKind::CountTooLarge { count, max } => write!(
                f,
                "count {count} too large: the rest of the file holds at most {max}"
            ),
            ErrorKind::StringTooLong { len, max } => {
                write!(f, "string length {len} exceeds the limit of {max}")
            }
            ErrorKind::InvalidUtf8 { valid_up_to } => write!(
                f,
                "string is not valid UTF-8 (first bad byte at string offset {valid_up_to})"
            ),
            ErrorKind::BadValueType { type_id } => write!(f, "unknown value type id {type_id}"),
            ErrorKind::BadBool { value } => write!(f, "boolean byte {value} is neither 0 nor 1"),
            ErrorKind::NestedTooDeep { max_depth } => {
                write!(f, "arrays nested deeper than {max_depth} levels")
            }
            ErrorKind::TooManyDims { n_dims, max } => {
                write!(f, "{n_dims} dimensions, at most {max} allowed")
            }
            ErrorKind::DimOverflow { dim } => {
                write!(f, "dimension {dim} makes the element count overflow i64")
            }
            ErrorKind::SizeOverflow => f.write_str("tensor byte size or position overflows usize"),
            ErrorKind::BadBlockAlignment { ne0, block_size } => write!(
                f,
                "first dimension {ne0} is not a multiple of the block size {block_size}"
            ),
            ErrorKind::UnknownDType { id } => write!(f, "unknown ggml type id {id}"),
            ErrorKind::UnsupportedDType { id } => match ggml_type_name(id) {
                Some(name) => write!(f, "unsupported ggml type {id} ({name})"),
                None => write!(f, "unsupported ggml type {id}"),
            },
            ErrorKind::OffsetOutOfBounds { offset, size } => write!(
                f,
                "tensor data at data section offset {offset}, {size} bytes long, lies \
                 outside the file"
            ),
            ErrorKind::MisalignedOffset { offset, alignment } => write!(
                f,
                "offset {offset} is not a multiple of the alignment {alignment}"
            ),
            ErrorKind::DuplicateName { first_index } => {
                write!(
                    f,
                    "duplicate tensor name, first used by tensor_info[{first_index}]"
                )
            }
            ErrorKind::DuplicateKey { first_index } => {
                write!(f, "duplicate key, first used by metadata[{first_index}]")
            }
            ErrorKind::BadAlignment { value } => {
                write!(f, "alignment {value} is not a power of two")
            }
            ErrorKind::WrongType { expected, found } => {
                write!(f, "value has type {found}, expected {expected}")
            }
            ErrorKind::UnexpectedOffset { found, expected } => write!(
                f,
                "offset {found} breaks the packed layout, expected {expected}"
            ),
        }
    }
}

/// ggml's name of a tensor type id, for ids that ggml defines (or once defined) but
/// [`DType`](crate::DType) does not support.
pub(crate) const fn ggml_type_name(id: u32) -> Option<&'static str> {
    Some(match id {
        4 => "q4_2 (removed)",
        5 => "q4_3 (removed)",
        16 => "iq2_xxs",
        17 => "iq2_xs",
        18 => "iq3_xxs",
        19 => "iq1_s",
        20 => "iq4_nl",
        21 => "iq3_s",
        22 => "iq2_s",
        23 => "iq4_xs",
        24 => "i8",
        25 => "i16",
        27 => "i64",
        28 => "f64",
        29 => "iq1_m",
        31 => "q4_0_4_4 (removed)",
        32 => "q4_0_4_8 (removed)",
        33 => "q4_0_8_8 (removed)",
        34 => "tq1_0",
        35 => "tq2_0",
        36 => "iq4_nl_4_4 (removed)",
        37 => "iq4_nl_4_8 (removed)",
        38 => "iq4_nl_8_8 (removed)",
        39 => "mxfp4",
        _ => return None,
    })
}

/// Indices into nested arrays leading to the element at fault, outermost first.
///
/// Indices are kept as `u32` to keep [`GgufError`] small; an index above `u32::MAX`
/// (an array of more than four billion elements) reads as `u32::MAX`.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct ArrayPath {
    idx: [u32; MAX_ARRAY_DEPTH],
    len: u8,
}

impl ArrayPath {
    /// The indices, outermost first.
    pub fn indices(&self) -> &[u32] {
        self.idx.get(..self.len as usize).unwrap_or(&[])
    }

    /// Puts `index` in front (called while unwinding out of an array).
    pub(crate) fn push_front(&mut self, index: usize) {
        if (self.len as usize) < MAX_ARRAY_DEPTH {
            self.idx.copy_within(0..self.len as usize, 1);
            self.idx[0] = u32::try_from(index).unwrap_or(u32::MAX);
            self.len += 1;
        }
    }
}

impl fmt::Debug for ArrayPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.indices()).finish()
    }
}

impl fmt::Display for ArrayPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for i in self.indices() {
            write!(f, "[{i}]")?;
        }
        Ok(())
    }
}

/// The field of the file an error is about. Its `Display` form is a path such as
/// `metadata[12].value[3]` or `tensor_info[3].dims[1]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// The magic bytes at the start.
    Magic,
    /// The format version.
    Version,
    /// The tensor count in the header.
    TensorCount,
    /// The metadata pair count in the header.
    MetadataCount,
    /// The key of metadata pair `index`.
    MetadataKey {
        /// Index of the pair.
        index: u64,
    },
    /// The value type of metadata pair `index`.
    MetadataType {
        /// Index of the pair.
        index: u64,
    },
    /// The value of metadata pair `index`, or an element of it if `path` is not empty.
    MetadataValue {
        /// Index of the pair.
        index: u64,
        /// Array indices to the element at fault (empty for the value itself).
        path: ArrayPath,
    },
    /// The name of tensor info `index`.
    TensorName {
        /// Index of the tensor.
        index: u64,
    },
    /// The dimension count of tensor info `index`.
    TensorNDims {
        /// Index of the tensor.
        index: u64,
    },
    /// Dimension `dim` of tensor info `index`.
    TensorDim {
        /// Index of the tensor.
        index: u64,
        /// Index of the dimension.
        dim: u32,
    },
    /// The dimensions of tensor info `index` taken together (its byte size).
    TensorDims {
        /// Index of the tensor.
        index: u64,
    },
    /// The type id of tensor info `index`.
    TensorType {
        /// Index of the tensor.
        index: u64,
    },
    /// The data offset of tensor info `index`.
    TensorOffset {
        /// Index of the tensor.
        index: u64,
    },
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Magic => f.write_str("magic"),
            Field::Version => f.write_str("version"),
            Field::TensorCount => f.write_str("tensor_count"),
            Field::MetadataCount => f.write_str("metadata_kv_count"),
            Field::MetadataKey { index } => write!(f, "metadata[{index}].key"),
            Field::MetadataType { index } => write!(f, "metadata[{index}].type"),
            Field::MetadataValue { index, path } => write!(f, "metadata[{index}].value{path}"),
            Field::TensorName { index } => write!(f, "tensor_info[{index}].name"),
            Field::TensorNDims { index } => write!(f, "tensor_info[{index}].n_dims"),
            Field::TensorDim { index, dim } => write!(f, "tensor_info[{index}].dims[{dim}]"),
            Field::TensorDims { index } => write!(f, "tensor_info[{index}].dims"),
            Field::TensorType { index } => write!(f, "tensor_info[{index}].type"),
            Field::TensorOffset { index } => write!(f, "tensor_info[{index}].offset"),
        }
    }
}

/// A metadata key or tensor name kept inside an error (which cannot borrow the file),
/// cut to [`ERROR_NAME_CAPACITY`] bytes at a character boundary.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ErrorName {
    buf: [u8; ERROR_NAME_CAPACITY],
    len: u8,
    state: u8,
}

const NAME_ABSENT: u8 = 0;
const NAME_WHOLE: u8 = 1;
const NAME_CUT: u8 = 2;

impl ErrorName {
    const NONE: ErrorName = ErrorName {
        buf: [0; ERROR_NAME_CAPACITY],
        len: 0,
        state: NAME_ABSENT,
    };

    pub(crate) fn new(s: &str) -> ErrorName {
        let mut len = s.len().min(ERROR_NAME_CAPACITY);
        while !s.is_char_boundary(len) {
            len -= 1;
        }
        let mut buf = [0u8; ERROR_NAME_CAPACITY];
        if let (Some(dst), Some(src)) = (buf.get_mut(..len), s.as_bytes().get(..len)) {
            dst.copy_from_slice(src);
        }
        ErrorName {
            buf,
            len: len as u8,
            state: if len < s.len() { NAME_CUT } else { NAME_WHOLE },
        }
    }

    /// The name (its first [`ERROR_NAME_CAPACITY`] bytes at most).
    pub fn as_str(&self) -> &str {
        let bytes = self.buf.get(..self.len as usize).unwrap_or(&[]);
        core::str::from_utf8(bytes).unwrap_or("")
    }

    /// Whether the name was cut.
    pub fn is_truncated(&self) -> bool {
        self.state == NAME_CUT
    }
}

impl fmt::Debug for ErrorName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)?;
        if self.is_truncated() {
            f.write_str("...")?;
        }
        Ok(())
    }
}

/// A refused GGUF file: the reason, the field and the byte offset where it was found.
///
/// Owns everything (no borrow of the file), so it can outlive the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GgufError {
    kind: ErrorKind,
    field: Field,
    offset: u64,
    name: ErrorName,
}

impl GgufError {
    pub(crate) fn new(kind: ErrorKind, field: Field, offset: u64) -> GgufError {
        GgufError {
            kind,
            field,
            offset,
            name: ErrorName::NONE,
        }
    }

    pub(crate) fn with_name(mut self, name: &str) -> GgufError {
        self.name = ErrorName::new(name);
        self
    }

    /// Why the file was refused.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The field at fault.
    pub fn field(&self) -> Field {
        self.field
    }

    /// Byte offset in the file where the fault was found (the start of the field, or
    /// of the offending byte inside it).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The metadata key or tensor name the field belongs to, when it was readable
    /// (cut to [`ERROR_NAME_CAPACITY`] bytes).
    pub fn name(&self) -> Option<&str> {
        (self.name.state != NAME_ABSENT).then(|| self.name.as_str())
    }

    /// The name with a flag telling whether it was cut, when it was readable.
    pub fn error_name(&self) -> Option<&ErrorName> {
        (self.name.state != NAME_ABSENT).then_some(&self.name)
    }
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid GGUF: {}", self.field)?;
        if let Some(name) = self.error_name() {
            write!(f, " ({name:?})")?;
        }
        write!(f, " at byte {}: {}", self.offset, self.kind)
    }
}

impl core::error::Error for GgufError {}
