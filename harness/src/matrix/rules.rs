//! The `identical` and `within` rules over the results of one run of a matrix.

use std::collections::HashMap;
use std::fmt;

use serde::Serialize;

use super::{Matrix, Rule};
use crate::regress::CellResult;

/// A rule a cell broke.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Violation {
    /// The cell.
    pub cell: String,
    /// The rule, as written in the matrix (or `races`, `golden`).
    pub rule: String,
    /// The chaos seed of the run, if any.
    pub chaos: Option<u64>,
    /// What differs.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cell '{}' breaks rule `{}`", self.cell, self.rule)?;
        if let Some(s) = self.chaos {
            write!(f, " (chaos seed {s})")?;
        }
        write!(f, ": {}", self.detail)
    }
}

/// Checks `matrix`'s rules against `results` (`(cell name, result)` of one run); the
/// violations name the cell and the rule.
pub fn evaluate(
    matrix: &Matrix,
    results: &[(String, CellResult)],
    chaos: Option<u64>,
) -> Vec<Violation> {
    let by_name: HashMap<&str, &CellResult> =
        results.iter().map(|(n, r)| (n.as_str(), r)).collect();
    let mut out = Vec::new();
    for rule in &matrix.rules {
        let violation = |cell: &str, detail: String| Violation {
            cell: cell.to_string(),
            rule: rule.to_string(),
            chaos,
            detail,
        };
        match rule {
            Rule::Identical { cells, .. } => {
                let Some((first, reference)) = cells
                    .iter()
                    .find_map(|c| by_name.get(c.as_str()).map(|r| (c, *r)))
                else {
                    continue;
                };
                for name in cells {
                    let Some(r) = by_name.get(name.as_str()) else {
                        continue;
                    };
                    if r.ppl_f64_bits != reference.ppl_f64_bits
                        || r.logits_sha256 != reference.logits_sha256
                    {
                        out.push(violation(
                            name,
                            format!(
                                "PPL {} (bits {}, logits {}…) vs '{first}' PPL {} (bits {}, logits {}…)",
                                r.ppl,
                                r.ppl_f64_bits,
                                &r.logits_sha256[..16],
                                reference.ppl,
                                reference.ppl_f64_bits,
                                &reference.logits_sha256[..16],
                            ),
                        ));
                    }
                }
            }
            Rule::Within { cell, of, rel_ppl } => {
                let (Some(c), Some(o)) = (by_name.get(cell.as_str()), by_name.get(of.as_str()))
                else {
                    continue;
                };
                let rel = (c.ppl - o.ppl).abs() / o.ppl;
                // A NaN perplexity is a violation too.
                if rel.is_nan() || rel > *rel_ppl {
                    out.push(violation(
                        cell,
                        format!(
                            "PPL {:.6} is {:.4} % from '{of}' PPL {:.6} (allowed {:.4} %)",
                            c.ppl,
                            rel * 100.0,
                            o.ppl,
                            rel_ppl * 100.0
                        ),
                    ));
                }
            }
        }
    }
    for (name, r) in results {
        if r.races > 0 {
            out.push(Violation {
                cell: name.clone(),
                rule: "races".into(),
                chaos,
                detail: format!("the happens-before checker found {} races", r.races),
            });
        }
    }
    out
}
