//! `ggml-harness synth-model`: a synthetic test model written as a GGUF file.

use std::path::PathBuf;

use clap::Args;
use harness::error::{HarnessError, Result};

/// The flags of `ggml-harness synth-model`.
#[derive(Args, Debug)]
pub struct SynthModelArgs {
    /// Architecture: llama or gemma3.
    #[arg(long, default_value = "llama")]
    arch: String,
    /// Output GGUF file.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// dtype of every matrix but the token embedding (f32, f16, bf16, q4_0, q4_1,
    /// q5_0, q5_1, q8_0, q4_k, q6_k, ...).
    #[arg(long, default_value = "q4_1", value_name = "T")]
    dtype: String,
    /// Seed of the weights.
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

/// Runs `ggml-harness synth-model`.
pub fn run(a: SynthModelArgs) -> Result<()> {
    let SynthModelArgs {
        arch,
        out,
        dtype,
        seed,
    } = a;
    let dt = harness::synthetic::weight_dtype(&dtype)
        .map_err(|e| HarnessError::Usage(format!("--dtype: {e}")))?;
    let arch = harness::model::Arch::from_name(&arch)?;
    let spec = harness::synthetic::SyntheticSpec {
        seed,
        ..harness::synthetic::SyntheticSpec::tiny_of(arch, dt)
    };
    let bytes = harness::synthetic::synthetic_gguf(&spec);
    std::fs::write(&out, &bytes).map_err(|source| HarnessError::Io {
        path: out.display().to_string(),
        source,
    })?;
    eprintln!(
        "wrote {} ({} bytes): synthetic {arch}, {} layers, n_embd {}, matrices {}",
        out.display(),
        bytes.len(),
        spec.n_layer,
        spec.n_embd,
        dt.name()
    );
    Ok(())
}
