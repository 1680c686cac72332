//! Goldens: the perplexity bits and logits hash a configuration must reproduce.
//!
//! A golden is keyed by what determines the bits: the hardware class whose kernels ran
//! (`cpu` for every x86-64 and aarch64 CPU, since all CPU ISA paths are bit-identical to
//! the reference), the model and text (by SHA-256) and the perplexity settings. Device
//! count, split mode, pipeline slots and threads are *not* part of the key: invariant 2
//! says they never change the bits, and the regression matrix checks exactly that. The
//! one computation that does change them on purpose, tensor-reduce (partial sums of
//! several devices added), is a key's `variant`: its bits depend on how many devices
//! share each sum and whether the sums cross as BF16, and on nothing else.

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{HarnessError, Result};
use crate::regress::CellResult;

/// The goldens shipped with the harness (`harness/goldens.json`).
pub const EMBEDDED: &str = include_str!("../goldens.json");

/// What determines the bits of a perplexity run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GoldenKey {
    /// Hardware class of the kernels (`cpu`, `cuda-sm90-NVIDIA-H100-80GB-HBM3-drv13000`, ...).
    pub hardware: String,
    /// SHA-256 of the model file, hex.
    pub model_sha256: String,
    /// SHA-256 of the text, hex.
    pub text_sha256: String,
    /// Tokens per chunk.
    pub n_ctx: usize,
    /// Tokens per decode call.
    pub n_batch: usize,
    /// Chunk limit (`None`: the whole text).
    pub chunks: Option<usize>,
    /// `None` for the exact computation; for tensor-reduce, `tensor-reduce:N:f32` or
    /// `tensor-reduce:N:bf16>=B` (N devices, BF16 from B bytes); `decode-class` (after
    /// a tensor-reduce variant: `...:decode-class`) for GPU cells whose micro-batches
    /// are under 8 tokens, which run the GPU's decode kernel class (DESIGN.md,
    /// invariant 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

/// A recorded result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Golden {
    /// What it applies to.
    #[serde(flatten)]
    pub key: GoldenKey,
    /// Perplexity (for people; the bits decide).
    pub ppl: f64,
    /// Perplexity f64 bits, hex.
    pub ppl_f64_bits: String,
    /// SHA-256 over the f32 bits of every scored logit.
    pub logits_sha256: String,
}

impl Golden {
    /// Whether `result` has exactly this golden's bits (PPL and every scored logit).
    pub fn matches(&self, result: &CellResult) -> bool {
        self.ppl_f64_bits == result.ppl_f64_bits && self.logits_sha256 == result.logits_sha256
    }
}

/// A set of goldens, as stored in `goldens.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GoldenSet {
    /// The entries, at most one per key.
    pub goldens: Vec<Golden>,
}

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl GoldenSet {
    /// Parses a golden file.
    pub fn parse(text: &str) -> Result<GoldenSet> {
        serde_json::from_str(text)
            .map_err(|e| HarnessError::Usage(format!("golden file is not valid: {e}")))
    }

    /// Reads a golden file; a missing file is an empty set.
    pub fn load(path: &Path) -> Result<GoldenSet> {
        match std::fs::read_to_string(path) {
            Ok(t) => GoldenSet::parse(&t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(GoldenSet::default()),
            Err(source) => Err(HarnessError::Io {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    /// Writes the set as pretty JSON (entries sorted by key, so diffs stay small).
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut sorted = self.clone();
        sorted.goldens.sort_by(|a, b| {
            let k = |g: &Golden| {
                (
                    g.key.hardware.clone(),
                    g.key.model_sha256.clone(),
                    g.key.text_sha256.clone(),
                    g.key.n_ctx,
                    g.key.n_batch,
                    g.key.chunks,
                )
            };
            k(a).cmp(&k(b))
        });
        let text = serde_json::to_string_pretty(&sorted)
            .map_err(|e| HarnessError::Usage(e.to_string()))?;
        std::fs::write(path, text + "\n").map_err(|source| HarnessError::Io {
            path: path.display().to_string(),
            source,
        })
    }

    /// The golden of `key`, if any.
    pub fn find(&self, key: &GoldenKey) -> Option<&Golden> {
        self.goldens.iter().find(|g| &g.key == key)
    }

    /// Records `golden`, replacing the entry with the same key.
    pub fn record(&mut self, golden: Golden) {
        self.goldens.retain(|g| g.key != golden.key);
        self.goldens.push(golden);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::SplitMode;

    fn key() -> GoldenKey {
        GoldenKey {
            hardware: "cpu".into(),
            model_sha256: "aa".into(),
            text_sha256: "bb".into(),
            n_ctx: 512,
            n_batch: 512,
            chunks: None,
            variant: None,
        }
    }

    fn cell(bits: &str, devices: &str) -> CellResult {
        CellResult {
            devices: devices.into(),
            split_mode: SplitMode::Layer,
            n_copies: 2,
            threads: 1,
            n_ubatch: 0,
            all_gather: Default::default(),
            ppl: 18.0,
            ppl_f64_bits: bits.into(),
            logits_sha256: "cc".into(),
            seconds: 0.0,
            host_syncs_per_forward: 1.0,
            races: 0,
        }
    }

    #[test]
    fn embedded_goldens_parse() {
        let set = GoldenSet::parse(EMBEDDED).unwrap();
        assert!(set.goldens.iter().all(|g| g.ppl_f64_bits.len() == 16));
    }

    #[test]
    fn find_and_matches_tell_missing_equal_and_moved_apart() {
        let mut set = GoldenSet::default();
        assert!(set.find(&key()).is_none());
        set.record(Golden {
            key: key(),
            ppl: 18.0,
            ppl_f64_bits: "01".into(),
            logits_sha256: "cc".into(),
        });
        let g = set.find(&key()).unwrap();
        assert!(g.matches(&cell("01", "cpu")));
        assert!(!g.matches(&cell("02", "cpu:3")));
        let mut other_logits = cell("01", "cpu");
        other_logits.logits_sha256 = "dd".into();
        assert!(!g.matches(&other_logits));
        let mut other = key();
        other.n_ctx = 128;
        assert!(set.find(&other).is_none());
    }

    #[test]
    fn record_replaces_and_save_round_trips() {
        let mut set = GoldenSet::default();
        for bits in ["01", "02"] {
            set.record(Golden {
                key: key(),
                ppl: 18.0,
                ppl_f64_bits: bits.into(),
                logits_sha256: "cc".into(),
            });
        }
        assert_eq!(set.goldens.len(), 1);
        let path = std::env::temp_dir().join(format!("goldens-{}.json", std::process::id()));
        set.save(&path).unwrap();
        let back = GoldenSet::load(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(back, set);
        assert!(GoldenSet::load(&path).unwrap().goldens.is_empty());
        assert!(GoldenSet::parse("{").is_err());
    }
}
