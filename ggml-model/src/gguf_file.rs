//! A memory-mapped GGUF file with owned tensor infos and typed metadata getters whose
//! errors name the key.

use std::path::{Path, PathBuf};

use ggml_core::gguf::{Gguf, Value};
use ggml_core::DType;
use memmap2::Mmap;

use crate::error::{ModelError, Result};

/// A tensor's entry in a GGUF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape, padded with 1s to four dimensions.
    pub ne: [usize; 4],
    /// Byte range of the data within the file.
    pub range: std::ops::Range<usize>,
}

/// An open, validated GGUF file. The bytes stay mapped for the life of the value, so
/// weights can be used in place.
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    tensors: Vec<TensorEntry>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("bytes", &self.map.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps and validates the file at `path`.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let io = |source| ModelError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the file is opened read-only and the mapping is read-only; this crate
        // never writes to it, and a concurrent writer would be outside this program's contract.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let mut f = GgufFile {
            path: path.to_path_buf(),
            map,
            tensors: Vec::new(),
        };
        let tensors = {
            let g = f.gguf()?;
            g.tensors()
                .map(|t| {
                    let ne = t.ne();
                    TensorEntry {
                        name: t.name().to_string(),
                        dtype: t.dtype(),
                        ne: [
                            ne[0] as usize,
                            ne[1] as usize,
                            ne[2] as usize,
                            ne[3] as usize,
                        ],
                        range: t.byte_range(),
                    }
                })
                .collect()
        };
        f.tensors = tensors;
        Ok(f)
    }

    /// The parsed file (validated when opened, so this only fails if the file changed).
    pub fn gguf(&self) -> Result<Gguf<'_>> {
        Gguf::parse(&self.map).map_err(|e| ModelError::Gguf {
            path: self.path.display().to_string(),
            detail: e.to_string(),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// All bytes of the file.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorEntry] {
        &self.tensors
    }

    /// The tensor named `name`.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorEntry> {
        self.tensors.iter().find(|t| t.name == name)
    }

    fn value<T>(
        &self,
        key: &str,
        expected: &'static str,
        get: impl FnOnce(&Value<'_>) -> Option<T>,
    ) -> Result<T> {
        let g = self.gguf()?;
        let v = g
            .get(key)
            .ok_or_else(|| ModelError::MissingKey(key.to_string()))?;
        get(&v).ok_or_else(|| ModelError::KeyType {
            key: key.to_string(),
            found: v.value_type().to_string(),
            expected,
        })
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<String> {
        self.value(key, "string", |v| v.as_str().map(str::to_string))
    }

    /// Any integer value that fits `usize`.
    pub fn get_usize(&self, key: &str) -> Result<usize> {
        self.value(key, "a non-negative integer", |v| v.to_usize())
    }

    /// An f32 value.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.value(key, "f32", |v| v.as_f32())
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.value(key, "bool", |v| v.as_bool())
    }
}
