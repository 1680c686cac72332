//! Matrix files: the shipped ones parse and validate, the CPU matrix holds on a synthetic
//! model, broken rules are reported by cell and rule, bad files are refused by line.

use std::path::{Path, PathBuf};

use ggml_core::DType;
use harness::golden::GoldenSet;
use harness::matrix::file::parse;
use harness::matrix::report::GoldenStatus;
use harness::matrix::run::{run, RunOptions};
use harness::matrix::{Matrix, Rule, Source};
use rstest::rstest;

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ggml-rs-matrix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `bytes` to `name` in the scratch folder once (tests run in parallel).
fn scratch_file(name: &str, bytes: impl FnOnce() -> Vec<u8>) -> PathBuf {
    let path = scratch().join(name);
    if !path.exists() {
        let tmp = scratch().join(format!("{name}.{:?}", std::thread::current().id()));
        std::fs::write(&tmp, bytes()).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

fn model() -> PathBuf {
    harness::synthetic::cached_model(DType::Q4_1).unwrap()
}

fn corpus() -> PathBuf {
    scratch_file("corpus.txt", || {
        harness::default_corpus().as_bytes()[..2500].to_vec()
    })
}

/// `m` on the synthetic model: two passes of 4 sequences of 64 tokens.
fn on_synthetic(mut m: Matrix) -> Matrix {
    m.settings.model = Source::Path(model());
    m.settings.corpus = Source::Path(corpus());
    m.settings.ppl.n_ctx = 64;
    m.settings.ppl.n_batch = 256;
    m.settings.ppl.max_chunks = Some(8);
    m
}

fn options(goldens: GoldenSet, bless: bool) -> RunOptions {
    RunOptions {
        check_races: true,
        chaos_seeds: vec![None],
        weaken: Vec::new(),
        goldens,
        bless,
        require_golden: false,
    }
}

fn matrix_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("matrices")
        .join(name)
}

#[test]
fn cpu_matrix_has_74_identical_cells_2_reduce_groups_and_4_within_tolerance() {
    let m = Matrix::load(&matrix_file("cpu.toml")).unwrap();
    let embedded = Matrix::cpu();
    assert_eq!(
        (&m.cells, &m.rules, &m.settings),
        (&embedded.cells, &embedded.rules, &embedded.settings)
    );
    assert_eq!(m.cells.len(), 80);
    let ring = m.cell("cpu3-tensor-ring-c2").expect("ring cells");
    assert_eq!(ring.cell.all_gather, harness::session::AllGather::Ring);
    let c = m.cell("cpu2-layer-c2-t1").expect("grid names its cells");
    assert_eq!(c.cell.devices.to_string(), "cpu:2");
    assert_eq!((c.cell.n_copies, c.cell.n_ubatch), (2, 0));
    let u = m.cell("cpu4-layer-c4-t2-u32").expect("micro-batch cells");
    assert_eq!((u.cell.n_copies, u.cell.n_ubatch), (4, 32));
    assert!(m.cell("cpu-none-c1-t1").is_some() && m.cell("cpu4-layer-c4-t2").is_some());
    assert_eq!(m.settings.model, Source::Default);
    assert_eq!(
        (m.settings.ppl.n_ctx, m.settings.ppl.max_chunks),
        (512, None)
    );
    match &m.rules[..] {
        [Rule::Identical { cells, .. }, Rule::Identical { cells: f32s, .. }, Rule::Identical { cells: bf16s, .. }, within @ ..] =>
        {
            assert_eq!(cells.len(), 74);
            assert!(!cells.iter().any(|c| c.contains("reduce")));
            // Each two-device reduce cell is bit-identical to itself with two slots and
            // micro-batches.
            assert_eq!(
                f32s,
                &["cpu2-tensor-reduce-f32", "cpu2-tensor-reduce-f32-c2-u128"]
            );
            assert_eq!(
                bf16s,
                &["cpu2-tensor-reduce-bf16", "cpu2-tensor-reduce-bf16-c2-u128"]
            );
            assert_eq!(within.len(), 4);
        }
        r => panic!("{r:?}"),
    }
}

#[rstest]
#[case::one_gpu("cuda-1gpu.toml", 17, &["cuda:0", "cuda:0x2"])]
#[case::two_gpus("cuda-2gpu.toml", 23, &["cuda:0", "cuda:0x2", "cuda:0,cuda:1"])]
fn cuda_matrices_validate(#[case] file: &str, #[case] n_cells: usize, #[case] gpus: &[&str]) {
    let m = Matrix::load(&matrix_file(file)).unwrap();
    assert_eq!(m.cells.len(), n_cells);
    for g in gpus {
        assert!(
            m.cells.iter().any(|c| c.cell.devices.to_string() == *g),
            "{g}"
        );
    }
    assert!(m.cell("cpu-none-c1-t4").is_some());
    assert!(m.rules.iter().any(|r| matches!(
        r,
        Rule::Within { cell, of, rel_ppl } if cell == "cuda0-none-c1-t1" && of == "cpu-none-c1-t4" && *rel_ppl == 0.005
    )));
    let identical: Vec<&Vec<String>> = m
        .rules
        .iter()
        .filter_map(|r| match r {
            Rule::Identical { cells, .. } => Some(cells),
            _ => None,
        })
        .collect();
    assert_eq!(identical.len(), 1);
    assert_eq!(
        identical[0].len(),
        n_cells - 3,
        "every GPU cell but the two tensor-reduce ones, not the CPU one"
    );
    let tensor: Vec<&str> = m
        .cells
        .iter()
        .filter(|c| c.cell.split == harness::session::SplitMode::Tensor)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(tensor.len(), 2, "{tensor:?}");
    assert!(tensor.iter().all(|t| identical[0].iter().any(|c| c == t)));
    let reduce = m
        .cells
        .iter()
        .filter(|c| c.cell.split == harness::session::SplitMode::TensorReduce)
        .count();
    assert_eq!(reduce, 2);
}

#[test]
fn cuda_cells_are_refused_up_front_without_cuda() {
    if ggml_cuda::CudaBackend::device_count().is_ok_and(|n| n > 0) {
        return; // A GPU runner: the refusal cannot be observed here.
    }
    let m = on_synthetic(Matrix::load(&matrix_file("cuda-1gpu.toml")).unwrap());
    let t0 = std::time::Instant::now();
    let e = run(&m, &options(GoldenSet::default(), false), |r| {
        panic!("cell {} ran", r.name)
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("cell 'cuda0-none-c1-t1' needs cuda:0"), "{e}");
    assert!(e.contains("CUDA is unavailable"), "{e}");
    assert!(!e.contains('\n'), "one line: {e}");
    assert!(t0.elapsed().as_secs() < 5);
}

/// Cells of the CPU matrix that cover each path (one device, a pipeline of micro-batches,
/// exact tensor parallelism, a reduce): cheap enough to run under emulation, which is how
/// `cargo xtask aarch64` checks that every NEON level gives the x86 golden's bits.
const SAMPLE_CELLS: [&str; 4] = [
    "cpu-none-c1-t2",
    "cpu2-layer-c2-t2-u32",
    "cpu3-tensor-c1-t2",
    "cpu2-tensor-reduce-f32",
];

#[test]
fn cpu_matrix_sample_matches_the_cpu_golden() {
    let mut m = on_synthetic(Matrix::cpu());
    m.cells.retain(|c| SAMPLE_CELLS.contains(&c.name.as_str()));
    assert_eq!(
        m.cells.len(),
        SAMPLE_CELLS.len(),
        "a sample cell was renamed"
    );
    // The exact cells give one set of bits; the reduce cell its own (each has a golden).
    let group = |cells: &[&str]| {
        let cells: Vec<String> = cells.iter().map(|c| c.to_string()).collect();
        Rule::Identical {
            patterns: cells.clone(),
            cells,
        }
    };
    m.rules = vec![group(&SAMPLE_CELLS[..3]), group(&SAMPLE_CELLS[3..])];
    let goldens = GoldenSet::parse(harness::golden::EMBEDDED).unwrap();
    let mut opts = options(goldens, false);
    opts.require_golden = true;
    let report = run(&m, &opts, |_| {}).unwrap();
    assert!(report.passed(), "{:?}", report.violations);
    for r in &report.rows {
        assert_eq!(r.golden, GoldenStatus::Equal, "{}: {:?}", r.name, r.golden);
        assert_eq!(r.result.races, 0, "{}", r.name);
    }
    eprintln!("{}", report.hardware_note);
}

#[test]
fn cpu_matrix_holds_on_a_synthetic_model() {
    // Against the committed goldens: the synthetic model is seeded, so its CPU golden in
    // harness/goldens.json pins the bits of every cell.
    let m = on_synthetic(Matrix::cpu());
    let goldens = GoldenSet::parse(harness::golden::EMBEDDED).unwrap();
    let mut opts = options(goldens, false);
    opts.require_golden = true;
    let report = run(&m, &opts, |_| {}).unwrap();
    assert_eq!(report.rows.len(), 80);
    assert!(report.passed(), "{:?}", report.violations);
    assert!(report.rows.iter().all(|r| r.hardware == "cpu"
        && r.result.races == 0
        && r.golden
            == if r.name.starts_with("cpu4-tensor-reduce") {
                GoldenStatus::NotCompared
            } else {
                GoldenStatus::Equal
            }));
    assert!(report
        .hardware_note
        .starts_with("CPU golden shared by all ISA paths (this run: "));
    let table = report.markdown();
    assert_eq!(table.lines().count(), 2 + 80);
    assert!(
        table.contains("| cpu2-layer-c2-t1 | cpu:2 | Layer | 2 | 1 | batch |"),
        "{table}"
    );
    assert!(
        table.contains("| cpu3-layer-c4-t2-u64 | cpu:3 | Layer | 4 | 2 | 64 |"),
        "{table}"
    );
}

const PERTURBED: &str = r#"
[settings]
model = "default"
corpus = "default"
ctx = 64
batch = 256

[[cell]]
name = "reference"
devices = "cpu"
split = "none"
n_copies = 1
threads = 1

[[cell]]
name = "fewer-chunks"
devices = "cpu:2"
split = "layer"
n_copies = 2
threads = 2
chunks = 4

[rules]
identical = [["*"]]
within = [{ cell = "fewer-chunks", of = "reference", rel_ppl = 1e-9 }]
"#;

#[test]
fn perturbed_cell_is_reported_with_its_rules() {
    let m = on_synthetic(parse("perturbed.toml", None, PERTURBED).unwrap());
    let report = run(&m, &options(GoldenSet::default(), false), |_| {}).unwrap();
    let broken: Vec<(&str, &str)> = report
        .violations
        .iter()
        .map(|v| (v.cell.as_str(), v.rule.as_str()))
        .collect();
    assert_eq!(
        broken,
        [
            ("fewer-chunks", r#"identical ["*"]"#),
            (
                "fewer-chunks",
                r#"within { cell = "fewer-chunks", of = "reference", rel_ppl = 0.000000001 }"#
            ),
        ]
    );
    let text = report.violations[0].to_string();
    assert!(
        text.starts_with(r#"cell 'fewer-chunks' breaks rule `identical ["*"]`: PPL "#),
        "{text}"
    );
    assert!(report.json().unwrap().contains("\"violations\""));
}

const TWO_CELLS: &str = r#"
[settings]
model = "default"
corpus = "default"
ctx = 64
batch = 256

[[grid]]
devices = ["cpu", "cpu:2"]
split = ["layer"]
n_copies = [2]
threads = [2]

[rules]
identical = [["cpu-layer-c2-t2", "cpu2-*"]]
"#;

#[test]
fn bless_records_the_group_and_the_next_run_checks_it() {
    let m = on_synthetic(parse("two.toml", None, TWO_CELLS).unwrap());
    let blessed = run(&m, &options(GoldenSet::default(), true), |_| {}).unwrap();
    assert!(blessed.passed(), "{:?}", blessed.violations);
    assert_eq!(blessed.blessed.len(), 1);
    let g = &blessed.blessed[0];
    assert_eq!(
        (g.key.hardware.as_str(), g.key.n_ctx, g.key.chunks),
        ("cpu", 64, Some(8))
    );
    assert_eq!(g.ppl_f64_bits, blessed.rows[0].result.ppl_f64_bits);

    let mut set = GoldenSet::default();
    set.record(g.clone());
    let checked = run(&m, &options(set.clone(), false), |_| {}).unwrap();
    assert!(checked.passed(), "{:?}", checked.violations);
    assert!(checked.rows.iter().all(|r| r.golden == GoldenStatus::Equal));

    // Without any golden the cells are only noted as missing, unless one is required.
    let unchecked = run(&m, &options(GoldenSet::default(), false), |_| {}).unwrap();
    assert!(unchecked.passed());
    assert!(unchecked
        .rows
        .iter()
        .all(|r| r.golden == GoldenStatus::Missing));
    let mut strict = options(GoldenSet::default(), false);
    strict.require_golden = true;
    let refused = run(&m, &strict, |_| {}).unwrap();
    assert_eq!(refused.violations.len(), 2, "{:?}", refused.violations);
    assert!(refused.violations[0]
        .detail
        .contains("no golden for hardware 'cpu'"));

    let mut moved = g.clone();
    moved.ppl_f64_bits = "0000000000000000".into();
    set.record(moved);
    let report = run(&m, &options(set, false), |_| {}).unwrap();
    assert_eq!(report.violations.len(), 2);
    assert!(report.violations.iter().all(|v| v.rule == "golden"));
}

const HEADER: &str =
    "[settings]\nmodel = \"default\"\ncorpus = \"default\"\nctx = 64\nbatch = 256\n";
const CELL: &str =
    "[[cell]]\nname = \"a\"\ndevices = \"cpu\"\nsplit = \"none\"\nn_copies = 1\nthreads = 1\n";

#[rstest]
#[case::unknown_key(format!("{HEADER}colour = \"red\"\n{CELL}"), 6, "unknown field `colour`")]
#[case::unknown_cell_key(format!("{HEADER}{CELL}speed = 3\n"), 12, "unknown field `speed`")]
#[case::missing_cell_in_rule(
    format!("{HEADER}{CELL}[rules]\nwithin = [{{ cell = \"a\", of = \"b\", rel_ppl = 0.1 }}]\n"),
    13,
    "no cell named 'b'"
)]
#[case::glob_matching_nothing(format!("{HEADER}{CELL}[rules]\nidentical = [[\"gpu*\"]]\n"), 13, "'gpu*' matches no cell")]
#[case::duplicate_name(format!("{HEADER}{CELL}{CELL}"), 13, "duplicate cell name 'a'")]
#[case::duplicate_grid_name(
    format!("{HEADER}{CELL}[[grid]]\ndevices = [\"cpu:2\", \"cpu:2\"]\nsplit = [\"none\"]\nn_copies = [1]\nthreads = [1]\n"),
    13,
    "duplicate cell name 'cpu2-none-c1-t1'"
)]
#[case::bad_device(format!("{HEADER}{}", CELL.replace("\"cpu\"", "\"gpu:0\"")), 8, "devices = \"gpu:0\"")]
#[case::bad_split(format!("{HEADER}{}", CELL.replace("\"none\"", "\"row\"")), 9, "unknown variant `row`")]
#[case::too_many_copies(format!("{HEADER}{}", CELL.replace("n_copies = 1", "n_copies = 8")), 10, "n_copies = 8: must be 1 to 4")]
#[case::no_cells(HEADER.to_string(), 1, "no cells")]
#[case::not_toml(format!("{HEADER}[[cell]\n"), 6, "")]
fn bad_files_are_refused_with_their_line(
    #[case] text: String,
    #[case] line: usize,
    #[case] reason: &str,
) {
    let e = parse("bad.toml", None, &text).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!("bad.toml:{line}: ")),
        "{e}\n--\n{text}"
    );
    assert!(e.contains(reason), "{e}");
}

#[rstest]
#[case("cpu", 80)]
#[case("cuda", 17)]
#[case("cuda-2gpu", 23)]
#[case("cuda-sim", 9)]
#[case("gemma3", 6)]
#[case("moe", 6)]
fn builtin_matrices_match_their_files(#[case] name: &str, #[case] n_cells: usize) {
    let m = Matrix::builtin(name).unwrap();
    assert_eq!(m.cells.len(), n_cells);
    let file = match name {
        "cpu" => "cpu.toml",
        "cuda" => "cuda-1gpu.toml",
        "cuda-sim" => "cuda-sim.toml",
        "gemma3" => "gemma3.toml",
        "moe" => "moe.toml",
        _ => "cuda-2gpu.toml",
    };
    assert_eq!(Matrix::load(&matrix_file(file)).unwrap().cells, m.cells);
    assert!(Matrix::builtin("tpu").is_none());
}

/// The CUDA backend's matrix on emulated GPUs, as CI runs it: race checker on, two chaos
/// seeds in the streams; every exact CUDA cell equals `cuda-sim:0` and the committed
/// cuda-sim golden (taken without chaos), the others hold their tolerances.
#[test]
fn cuda_sim_matrix_holds_under_chaos_with_the_race_checker() {
    let m = Matrix::builtin("cuda-sim").unwrap();
    assert_eq!(m.settings.model, Source::Synthetic(DType::Q4_1));
    let goldens = GoldenSet::parse(harness::golden::EMBEDDED).unwrap();
    let mut opts = options(goldens, false);
    opts.require_golden = true;
    opts.chaos_seeds = vec![Some(1), Some(2)];
    let report = run(&m, &opts, |_| {}).unwrap();
    assert!(report.passed(), "{:?}", report.violations);
    assert_eq!(report.rows.len(), 2 * 9);
    for r in &report.rows {
        assert_eq!(r.result.races, 0, "{}", r.name);
        let exact = r.name.starts_with("sim0") && !r.name.contains("reduce");
        let want = if exact {
            GoldenStatus::Equal
        } else {
            GoldenStatus::NotCompared
        };
        assert_eq!(r.golden, want, "{}", r.name);
        if r.name.starts_with("sim") {
            assert_eq!(r.hardware, "cuda-sim", "{}", r.name);
        }
    }
}

#[rstest]
#[case::bad_dtype("synthetic:q9_9", "model: 'q9_9' is not a weight dtype")]
#[case::not_a_weight("synthetic:i32", "model: 'i32' is not a weight dtype")]
fn bad_synthetic_models_are_refused_with_their_line(#[case] model: &str, #[case] want: &str) {
    let text = format!(
        "[settings]\nmodel = \"{model}\"\ncorpus = \"default\"\nctx = 64\nbatch = 64\n\n[[cell]]\nname = \"a\"\ndevices = \"cpu\"\nsplit = \"none\"\nn_copies = 1\nthreads = 1\n"
    );
    let e = parse("m.toml", None, &text).unwrap_err().to_string();
    assert!(e.starts_with("m.toml:2: ") && e.contains(want), "{e}");
}
