//! Mixtures of experts: the synthetic llama with 4 experts (2 used per token) through
//! every split mode, tensor parallelism over experts with its single all-reduce per FFN,
//! and cuda-sim.

use ggml_core::{DType, Op};
use harness::model::{build_forward, BatchShape, Model};
use harness::perplexity::PplSettings;
use harness::regress::{run_cell, Cell, RegressSettings};
use harness::session::SplitMode;
use rstest::rstest;

fn synthetic() -> std::path::PathBuf {
    harness::synthetic::cached_moe_model(DType::Q4_1).unwrap()
}

fn model() -> Model {
    let f = harness::gguf_file::GgufFile::open(&synthetic()).unwrap();
    Model::from_gguf(&f).unwrap()
}

fn cell(devices: &str, split: SplitMode, n_copies: usize, n_ubatch: usize) -> Cell {
    Cell {
        devices: devices.parse().unwrap(),
        split,
        n_copies,
        threads: 2,
        n_ubatch,
        reduce_bf16_min: None,
        all_gather: Default::default(),
    }
}

fn settings() -> RegressSettings {
    RegressSettings {
        ppl: PplSettings {
            n_ctx: 48,
            n_batch: 96,
            max_chunks: Some(2),
        },
        check_races: true,
        chaos: Some(3),
        weaken: Vec::new(),
    }
}

#[test]
fn synthetic_moe_loads_with_its_experts() {
    let m = model();
    assert_eq!((m.hp.n_expert, m.hp.n_expert_used), (4, 2));
    for l in &m.layers {
        let router = l.ffn_gate_inp.expect("a router per layer");
        assert_eq!(m.weights[router.index()].ne, [256, 4, 1, 1]);
        assert_eq!(m.weights[l.ffn_gate.index()].ne, [256, 512, 4, 1]);
        assert_eq!(m.weights[l.ffn_down.index()].ne, [512, 256, 4, 1]);
    }
}

/// The graph has llama.cpp's MoE shape: per layer a router (softmax, top-k), three
/// expert products and the normalised weights.
#[test]
fn the_moe_graph_routes_every_layer() {
    let m = model();
    let cache = ggml_core::Tensor::contiguous(DType::F16, [m.hp.n_embd_kv(), 256, 1, 1]).unwrap();
    let shape = BatchShape {
        n_tokens: 7,
        n_kv: 256,
        n_outputs: 7,
    };
    let g = build_forward(&m, &vec![(cache, cache); m.hp.n_layer], shape).unwrap();
    let count = |op: fn(&Op) -> bool| {
        g.nodes
            .iter()
            .filter(|n| op(&g.tensors[n.index()].op))
            .count()
    };
    let layers = m.hp.n_layer;
    assert_eq!(count(|o| *o == Op::MulMatId), 3 * layers);
    assert_eq!(count(|o| matches!(o, Op::ArgsortTopK { k: 2 })), layers);
    assert_eq!(count(|o| *o == Op::SumRows), layers);
    let out = g
        .nodes
        .iter()
        .find(|n| g.tensors[n.index()].name.as_str() == "ffn_moe_out-0")
        .expect("the expert sum of layer 0");
    assert_eq!(g.tensors[out.index()].ne, [256, 7, 1, 1]);
}

/// Every exact split of the MoE model (layers, pipelined copies, micro-batches, tensor
/// parallelism over experts on 2 and 3 devices) gives the logits of one CPU, bit for bit,
/// under chaos and the race checker.
#[rstest]
#[case::layer_c2("cpu:2", SplitMode::Layer, 2, 0)]
#[case::layer_ubatch("cpu:3", SplitMode::Layer, 2, 16)]
#[case::tensor2("cpu:2", SplitMode::Tensor, 1, 0)]
#[case::tensor3_c2("cpu:3", SplitMode::Tensor, 2, 32)]
fn synthetic_moe_splits_give_the_bits_of_one_device(
    #[case] devices: &str,
    #[case] split: SplitMode,
    #[case] n_copies: usize,
    #[case] n_ubatch: usize,
) {
    let text = &harness::default_corpus()[..1500];
    let s = settings();
    let one = run_cell(&synthetic(), text, &cell("cpu", SplitMode::None, 1, 0), &s).unwrap();
    let split = run_cell(
        &synthetic(),
        text,
        &cell(devices, split, n_copies, n_ubatch),
        &s,
    )
    .unwrap();
    assert_eq!(
        split.logits_sha256, one.logits_sha256,
        "{devices} {split:?}"
    );
    assert_eq!(split.races, 0);
    assert!(one.ppl.is_finite() && one.ppl > 1.0);
}

/// Tensor-reduce over experts sums partial products in another order: within 2.4e-3,
/// twice what it measured (1.202e-3 on 2026-11-26; routing is a discrete choice, so a last-bit difference in the
/// router's input can flip a near-tie between two experts, and the real model shows the
/// same order of sensitivity with and without routing, see matrices/moe.toml). (`cpu:3` cannot cut `n_ff` = 512
/// on 32-element blocks; the exact cells cover three devices.)
#[test]
fn synthetic_moe_tensor_reduce_is_close() {
    let devices = "cpu:2";
    let text = &harness::default_corpus()[..1500];
    let s = settings();
    let one = run_cell(&synthetic(), text, &cell("cpu", SplitMode::None, 1, 0), &s).unwrap();
    let red = run_cell(
        &synthetic(),
        text,
        &cell(devices, SplitMode::TensorReduce, 1, 0),
        &s,
    )
    .unwrap();
    assert_eq!(red.races, 0);
    let rel = (red.ppl - one.ppl).abs() / one.ppl;
    eprintln!("tensor-reduce vs none: {rel:.3e}");
    assert!(
        rel < 2.4e-3,
        "tensor-reduce {} vs {} ({rel:.2e})",
        red.ppl,
        one.ppl
    );
}

/// The router, top-k, expert products and weighting on the CUDA backend (cuda-sim):
/// within 0.43 % of the CPU (measured 2.14e-3 with the second-generation products at
/// 39c1111, 1.13e-3 with the first; the limit is twice the measurement). Each product is within mul_mat's CUDA tolerance of the CPU's
/// (see tests/cuda_sim.rs; the dense model agrees to 1e-4), and a near-tie in routing
/// that flips amplifies that, as for tensor-reduce above.
#[test]
fn synthetic_moe_on_cuda_sim_matches_the_cpu() {
    let text = &harness::default_corpus()[..1500];
    let mut s = settings();
    s.chaos = None;
    let cpu = run_cell(&synthetic(), text, &cell("cpu", SplitMode::None, 1, 0), &s).unwrap();
    let gpu = run_cell(
        &synthetic(),
        text,
        &cell("cuda-sim:0", SplitMode::None, 1, 0),
        &s,
    )
    .unwrap();
    let rel = (gpu.ppl - cpu.ppl).abs() / cpu.ppl;
    eprintln!("cuda-sim vs cpu: {rel:.3e}");
    assert!(
        rel < 4.3e-3,
        "cuda-sim {} vs cpu {} ({rel:.2e})",
        gpu.ppl,
        cpu.ppl
    );
}

/// Tensor parallelism over experts needs one all-reduce per FFN, after the weighted sum
/// of the chosen experts: `n_embd` floats per token, not `n_embd` per chosen expert.
#[test]
fn one_all_reduce_per_moe_ffn_after_the_expert_sum() {
    let m = model();
    let points = harness::model::tp::reduce_points(&m).unwrap();
    assert_eq!(points.len(), 2 * m.hp.n_layer);
    for p in points
        .iter()
        .filter(|p| p.partial.starts_with("ffn_moe_down"))
    {
        assert_eq!(p.at, format!("ffn_moe_out-{}", p.layer));
        assert_eq!(
            p.bytes_at_partial,
            4 * 256 * 2,
            "two experts' outputs per token"
        );
        assert_eq!(p.bytes_at_point, 4 * 256);
    }
    for p in points.iter().filter(|p| p.partial.starts_with("attn_proj")) {
        assert_eq!(p.at, p.partial, "the residual add reads the projection");
    }
    // The dense model keeps its reduce at the down product.
    let f =
        harness::gguf_file::GgufFile::open(&harness::synthetic::cached_model(DType::Q4_1).unwrap())
            .unwrap();
    let dense = Model::from_gguf(&f).unwrap();
    for p in harness::model::tp::reduce_points(&dense).unwrap() {
        assert_eq!(p.at, p.partial);
    }
}

// --- The real MoE model: SmolLM2 upcycled by make-moe (4 experts, 2 used, seed 1) ------

/// llama-perplexity on `smollm2-moe` (the file `harness::moe_model_path()` builds), GPL-3
/// corpus, `-c 512 -b 512 -t 2`, CPU (llama.cpp of llama-cpp-python 0.3.36), measured
/// 2026-11-25: running PPL per chunk.
const REFERENCE_CHUNKS: [f64; 14] = [
    16.5554, 18.9783, 17.6229, 19.7570, 19.6714, 19.4909, 19.5882, 19.7621, 19.7528, 20.0360,
    19.9249, 20.0117, 19.2113, 20.0262,
];

#[test]
fn moe_whole_corpus_tracks_llama_cpp() {
    use harness::perplexity::perplexity;
    use harness::session::{RunConfig, Session};
    let path = harness::moe_model_path().unwrap();
    let config = RunConfig::simple("cpu".parse().unwrap(), SplitMode::None, 1, 2);
    let s = Session::open(&path, config).unwrap();
    assert_eq!((s.model.hp.n_expert, s.model.hp.n_expert_used), (4, 2));
    let mut text = harness::default_corpus().to_string();
    text.pop();
    let tokens = s.tokenizer.encode(&text);
    let mut kv = s.kv_cache(512).unwrap();
    let mut exec = s.executor().unwrap();
    let settings = PplSettings {
        n_ctx: 512,
        n_batch: 512,
        max_chunks: None,
    };
    // As llama-perplexity: BOS first only where the vocabulary adds it (not SmolLM2's).
    let bos = s.tokenizer.add_bos().then(|| s.tokenizer.bos()).flatten();
    let r = perplexity(
        &s.model,
        exec.as_mut(),
        &mut kv,
        &tokens,
        bos,
        settings,
        |_, _, _| {},
    )
    .unwrap();
    assert_eq!(r.chunks.len(), REFERENCE_CHUNKS.len());
    for (i, (ours, theirs)) in r.chunks.iter().zip(REFERENCE_CHUNKS).enumerate() {
        let rel = (ours - theirs).abs() / theirs;
        eprintln!(
            "[{}] ours {ours:.4} llama.cpp {theirs:.4} (rel diff {rel:.2e})",
            i + 1
        );
        assert!(rel < 1.5e-2, "chunk {}: {ours} vs {theirs}", i + 1);
    }
    let last = REFERENCE_CHUNKS[13];
    let rel = (r.ppl - last).abs() / last;
    assert!(rel < 2e-3, "final PPL {} vs {last} ({rel:.2e})", r.ppl);
}

/// The MoE CPU matrix: layer splits, micro-batches and tensor parallelism over experts on
/// two and three devices bit-identical to one device, race-checked, equal to the golden.
#[test]
fn moe_matrix_is_bit_identical_race_free_and_golden() {
    use harness::golden::GoldenSet;
    use harness::matrix::run::{run, RunOptions};
    let m = harness::matrix::Matrix::builtin("moe").unwrap();
    let opts = RunOptions {
        check_races: true,
        chaos_seeds: vec![None],
        weaken: Vec::new(),
        goldens: GoldenSet::parse(harness::golden::EMBEDDED).unwrap(),
        bless: false,
        require_golden: true,
    };
    let report = run(&m, &opts, |_| {}).unwrap();
    assert!(report.passed(), "{:?}", report.violations);
    for r in &report.rows {
        assert_eq!(r.result.races, 0, "{}", r.name);
        if !r.name.contains("reduce") {
            assert_eq!(
                r.golden,
                harness::matrix::report::GoldenStatus::Equal,
                "{}: no golden or a different one",
                r.name
            );
        }
    }
}

/// On two emulated GPUs, a pipelined layer split and tensor parallelism over experts give
/// the bits of one (cuda-sim), under chaos and the race checker.
#[rstest]
#[case::layer("cuda-sim:0,cuda-sim:1", SplitMode::Layer, 2, 16)]
#[case::tensor("cuda-sim:0,cuda-sim:1", SplitMode::Tensor, 1, 0)]
fn synthetic_moe_cuda_sim_splits_give_the_bits_of_one_gpu(
    #[case] devices: &str,
    #[case] split: SplitMode,
    #[case] n_copies: usize,
    #[case] n_ubatch: usize,
) {
    let text = &harness::default_corpus()[..600];
    let mut s = settings();
    s.ppl.max_chunks = Some(1);
    let one = run_cell(
        &synthetic(),
        text,
        &cell("cuda-sim:0", SplitMode::None, 1, 0),
        &s,
    )
    .unwrap();
    let split = run_cell(
        &synthetic(),
        text,
        &cell(devices, split, n_copies, n_ubatch),
        &s,
    )
    .unwrap();
    assert_eq!(
        split.logits_sha256, one.logits_sha256,
        "{devices} {split:?}"
    );
    assert_eq!(split.races, 0);
}
