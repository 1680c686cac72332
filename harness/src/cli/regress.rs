//! `ggml-harness regress`: a regression matrix run against its rules and goldens.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::Args;
use harness::error::{HarnessError, Result};
use harness::golden::GoldenSet;
use harness::matrix::report::GoldenStatus;
use harness::matrix::run::RunOptions;
use harness::matrix::{Matrix, Source};

use super::run_args::parse_weaken;

/// The flags of `ggml-harness regress`.
#[derive(Args, Debug)]
pub struct RegressArgs {
    /// Matrix file (TOML, see harness/matrices/); default: the embedded CPU matrix.
    #[arg(long, value_name = "FILE", conflicts_with = "devices_matrix")]
    matrix: Option<PathBuf>,
    /// Built-in matrix: `cpu` (harness/matrices/cpu.toml, 80 cells), `cuda` (cuda-1gpu.toml),
    /// `cuda-2gpu`, `cuda-sim` (emulated GPUs, synthetic model; no GPU needed),
    /// `gemma3` (Gemma 3 270M on the CPU) or `moe` (SmolLM2 as 4 experts on the CPU).
    #[arg(long)]
    devices_matrix: Option<String>,
    /// GGUF model (default: the matrix's).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Text file (default: the matrix's corpus).
    #[arg(long)]
    file: Option<PathBuf>,
    /// Tokens per chunk (default: the matrix's).
    #[arg(long)]
    ctx: Option<usize>,
    /// Tokens per decode call (default: the matrix's).
    #[arg(long)]
    batch: Option<usize>,
    /// Process at most this many chunks per cell (default: the matrix's).
    #[arg(long)]
    chunks: Option<usize>,
    /// Tokens per micro-batch in every cell (default: each cell's own, usually the batch).
    #[arg(long, value_name = "N")]
    ubatch: Option<usize>,
    /// Check races in every cell (any race fails the run).
    #[arg(long)]
    check_races: bool,
    /// Random delays in CPU queues and cuda-sim streams from this seed.
    #[arg(long, value_name = "SEED")]
    chaos: Option<u64>,
    /// With --chaos: run the whole matrix for this many seeds (SEED, SEED+1, ...).
    #[arg(long, default_value_t = 1, requires = "chaos")]
    seeds: u64,
    /// Golden file to compare with, and to record into with --bless (default: the
    /// goldens built into the binary).
    #[arg(long, value_name = "PATH")]
    golden: Option<PathBuf>,
    /// Record a golden in the --golden file for each identical group of the matrix
    /// (only groups whose cells agree bit for bit, race-free).
    #[arg(long)]
    bless: bool,
    /// A cell without a golden for this hardware fails the run (instead of a note).
    #[arg(long, conflicts_with_all = ["bless", "update_golden"])]
    require_golden: bool,
    /// Same as --bless --golden PATH.
    #[arg(long, value_name = "PATH", conflicts_with = "golden")]
    update_golden: Option<PathBuf>,
    /// Write the JSON report (cells, violations, goldens recorded) to PATH.
    #[arg(long, value_name = "PATH")]
    report: Option<PathBuf>,
    /// Weaken the scheduler on purpose (see `perplexity --help`).
    #[arg(long, hide = true, value_delimiter = ',')]
    weaken: Vec<String>,
    /// Print the JSON report instead of a table.
    #[arg(long)]
    json: bool,
}

/// The matrix of `regress`, with the command line's settings on top of the file's.
fn regress_matrix(a: &RegressArgs) -> Result<Matrix> {
    let mut m = match (&a.matrix, a.devices_matrix.as_deref()) {
        (Some(path), _) => Matrix::load(path)?,
        (None, None) => Matrix::cpu(),
        (None, Some(name)) => Matrix::builtin(name).ok_or_else(|| {
            HarnessError::Usage(format!(
                "--devices-matrix {name}: built in are cpu, cuda (one GPU), cuda-2gpu and cuda-sim (or use --matrix FILE)"
            ))
        })?,
    };
    if let Some(p) = &a.model {
        m.settings.model = Source::Path(p.clone());
    }
    if let Some(p) = &a.file {
        m.settings.corpus = Source::Path(p.clone());
    }
    let ppl = &mut m.settings.ppl;
    ppl.n_ctx = a.ctx.unwrap_or(ppl.n_ctx);
    ppl.n_batch = a.batch.unwrap_or(ppl.n_batch);
    ppl.max_chunks = a.chunks.or(ppl.max_chunks);
    match a.ubatch {
        Some(0) => return Err(HarnessError::Usage("--ubatch must be at least 1".into())),
        Some(u) => m.cells.iter_mut().for_each(|c| c.cell.n_ubatch = u),
        None => {}
    }
    Ok(m)
}

/// Runs `ggml-harness regress`.
pub fn run(a: RegressArgs) -> Result<()> {
    let matrix = regress_matrix(&a)?;
    let golden_path = a.update_golden.clone().or(a.golden.clone());
    let bless = a.bless || a.update_golden.is_some();
    if bless && golden_path.is_none() {
        return Err(HarnessError::Usage(
            "--bless records into the --golden PATH file; give one".into(),
        ));
    }
    let goldens = match &golden_path {
        Some(p) => GoldenSet::load(p)?,
        None => GoldenSet::parse(harness::golden::EMBEDDED)?,
    };
    let chaos_seeds: Vec<Option<u64>> = match a.chaos {
        Some(s0) => (0..a.seeds).map(|i| Some(s0.wrapping_add(i))).collect(),
        None => vec![None],
    };
    let opts = RunOptions {
        check_races: a.check_races,
        chaos_seeds,
        weaken: parse_weaken(&a.weaken)?,
        goldens,
        bless,
        require_golden: a.require_golden,
    };
    let show_bar = !a.json && std::io::stderr().is_terminal();
    let total = (matrix.cells.len() * opts.chaos_seeds.len()) as u64;
    let bar = show_bar.then(|| indicatif::ProgressBar::new(total));
    let report = harness::matrix::run::run(&matrix, &opts, |row| {
        if let Some(b) = &bar {
            b.inc(1);
        } else if !a.json {
            eprintln!(
                "{}{}: PPL {:.4} in {:.1} s, {} races",
                row.chaos.map_or(String::new(), |s| format!("seed {s}: ")),
                row.name,
                row.result.ppl,
                row.result.seconds,
                row.result.races
            );
        }
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if let Some(p) = &a.report {
        report.write_json(p)?;
    }
    if a.json {
        println!("{}", report.json()?);
    } else {
        if opts.chaos_seeds.len() == 1 {
            print!("{}", report.markdown());
        }
        println!("{}", report.hardware_note);
        let missing = report
            .rows
            .iter()
            .filter(|r| r.golden == GoldenStatus::Missing)
            .count();
        if missing > 0 && !bless {
            println!("{missing} cells have no golden (record them with --bless)");
        }
    }
    for v in &report.violations {
        eprintln!("violation: {v}");
    }
    if let Some(path) = golden_path.as_ref().filter(|_| bless) {
        if !report.blessed.is_empty() {
            let mut set = GoldenSet::load(path)?;
            for g in &report.blessed {
                set.record(g.clone());
            }
            set.save(path)?;
            eprintln!(
                "{} goldens recorded in {}",
                report.blessed.len(),
                path.display()
            );
        }
    }
    if !report.passed() {
        return Err(HarnessError::Violations(report.violations.len()));
    }
    if !a.json {
        println!(
            "{} cells over {} run(s): every rule holds",
            matrix.cells.len(),
            opts.chaos_seeds.len()
        );
    }
    Ok(())
}
