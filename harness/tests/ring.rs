//! `--all-gather ring`: all-gathers pipelined with the products they feed, their copies
//! on a copy engine per device. Bit-identical to `concat` and to one device, race-free
//! under chaos; each engine rule, weakened, is caught by the checker.

use ggml_core::DType;
use harness::model::Arch;
use harness::perplexity::PplSettings;
use harness::regress::{run_cell, Cell, RegressSettings};
use harness::session::{AllGather, RunConfig, Session, SplitMode};
use rstest::rstest;

fn synthetic(arch: Arch) -> std::path::PathBuf {
    harness::synthetic::cached_model_of(arch, DType::Q4_1).unwrap()
}

fn cell(devices: &str, split: SplitMode, n_copies: usize, all_gather: AllGather) -> Cell {
    Cell {
        devices: devices.parse().unwrap(),
        split,
        n_copies,
        threads: 2,
        n_ubatch: 0,
        reduce_bf16_min: None,
        all_gather,
    }
}

fn settings(weaken: Vec<ggml_sched::WeakenKnob>, chaos: u64) -> RegressSettings {
    RegressSettings {
        ppl: PplSettings {
            n_ctx: 48,
            n_batch: 96,
            max_chunks: Some(2),
        },
        check_races: true,
        chaos: Some(chaos),
        weaken,
    }
}

#[rstest]
#[case::llama_cpu2(Arch::Llama, "cpu:2", 1)]
#[case::llama_cpu3_c2(Arch::Llama, "cpu:3", 2)]
#[case::gemma_cpu2_c2(Arch::Gemma3, "cpu:2", 2)]
#[case::llama_cuda_sim(Arch::Llama, "cuda-sim:0,cuda-sim:1", 1)]
fn ring_gives_the_bits_of_concat_and_of_one_device(
    #[case] arch: Arch,
    #[case] devices: &str,
    #[case] n_copies: usize,
) {
    let text = &harness::default_corpus()[..1500];
    let s = settings(Vec::new(), 5);
    let model = synthetic(arch);
    let one = run_cell(
        &model,
        text,
        &cell("cpu", SplitMode::None, 1, AllGather::Concat),
        &s,
    )
    .unwrap();
    let concat = cell(devices, SplitMode::Tensor, n_copies, AllGather::Concat);
    let concat = run_cell(&model, text, &concat, &s).unwrap();
    let ring = cell(devices, SplitMode::Tensor, n_copies, AllGather::Ring);
    let ring = run_cell(&model, text, &ring, &s).unwrap();
    assert_eq!(ring.races, 0);
    assert_eq!(ring.logits_sha256, concat.logits_sha256, "{devices}");
    if !devices.starts_with("cuda") {
        assert_eq!(ring.logits_sha256, one.logits_sha256, "{devices}");
    }
    assert_eq!(ring.all_gather, AllGather::Ring);
}

/// The engine rules that the model's graph depends on, weakened, are reported by the
/// checker. (`engine-reuse` is not observable here: every device gathers from every
/// other in each layer, so the engine's receive buffer of run r is already ordered after
/// its readers of run r - N through the producer waits; ggml-sched's `engines` tests
/// show it on a pipeline, with the checker and in the numbers.)
#[rstest]
#[case::early(ggml_sched::WeakenKnob::EngineEarly)]
#[case::no_arrival(ggml_sched::WeakenKnob::EngineNoArrival)]
fn weakened_engine_rules_are_caught(#[case] knob: ggml_sched::WeakenKnob) {
    let text = &harness::default_corpus()[..1500];
    let s = settings(vec![knob], 7);
    let ring = cell("cpu:2", SplitMode::Tensor, 2, AllGather::Ring);
    let r = run_cell(&synthetic(Arch::Llama), text, &ring, &s).unwrap();
    assert!(r.races > 0, "{knob:?}: no race reported");
}

#[test]
fn ring_needs_the_exact_tensor_split() {
    let text = &harness::default_corpus()[..200];
    let s = settings(Vec::new(), 1);
    let bad = cell("cpu:2", SplitMode::Layer, 1, AllGather::Ring);
    let e = run_cell(&synthetic(Arch::Llama), text, &bad, &s)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--all-gather ring applies to --split-mode tensor"),
        "{e}"
    );
}

/// The plan of a ring pass: every gather that feeds a product is cut into one chunk per
/// device, each device multiplies every chunk, and computed tensors cross devices only
/// on the copy engines, each copy from a device to the next one round the ring.
#[rstest]
#[case::two(2)]
#[case::three(3)]
fn ring_plans_chunk_products_and_copy_on_engines(#[case] n: usize) {
    let devices = format!("cpu:{n}");
    let mut config = RunConfig::simple(devices.parse().unwrap(), SplitMode::Tensor, 1, 2);
    config.all_gather = AllGather::Ring;
    let session = Session::open(&synthetic(Arch::Llama), config).unwrap();
    assert_eq!(session.engines.len(), n);
    let mut kv = session.kv_cache(48).unwrap();
    let mut exec = session
        .sched_executor(ggml_sched::PlanStyle::Minimal)
        .unwrap();
    let mut batch = harness::batch::Batch::default();
    for i in 0..48 {
        batch.push(0, i, 0, i == 47);
    }
    exec.prepare(&session.model, &mut kv, &batch).unwrap();
    let sched = exec.scheduler();
    let part = sched.partition().unwrap();
    let plan = sched.plan(0).unwrap();
    let products = |name: &str| {
        part.splits
            .iter()
            .flat_map(|s| &s.nodes)
            .filter(|n| {
                sched
                    .tensor(0, **n)
                    .unwrap()
                    .name
                    .as_str()
                    .starts_with(name)
            })
            .count()
    };
    // n chunks x n devices, then each device joins its chunks.
    assert_eq!(products("attn_proj-0#"), n * n);
    assert_eq!(products("ffn_out-0#"), n * n);
    assert_eq!(products("attn_proj-0.join#"), n * (n - 1));
    let mut forwards = 0;
    for cp in &part.copies {
        if cp.kind == ggml_sched::SourceKind::Computed {
            assert_eq!(cp.to, (cp.from + 1) % n, "{}: one link", cp.name);
            forwards += usize::from(cp.via.is_some());
        }
    }
    assert_eq!(forwards > 0, n > 2);
    let mut engine = 0;
    for a in plan.actions() {
        if let ggml_sched::Action::Copy { on, copy, .. } = a {
            match on {
                ggml_sched::CopyOn::Engine(_) => engine += 1,
                _ => assert_ne!(
                    part.copies[*copy].kind,
                    ggml_sched::SourceKind::Computed,
                    "{plan}"
                ),
            }
        }
    }
    assert!(engine > 0, "{plan}");
}
