//! The TOML form of a matrix and its validation.
//!
//! ```toml
//! [settings]                  # model, corpus: "default" or a path; ctx, batch, chunks
//! model = "default"
//! corpus = "default"
//! ctx = 512
//! batch = 512
//!
//! [[grid]]                    # a cross product; cells named like cpu2-layer-c2-t1
//! devices = ["cpu", "cpu:2"]
//! split = ["none", "layer"]
//! n_copies = [1, 2]
//! threads = [1, 2]
//! ubatch = [0, 128]           # optional: micro-batch sizes (0: the batch), names end -u128
//!
//! [[cell]]                    # one named cell; grid and cell take ctx, batch, chunks
//! name = "cpu-short"
//! devices = "cpu"
//! split = "none"
//! n_copies = 1
//! threads = 1
//! chunks = 2
//! # ubatch = 64; reduce_bf16_min = 0 (tensor-reduce: partial sums as BF16 on the wire)
//! # all_gather = "ring" (tensor: all-gathers pipelined with their products)
//!
//! [rules]
//! identical = [["cpu*"]]      # groups of names or globs (`*`, `?`)
//! within = [{ cell = "cpu-short", of = "cpu-none-c1-t1", rel_ppl = 0.5 }]
//! ```
//!
//! Every mistake (unknown key, bad device, a rule naming a missing cell, a duplicate
//! name) is refused with the file, line and reason.

use std::collections::HashSet;
use std::path::Path;

use serde::Deserialize;
use toml::Spanned;

use super::{CellOverrides, Matrix, MatrixCell, Rule, Settings, Source};
use crate::devices::{DeviceList, DeviceSpec};
use crate::error::{HarnessError, ModelError, Result};
use crate::perplexity::PplSettings;
use crate::regress::Cell;
use crate::session::{AllGather, SplitMode};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MatrixFile {
    settings: SettingsTable,
    #[serde(default)]
    grid: Vec<GridTable>,
    #[serde(default)]
    cell: Vec<CellTable>,
    #[serde(default)]
    rules: RulesTable,
    /// Read by `cargo xtask gen-ci` (the runner labels of the matrix's workflow); the
    /// harness only checks its shape.
    #[serde(default)]
    #[allow(dead_code)]
    ci: Option<CiTable>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CiTable {
    #[allow(dead_code)]
    runs_on: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettingsTable {
    model: Spanned<String>,
    corpus: String,
    ctx: Spanned<usize>,
    batch: Spanned<usize>,
    chunks: Option<Spanned<usize>>,
}

#[derive(Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum SplitName {
    None,
    Layer,
    Tensor,
    TensorReduce,
}

impl From<SplitName> for SplitMode {
    fn from(s: SplitName) -> SplitMode {
        match s {
            SplitName::None => SplitMode::None,
            SplitName::Layer => SplitMode::Layer,
            SplitName::Tensor => SplitMode::Tensor,
            SplitName::TensorReduce => SplitMode::TensorReduce,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GridTable {
    devices: Vec<Spanned<String>>,
    split: Vec<SplitName>,
    n_copies: Vec<Spanned<usize>>,
    threads: Vec<Spanned<usize>>,
    #[serde(default)]
    ubatch: Vec<Spanned<usize>>,
    ctx: Option<Spanned<usize>>,
    batch: Option<Spanned<usize>>,
    chunks: Option<Spanned<usize>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CellTable {
    name: Spanned<String>,
    devices: Spanned<String>,
    split: SplitName,
    n_copies: Spanned<usize>,
    threads: Spanned<usize>,
    ubatch: Option<Spanned<usize>>,
    reduce_bf16_min: Option<Spanned<usize>>,
    all_gather: Option<Spanned<String>>,
    ctx: Option<Spanned<usize>>,
    batch: Option<Spanned<usize>>,
    chunks: Option<Spanned<usize>>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesTable {
    #[serde(default)]
    identical: Vec<Vec<Spanned<String>>>,
    #[serde(default)]
    within: Vec<WithinTable>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WithinTable {
    cell: Spanned<String>,
    of: Spanned<String>,
    rel_ppl: Spanned<f64>,
}

/// Errors located in one file.
struct Located<'a> {
    path: &'a str,
    text: &'a str,
}

impl Located<'_> {
    fn line_of(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())]
            .matches('\n')
            .count()
            + 1
    }

    fn at<T>(&self, spanned: &Spanned<T>, reason: impl Into<String>) -> HarnessError {
        HarnessError::Matrix {
            path: self.path.to_string(),
            line: self.line_of(spanned.span().start),
            reason: reason.into(),
        }
    }

    fn count(
        &self,
        n: &Spanned<usize>,
        what: &str,
        range: std::ops::RangeInclusive<usize>,
    ) -> Result<usize> {
        if range.contains(n.get_ref()) {
            Ok(*n.get_ref())
        } else {
            Err(self.at(
                n,
                format!(
                    "{what} = {}: must be {} to {}",
                    n.get_ref(),
                    range.start(),
                    range.end()
                ),
            ))
        }
    }

    fn positive(&self, n: &Option<Spanned<usize>>, what: &str) -> Result<Option<usize>> {
        n.as_ref()
            .map(|n| self.count(n, what, 1..=usize::MAX))
            .transpose()
    }

    fn devices(&self, d: &Spanned<String>) -> Result<DeviceList> {
        d.get_ref()
            .parse()
            .map_err(|e: ModelError| self.at(d, format!("devices = {:?}: {e}", d.get_ref())))
    }
}

/// The part of a cell name that says which devices: `cpu`, `cpu2`, `cuda0x2`,
/// `cuda0+cuda1`.
pub fn devices_slug(devices: &DeviceList) -> String {
    devices
        .0
        .iter()
        .map(|d| match *d {
            DeviceSpec::Cpu { count: 1 } => "cpu".to_string(),
            DeviceSpec::Cpu { count } => format!("cpu{count}"),
            DeviceSpec::Cuda {
                driver,
                gpu,
                count: 1,
            } => format!("{}{gpu}", driver.prefix()),
            DeviceSpec::Cuda { driver, gpu, count } => {
                format!("{}{gpu}x{count}", driver.prefix())
            }
        })
        .collect::<Vec<_>>()
        .join("+")
}

/// The name a grid gives a cell: `cpu2-layer-c2-t1`, with `-u128` for micro-batches.
pub fn grid_cell_name(cell: &Cell) -> String {
    let split = match cell.split {
        SplitMode::None => "none",
        SplitMode::Layer => "layer",
        SplitMode::Tensor => "tensor",
        SplitMode::TensorReduce => "tensor-reduce",
    };
    let ubatch = match cell.n_ubatch {
        0 => String::new(),
        u => format!("-u{u}"),
    };
    format!(
        "{}-{split}-c{}-t{}{ubatch}",
        devices_slug(&cell.devices),
        cell.n_copies,
        cell.threads
    )
}

/// Whether `name` matches `pattern`, where `*` is any run of characters and `?` any one.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // Greedy matching with backtracking to the last `*`.
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

fn source(value: &str, base: Option<&Path>) -> Source {
    if value == "default" {
        Source::Default
    } else {
        Source::Path(base.map_or_else(|| value.into(), |b| b.join(value)))
    }
}

/// `model = "synthetic:DTYPE"` names the seeded synthetic model, a known model's name
/// (`gemma3-270m`, `smollm2-moe`) that model; anything else is [`source`].
fn model_source(loc: &Located<'_>, value: &Spanned<String>, base: Option<&Path>) -> Result<Source> {
    match value.get_ref().strip_prefix("synthetic:") {
        Some(name) => crate::synthetic::weight_dtype(name)
            .map(Source::Synthetic)
            .map_err(|e| loc.at(value, format!("model: {e}"))),
        None if crate::fetch::known_model(value.get_ref()).is_some()
            || value.get_ref() == crate::MOE_MODEL_NAME =>
        {
            Ok(Source::Path(value.get_ref().into()))
        }
        None => Ok(source(value.get_ref(), base)),
    }
}

/// Parses and validates a matrix; `path` names it in errors, `base` is the folder that
/// relative model and corpus paths start from.
pub fn parse(path: &str, base: Option<&Path>, text: &str) -> Result<Matrix> {
    let loc = Located { path, text };
    let file: MatrixFile = toml::from_str(text).map_err(|e| HarnessError::Matrix {
        path: path.to_string(),
        line: e.span().map_or(1, |s| loc.line_of(s.start)),
        reason: e.message().trim().to_string(),
    })?;
    let s = &file.settings;
    let settings = Settings {
        model: model_source(&loc, &s.model, base)?,
        corpus: source(&s.corpus, base),
        ppl: PplSettings {
            n_ctx: loc.count(&s.ctx, "ctx", 1..=usize::MAX)?,
            n_batch: loc.count(&s.batch, "batch", 1..=usize::MAX)?,
            max_chunks: loc.positive(&s.chunks, "chunks")?,
        },
    };

    // Each cell with the span its errors point at (its name, or its grid's devices).
    let mut cells: Vec<(MatrixCell, Spanned<String>)> = Vec::new();
    for g in &file.grid {
        let overrides = CellOverrides {
            n_ctx: loc.positive(&g.ctx, "ctx")?,
            n_batch: loc.positive(&g.batch, "batch")?,
            max_chunks: loc.positive(&g.chunks, "chunks")?,
        };
        let ubatches = if g.ubatch.is_empty() {
            vec![0]
        } else {
            g.ubatch
                .iter()
                .map(|u| loc.count(u, "ubatch", 0..=usize::MAX))
                .collect::<Result<Vec<_>>>()?
        };
        for d in &g.devices {
            let devices = loc.devices(d)?;
            for &split in &g.split {
                for n_copies in &g.n_copies {
                    for threads in &g.threads {
                        for &n_ubatch in &ubatches {
                            let cell = Cell {
                                devices: devices.clone(),
                                split: split.into(),
                                n_copies: loc.count(n_copies, "n_copies", 1..=4)?,
                                threads: loc.count(threads, "threads", 1..=usize::MAX)?,
                                n_ubatch,
                                reduce_bf16_min: None,
                                all_gather: AllGather::Concat,
                            };
                            let name = grid_cell_name(&cell);
                            let at = Spanned::new(d.span(), name.clone());
                            cells.push((
                                MatrixCell {
                                    name,
                                    cell,
                                    overrides,
                                },
                                at,
                            ));
                        }
                    }
                }
            }
        }
    }
    for c in &file.cell {
        if c.name.get_ref().is_empty() || c.name.get_ref().contains(['*', '?']) {
            return Err(loc.at(&c.name, "a cell name must be non-empty, without `*` or `?`"));
        }
        let cell = Cell {
            devices: loc.devices(&c.devices)?,
            split: c.split.into(),
            n_copies: loc.count(&c.n_copies, "n_copies", 1..=4)?,
            threads: loc.count(&c.threads, "threads", 1..=usize::MAX)?,
            n_ubatch: match &c.ubatch {
                Some(u) => loc.count(u, "ubatch", 0..=usize::MAX)?,
                None => 0,
            },
            reduce_bf16_min: c.reduce_bf16_min.as_ref().map(|b| *b.get_ref()),
            all_gather: match &c.all_gather {
                None => AllGather::Concat,
                Some(a) => match a.get_ref().as_str() {
                    "concat" => AllGather::Concat,
                    "ring" if c.split == SplitName::Tensor => AllGather::Ring,
                    "ring" => {
                        return Err(loc.at(a, "all_gather = \"ring\" needs split = \"tensor\""))
                    }
                    _ => return Err(loc.at(a, "all_gather must be \"concat\" or \"ring\"")),
                },
            },
        };
        let overrides = CellOverrides {
            n_ctx: loc.positive(&c.ctx, "ctx")?,
            n_batch: loc.positive(&c.batch, "batch")?,
            max_chunks: loc.positive(&c.chunks, "chunks")?,
        };
        let name = c.name.get_ref().clone();
        cells.push((
            MatrixCell {
                name,
                cell,
                overrides,
            },
            c.name.clone(),
        ));
    }
    if cells.is_empty() {
        return Err(HarnessError::Matrix {
            path: path.to_string(),
            line: 1,
            reason: "the matrix has no cells (add a [[grid]] or [[cell]])".into(),
        });
    }
    let mut seen = HashSet::new();
    for (c, at) in &cells {
        if !seen.insert(c.name.as_str()) {
            return Err(loc.at(at, format!("duplicate cell name '{}'", c.name)));
        }
    }
    let cells: Vec<MatrixCell> = cells.into_iter().map(|(c, _)| c).collect();

    let exists = |name: &Spanned<String>| -> Result<String> {
        if cells.iter().any(|c| &c.name == name.get_ref()) {
            Ok(name.get_ref().clone())
        } else {
            Err(loc.at(name, format!("no cell named '{}'", name.get_ref())))
        }
    };
    let mut rules = Vec::new();
    for group in &file.rules.identical {
        let mut members: Vec<String> = Vec::new();
        for p in group {
            if p.get_ref().contains(['*', '?']) {
                let matched: Vec<&MatrixCell> = cells
                    .iter()
                    .filter(|c| glob_match(p.get_ref(), &c.name))
                    .collect();
                if matched.is_empty() {
                    return Err(loc.at(p, format!("'{}' matches no cell", p.get_ref())));
                }
                members.extend(matched.iter().map(|c| c.name.clone()));
            } else {
                members.push(exists(p)?);
            }
        }
        rules.push(Rule::Identical {
            patterns: group.iter().map(|p| p.get_ref().clone()).collect(),
            cells: cells
                .iter()
                .filter(|c| members.contains(&c.name))
                .map(|c| c.name.clone())
                .collect(),
        });
    }
    for w in &file.rules.within {
        let rel_ppl = *w.rel_ppl.get_ref();
        if !(rel_ppl.is_finite() && rel_ppl >= 0.0) {
            return Err(loc.at(
                &w.rel_ppl,
                format!("rel_ppl = {rel_ppl}: must be finite and >= 0"),
            ));
        }
        rules.push(Rule::Within {
            cell: exists(&w.cell)?,
            of: exists(&w.of)?,
            rel_ppl,
        });
    }
    Ok(Matrix {
        path: path.to_string(),
        settings,
        cells,
        rules,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("*", "cpu-none-c1-t1", true)]
    #[case("cpu*", "cpu2-layer-c2-t1", true)]
    #[case("cuda0-*", "cuda0x2-none-c1-t1", false)]
    #[case("cpu?-*-t1", "cpu2-layer-c2-t1", true)]
    #[case("cpu?-*-t1", "cpu-none-c1-t1", false)]
    #[case("*-t2", "cpu-none-c1-t1", false)]
    #[case("a*b*c", "aXbYbZc", true)]
    #[case("exact", "exact", true)]
    #[case("exact", "exactly", false)]
    fn globs(#[case] pattern: &str, #[case] name: &str, #[case] want: bool) {
        assert_eq!(glob_match(pattern, name), want, "{pattern} {name}");
    }

    #[rstest]
    #[case("cpu", "cpu-none-c1-t1")]
    #[case("cpu:2", "cpu2-none-c1-t1")]
    #[case("cuda:0x2", "cuda0x2-none-c1-t1")]
    #[case("cuda:0,cuda:1", "cuda0+cuda1-none-c1-t1")]
    fn grid_names(#[case] devices: &str, #[case] want: &str) {
        let mut cell = Cell {
            devices: devices.parse().unwrap(),
            split: SplitMode::None,
            n_copies: 1,
            threads: 1,
            n_ubatch: 0,
            reduce_bf16_min: None,
            all_gather: AllGather::Concat,
        };
        assert_eq!(grid_cell_name(&cell), want);
        cell.n_ubatch = 64;
        let want = format!("{want}-u64");
        assert_eq!(grid_cell_name(&cell), want);
    }
}
