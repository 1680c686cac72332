//! Synthetic models ([`ggml_model::synthetic`], re-exported here) and their copies in the
//! model cache, which the harness's tests and matrices open by path.

use std::path::PathBuf;

use ggml_core::DType;
use ggml_model::model::Arch;

pub use ggml_model::synthetic::*;

use crate::error::{HarnessError, Result};

/// The file of [`SyntheticSpec::tiny`]`(dtype)` in the model cache
/// (`$GGML_RS_CACHE`, default `~/.cache/ggml-rs`), written there if it is missing or
/// differs (the generator is deterministic, so the bytes are known).
pub fn cached_model(dtype: DType) -> Result<PathBuf> {
    cached_model_of(Arch::Llama, dtype)
}

/// The file of [`SyntheticSpec::tiny_of`]`(arch, dtype)` in the model cache, written
/// there if it is missing or differs.
pub fn cached_model_of(arch: Arch, dtype: DType) -> Result<PathBuf> {
    let stem = match arch {
        Arch::Llama => format!("synthetic-{}", dtype.name()),
        other => format!("synthetic-{}-{}", other.name(), dtype.name()),
    };
    cached_spec(&stem, &SyntheticSpec::tiny_of(arch, dtype))
}

/// The file of [`SyntheticSpec::tiny_moe`]`(dtype)` in the model cache, written there if
/// it is missing or differs.
pub fn cached_moe_model(dtype: DType) -> Result<PathBuf> {
    cached_spec(
        &format!("synthetic-moe-{}", dtype.name()),
        &SyntheticSpec::tiny_moe(dtype),
    )
}

/// The model of `spec` in the cache as `{stem}.gguf`.
fn cached_spec(stem: &str, spec: &SyntheticSpec) -> Result<PathBuf> {
    let dir = crate::fetch::cache_dir().map_err(HarnessError::Model)?;
    let path = dir.join(format!("{stem}.gguf"));
    write_synthetic(spec, &path)?;
    Ok(path)
}
