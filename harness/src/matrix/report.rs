//! What a matrix run reports: a Markdown table for people, JSON for machines.

use std::path::Path;

use serde::Serialize;

use super::rules::Violation;
use crate::error::{HarnessError, Result};
use crate::golden::Golden;
use crate::regress::CellResult;

/// How a cell compares with its golden.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum GoldenStatus {
    /// Same bits as the golden.
    Equal,
    /// No golden for the cell's key.
    Missing,
    /// Bits differ from the golden.
    Moved,
    /// Not compared (the run records goldens instead).
    Blessing,
    /// Not compared: the cell is in no identical group (it answers to tolerances).
    NotCompared,
}

/// One cell of one run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// The cell's name.
    pub name: String,
    /// The chaos seed of the run, if any.
    pub chaos: Option<u64>,
    /// The hardware class of its golden key (`cpu`, `cuda-sm90-NVIDIA-H100-80GB-HBM3-drv13000`).
    pub hardware: String,
    /// How it compares with its golden.
    pub golden: GoldenStatus,
    /// What it measured.
    #[serde(flatten)]
    pub result: CellResult,
}

/// The outcome of running a matrix.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The matrix file.
    pub matrix: String,
    /// The model file.
    pub model: String,
    /// SHA-256 of the model file.
    pub model_sha256: String,
    /// SHA-256 of the text.
    pub text_sha256: String,
    /// The ISA the CPU backend's kernels use on this machine.
    pub cpu_isa: String,
    /// How the hardware maps to goldens, for people.
    pub hardware_note: String,
    /// Every cell of every run, in order.
    pub rows: Vec<Row>,
    /// Every rule broken.
    pub violations: Vec<Violation>,
    /// The goldens this run recorded (with `--bless`).
    pub blessed: Vec<Golden>,
}

impl Report {
    /// Whether every rule held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The rows as a Markdown table.
    pub fn markdown(&self) -> String {
        let mut s = String::from(
            "| cell | devices | split | copies | threads | ubatch | PPL | PPL bits | logits sha256 | seconds | host syncs/fwd | races | golden |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for row in &self.rows {
            let r = &row.result;
            let name = match row.chaos {
                Some(seed) => format!("{} (seed {seed})", row.name),
                None => row.name.clone(),
            };
            s.push_str(&format!(
                "| {name} | {} | {} | {} | {} | {} | {:.4} | {} | {}… | {:.1} | {:.2} | {} | {} |\n",
                r.devices,
                match r.all_gather {
                    crate::session::AllGather::Ring => format!("{:?} (ring)", r.split_mode),
                    crate::session::AllGather::Concat => format!("{:?}", r.split_mode),
                },
                r.n_copies,
                r.threads,
                match r.n_ubatch {
                    0 => "batch".to_string(),
                    u => u.to_string(),
                },
                r.ppl,
                r.ppl_f64_bits,
                &r.logits_sha256[..16],
                r.seconds,
                r.host_syncs_per_forward,
                r.races,
                match row.golden {
                    GoldenStatus::Equal => "equal",
                    GoldenStatus::Missing => "missing",
                    GoldenStatus::Moved => "MOVED",
                    GoldenStatus::Blessing => "blessing",
                    GoldenStatus::NotCompared => "-",
                },
            ));
        }
        s
    }

    /// The report as JSON.
    pub fn json(&self) -> Result<String> {
        serde_json::to_string_pretty(self).map_err(|e| HarnessError::Usage(e.to_string()))
    }

    /// Writes the JSON report to `path`.
    pub fn write_json(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.json()? + "\n").map_err(|source| HarnessError::Io {
            path: path.display().to_string(),
            source,
        })
    }
}
