//! Programmatic dependent launch through the whole stack, on cuda-sim's devices emulating
//! sm_90 (every test of this binary configures them so, before the first backend opens):
//! greedy generation gives bit for bit the logits it gives without it (`no-pdl`), with
//! CUDA graphs, in every split mode, on the dense and the MoE model, under the race
//! checker and the interpreter's check that no programmatically launched kernel touches
//! global memory before its `griddepcontrol.wait`; and the profile of a decoded token
//! launches every decode product and attention so, and prices the overlap (again, as
//! `profile::reprice` does for a fit's constants).

use ggml_core::DType;
use ggml_cuda::cuda_sim::driver::{Driver, SimConfig};
use ggml_cuda::{CudaTuning, KernelId};
use harness::session::{RunConfig, Session, SplitMode};
use rstest::rstest;

mod common;

/// cuda-sim's global driver with sm_90 devices (the rest as `CUDA_SIM_*` say).
fn sm90() {
    let mut cfg = SimConfig::from_env().expect("CUDA_SIM_*");
    cfg.compute_capability = (9, 0);
    Driver::configure_global(cfg).expect("one configuration for this test binary");
}

/// The logits (as bits) of a prompt and of 4 greedily generated tokens, and the races.
fn generate(
    model: &std::path::Path,
    devices: &str,
    split: SplitMode,
    n_copies: usize,
    pdl: bool,
) -> (Vec<Vec<u32>>, usize) {
    sm90();
    let mut config = RunConfig::simple(devices.parse().unwrap(), split, n_copies, 2);
    config.check_races = true;
    config.cuda_tuning = CudaTuning {
        pdl,
        ..CudaTuning::default()
    };
    let session = Session::open(model, config).unwrap();
    let prompt: Vec<u32> = "Hi, PDL".bytes().map(u32::from).collect();
    let bits = common::greedy_logit_bits(&session, 64, &prompt, 4);
    (bits, session.race_log.as_ref().unwrap().race_count())
}

#[rstest]
#[case::one_gpu("cuda-sim:0", SplitMode::None, 1, false)]
#[case::layer_split_two_slots("cuda-sim:0,cuda-sim:1", SplitMode::Layer, 2, false)]
#[case::tensor_split("cuda-sim:0x2", SplitMode::Tensor, 1, false)]
#[case::moe("cuda-sim:0", SplitMode::None, 1, true)]
fn generation_is_bit_identical_with_programmatic_launches(
    #[case] devices: &str,
    #[case] split: SplitMode,
    #[case] n_copies: usize,
    #[case] moe: bool,
) {
    let model = if moe {
        harness::synthetic::cached_moe_model(DType::Q4_1).unwrap()
    } else {
        harness::synthetic::cached_model(DType::Q4_1).unwrap()
    };
    let (on, races_on) = generate(&model, devices, split, n_copies, true);
    let (off, races_off) = generate(&model, devices, split, n_copies, false);
    assert_eq!((races_on, races_off), (0, 0));
    assert_eq!(on.len(), 5);
    for (i, (a, b)) in on.iter().zip(&off).enumerate() {
        assert!(a == b, "{devices}: logits of step {i} differ with PDL");
    }
}

/// A decoded token profiled on sm_90: every `qmm` and attention launch is
/// programmatic and nothing else is; each one after another programmatic launch hides
/// its launch and pre-wait path (some of its modelled time), and the pass's modelled
/// time is the sum of what each launch adds. With `no-pdl` none is, and nothing hides.
#[test]
fn a_decoded_token_launches_its_products_and_attention_programmatically() {
    use ggml_cuda::cuda_sim::cost::{GpuSpec, LaunchKind};
    use harness::profile::{pass_seconds, profile_model, reprice, ProfileSettings};
    sm90();
    let profile_passes = |tuning: CudaTuning, n_prompt: usize| {
        let mut config = RunConfig::simple("cuda-sim:0".parse().unwrap(), SplitMode::None, 1, 1);
        config.cuda_tuning = tuning;
        let path = harness::synthetic::cached_model(DType::Q4_1).unwrap();
        let session = Session::open(&path, config).unwrap();
        let mut kv = session.kv_cache(16).unwrap();
        let mut exec = session.executor().unwrap();
        let settings = ProfileSettings {
            gpu: ggml_cuda::cuda_sim::cost::GpuSpec::h200(),
            sample_blocks: Some(2),
            n_prompt,
            n_gen: 1,
            gen_position: 4,
            launch: ggml_cuda::cuda_sim::cost::LaunchKind::GraphNode,
            stall_lines: false,
        };
        profile_model(
            &session.model,
            exec.as_mut(),
            &mut kv,
            &session.cuda_backends(),
            &settings,
        )
        .unwrap()
    };
    let profile = |tuning: CudaTuning| profile_passes(tuning, 0);
    let on = profile(CudaTuning::default());
    let waits = |k: KernelId| {
        matches!(
            k,
            KernelId::Qmm
                | KernelId::FlashAttnDec
                | KernelId::FlashAttnRow64
                | KernelId::FlashAttnRow128
                | KernelId::FlashAttnRow256
        )
    };
    assert!(on.iter().filter(|l| waits(l.kernel)).count() >= 4);
    let mut hidden = 0;
    for (i, l) in on.iter().enumerate() {
        assert_eq!(l.programmatic, waits(l.kernel), "{} {:?}", l.node, l.kernel);
        assert!(
            l.counters.post_wait_path.is_some() == waits(l.kernel),
            "{}",
            l.node
        );
        let after_a_waiting_one = i > 0 && waits(on[i - 1].kernel);
        assert_eq!(
            l.hidden_s > 0.0,
            l.programmatic && after_a_waiting_one,
            "{}",
            l.node
        );
        assert!(l.hidden_s <= l.prediction.launch_s + l.prediction.pre_wait_s() + 1e-15);
        hidden += (l.hidden_s > 0.0) as usize;
    }
    assert!(hidden >= 3, "{hidden}");
    let sum: f64 = on.iter().map(|l| l.prediction.time_s - l.hidden_s).sum();
    assert!((pass_seconds(&on, "tg") - sum).abs() < 1e-12);
    let off = profile(CudaTuning {
        pdl: false,
        ..CudaTuning::default()
    });
    assert!(off.iter().all(|l| !l.programmatic && l.hidden_s == 0.0));
    assert!(pass_seconds(&on, "tg") < pass_seconds(&off, "tg"));

    // Priced again (what a fit's end-to-end check does): the same constants give the same
    // figures; one more µs a graph node adds one µs a launch without PDL, and with it
    // every overlap still stays within its launch and pre-wait path.
    let same = |ls: &[harness::profile::ProfiledLaunch]| {
        let mut again = ls.to_vec();
        reprice(&mut again, &GpuSpec::h200(), LaunchKind::GraphNode).unwrap();
        for (a, b) in ls.iter().zip(&again) {
            assert_eq!(a.prediction, b.prediction, "{}", a.node);
            assert_eq!(a.hidden_s.to_bits(), b.hidden_s.to_bits(), "{}", a.node);
        }
    };
    same(&on);
    same(&off);
    // A prompt's pass beside the token's (as a fit profiles them): its launches count from
    // 0 too, and none of them pairs with one of the token's when priced again.
    let both = profile_passes(CudaTuning::default(), 12);
    assert!(both.iter().any(|l| l.pass == "pp12"));
    same(&both);
    let token: Vec<_> = both.iter().filter(|l| l.pass == "tg").collect();
    for (a, b) in token.iter().zip(&on) {
        assert_eq!(a.hidden_s.to_bits(), b.hidden_s.to_bits(), "{}", a.node);
    }
    let mut dearer = GpuSpec::h200();
    dearer.tunables.launch_graph_node_s += 1e-6;
    let mut off2 = off.clone();
    reprice(&mut off2, &dearer, LaunchKind::GraphNode).unwrap();
    let added = pass_seconds(&off2, "tg") - pass_seconds(&off, "tg");
    assert!((added - off.len() as f64 * 1e-6).abs() < 1e-12, "{added}");
    let mut on2 = on.clone();
    reprice(&mut on2, &dearer, LaunchKind::GraphNode).unwrap();
    for l in &on2 {
        assert!(l.hidden_s <= l.prediction.launch_s + l.prediction.pre_wait_s() + 1e-15);
    }
    // With PDL the dearer node adds no more than without: an overlap is capped by the
    // grid before it, which the H200's fitted node cost (3.75 µs) already reaches.
    assert!(pass_seconds(&on2, "tg") > pass_seconds(&on, "tg"));
    assert!(pass_seconds(&on2, "tg") - pass_seconds(&on, "tg") <= added + 1e-12);
}
