//! Running a matrix: devices checked first, then every cell, its rules and goldens.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use super::report::{GoldenStatus, Report, Row};
use super::rules::{evaluate, Violation};
use super::{Matrix, MatrixCell, Rule};
use ggml_cuda::DriverKind;

use crate::devices::DeviceSpec;
use crate::error::{HarnessError, Result};
use crate::golden::{sha256_hex, Golden, GoldenKey, GoldenSet};
use crate::regress::{run_cell, CellResult, RegressSettings};

/// How to run a matrix.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Check races in every cell (a race is a violation).
    pub check_races: bool,
    /// Run the whole matrix once per entry, with that chaos seed (`None`: no chaos).
    pub chaos_seeds: Vec<Option<u64>>,
    /// Scheduler rules weakened on purpose.
    pub weaken: Vec<ggml_sched::WeakenKnob>,
    /// The goldens to compare with.
    pub goldens: GoldenSet,
    /// Record a golden for each identical group instead of comparing.
    pub bless: bool,
    /// A cell compared with goldens that has none is a violation (CI, and GPU workflows
    /// once their hardware is blessed), not a note: otherwise a runner whose GPU has no
    /// golden checks nothing.
    pub require_golden: bool,
}

/// The hardware class of each cell's golden key, in matrix order: `cpu` for every CPU
/// (all ISA paths are bit-identical), `cuda-smXY-NAME-drvV` per GPU (architecture, name, driver version), joined with `+`
/// when a cell mixes them. Fails, before anything runs, when a cell needs a device this
/// machine lacks.
pub fn hardware_classes(matrix: &Matrix) -> Result<Vec<String>> {
    let mut gpu_class: HashMap<(DriverKind, usize), String> = HashMap::new();
    let mut n_gpus: HashMap<DriverKind, usize> = HashMap::new();
    let mut out = Vec::with_capacity(matrix.cells.len());
    for c in &matrix.cells {
        let mut classes = Vec::new();
        for d in &c.cell.devices.0 {
            match *d {
                DeviceSpec::Cpu { .. } => classes.push("cpu".to_string()),
                DeviceSpec::Cuda { driver, gpu, .. } => {
                    let p = driver.prefix();
                    let unavailable = |why: String| {
                        HarnessError::Usage(format!(
                            "{}: cell '{}' needs {p}:{gpu}, but {why}; run this matrix on a runner with the GPUs it names",
                            matrix.path, c.name
                        ))
                    };
                    let n = match n_gpus.entry(driver) {
                        Entry::Occupied(e) => *e.get(),
                        Entry::Vacant(e) => {
                            let n =
                                ggml_cuda::CudaBackend::device_count_of(driver).map_err(|e| {
                                    let what = match driver {
                                        DriverKind::Cuda => "CUDA",
                                        DriverKind::Sim => "cuda-sim",
                                    };
                                    unavailable(format!(
                                        "{what} is unavailable on this machine ({})",
                                        e.to_string().replace('\n', " ")
                                    ))
                                })?;
                            *e.insert(n)
                        }
                    };
                    if gpu >= n {
                        return Err(unavailable(format!("this machine has {n} {p} devices")));
                    }
                    let class = match gpu_class.entry((driver, gpu)) {
                        Entry::Occupied(e) => e.get().clone(),
                        // The emulator computes the same bits on every host.
                        Entry::Vacant(e) if driver == DriverKind::Sim => {
                            e.insert("cuda-sim".to_string()).clone()
                        }
                        Entry::Vacant(e) => {
                            let b = ggml_cuda::CudaBackend::with_driver(driver, gpu, 0)
                                .map_err(|err| unavailable(err.to_string().replace('\n', " ")))?;
                            let (major, minor) = b.compute_capability();
                            // Name and driver as well as architecture: SM counts can change
                            // how a kernel splits work, and the driver assembles the PTX.
                            let name: String = b
                                .device_name()
                                .chars()
                                .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                                .collect();
                            let version = driver.version().map_err(|err| {
                                unavailable(format!("{}: {}", err.what, err.code))
                            })?;
                            e.insert(format!("cuda-sm{major}{minor}-{name}-drv{version}"))
                                .clone()
                        }
                    };
                    classes.push(class);
                }
            }
        }
        classes.sort();
        classes.dedup();
        out.push(classes.join("+"));
    }
    Ok(out)
}

/// The ISA the CPU backend's kernels use here (a backend with default options says).
pub fn cpu_isa() -> Result<ggml_cpu::Isa> {
    Ok(ggml_cpu::CpuBackend::new(ggml_cpu::CpuBackendOptions::with_threads(1))?.isa())
}

fn key(m: &MatrixCell, matrix: &Matrix, hardware: &str, model: &str, text: &str) -> GoldenKey {
    let ppl = m.ppl(matrix.settings.ppl);
    GoldenKey {
        hardware: hardware.to_string(),
        model_sha256: model.to_string(),
        text_sha256: text.to_string(),
        n_ctx: ppl.n_ctx,
        n_batch: ppl.n_batch,
        chunks: ppl.max_chunks,
        variant: variant(m, hardware),
    }
}

/// The golden key's variant of a cell (see [`GoldenKey::variant`]).
fn variant(m: &MatrixCell, hardware: &str) -> Option<String> {
    let reduce = (m.cell.split == crate::session::SplitMode::TensorReduce).then(|| {
        let n = m.cell.devices.count();
        match m.cell.reduce_bf16_min {
            Some(b) => format!("tensor-reduce:{n}:bf16>={b}"),
            None => format!("tensor-reduce:{n}:f32"),
        }
    });
    let decode_class =
        hardware != "cpu" && m.cell.n_ubatch != 0 && m.cell.n_ubatch < ggml_cuda::MMQ_MIN_N;
    match (reduce, decode_class) {
        (Some(r), true) => Some(format!("{r}:decode-class")),
        (r, false) => r,
        (None, true) => Some("decode-class".into()),
    }
}

/// Runs every cell of `matrix` once per chaos seed, checks its rules and goldens (or
/// records goldens with `bless`), calling `progress` after each cell.
pub fn run(matrix: &Matrix, opts: &RunOptions, mut progress: impl FnMut(&Row)) -> Result<Report> {
    let hardware = hardware_classes(matrix)?;
    let isa = cpu_isa()?;
    let model = matrix.settings.model.model_file()?;
    let text = crate::corpus_text(matrix.settings.corpus.path())?;
    let model_sha256 = sha256_hex(&std::fs::read(&model).map_err(|source| HarnessError::Io {
        path: model.display().to_string(),
        source,
    })?);
    let text_sha256 = sha256_hex(text.as_bytes());
    let keys: Vec<GoldenKey> = matrix
        .cells
        .iter()
        .zip(&hardware)
        .map(|(m, h)| key(m, matrix, h, &model_sha256, &text_sha256))
        .collect();

    // Goldens hold bits, so only cells that must be bit-identical to others (members of
    // an identical group) are compared with them; the others answer to their `within`
    // rules (tensor-reduce cells, by PPL tolerance).
    let exact: std::collections::HashSet<&str> = matrix
        .rules
        .iter()
        .flat_map(|r| match r {
            super::Rule::Identical { cells, .. } => cells.iter().map(String::as_str).collect(),
            super::Rule::Within { .. } => Vec::new(),
        })
        .collect();
    let mut rows = Vec::new();
    let mut violations = Vec::new();
    for &chaos in &opts.chaos_seeds {
        let mut results: Vec<(String, CellResult)> = Vec::new();
        for ((m, hw), key) in matrix.cells.iter().zip(&hardware).zip(&keys) {
            let settings = RegressSettings {
                ppl: m.ppl(matrix.settings.ppl),
                check_races: opts.check_races,
                chaos,
                weaken: opts.weaken.clone(),
            };
            let result = run_cell(&model, &text, &m.cell, &settings)?;
            let golden = if opts.bless {
                GoldenStatus::Blessing
            } else if !exact.contains(m.name.as_str()) {
                GoldenStatus::NotCompared
            } else {
                match opts.goldens.find(key) {
                    None => {
                        if opts.require_golden {
                            violations.push(Violation {
                                cell: m.name.clone(),
                                rule: "golden".into(),
                                chaos,
                                detail: format!(
                                    "no golden for hardware '{}' (n_ctx {}, chunks {:?}); record one with --bless",
                                    key.hardware, key.n_ctx, key.chunks
                                ),
                            });
                        }
                        GoldenStatus::Missing
                    }
                    Some(g) if g.matches(&result) => GoldenStatus::Equal,
                    Some(g) => {
                        violations.push(Violation {
                            cell: m.name.clone(),
                            rule: "golden".into(),
                            chaos,
                            detail: format!(
                                "PPL {:.4} ({}) vs golden {:.4} ({})",
                                result.ppl, result.ppl_f64_bits, g.ppl, g.ppl_f64_bits
                            ),
                        });
                        GoldenStatus::Moved
                    }
                }
            };
            let row = Row {
                name: m.name.clone(),
                chaos,
                hardware: hw.clone(),
                golden,
                result: result.clone(),
            };
            progress(&row);
            rows.push(row);
            results.push((m.name.clone(), result));
        }
        violations.extend(evaluate(matrix, &results, chaos));
    }
    let blessed = if opts.bless {
        bless(matrix, &keys, &rows, &mut violations)
    } else {
        Vec::new()
    };
    let hardware_note = if hardware.iter().all(|h| h == "cpu") {
        format!("CPU golden shared by all ISA paths (this run: {isa})")
    } else {
        format!(
            "CPU golden shared by all ISA paths (this run: {isa}); GPU goldens per architecture"
        )
    };
    Ok(Report {
        matrix: matrix.path.clone(),
        model: model.display().to_string(),
        model_sha256,
        text_sha256,
        cpu_isa: isa.to_string(),
        hardware_note,
        rows,
        violations,
        blessed,
    })
}

/// The golden of each identical group whose cells agree in every run, race-free and
/// under one key; a group that cannot be blessed is a violation.
fn bless(
    matrix: &Matrix,
    keys: &[GoldenKey],
    rows: &[Row],
    violations: &mut Vec<Violation>,
) -> Vec<Golden> {
    let key_of: HashMap<&str, &GoldenKey> = matrix
        .cells
        .iter()
        .zip(keys)
        .map(|(m, k)| (m.name.as_str(), k))
        .collect();
    let mut out: Vec<Golden> = Vec::new();
    for rule in &matrix.rules {
        let Rule::Identical { cells, .. } = rule else {
            continue;
        };
        let members: Vec<&Row> = rows.iter().filter(|r| cells.contains(&r.name)).collect();
        let Some(first) = members.first() else {
            continue;
        };
        let key = key_of[first.name.as_str()];
        let refuse = |why: String| Violation {
            cell: first.name.clone(),
            rule: format!("bless {rule}"),
            chaos: None,
            detail: why,
        };
        if let Some(other) = members.iter().find(|r| key_of[r.name.as_str()] != key) {
            violations.push(refuse(format!(
                "'{}' has another golden key (hardware or settings) than '{}'; not recorded",
                other.name, first.name
            )));
            continue;
        }
        let agree = members.iter().all(|r| {
            r.result.races == 0
                && r.result.ppl_f64_bits == first.result.ppl_f64_bits
                && r.result.logits_sha256 == first.result.logits_sha256
        });
        if !agree {
            violations.push(refuse(
                "the group is not bit-identical and race-free; not recorded".into(),
            ));
            continue;
        }
        let golden = Golden {
            key: key.clone(),
            ppl: first.result.ppl,
            ppl_f64_bits: first.result.ppl_f64_bits.clone(),
            logits_sha256: first.result.logits_sha256.clone(),
        };
        match out.iter().find(|g| g.key == golden.key) {
            Some(g) if g != &golden => {
                violations.push(refuse(
                    "another group with the same golden key has other bits; neither recorded"
                        .into(),
                ));
                out.retain(|g| g.key != golden.key);
            }
            Some(_) => {}
            None => out.push(golden),
        }
    }
    out
}
