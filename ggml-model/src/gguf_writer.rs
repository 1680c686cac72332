//! A small GGUF v3 writer (for synthetic models and tests).

use ggml_core::DType;

/// A metadata value to write.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    /// GGUF type 4.
    U32(u32),
    /// GGUF type 5.
    I32(i32),
    /// GGUF type 6.
    F32(f32),
    /// GGUF type 7.
    Bool(bool),
    /// GGUF type 8.
    Str(String),
    /// An array of strings.
    StrArray(Vec<String>),
    /// An array of i32.
    I32Array(Vec<i32>),
    /// An array of f32.
    F32Array(Vec<f32>),
}

/// Collects metadata and tensors, then serialises them as GGUF v3.
#[derive(Clone, Debug, Default)]
pub struct GgufWriter {
    meta: Vec<(String, MetaValue)>,
    tensors: Vec<(String, DType, Vec<u64>, Vec<u8>)>,
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Adds a metadata key.
    pub fn meta(&mut self, key: &str, v: MetaValue) -> &mut Self {
        self.meta.push((key.to_string(), v));
        self
    }

    /// Adds a tensor with dims `ne` (innermost first) and raw `data` bytes.
    pub fn tensor(&mut self, name: &str, dtype: DType, ne: &[u64], data: Vec<u8>) -> &mut Self {
        self.tensors
            .push((name.to_string(), dtype, ne.to_vec(), data));
        self
    }

    /// The data alignment: `general.alignment` if the metadata sets it (a `u32` power of
    /// two, as readers require), else GGUF's default of 32.
    fn alignment(&self) -> Result<usize, String> {
        let key = ggml_core::gguf::ALIGNMENT_KEY;
        match self.meta.iter().rev().find(|(k, _)| k == key) {
            None => Ok(ggml_core::gguf::DEFAULT_ALIGNMENT as usize),
            Some((_, MetaValue::U32(a))) if a.is_power_of_two() => Ok(*a as usize),
            Some((_, v)) => Err(format!("{key} must be a u32 power of two, not {v:?}")),
        }
    }

    /// The file's bytes, or why readers would refuse the file: a bad
    /// `general.alignment`, a key or tensor name given twice, a tensor name longer than
    /// ggml's 63 bytes, or more than 4 dimensions.
    pub fn to_bytes(&self) -> Result<Vec<u8>, String> {
        use ggml_core::gguf::{MAX_DIMS, MAX_TENSOR_NAME_LEN};
        let align = self.alignment()?;
        for (i, (k, _)) in self.meta.iter().enumerate() {
            if self.meta[..i].iter().any(|(other, _)| other == k) {
                return Err(format!("metadata key {k:?} given twice"));
            }
        }
        for (i, (name, _, ne, _)) in self.tensors.iter().enumerate() {
            if name.len() > MAX_TENSOR_NAME_LEN {
                return Err(format!(
                    "tensor name {name:?} is {} bytes, over ggml's limit of {MAX_TENSOR_NAME_LEN}",
                    name.len()
                ));
            }
            if ne.len() > MAX_DIMS {
                return Err(format!(
                    "tensor {name:?} has {} dimensions, over {MAX_DIMS}",
                    ne.len()
                ));
            }
            if self.tensors[..i].iter().any(|(other, ..)| other == name) {
                return Err(format!("tensor name {name:?} given twice"));
            }
        }
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.meta.len() as u64).to_le_bytes());
        let s = |out: &mut Vec<u8>, s: &str| {
            out.extend_from_slice(&(s.len() as u64).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        };
        for (k, v) in &self.meta {
            s(&mut out, k);
            match v {
                MetaValue::U32(x) => {
                    out.extend_from_slice(&4u32.to_le_bytes());
                    out.extend_from_slice(&x.to_le_bytes());
                }
                MetaValue::I32(x) => {
                    out.extend_from_slice(&5u32.to_le_bytes());
                    out.extend_from_slice(&x.to_le_bytes());
                }
                MetaValue::F32(x) => {
                    out.extend_from_slice(&6u32.to_le_bytes());
                    out.extend_from_slice(&x.to_le_bytes());
                }
                MetaValue::Bool(x) => {
                    out.extend_from_slice(&7u32.to_le_bytes());
                    out.push(u8::from(*x));
                }
                MetaValue::Str(x) => {
                    out.extend_from_slice(&8u32.to_le_bytes());
                    s(&mut out, x);
                }
                MetaValue::StrArray(xs) => {
                    out.extend_from_slice(&9u32.to_le_bytes());
                    out.extend_from_slice(&8u32.to_le_bytes());
                    out.extend_from_slice(&(xs.len() as u64).to_le_bytes());
                    for x in xs {
                        s(&mut out, x);
                    }
                }
                MetaValue::I32Array(xs) => {
                    out.extend_from_slice(&9u32.to_le_bytes());
                    out.extend_from_slice(&5u32.to_le_bytes());
                    out.extend_from_slice(&(xs.len() as u64).to_le_bytes());
                    for x in xs {
                        out.extend_from_slice(&x.to_le_bytes());
                    }
                }
                MetaValue::F32Array(xs) => {
                    out.extend_from_slice(&9u32.to_le_bytes());
                    out.extend_from_slice(&6u32.to_le_bytes());
                    out.extend_from_slice(&(xs.len() as u64).to_le_bytes());
                    for x in xs {
                        out.extend_from_slice(&x.to_le_bytes());
                    }
                }
            }
        }
        let mut offset = 0usize;
        for (name, dtype, ne, data) in &self.tensors {
            s(&mut out, name);
            out.extend_from_slice(&(ne.len() as u32).to_le_bytes());
            for d in ne {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&dtype.ggml_id().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offset += data.len().div_ceil(align) * align;
        }
        out.resize(out.len().div_ceil(align) * align, 0);
        for (_, _, _, data) in &self.tensors {
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(align) * align, 0);
        }
        Ok(out)
    }
}
