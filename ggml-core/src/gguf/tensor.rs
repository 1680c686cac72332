//! Tensor infos: name, shape, dtype and where the data lies.

use core::ops::Range;

use super::error::{ggml_type_name, ErrorKind, Field, GgufError};
use super::reader::Cursor;
use crate::DType;

/// Most dimensions a tensor may have (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// Longest tensor name in bytes (`GGML_MAX_NAME` minus the terminating NUL).
pub const MAX_TENSOR_NAME_LEN: usize = 63;

/// Fewest bytes a tensor info takes: name length, dimension count, type, offset.
pub(crate) const MIN_TENSOR_INFO_SIZE: usize = 8 + 4 + 4 + 8;

/// One tensor's description from the file, with its data range already checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorInfo<'a> {
    index: usize,
    name: &'a str,
    n_dims: u32,
    ne: [u64; MAX_DIMS],
    dtype: DType,
    offset: u64,
    start: usize,
    size: usize,
}

impl<'a> TensorInfo<'a> {
    /// Position of this tensor among the file's tensor infos.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The tensor's name.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// Number of dimensions stored in the file (0 to 4).
    pub fn n_dims(&self) -> usize {
        self.n_dims as usize
    }

    /// The stored dimensions, innermost (`ne[0]`, contiguous) first.
    pub fn dims(&self) -> &[u64] {
        self.ne.get(..self.n_dims as usize).unwrap_or(&self.ne)
    }

    /// All four dimensions as ggml's `ne`, missing ones set to 1. Each is at most
    /// `i64::MAX`, and so is their product.
    pub fn ne(&self) -> [u64; MAX_DIMS] {
        self.ne
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements (product of the dimensions).
    pub fn n_elements(&self) -> u64 {
        // Checked at parse time not to overflow.
        self.ne.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }

    /// Size of the data in bytes.
    pub fn n_bytes(&self) -> usize {
        self.size
    }

    /// Offset of the data relative to the start of the data section, as stored.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Where the data lies in the file (absolute byte range).
    pub fn byte_range(&self) -> Range<usize> {
        self.start..self.start.saturating_add(self.size)
    }

    /// The tensor's bytes in `file`, which must be the file this info was parsed from
    /// (or a copy of it). Returns an empty slice if `file` is too short to hold them,
    /// which cannot happen for the file given to [`Gguf::parse`](super::Gguf::parse).
    pub fn data<'f>(&self, file: &'f [u8]) -> &'f [u8] {
        file.get(self.byte_range()).unwrap_or(&[])
    }
}

/// A tensor info as decoded and validated, before its data range is placed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Decoded<'a> {
    pub name: &'a str,
    pub n_dims: u32,
    pub ne: [u64; MAX_DIMS],
    pub dtype: DType,
    pub offset: u64,
    pub offset_at: usize,
    pub size: usize,
}

/// Reads and validates tensor info `index` (everything but the data bounds).
pub(crate) fn decode<'a>(
    cur: &mut Cursor<'a>,
    index: u64,
    alignment: u32,
) -> Result<Decoded<'a>, GgufError> {
    let name = cur
        .string(MAX_TENSOR_NAME_LEN as u64)
        .map_err(|r| r.at(Field::TensorName { index }))?;
    let named = |e: GgufError| e.with_name(name);

    let n_dims_at = cur.pos();
    let n_dims = cur
        .u32()
        .map_err(|r| named(r.at(Field::TensorNDims { index })))?;
    if n_dims as usize > MAX_DIMS {
        return Err(named(GgufError::new(
            ErrorKind::TooManyDims {
                n_dims,
                max: MAX_DIMS as u32,
            },
            Field::TensorNDims { index },
            n_dims_at as u64,
        )));
    }
    let dims_at = cur.pos();
    let mut ne = [1u64; MAX_DIMS];
    let mut n_elements: i64 = 1;
    for (d, slot) in ne.iter_mut().take(n_dims as usize).enumerate() {
        let field = Field::TensorDim {
            index,
            dim: d as u32,
        };
        let at = cur.pos();
        let dim = cur.u64().map_err(|r| named(r.at(field)))?;
        let product = i64::try_from(dim)
            .ok()
            .and_then(|v| n_elements.checked_mul(v));
        match product {
            Some(p) => n_elements = p,
            None => {
                return Err(named(GgufError::new(
                    ErrorKind::DimOverflow { dim },
                    field,
                    at as u64,
                )))
            }
        }
        *slot = dim;
    }

    let type_at = cur.pos();
    let type_field = Field::TensorType { index };
    let id = cur.u32().map_err(|r| named(r.at(type_field)))?;
    let dtype = match DType::from_ggml_id(id) {
        Some(t) => t,
        None => {
            let kind = if ggml_type_name(id).is_some() {
                ErrorKind::UnsupportedDType { id }
            } else {
                ErrorKind::UnknownDType { id }
            };
            return Err(named(GgufError::new(kind, type_field, type_at as u64)));
        }
    };

    let block = dtype.block_size() as u64;
    if ne[0] % block != 0 {
        let (field, at) = if n_dims == 0 {
            (type_field, type_at)
        } else {
            (Field::TensorDim { index, dim: 0 }, dims_at)
        };
        return Err(named(GgufError::new(
            ErrorKind::BadBlockAlignment {
                ne0: ne[0],
                block_size: block as u32,
            },
            field,
            at as u64,
        )));
    }
    let size = usize::try_from(ne[0])
        .ok()
        .and_then(|ne0| dtype.row_size(ne0))
        .and_then(|row| {
            ne[1..]
                .iter()
                .try_fold(row, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
        })
        .ok_or_else(|| {
            named(GgufError::new(
                ErrorKind::SizeOverflow,
                Field::TensorDims { index },
                dims_at as u64,
            ))
        })?;

    let offset_at = cur.pos();
    let offset = cur
        .u64()
        .map_err(|r| named(r.at(Field::TensorOffset { index })))?;
    if offset % u64::from(alignment) != 0 {
        return Err(named(GgufError::new(
            ErrorKind::MisalignedOffset { offset, alignment },
            Field::TensorOffset { index },
            offset_at as u64,
        )));
    }
    Ok(Decoded {
        name,
        n_dims,
        ne,
        dtype,
        offset,
        offset_at,
        size,
    })
}

/// Places a decoded info's data after `data_offset` and checks it lies inside
/// `file_len` bytes.
pub(crate) fn place<'a>(
    d: Decoded<'a>,
    index: usize,
    data_offset: usize,
    file_len: u64,
) -> Result<TensorInfo<'a>, GgufError> {
    let err = |kind| {
        GgufError::new(
            kind,
            Field::TensorOffset {
                index: index as u64,
            },
            d.offset_at as u64,
        )
        .with_name(d.name)
    };
    // The data section may start past the end of a file without tensor data; then
    // even an empty tensor lies outside the file (llama.cpp refuses it too).
    let size = d.size as u64;
    let in_bounds = file_len
        .checked_sub(data_offset as u64)
        .zip(d.offset.checked_add(size))
        .is_some_and(|(available, end)| end <= available);
    if !in_bounds {
        return Err(err(ErrorKind::OffsetOutOfBounds {
            offset: d.offset,
            size,
        }));
    }
    // In bounds of `file_len`; the range must also be addressable.
    let start = usize::try_from(d.offset)
        .ok()
        .and_then(|o| o.checked_add(data_offset))
        .filter(|s| s.checked_add(d.size).is_some())
        .ok_or_else(|| err(ErrorKind::SizeOverflow))?;
    Ok(TensorInfo {
        index,
        name: d.name,
        n_dims: d.n_dims,
        ne: d.ne,
        dtype: d.dtype,
        offset: d.offset,
        start,
        size: d.size,
    })
}
