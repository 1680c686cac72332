//! Test-only GGUF writer (uses std), able to write malformed files on purpose, and a
//! helper that touches every accessor of a parsed file.
#![allow(dead_code)]

pub mod getters;

use ggml_core::gguf::{Gguf, Value};
use ggml_core::DType;

/// A metadata value to write.
#[derive(Clone, Debug)]
pub enum Val {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    /// A string from raw bytes (may be invalid UTF-8).
    RawStr(Vec<u8>),
    /// An array of the given element type id; elements are written by their payload.
    Array(u32, Vec<Val>),
    /// An array header with an arbitrary count, followed by raw bytes.
    ArrayRaw {
        elem: u32,
        count: u64,
        bytes: Vec<u8>,
    },
    /// Any type id followed by raw bytes.
    Raw {
        type_id: u32,
        bytes: Vec<u8>,
    },
}

impl Val {
    pub fn type_id(&self) -> u32 {
        match self {
            Val::U8(_) => 0,
            Val::I8(_) => 1,
            Val::U16(_) => 2,
            Val::I16(_) => 3,
            Val::U32(_) => 4,
            Val::I32(_) => 5,
            Val::F32(_) => 6,
            Val::Bool(_) => 7,
            Val::Str(_) | Val::RawStr(_) => 8,
            Val::Array(..) | Val::ArrayRaw { .. } => 9,
            Val::U64(_) => 10,
            Val::I64(_) => 11,
            Val::F64(_) => 12,
            Val::Raw { type_id, .. } => *type_id,
        }
    }

    pub fn write_payload(&self, out: &mut Vec<u8>) {
        match self {
            Val::U8(v) => out.push(*v),
            Val::I8(v) => out.extend(v.to_le_bytes()),
            Val::U16(v) => out.extend(v.to_le_bytes()),
            Val::I16(v) => out.extend(v.to_le_bytes()),
            Val::U32(v) => out.extend(v.to_le_bytes()),
            Val::I32(v) => out.extend(v.to_le_bytes()),
            Val::U64(v) => out.extend(v.to_le_bytes()),
            Val::I64(v) => out.extend(v.to_le_bytes()),
            Val::F32(v) => out.extend(v.to_le_bytes()),
            Val::F64(v) => out.extend(v.to_le_bytes()),
            Val::Bool(v) => out.push(*v as u8),
            Val::Str(s) => write_str(out, s.as_bytes()),
            Val::RawStr(s) => write_str(out, s),
            Val::Array(elem, items) => {
                out.extend(elem.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for it in items {
                    it.write_payload(out);
                }
            }
            Val::ArrayRaw { elem, count, bytes } => {
                out.extend(elem.to_le_bytes());
                out.extend(count.to_le_bytes());
                out.extend(bytes);
            }
            Val::Raw { bytes, .. } => out.extend(bytes),
        }
    }
}

pub fn write_str(out: &mut Vec<u8>, s: &[u8]) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s);
}

/// A tensor info to write.
#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: Vec<u8>,
    pub dims: Vec<u64>,
    /// Written instead of `dims.len()` if set.
    pub n_dims: Option<u32>,
    pub type_id: u32,
    /// Written instead of the packed offset if set.
    pub offset: Option<u64>,
}

impl TensorSpec {
    pub fn new(name: &str, dims: &[u64], dtype: DType) -> TensorSpec {
        TensorSpec {
            name: name.as_bytes().to_vec(),
            dims: dims.to_vec(),
            n_dims: None,
            type_id: dtype.ggml_id(),
            offset: None,
        }
    }

    /// Data size, if the type is known and the size reasonable.
    pub fn size(&self) -> Option<u64> {
        let dtype = DType::from_ggml_id(self.type_id)?;
        let n: u64 = self
            .dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
        let bs = dtype.block_size() as u64;
        (n % bs == 0 && n < (1 << 24)).then(|| n / bs * dtype.type_size() as u64)
    }
}

/// A GGUF file to write; every field can be bent to make malformed files.
#[derive(Clone, Debug)]
pub struct Builder {
    pub magic: [u8; 4],
    pub version: u32,
    /// Written instead of `tensors.len()` if set.
    pub n_tensors: Option<u64>,
    /// Written instead of `kvs.len()` if set.
    pub n_kv: Option<u64>,
    pub kvs: Vec<(Vec<u8>, Val)>,
    pub tensors: Vec<TensorSpec>,
    /// Alignment used to lay out the data section (set `general.alignment` separately).
    pub alignment: u64,
    /// Pad the end of the data section to the alignment.
    pub pad_end: bool,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            magic: *b"GGUF",
            version: 3,
            n_tensors: None,
            n_kv: None,
            kvs: Vec::new(),
            tensors: Vec::new(),
            alignment: 32,
            pad_end: true,
        }
    }
}

/// The byte value of tensor `t`'s data at position `j`.
pub fn data_byte(t: usize, j: usize) -> u8 {
    (t.wrapping_mul(31).wrapping_add(j.wrapping_mul(7)) % 251) as u8
}

fn align(n: u64, a: u64) -> u64 {
    n.div_ceil(a) * a
}

impl Builder {
    pub fn new() -> Builder {
        Builder::default()
    }

    pub fn kv(mut self, key: &str, v: Val) -> Builder {
        self.kvs.push((key.as_bytes().to_vec(), v));
        self
    }

    pub fn tensor(mut self, name: &str, dims: &[u64], dtype: DType) -> Builder {
        self.tensors.push(TensorSpec::new(name, dims, dtype));
        self
    }

    /// The packed offsets the writer uses for tensors without an explicit offset.
    pub fn offsets(&self) -> Vec<u64> {
        let mut next = 0u64;
        self.tensors
            .iter()
            .map(|t| match t.offset {
                Some(o) => o,
                None => {
                    let o = next;
                    next = align(next + t.size().unwrap_or(0), self.alignment);
                    o
                }
            })
            .collect()
    }

    /// Bytes of the header (everything before the data section), unpadded.
    pub fn header(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(self.magic);
        out.extend(self.version.to_le_bytes());
        out.extend(
            self.n_tensors
                .unwrap_or(self.tensors.len() as u64)
                .to_le_bytes(),
        );
        out.extend(self.n_kv.unwrap_or(self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            write_str(&mut out, k);
            out.extend(v.type_id().to_le_bytes());
            v.write_payload(&mut out);
        }
        for (t, off) in self.tensors.iter().zip(self.offsets()) {
            write_str(&mut out, &t.name);
            out.extend(t.n_dims.unwrap_or(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.type_id.to_le_bytes());
            out.extend(off.to_le_bytes());
        }
        out
    }

    pub fn build(&self) -> Vec<u8> {
        let mut out = self.header();
        let data_start = align(out.len() as u64, self.alignment) as usize;
        out.resize(data_start, 0);
        let mut end = 0usize;
        let placed: Vec<(usize, usize)> = self
            .tensors
            .iter()
            .zip(self.offsets())
            .filter_map(|(t, off)| {
                let size = t.size()?;
                (off.checked_add(size)? <= 1 << 24).then_some((off as usize, size as usize))
            })
            .collect();
        for &(off, size) in &placed {
            end = end.max(off + size);
        }
        if self.pad_end {
            end = align(end as u64, self.alignment) as usize;
        }
        out.resize(data_start + end, 0);
        for (i, (t, off)) in self.tensors.iter().zip(self.offsets()).enumerate() {
            let Some(size) = t.size() else { continue };
            if off.checked_add(size).is_none_or(|end| end > 1 << 24) {
                continue;
            }
            for j in 0..size as usize {
                out[data_start + off as usize + j] = data_byte(i, j);
            }
        }
        out
    }
}

/// A small valid file: a few metadata types, three tensors of different dtypes.
pub fn sample() -> Builder {
    Builder::new()
        .kv("general.architecture", Val::Str("llama".into()))
        .kv("llama.block_count", Val::U32(2))
        .kv("llama.context_length", Val::I32(128))
        .kv("llama.rope.freq_base", Val::F32(10000.0))
        .kv(
            "tokenizer.ggml.tokens",
            Val::Array(
                8,
                vec![
                    Val::Str("<s>".into()),
                    Val::Str("a".into()),
                    Val::Str("é".into()),
                ],
            ),
        )
        .kv(
            "tokenizer.ggml.scores",
            Val::Array(6, vec![Val::F32(0.0), Val::F32(-1.5), Val::F32(2.25)]),
        )
        .kv("general.flag", Val::Bool(true))
        .tensor("token_embd.weight", &[64, 3], DType::Q8_0)
        .tensor("output_norm.weight", &[64], DType::F32)
        .tensor("blk.0.attn_q.weight", &[256, 2], DType::Q4K)
}

/// Touches every accessor of a parsed file; returns a checksum so nothing is optimised
/// away. Panics only where the parser broke one of its own promises.
pub fn touch_all(g: &Gguf<'_>, file: &[u8]) -> u64 {
    let mut sum = 0u64;
    sum ^= g.version() as u64 ^ g.alignment() as u64 ^ g.data_offset() as u64;
    sum ^= g.file_len() ^ g.bytes().len() as u64;
    let mut n = 0;
    for (k, v) in g.metadata() {
        n += 1;
        sum = sum.wrapping_add(k.len() as u64);
        sum = sum.wrapping_add(touch_value(&v));
        assert_eq!(g.get(k), Some(v), "get({k:?}) disagrees with metadata()");
        getters::call_every_getter(g, k);
    }
    assert_eq!(n, g.metadata_count());
    assert_eq!(g.metadata().len(), g.metadata_count());
    let mut n = 0;
    for t in g.tensors() {
        assert_eq!(t.index(), n);
        n += 1;
        let r = t.byte_range();
        assert!(r.end <= file.len(), "tensor data out of the file");
        assert_eq!(r.len(), t.n_bytes());
        assert_eq!(t.data(file).len(), t.n_bytes());
        match g.tensor_data(&t) {
            Some(d) => assert_eq!(d, t.data(file)),
            None => assert!(r.end > g.bytes().len(), "tensor_data refused data it holds"),
        }
        assert_eq!(t.dims().len(), t.n_dims());
        assert!(t.n_dims() <= 4);
        assert_eq!(t.offset() as usize + g.data_offset(), r.start);
        assert_eq!(t.offset() % g.alignment() as u64, 0);
        assert_eq!(t.ne()[0] % t.dtype().block_size() as u64, 0);
        sum = sum
            .wrapping_add(t.n_elements())
            .wrapping_add(t.data(file).iter().map(|&b| b as u64).sum::<u64>());
        assert_eq!(g.tensor(t.name()), Some(t));
        assert_eq!(g.tensor_at(t.index()), Some(t));
    }
    assert_eq!(n, g.tensor_count());
    let _ = g.check_packed_layout();
    let _ = format!("{g:?}");
    sum
}

fn touch_value(v: &Value<'_>) -> u64 {
    let mut sum = v.value_type().id() as u64;
    getters::call_every_conversion(v);
    if let Some(a) = v.as_array() {
        assert_eq!(a.iter().len(), a.len());
        let mut n = 0;
        for e in a.iter() {
            assert_eq!(e.value_type(), a.elem_type());
            sum = sum.wrapping_add(touch_value(&e));
            n += 1;
        }
        assert_eq!(n, a.len());
        if let Some(s) = a.strings() {
            assert_eq!(s.count(), a.len());
        }
        macro_rules! nums {
            ($($t:ty),*) => {$(
                if let Some(it) = a.numbers::<$t>() {
                    assert_eq!(it.count(), a.len());
                    let mut buf = [<$t>::default(); 4];
                    let copied = a.copy_into(&mut buf[..]).unwrap();
                    assert_eq!(copied, a.len().min(4));
                }
            )*};
        }
        nums!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64, bool);
        if let Some(arrs) = a.arrays() {
            assert_eq!(arrs.count(), a.len());
        }
        if !a.is_empty() {
            assert!(a.get(0).is_some());
            assert!(a.get(a.len() - 1).is_some());
        }
        assert!(a.get(a.len()).is_none());
        sum = sum.wrapping_add(a.raw_bytes().len() as u64 + a.depth() as u64);
    }
    sum
}
