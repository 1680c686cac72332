//! Data-driven regression matrices: cells and rules read from a TOML file
//! (`harness/matrices/*.toml`), run on whatever devices the runner has.
//!
//! - [`file`](mod@file): the TOML form and its validation (every mistake refused with the file,
//!   line and reason before anything runs);
//! - [`run`]: device checks, running the cells, goldens and blessing;
//! - [`rules`]: the `identical` and `within` rules over one run's results;
//! - [`report`]: the Markdown table and the JSON report.

pub mod file;
pub mod report;
pub mod rules;
pub mod run;

use std::fmt;
use std::path::PathBuf;

use crate::error::Result;
use crate::perplexity::PplSettings;
use crate::regress::Cell;

/// The CPU matrix shipped with the harness (`harness/matrices/cpu.toml`).
pub const CPU_MATRIX: &str = include_str!("../matrices/cpu.toml");

/// The one-GPU CUDA matrix shipped with the harness (`harness/matrices/cuda-1gpu.toml`).
pub const CUDA_1GPU_MATRIX: &str = include_str!("../matrices/cuda-1gpu.toml");

/// The two-GPU CUDA matrix shipped with the harness (`harness/matrices/cuda-2gpu.toml`).
pub const CUDA_2GPU_MATRIX: &str = include_str!("../matrices/cuda-2gpu.toml");

/// The CUDA matrix on cuda-sim's emulated GPUs, run in CI (`harness/matrices/cuda-sim.toml`).
pub const CUDA_SIM_MATRIX: &str = include_str!("../matrices/cuda-sim.toml");
/// The Gemma 3 CPU matrix (`harness/matrices/gemma3.toml`).
pub const GEMMA3_MATRIX: &str = include_str!("../matrices/gemma3.toml");
/// The mixture-of-experts CPU matrix (`harness/matrices/moe.toml`).
pub const MOE_MATRIX: &str = include_str!("../matrices/moe.toml");

/// Where a model or corpus comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The default one: the cached SmolLM2 model, or the embedded GPL-3 corpus.
    Default,
    /// A file.
    Path(PathBuf),
    /// The seeded synthetic llama model with weights of this dtype
    /// (`model = "synthetic:q4_1"` in a matrix file; models only), written to the cache
    /// on first use.
    Synthetic(ggml_core::DType),
}

impl Source {
    /// The file, or `None` for the default and for a synthetic model.
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            Source::Path(p) => Some(p),
            Source::Default | Source::Synthetic(_) => None,
        }
    }

    /// The model file this source names: the file, the cached default model (downloaded
    /// if missing), or the cached synthetic model (written if missing).
    pub fn model_file(&self) -> crate::error::Result<PathBuf> {
        match self {
            Source::Synthetic(dtype) => crate::synthetic::cached_model(*dtype),
            _ => crate::model_path(self.path()),
        }
    }
}

/// Settings every cell starts from.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// The model.
    pub model: Source,
    /// The text perplexity is measured on.
    pub corpus: Source,
    /// Tokens per chunk, per decode call, and the chunk limit.
    pub ppl: PplSettings,
}

/// Perplexity settings one cell sets for itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CellOverrides {
    /// Tokens per chunk.
    pub n_ctx: Option<usize>,
    /// Tokens per decode call.
    pub n_batch: Option<usize>,
    /// Chunk limit.
    pub max_chunks: Option<usize>,
}

/// A named cell of a matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct MatrixCell {
    /// Its name, unique in the matrix (`cpu2-layer-c2-t1`).
    pub name: String,
    /// Devices, split mode, pipeline slots and threads.
    pub cell: Cell,
    /// Its own perplexity settings, if any.
    pub overrides: CellOverrides,
}

impl MatrixCell {
    /// The perplexity settings of this cell, given the matrix's.
    pub fn ppl(&self, defaults: PplSettings) -> PplSettings {
        PplSettings {
            n_ctx: self.overrides.n_ctx.unwrap_or(defaults.n_ctx),
            n_batch: self.overrides.n_batch.unwrap_or(defaults.n_batch),
            max_chunks: self.overrides.max_chunks.or(defaults.max_chunks),
        }
    }
}

/// A rule over the results of one run of the matrix.
#[derive(Clone, Debug, PartialEq)]
pub enum Rule {
    /// These cells must give the same bits (PPL and every logit).
    Identical {
        /// The names or globs as written in the file.
        patterns: Vec<String>,
        /// The cells they name, in matrix order.
        cells: Vec<String>,
    },
    /// The perplexity of `cell` must be within `rel_ppl` (relative) of that of `of`.
    Within {
        /// The cell checked.
        cell: String,
        /// The reference cell.
        of: String,
        /// Largest allowed `|ppl(cell) - ppl(of)| / ppl(of)`.
        rel_ppl: f64,
    },
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Identical { patterns, .. } => write!(f, "identical {patterns:?}"),
            Rule::Within { cell, of, rel_ppl } => {
                write!(
                    f,
                    "within {{ cell = {cell:?}, of = {of:?}, rel_ppl = {rel_ppl} }}"
                )
            }
        }
    }
}

/// A validated matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    /// The file it came from (for messages).
    pub path: String,
    /// Settings shared by every cell.
    pub settings: Settings,
    /// The cells, in file order.
    pub cells: Vec<MatrixCell>,
    /// The rules.
    pub rules: Vec<Rule>,
}

impl Matrix {
    /// Reads and validates a matrix file; relative model and corpus paths in it are
    /// relative to the file's folder.
    pub fn load(path: &std::path::Path) -> Result<Matrix> {
        let text =
            std::fs::read_to_string(path).map_err(|source| crate::error::HarnessError::Io {
                path: path.display().to_string(),
                source,
            })?;
        file::parse(&path.display().to_string(), path.parent(), &text)
    }

    /// The embedded CPU matrix ([`CPU_MATRIX`]).
    pub fn cpu() -> Matrix {
        file::parse("harness/matrices/cpu.toml", None, CPU_MATRIX)
            .expect("the embedded CPU matrix is valid")
    }

    /// A built-in matrix by name: `cpu`, `cuda` (one GPU), `cuda-2gpu`, `cuda-sim`,
    /// `gemma3` (Gemma 3 270M on the CPU) or `moe` (SmolLM2 as 4 experts on the CPU).
    pub fn builtin(name: &str) -> Option<Matrix> {
        let (path, text) = match name {
            "cpu" => ("harness/matrices/cpu.toml", CPU_MATRIX),
            "cuda" | "cuda-1gpu" => ("harness/matrices/cuda-1gpu.toml", CUDA_1GPU_MATRIX),
            "cuda-2gpu" => ("harness/matrices/cuda-2gpu.toml", CUDA_2GPU_MATRIX),
            "cuda-sim" => ("harness/matrices/cuda-sim.toml", CUDA_SIM_MATRIX),
            "gemma3" => ("harness/matrices/gemma3.toml", GEMMA3_MATRIX),
            "moe" => ("harness/matrices/moe.toml", MOE_MATRIX),
            _ => return None,
        };
        Some(file::parse(path, None, text).expect("the built-in matrices are valid"))
    }

    /// The cell named `name`.
    pub fn cell(&self, name: &str) -> Option<&MatrixCell> {
        self.cells.iter().find(|c| c.name == name)
    }
}
