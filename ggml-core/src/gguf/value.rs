//! Metadata values: scalars, strings and lazily read arrays, all borrowing the file.

use core::fmt;
use core::marker::PhantomData;

use super::error::{ErrorKind, MAX_ARRAY_DEPTH};
use super::reader::{Cursor, Raw};

/// The type of a metadata value, numbered as in GGUF (`enum gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    /// `uint8`.
    U8 = 0,
    /// `int8`.
    I8 = 1,
    /// `uint16`.
    U16 = 2,
    /// `int16`.
    I16 = 3,
    /// `uint32`.
    U32 = 4,
    /// `int32`.
    I32 = 5,
    /// `float32`.
    F32 = 6,
    /// `bool`, one byte, 0 or 1.
    Bool = 7,
    /// UTF-8 string with a u64 length prefix.
    String = 8,
    /// Array: element type, u64 count, elements.
    Array = 9,
    /// `uint64`.
    U64 = 10,
    /// `int64`.
    I64 = 11,
    /// `float64`.
    F64 = 12,
}

impl ValueType {
    /// The type with GGUF id `id`.
    pub const fn from_id(id: u32) -> Option<ValueType> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    /// The GGUF id.
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// Bytes of one value for fixed-size types; `None` for strings and arrays.
    pub const fn fixed_size(self) -> Option<usize> {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => Some(1),
            ValueType::U16 | ValueType::I16 => Some(2),
            ValueType::U32 | ValueType::I32 | ValueType::F32 => Some(4),
            ValueType::U64 | ValueType::I64 | ValueType::F64 => Some(8),
            ValueType::String | ValueType::Array => None,
        }
    }

    /// Fewest bytes a value of this type takes (a string's length prefix, an array's
    /// element type and count).
    pub const fn min_size(self) -> usize {
        match self.fixed_size() {
            Some(n) => n,
            None => match self {
                ValueType::String => 8,
                _ => 12,
            },
        }
    }

    /// GGUF's name of the type (`"u32"`, `"string"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value, borrowing the file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value<'a> {
    /// `uint8`.
    U8(u8),
    /// `int8`.
    I8(i8),
    /// `uint16`.
    U16(u16),
    /// `int16`.
    I16(i16),
    /// `uint32`.
    U32(u32),
    /// `int32`.
    I32(i32),
    /// `uint64`.
    U64(u64),
    /// `int64`.
    I64(i64),
    /// `float32`.
    F32(f32),
    /// `float64`.
    F64(f64),
    /// `bool`.
    Bool(bool),
    /// A UTF-8 string.
    String(&'a str),
    /// An array, read lazily.
    Array(ArrayValue<'a>),
}

macro_rules! exact_getters {
    ($($(#[$doc:meta])* $name:ident => $variant:ident : $t:ty;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(&self) -> Option<$t> {
                match *self {
                    Value::$variant(v) => Some(v),
                    _ => None,
                }
            }
        )*
    };
}

macro_rules! tolerant_getters {
    ($($(#[$doc:meta])* $name:ident -> $t:ty;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(&self) -> Option<$t> {
                match *self {
                    Value::U8(v) => <$t>::try_from(v).ok(),
                    Value::I8(v) => <$t>::try_from(v).ok(),
                    Value::U16(v) => <$t>::try_from(v).ok(),
                    Value::I16(v) => <$t>::try_from(v).ok(),
                    Value::U32(v) => <$t>::try_from(v).ok(),
                    Value::I32(v) => <$t>::try_from(v).ok(),
                    Value::U64(v) => <$t>::try_from(v).ok(),
                    Value::I64(v) => <$t>::try_from(v).ok(),
                    _ => None,
                }
            }
        )*
    };
}

impl<'a> Value<'a> {
    /// The value's type.
    pub const fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F32(_) => ValueType::F32,
            Value::F64(_) => ValueType::F64,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
        }
    }

    exact_getters! {
        /// The value if it is a `u8`.
        as_u8 => U8: u8;
        /// The value if it is an `i8`.
        as_i8 => I8: i8;
        /// The value if it is a `u16`.
        as_u16 => U16: u16;
        /// The value if it is an `i16`.
        as_i16 => I16: i16;
        /// The value if it is a `u32`.
        as_u32 => U32: u32;
        /// The value if it is an `i32`.
        as_i32 => I32: i32;
        /// The value if it is a `u64`.
        as_u64 => U64: u64;
        /// The value if it is an `i64`.
        as_i64 => I64: i64;
        /// The value if it is an `f32`.
        as_f32 => F32: f32;
        /// The value if it is an `f64`.
        as_f64 => F64: f64;
        /// The value if it is a `bool`.
        as_bool => Bool: bool;
    }

    tolerant_getters! {
        /// The value if it is an integer of any type that fits `u32`.
        to_u32 -> u32;
        /// The value if it is an integer of any type that fits `i32`.
        to_i32 -> i32;
        /// The value if it is an integer of any type that fits `u64`.
        to_u64 -> u64;
        /// The value if it is an integer of any type that fits `i64`.
        to_i64 -> i64;
        /// The value if it is an integer of any type that fits `usize`.
        to_usize -> usize;
    }

    /// The value if it is a string.
    pub fn as_str(&self) -> Option<&'a str> {
        match *self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value if it is an array.
    pub fn as_array(&self) -> Option<ArrayValue<'a>> {
        match *self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// An array value: element type, count, and the bytes of the elements, read lazily.
///
/// The parser validated every element, so reading never fails.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ArrayValue<'a> {
    elem_type: ValueType,
    len: usize,
    data: &'a [u8],
    depth: u8,
}

impl fmt::Debug for ArrayValue<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArrayValue")
            .field("elem_type", &self.elem_type)
            .field("len", &self.len)
            .field("bytes", &self.data.len())
            .finish()
    }
}

impl<'a> ArrayValue<'a> {
    /// Type of the elements.
    pub fn elem_type(&self) -> ValueType {
        self.elem_type
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Nesting depth: 1 for an array that is a metadata value, 2 for its elements if
    /// they are arrays, and so on.
    pub fn depth(&self) -> usize {
        self.depth as usize
    }

    /// The raw little-endian bytes of all elements (for strings and arrays, including
    /// their length prefixes and headers).
    pub fn raw_bytes(&self) -> &'a [u8] {
        self.data
    }

    /// The elements as [`Value`]s.
    pub fn iter(&self) -> ArrayIter<'a> {
        ArrayIter {
            cur: Cursor::new(self.data, 0),
            elem_type: self.elem_type,
            left: self.len,
            depth: self.depth,
        }
    }

    /// Element `i`: constant time for fixed-size elements, linear for strings and arrays.
    pub fn get(&self, i: usize) -> Option<Value<'a>> {
        if i >= self.len {
            return None;
        }
        match self.elem_type.fixed_size() {
            Some(size) => {
                let start = i.checked_mul(size)?;
                let bytes = self.data.get(start..start.checked_add(size)?)?;
                read_value(&mut Cursor::new(bytes, 0), self.elem_type, self.depth).ok()
            }
            None => self.iter().nth(i),
        }
    }

    /// The elements as strings, if they are strings.
    pub fn strings(&self) -> Option<Strings<'a>> {
        (self.elem_type == ValueType::String).then(|| Strings {
            cur: Cursor::new(self.data, 0),
            left: self.len,
        })
    }

    /// The elements as numbers of type `T`, if the element type is exactly `T`'s
    /// (e.g. `numbers::<f32>()` on an `f32` array).
    pub fn numbers<T: ArrayElement>(&self) -> Option<Numbers<'a, T>> {
        (self.elem_type == T::TYPE).then(|| Numbers {
            chunks: self.data.chunks_exact(T::SIZE),
            _t: PhantomData,
        })
    }

    /// Copies the elements into `out` if their type is exactly `T`'s; returns how many
    /// were copied (`min(len, out.len())`).
    pub fn copy_into<T: ArrayElement>(&self, out: &mut [T]) -> Option<usize> {
        let mut n = 0;
        for (dst, src) in out.iter_mut().zip(self.numbers::<T>()?) {
            *dst = src;
            n += 1;
        }
        Some(n)
    }

    /// Nested arrays, if the elements are arrays.
    pub fn arrays(&self) -> Option<impl Iterator<Item = ArrayValue<'a>> + 'a> {
        (self.elem_type == ValueType::Array).then(|| self.iter().filter_map(|v| v.as_array()))
    }
}

impl<'a> IntoIterator for ArrayValue<'a> {
    type Item = Value<'a>;
    type IntoIter = ArrayIter<'a>;

    fn into_iter(self) -> ArrayIter<'a> {
        self.iter()
    }
}

/// Iterator over an array's elements as [`Value`]s.
#[derive(Clone, Debug)]
pub struct ArrayIter<'a> {
    cur: Cursor<'a>,
    elem_type: ValueType,
    left: usize,
    depth: u8,
}

impl<'a> Iterator for ArrayIter<'a> {
    type Item = Value<'a>;

    fn next(&mut self) -> Option<Value<'a>> {
        if self.left == 0 {
            return None;
        }
        match read_value(&mut self.cur, self.elem_type, self.depth) {
            Ok(v) => {
                self.left -= 1;
                Some(v)
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

impl ExactSizeIterator for ArrayIter<'_> {}

/// Iterator over the elements of a string array.
#[derive(Clone, Debug)]
pub struct Strings<'a> {
    cur: Cursor<'a>,
    left: usize,
}

impl<'a> Iterator for Strings<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.left == 0 {
            return None;
        }
        match self.cur.string(u64::MAX) {
            Ok(s) => {
                self.left -= 1;
                Some(s)
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

impl ExactSizeIterator for Strings<'_> {}

/// Iterator over the elements of a numeric (or bool) array as `T`.
#[derive(Clone, Debug)]
pub struct Numbers<'a, T> {
    chunks: core::slice::ChunksExact<'a, u8>,
    _t: PhantomData<T>,
}

impl<T: ArrayElement> Iterator for Numbers<'_, T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        T::from_le(self.chunks.next()?)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.chunks.size_hint()
    }
}

impl<T: ArrayElement> ExactSizeIterator for Numbers<'_, T> {}

mod sealed {
    pub trait Sealed {}
}

/// A fixed-size element type of a GGUF array (`u8` ... `f64`, `bool`).
pub trait ArrayElement: Copy + sealed::Sealed {
    /// The GGUF type of this element type.
    const TYPE: ValueType;
    /// Bytes per element.
    const SIZE: usize;
    /// Decodes one element from its little-endian bytes (`None` if `bytes` has the
    /// wrong length).
    fn from_le(bytes: &[u8]) -> Option<Self>;
}

macro_rules! array_element {
    ($($t:ty => $vt:ident),*) => {
        $(
            impl sealed::Sealed for $t {}
            impl ArrayElement for $t {
                const TYPE: ValueType = ValueType::$vt;
                const SIZE: usize = core::mem::size_of::<$t>();
                fn from_le(bytes: &[u8]) -> Option<Self> {
                    Some(<$t>::from_le_bytes(*bytes.first_chunk()?))
                }
            }
        )*
    };
}

array_element!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32,
    u64 => U64, i64 => I64, f32 => F32, f64 => F64);

impl sealed::Sealed for bool {}
impl ArrayElement for bool {
    const TYPE: ValueType = ValueType::Bool;
    const SIZE: usize = 1;
    fn from_le(bytes: &[u8]) -> Option<Self> {
        Some(*bytes.first()? != 0)
    }
}

/// Reads a value of type `ty`; `depth` is the nesting depth of the array holding it
/// (0 for a metadata value). Every element of an array is validated.
pub(crate) fn read_value<'a>(
    cur: &mut Cursor<'a>,
    ty: ValueType,
    depth: u8,
) -> Result<Value<'a>, Raw> {
    Ok(match ty {
        ValueType::U8 => Value::U8(cur.u8()?),
        ValueType::I8 => Value::I8(i8::from_le_bytes(cur.array()?)),
        ValueType::U16 => Value::U16(u16::from_le_bytes(cur.array()?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(cur.array()?)),
        ValueType::U32 => Value::U32(cur.u32()?),
        ValueType::I32 => Value::I32(i32::from_le_bytes(cur.array()?)),
        ValueType::U64 => Value::U64(cur.u64()?),
        ValueType::I64 => Value::I64(i64::from_le_bytes(cur.array()?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(cur.array()?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(cur.array()?)),
        ValueType::Bool => {
            let at = cur.pos();
            match cur.u8()? {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                value => return Err(Raw::new(ErrorKind::BadBool { value }, at)),
            }
        }
        ValueType::String => Value::String(cur.string(u64::MAX)?),
        ValueType::Array => Value::Array(read_array(cur, depth.saturating_add(1))?),
    })
}

/// Reads an array header and validates its elements; `depth` is this array's depth.
fn read_array<'a>(cur: &mut Cursor<'a>, depth: u8) -> Result<ArrayValue<'a>, Raw> {
    if depth as usize > MAX_ARRAY_DEPTH {
        return Err(Raw::new(
            ErrorKind::NestedTooDeep {
                max_depth: MAX_ARRAY_DEPTH as u32,
            },
            cur.pos(),
        ));
    }
    let type_at = cur.pos();
    let type_id = cur.u32()?;
    let elem_type = ValueType::from_id(type_id)
        .ok_or_else(|| Raw::new(ErrorKind::BadValueType { type_id }, type_at))?;
    let count_at = cur.pos();
    let count = cur.u64()?;
    let max = (cur.remaining() / elem_type.min_size()) as u64;
    if count > max {
        return Err(Raw::new(ErrorKind::CountTooLarge { count, max }, count_at));
    }
    // `count <= remaining bytes`, so it fits usize and `count * size` does not overflow.
    let len = count as usize;
    let start = cur.pos();
    match elem_type.fixed_size() {
        Some(size) => {
            let data = cur.take(len * size)?;
            if elem_type == ValueType::Bool {
                if let Some(i) = data.iter().position(|&b| b > 1) {
                    let mut raw = Raw::new(
                        ErrorKind::BadBool {
                            value: data.get(i).copied().unwrap_or(0),
                        },
                        start.saturating_add(i),
                    );
                    raw.path.push_front(i);
                    return Err(raw);
                }
            }
        }
        None => {
            for i in 0..len {
                if let Err(mut raw) = read_value(cur, elem_type, depth) {
                    raw.path.push_front(i);
                    return Err(raw);
                }
            }
        }
    }
    let data = cur.buf().get(start..cur.pos()).unwrap_or(&[]);
    Ok(ArrayValue {
        elem_type,
        len,
        data,
        depth,
    })
}
