//! CUDA graphs through the whole stack on cuda-sim's emulated GPUs: greedy generation on
//! the synthetic model gives bit for bit the same logits with graphs on and off, in every
//! split mode, under the race checker; and in the steady state of generation no kernel
//! is launched from the host, only graphs. Greedy generation with the token taken on the
//! device (ARGMAX) streams the same tokens as the host's argmax over the logits, with one
//! host sync and 4 bytes read back per token.

use ggml_core::DType;
use ggml_cuda::{CudaTuning, HostCounters};
use harness::batch::Batch;
use harness::session::{RunConfig, Session, SplitMode};
use rstest::rstest;

mod common;

/// Tokens generated; the counters are read over the last [`STEADY`] of them (with two
/// pipeline slots a graph is captured at the third and fourth token).
const GEN: usize = 6;
const STEADY: usize = 2;

struct Run {
    /// The logits of the prompt's last token and of each generated token, as bits.
    logits: Vec<Vec<u32>>,
    /// Host counters of the CUDA devices over the last `STEADY` tokens, summed.
    steady: HostCounters,
    /// Per device over the same tokens.
    per_device: Vec<HostCounters>,
    races: usize,
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// A session on the synthetic Q4_1 model with the race checker and graphs on or off.
fn open(devices: &str, split: SplitMode, n_copies: usize, graphs: bool) -> Session {
    let mut config = RunConfig::simple(devices.parse().unwrap(), split, n_copies, 2);
    config.check_races = true;
    config.cuda_tuning = CudaTuning {
        graphs,
        ..CudaTuning::default()
    };
    let path = harness::synthetic::cached_model(DType::Q4_1).unwrap();
    Session::open(&path, config).unwrap()
}

fn generate(devices: &str, split: SplitMode, n_copies: usize, graphs: bool) -> Run {
    let session = open(devices, split, n_copies, graphs);
    let mut kv = session.kv_cache(64).unwrap();
    let mut exec = session.executor().unwrap();
    let prompt: Vec<u32> = "Hi, GPU".bytes().map(u32::from).collect();
    let mut batch = Batch::default();
    for (i, &t) in prompt.iter().enumerate() {
        batch.push(t, i as i32, 0, i + 1 == prompt.len());
    }
    let mut logits = vec![exec.forward(&session.model, &mut kv, &batch).unwrap()];
    let gpus = session.cuda_backends();
    let snap = || gpus.iter().map(|g| g.host_counters()).collect::<Vec<_>>();
    let mut before = snap();
    for i in 0..GEN {
        if i == GEN - STEADY {
            before = snap();
        }
        let tok = argmax(logits.last().unwrap());
        let mut b = Batch::default();
        b.push(tok, (prompt.len() + i) as i32, 0, true);
        logits.push(exec.forward(&session.model, &mut kv, &b).unwrap());
    }
    let per_device: Vec<HostCounters> =
        snap().into_iter().zip(before).map(|(a, b)| a - b).collect();
    let races = session.race_log.as_ref().unwrap().race_count();
    Run {
        logits: logits
            .into_iter()
            .map(|l| l.iter().map(|x| x.to_bits()).collect())
            .collect(),
        steady: per_device.iter().copied().sum(),
        per_device,
        races,
    }
}

#[rstest]
#[case::one_gpu("cuda-sim:0", SplitMode::None, 1)]
#[case::layer_split_two_slots("cuda-sim:0,cuda-sim:1", SplitMode::Layer, 2)]
#[case::tensor_split("cuda-sim:0x2", SplitMode::Tensor, 1)]
fn generation_is_bit_identical_with_graphs(
    #[case] devices: &str,
    #[case] split: SplitMode,
    #[case] n_copies: usize,
) {
    let on = generate(devices, split, n_copies, true);
    let off = generate(devices, split, n_copies, false);
    assert_eq!(on.races, 0);
    assert_eq!(off.races, 0);
    assert_eq!(on.logits.len(), GEN + 1);
    for (i, (a, b)) in on.logits.iter().zip(&off.logits).enumerate() {
        assert!(
            a == b,
            "{devices}: logits of step {i} differ with graphs on"
        );
    }
    let per_token = |x: u64| x as f64 / STEADY as f64;
    // Steady state with graphs: only graphs run, each device launches at least one per
    // token, and no kernel is launched from the host.
    let s = on.steady;
    assert_eq!(s.calls.launch, 0, "{devices}: {s:?}");
    assert_eq!(s.graph_captures, 0, "{devices}: {s:?}");
    assert_eq!(s.kernel_launches, off.steady.kernel_launches, "{devices}");
    for d in &on.per_device {
        assert!(d.graph_launches >= STEADY as u64, "{devices}: {d:?}");
    }
    // Without graphs, the same kernels are launched one by one.
    assert_eq!(off.steady.graph_launches, 0);
    assert_eq!(off.steady.calls.launch, off.steady.kernel_launches);
    if devices == "cuda-sim:0" {
        // One graph launch per token, and 8 driver calls: the uploads' copy, the graph
        // launch, the scheduler's split record, the staging copy, the copy of the staged
        // bytes to pinned memory, the staging record, and the host's wait (an event
        // query, then the event synchronize). Before the read rode on that wait: 9 (a
        // stream synchronize after a copy enqueued at read time) and 2 host syncs.
        // The logits come back through pinned memory enqueued behind the staging copy
        // (`Backend::buffer_prefetch`): the wait for the staging event is the only one.
        assert_eq!(per_token(s.graph_launches), 1.0, "{s:?}");
        assert_eq!(per_token(s.driver_calls()), 8.0, "{s:?}");
        assert_eq!(per_token(s.host_syncs), 1.0, "{s:?}");
        assert_eq!(per_token(s.calls.stream_sync), 0.0, "{s:?}");
    }
}

/// The logits (as bits) of a 124-token prompt's last token and of 8 tokens generated
/// after it, so that the cells attended grow from one KV tile (128) to two at position
/// 128: the decode attention then writes partials and combines them, its workspace grows
/// and the captured graphs are dropped and captured again. The race count beside them.
fn generate_across_a_tile(graphs: bool) -> (Vec<Vec<u32>>, usize) {
    let session = open("cuda-sim:0", SplitMode::None, 1, graphs);
    let prompt: Vec<u32> = (0..124u32).map(|i| 32 + (i * 7) % 90).collect();
    let bits = common::greedy_logit_bits(&session, 256, &prompt, 8);
    (bits, session.race_log.as_ref().unwrap().race_count())
}

/// Generation across a KV tile boundary gives the same bits with graphs as without, and
/// no race: the step from one tile to two replaces the graphs, it does not replay stale
/// ones.
#[test]
fn generation_across_a_kv_tile_is_bit_identical_with_graphs() {
    let (on, on_races) = generate_across_a_tile(true);
    let (off, off_races) = generate_across_a_tile(false);
    assert_eq!((on_races, off_races), (0, 0));
    assert_eq!(on.len(), 9);
    for (i, (a, b)) in on.iter().zip(&off).enumerate() {
        assert!(a == b, "logits of step {i} differ with graphs on");
    }
}

/// Greedy decoding of `GEN` tokens after the prompt, each pass's token taken by
/// ARGMAX on the device or the host's argmax of the logits: the tokens, the host
/// counters of the CUDA devices over the last `STEADY`, races, the vocabulary size.
fn greedy_tokens(
    devices: &str,
    split: SplitMode,
    n_copies: usize,
    device_argmax: bool,
) -> (Vec<u32>, HostCounters, usize, usize) {
    let session = open(devices, split, n_copies, true);
    let mut kv = session.kv_cache(64).unwrap();
    let mut exec = session.executor().unwrap();
    let model = &session.model;
    let prompt: Vec<u32> = "Hi, GPU".bytes().map(u32::from).collect();
    let mut batch = Batch::default();
    for (i, &t) in prompt.iter().enumerate() {
        batch.push(t, i as i32, 0, i + 1 == prompt.len());
    }
    let mut pass = |kv: &mut _, b: &Batch| -> u32 {
        if device_argmax {
            let t = exec.forward_greedy(model, kv, b).unwrap();
            assert_eq!(t.len(), 1);
            t[0]
        } else {
            argmax(&exec.forward(model, kv, b).unwrap())
        }
    };
    let mut toks = vec![pass(&mut kv, &batch)];
    let gpus = session.cuda_backends();
    let snap = || gpus.iter().map(|g| g.host_counters()).sum::<HostCounters>();
    let mut before = snap();
    for i in 0..GEN {
        if i == GEN - STEADY {
            before = snap();
        }
        let mut b = Batch::default();
        b.push(*toks.last().unwrap(), (prompt.len() + i) as i32, 0, true);
        toks.push(pass(&mut kv, &b));
    }
    let steady = snap() - before;
    let races = session.race_log.as_ref().unwrap().race_count();
    (toks, steady, races, model.hp.n_vocab)
}

/// The token of greedy generation computed on the device (ARGMAX after the logits, only
/// its 4 bytes read back) is the host's argmax of the logits, token for token, on the CPU
/// and on emulated GPUs in every split mode. On one GPU a token then costs one host sync
/// and 4 bytes of result read back, where the logits path reads a row of `n_vocab` floats.
#[rstest]
#[case::cpu("cpu", SplitMode::None, 1)]
#[case::one_gpu("cuda-sim:0", SplitMode::None, 1)]
#[case::layer_split_two_slots("cuda-sim:0,cuda-sim:1", SplitMode::Layer, 2)]
#[case::tensor_split("cuda-sim:0x2", SplitMode::Tensor, 1)]
fn greedy_tokens_are_the_same_with_the_argmax_on_the_device(
    #[case] devices: &str,
    #[case] split: SplitMode,
    #[case] n_copies: usize,
) {
    let (host, host_counts, host_races, n_vocab) = greedy_tokens(devices, split, n_copies, false);
    let (dev, dev_counts, dev_races, _) = greedy_tokens(devices, split, n_copies, true);
    assert_eq!((host_races, dev_races), (0, 0));
    assert_eq!(
        dev, host,
        "{devices}: greedy tokens differ with the device argmax"
    );
    let per_token = |x: u64| x as f64 / STEADY as f64;
    if devices == "cuda-sim:0" {
        println!(
            "per token, host argmax: {host_counts:?}\nper token, device argmax: {dev_counts:?}"
        );
        // Besides the result, each graph replay copies the kernels' error words back
        // (the same bytes on both paths).
        let host_words = per_token(host_counts.d2h_bytes) - 4.0 * n_vocab as f64;
        let dev_words = per_token(dev_counts.d2h_bytes) - 4.0;
        assert_eq!(host_words, dev_words, "{host_counts:?} {dev_counts:?}");
        assert!(dev_words < 64.0, "{dev_counts:?}");
        assert_eq!(per_token(dev_counts.host_syncs), 1.0);
        assert_eq!(per_token(dev_counts.graph_launches), 1.0);
        assert_eq!(per_token(dev_counts.driver_calls()), 8.0, "{dev_counts:?}");
        // One more kernel per token: the argmax.
        assert_eq!(
            per_token(dev_counts.kernel_launches),
            per_token(host_counts.kernel_launches) + 1.0
        );
    }
}

/// `generate` with the greedy sampler (the token from the device) streams the same
/// tokens and text as with a sampler that takes the logits and keeps the single best
/// (top-k 1 at temperature 1: the host's choice), on the CPU and on an emulated GPU.
#[rstest]
#[case::cpu("cpu")]
#[case::one_gpu("cuda-sim:0")]
fn generate_streams_the_same_text_with_the_device_argmax(#[case] devices: &str) {
    use harness::generate::{generate, Sampler, SamplerConfig};
    let config = RunConfig::simple(devices.parse().unwrap(), SplitMode::None, 1, 2);
    let path = harness::synthetic::cached_model(DType::Q4_1).unwrap();
    let session = Session::open(&path, config).unwrap();
    let mut kv = session.kv_cache(64).unwrap();
    let mut exec = session.executor().unwrap();
    let mut run = |cfg: SamplerConfig| {
        let mut sampler = Sampler::new(cfg).unwrap();
        let mut text = Vec::new();
        let g = generate(
            &session,
            &mut *exec,
            &mut kv,
            "Hi, GPU",
            12,
            &mut sampler,
            |_, b| {
                text.extend_from_slice(b);
                Ok(())
            },
        )
        .unwrap();
        (g.tokens, g.ended, text)
    };
    let device = run(SamplerConfig::default());
    let host = run(SamplerConfig {
        temp: 1.0,
        top_k: 1,
        ..SamplerConfig::default()
    });
    assert!(!device.0.is_empty());
    assert_eq!(device, host, "{devices}");
}
