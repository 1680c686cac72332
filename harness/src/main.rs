//! `ggml-harness`: perplexity, generation and tokenization on GGUF models (llama, gemma3).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
mod cli;
use cli::common::check_tflops;
use cli::run_args::{parse_weaken, RunArgs, SplitModeArg};
use harness::error::{HarnessError, Result};
use harness::golden::GoldenSet;
use harness::matrix::report::GoldenStatus;
use harness::matrix::run::RunOptions;
use harness::matrix::{Matrix, Source};
use harness::session::{AllGather, Session, SplitMode};

/// Perplexity, generation and tokenization on GGUF models (llama, gemma3), on CPU and CUDA
/// backends.
#[derive(Parser, Debug)]
#[command(name = "ggml-harness", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Perplexity of a model over a text, as llama-perplexity computes it.
    Perplexity(cli::perplexity::PplArgs),
    /// Prints the token ids of a text, one per line.
    Tokenize(cli::tokenize::TokenizeArgs),
    /// Runs a regression matrix (a TOML file of cells and rules; default: the CPU matrix)
    /// and fails if any rule breaks or any cell moves from its golden.
    Regress(RegressArgs),
    /// Prompt-processing and generation speed, like llama-bench.
    Bench(cli::bench::BenchArgs),
    /// Measures a CUDA device for the cost model: microbenchmarks (probes.json) and every
    /// kernel of a prompt pass and a generated token timed alone (kernels.json).
    Calibrate(cli::calibrate::CalibrateArgs),
    /// Counts every kernel launch of a prompt pass and a generated token on cuda-sim and
    /// prices it with the cost model of a named GPU: modelled (not measured) time per op,
    /// the counters beside it, and modelled pp/tg tokens per second.
    Profile(cli::profile::ProfileArgs),
    /// Fits the cost model's constants to what a GPU measured (a `calibrate` folder or a
    /// per-op table), profiling the same passes on cuda-sim, and prints every row's error.
    FitCostModel(cli::fit_cost_model::FitArgs),
    /// Prints the scheduler's plan of one forward pass: per split, its waits, copies,
    /// compute and records, and the host syncs they cost.
    Plan(PlanArgs),
    /// Injects a fault at every op of a forward pass (every kind, every device) and
    /// checks each run fails with an error naming device, op and cause, in time, without
    /// leaks, and that a clean run afterwards gives the same bits; prints the summary.
    FaultSweep(FaultSweepArgs),
    /// Predicts the copy time that the all-gathers of the exact tensor split expose,
    /// whole (concat) or pipelined with their products (ring), for layer shapes, device
    /// counts and links (PCIe 4, PCIe 5, NVLink 4).
    CostModel(CostModelArgs),
    /// Continues a prompt: greedy by default (as llama-simple), or sampled with
    /// --temp/--top-k/--top-p/--seed; streams the text, then prints tokens per second.
    Generate(cli::generate::GenerateArgs),
    /// Downloads a known model (default: SmolLM2) into the cache and prints its path.
    FetchModel {
        /// Which model: smollm2-135m or gemma3-270m.
        #[arg(long, default_value = "smollm2-135m")]
        model: String,
    },
    /// Writes a synthetic model the tests use (llama: 4 layers, 256 wide, GQA, byte
    /// vocabulary; gemma3: 6 layers with sliding windows, SentencePiece vocabulary;
    /// seeded weights) as a GGUF file, e.g. for runs on cuda-sim in CI.
    SynthModel {
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
    },
    /// Upcycles a dense llama model (e.g. SmolLM2) into a mixture of experts in Mixtral's
    /// layout, which llama.cpp loads as is, and prints a one-line summary.
    MakeMoe(MakeMoeArgs),
    /// Summarises a `--trace` file: busy and idle time per queue, overlap of the queues,
    /// the sync pattern of each split and the host syncs by rule.
    TraceSummary {
        /// Trace file written by `perplexity --trace` or `bench --trace`.
        file: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Debug)]
struct MakeMoeArgs {
    /// Dense llama GGUF model or a known model's name (default: the cached SmolLM2).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Experts per feed-forward block (2..=1024).
    #[arg(long, default_value_t = 4)]
    experts: usize,
    /// Experts each token uses (1..=experts).
    #[arg(long, default_value_t = 2)]
    used: usize,
    /// Seed of the experts' noise and of the routers.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Noise of each expert weight, relative to the RMS of its row (one standard
    /// deviation; requantisation adds its own).
    #[arg(long, default_value_t = harness::make_moe::DEFAULT_NOISE)]
    noise: f32,
    /// Standard deviation of the routers' logits for a typical hidden state.
    #[arg(long, default_value_t = harness::make_moe::DEFAULT_ROUTER_SCALE)]
    router_scale: f32,
    /// Output GGUF file.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

#[derive(Args, Debug)]
struct RegressArgs {
    /// Matrix file (TOML, see harness/matrices/); default: the embedded CPU matrix.
    #[arg(long, value_name = "FILE", conflicts_with = "devices_matrix")]
    matrix: Option<PathBuf>,
    /// Built-in matrix: `cpu` (harness/matrices/cpu.toml, 78 cells), `cuda` (cuda-1gpu.toml),
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

#[derive(Args, Debug)]
struct PlanArgs {
    /// GGUF model (default: the cached SmolLM2, downloaded if missing).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Tokens in the batch the plan is made for.
    #[arg(long, default_value_t = 512)]
    tokens: usize,
    /// Pipeline slot whose plan is printed (every slot has its own copies).
    #[arg(long, default_value_t = 0)]
    slot: usize,
    /// Print ggml's plan (a host sync before every split) instead of ours.
    #[arg(long)]
    naive: bool,
    /// With --split-mode tensor: product speed per device for the all-gather cost model
    /// printed after the plan.
    #[arg(long, default_value_t = 400.0, value_name = "TFLOPS")]
    tflops: f64,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args, Debug)]
struct FaultSweepArgs {
    /// GGUF model (default: the synthetic llama the tests use, Q4_1).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Devices, as --devices.
    #[arg(long, default_value = "cpu:2")]
    devices: String,
    /// Split mode.
    #[arg(long, value_enum, default_value_t = SplitModeArg::Layer)]
    split_mode: SplitModeArg,
    /// Pipeline slots (2: another pass is in flight when the fault hits).
    #[arg(long, default_value_t = 2)]
    n_copies: usize,
    /// Tokens per micro-batch.
    #[arg(long, default_value_t = 16)]
    ubatch: usize,
    /// Threads in total.
    #[arg(short = 't', long, default_value_t = 2)]
    threads: usize,
    /// Inject at every N-th op only.
    #[arg(long, default_value_t = 1)]
    every: usize,
    /// Seconds the host waits for a hung device.
    #[arg(long, default_value_t = 0.5)]
    wait_timeout: f64,
    /// Only these kinds, comma-separated (default: alloc, kernel and hang, and on
    /// cuda-sim devices illegal-address, launch, peer-copy and event too).
    #[arg(long, value_delimiter = ',', value_name = "KIND,...", value_parser = parse_inject_kind)]
    kinds: Vec<harness::faults::InjectKind>,
    /// Print every faulty run.
    #[arg(long)]
    verbose: bool,
}

#[derive(Args, Debug)]
struct CostModelArgs {
    /// Width of the residual stream (SmolLM2: 576, Llama 3 8B: 4096).
    #[arg(long)]
    n_embd: usize,
    /// Width of the attention heads together (default: n_embd).
    #[arg(long)]
    n_q: Option<usize>,
    /// Width of the FFN (SmolLM2: 1536, Llama 3 8B: 14336).
    #[arg(long)]
    n_ff: usize,
    /// Tokens of the pass.
    #[arg(long, default_value_t = 512)]
    tokens: usize,
    /// Device counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    devices: Vec<usize>,
    /// Product speed per device.
    #[arg(long, default_value_t = 400.0, value_name = "TFLOPS")]
    tflops: f64,
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

fn run_regress(a: RegressArgs) -> Result<()> {
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

fn run_plan(a: PlanArgs) -> Result<()> {
    let config = a.run.config()?;
    if a.slot >= config.n_copies {
        return Err(HarnessError::Usage(format!(
            "--slot {}: there are {} pipeline slots (--n-copies)",
            a.slot, config.n_copies
        )));
    }
    if a.tokens == 0 {
        return Err(HarnessError::Usage("--tokens must be at least 1".into()));
    }
    let session = Session::open(&harness::model_path(a.model.as_deref())?, config)?;
    let mut kv = session.kv_cache(a.tokens)?;
    let style = if a.naive {
        ggml_sched::PlanStyle::Naive
    } else {
        ggml_sched::PlanStyle::Minimal
    };
    let mut exec = session.sched_executor(style)?;
    let mut batch = harness::batch::Batch::default();
    for i in 0..a.tokens {
        batch.push(0, i as i32, 0, i + 1 == a.tokens);
    }
    exec.prepare(&session.model, &mut kv, &batch)?;
    let plan = exec
        .scheduler()
        .plan(a.slot)
        .ok_or_else(|| HarnessError::Usage("the scheduler made no plan".into()))?;
    print!("{plan}");
    if session.config.split_mode == SplitMode::TensorReduce {
        let points = harness::model::tp::reduce_points(&session.model)?;
        print!("{}", harness::model::tp::reduce_table(&points, a.tokens));
    }
    if session.config.split_mode == SplitMode::Tensor {
        let hp = &session.model.hp;
        let gathers =
            harness::cost::layer_gathers(hp.n_embd, hp.n_head * hp.head_dim, hp.n_ff, a.tokens);
        let mut devices = vec![session.backends.len(), 2, 4, 8];
        devices.sort_unstable();
        devices.dedup();
        check_tflops(a.tflops)?;
        println!();
        print!(
            "{}",
            harness::cost::table(&gathers, &devices, &harness::cost::LINKS, a.tflops * 1e12)
        );
    }
    Ok(())
}

fn parse_inject_kind(s: &str) -> std::result::Result<harness::faults::InjectKind, String> {
    harness::faults::InjectKind::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = harness::faults::InjectKind::ALL
            .iter()
            .map(|k| k.name())
            .collect();
        format!("unknown fault kind (one of {})", names.join(", "))
    })
}

fn run_fault_sweep(a: FaultSweepArgs) -> Result<()> {
    if !(a.wait_timeout.is_finite() && a.wait_timeout > 0.0) {
        return Err(HarnessError::Usage(format!(
            "--wait-timeout {}: must be positive",
            a.wait_timeout
        )));
    }
    let model = match &a.model {
        Some(p) => harness::model_path(Some(p))?,
        None => harness::synthetic::cached_model(ggml_core::DType::Q4_1)?,
    };
    let cell = harness::regress::Cell {
        devices: a.devices.parse()?,
        split: a.split_mode.into(),
        n_copies: a.n_copies,
        threads: a.threads,
        n_ubatch: a.ubatch,
        reduce_bf16_min: None,
        all_gather: AllGather::Concat,
    };
    let settings = harness::regress::RegressSettings {
        ppl: harness::perplexity::PplSettings {
            n_ctx: 48,
            n_batch: 96,
            max_chunks: Some(2),
        },
        check_races: false,
        chaos: None,
        weaken: Vec::new(),
    };
    let text = &harness::default_corpus()[..1500];
    let timeout = std::time::Duration::from_secs_f64(a.wait_timeout);
    let limit = 20.0 * a.wait_timeout + 30.0;
    let mut by_kind: Vec<(harness::faults::InjectKind, harness::faults::SweepSummary)> = Vec::new();
    let summary = harness::faults::sweep(
        &model,
        text,
        &cell,
        &settings,
        harness::faults::SweepOptions {
            every: a.every,
            timeout,
            limit,
            kinds: a.kinds.clone(),
        },
        |r, later| {
            match by_kind.iter_mut().find(|(k, _)| *k == r.spec.kind) {
                Some((_, s)) => s.add(r, later, limit),
                None => {
                    let mut s = harness::faults::SweepSummary::default();
                    s.add(r, later, limit);
                    by_kind.push((r.spec.kind, s));
                }
            }
            if a.verbose || (r.fired && !(r.named && later == Some(true))) {
                eprintln!(
                    "{} fired={} {:.2}s leaked={} later={later:?}: {}",
                    r.spec,
                    r.fired,
                    r.seconds,
                    r.leaked_bytes,
                    r.error.as_deref().unwrap_or("no error")
                );
            }
        },
    )?;
    println!("{}", harness::faults::SweepSummary::HEADER);
    for (kind, s) in &by_kind {
        println!("{}", s.row(&a.devices, kind.name()));
    }
    println!("{}", summary.row(&a.devices, "all"));
    if summary.clean() {
        Ok(())
    } else {
        Err(HarnessError::Usage(
            "the fault sweep found problems (see above)".into(),
        ))
    }
}

fn run_cost_model(a: CostModelArgs) -> Result<()> {
    check_tflops(a.tflops)?;
    if a.n_embd == 0 || a.n_ff == 0 || a.tokens == 0 || a.n_q == Some(0) {
        return Err(HarnessError::Usage(
            "--n-embd, --n-q, --n-ff and --tokens must be at least 1".into(),
        ));
    }
    if a.devices.contains(&0) {
        return Err(HarnessError::Usage(
            "--devices: counts must be at least 1".into(),
        ));
    }
    let gathers =
        harness::cost::layer_gathers(a.n_embd, a.n_q.unwrap_or(a.n_embd), a.n_ff, a.tokens);
    print!(
        "{}",
        harness::cost::table(&gathers, &a.devices, &harness::cost::LINKS, a.tflops * 1e12)
    );
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.command {
        Command::Perplexity(a) => cli::perplexity::run(a),
        Command::Tokenize(a) => cli::tokenize::run(a),
        Command::Bench(a) => cli::bench::run(a),
        Command::Calibrate(a) => cli::calibrate::run(a),
        Command::Profile(a) => cli::profile::run(a),
        Command::FitCostModel(a) => cli::fit_cost_model::run(a),
        Command::Regress(a) => run_regress(a),
        Command::Plan(a) => run_plan(a),
        Command::CostModel(a) => run_cost_model(a),
        Command::FaultSweep(a) => run_fault_sweep(a),
        Command::Generate(a) => cli::generate::run(a),
        Command::FetchModel { model } => harness::model_path(Some(std::path::Path::new(&model)))
            .map(|p| println!("{}", p.display())),
        Command::SynthModel {
            arch,
            out,
            dtype,
            seed,
        } => synth_model(&arch, &out, &dtype, seed),
        Command::MakeMoe(a) => run_make_moe(a),
        Command::TraceSummary { file, json } => harness::trace::summarize(&file).map(|s| {
            if json {
                println!("{}", serde_json::to_string(&s).expect("serialisable"));
            } else {
                print!("{}", s.text());
            }
        }),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ggml-harness: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_make_moe(a: MakeMoeArgs) -> Result<()> {
    let src = harness::model_path(a.model.as_deref())?;
    let opts = harness::make_moe::MoeOptions {
        experts: a.experts,
        used: a.used,
        seed: a.seed,
        noise: a.noise,
        router_scale: a.router_scale,
    };
    let t0 = Instant::now();
    let s = harness::make_moe::make_moe(&src, &opts, &a.out)?;
    println!(
        "wrote {} from {} in {:.1} s: {s}",
        a.out.display(),
        src.display(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

fn synth_model(arch: &str, out: &std::path::Path, dtype: &str, seed: u64) -> Result<()> {
    let dt = harness::synthetic::weight_dtype(dtype)
        .map_err(|e| HarnessError::Usage(format!("--dtype: {e}")))?;
    let arch = harness::model::Arch::from_name(arch)?;
    let spec = harness::synthetic::SyntheticSpec {
        seed,
        ..harness::synthetic::SyntheticSpec::tiny_of(arch, dt)
    };
    let bytes = harness::synthetic::synthetic_gguf(&spec);
    std::fs::write(out, &bytes).map_err(|source| HarnessError::Io {
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
