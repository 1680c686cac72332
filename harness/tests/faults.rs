//! Faults mid-graph on the synthetic model: a CPU layer split with two pipeline slots and
//! micro-batches (so another pass is in flight when a fault hits). Every injected fault
//! comes back as an error naming the device, the op and the cause, in time, without
//! leaks, and a clean run afterwards gives the bits of a run without faults. (The full
//! sweep, every op and cuda-sim too: `cargo xtask faults`.)

use std::time::Duration;

use ggml_core::DType;
use ggml_sched::FaultKind;
use harness::faults::{run_with_fault, sweep, FaultSpec, InjectKind, SweepOptions};
use harness::perplexity::PplSettings;
use harness::regress::{Cell, RegressSettings};
use harness::session::{RunConfig, Session, SplitMode};

fn cell() -> Cell {
    Cell {
        devices: "cpu:2".parse().unwrap(),
        split: SplitMode::Layer,
        n_copies: 2,
        threads: 2,
        n_ubatch: 16,
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
        check_races: false,
        chaos: None,
        weaken: Vec::new(),
    }
}

#[test]
fn every_ninth_op_of_a_cpu2_pipeline_fails_cleanly() {
    let model = harness::synthetic::cached_model(DType::Q4_1).unwrap();
    let text = &harness::default_corpus()[..1500];
    let mut bad = Vec::new();
    let s = sweep(
        &model,
        text,
        &cell(),
        &settings(),
        SweepOptions {
            every: 9,
            timeout: Duration::from_millis(500),
            limit: 20.0,
            kinds: Vec::new(),
        },
        |r, later| {
            if r.fired && !(r.named && later == Some(true)) {
                bad.push(format!("{} {:?} {later:?}", r.spec, r.error));
            }
        },
    )
    .unwrap();
    assert!(s.clean(), "{s:?}\n{}", bad.join("\n"));
    assert!(s.injected >= 18, "{s:?}");
}

#[test]
fn a_fault_past_the_pass_never_fires() {
    let model = harness::synthetic::cached_model(DType::Q4_1).unwrap();
    let text = &harness::default_corpus()[..600];
    let spec = FaultSpec {
        device: 1,
        op: 1_000_000,
        kind: InjectKind::Backend(FaultKind::Kernel),
    };
    let r = run_with_fault(
        &model,
        text,
        &cell(),
        &settings(),
        spec,
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(!r.fired && r.error.is_none(), "{r:?}");
}

#[test]
fn a_fault_on_a_missing_device_is_refused() {
    let model = harness::synthetic::cached_model(DType::Q4_1).unwrap();
    let mut config = RunConfig::simple("cpu:2".parse().unwrap(), SplitMode::Layer, 1, 2);
    config.inject_fault = Some("2:0:kernel".parse::<FaultSpec>().unwrap().injector());
    let e = Session::open(&model, config).unwrap_err().to_string();
    assert!(e.contains("device 2 of 2"), "{e}");
}

/// Each of the emulated driver's errors once, on a cuda-sim layer split with two pipeline
/// slots: reported with its code, the kernel or copy that failed and the node it was
/// armed at; memory (the driver's own count, resets included) back at its level; and a
/// clean run afterwards on fresh backends (a poisoned context reset by its last release)
/// gives the bits of a run without faults. (Every op: `cargo xtask faults`.)
#[test]
fn each_driver_error_on_cuda_sim_is_reported_and_the_device_recovers() {
    use ggml_cuda::cuda_sim::driver::InjectedError;
    let model = harness::synthetic::cached_model(DType::Q4_1).unwrap();
    let text = &harness::default_corpus()[..1500];
    let cell = Cell {
        devices: "cuda-sim:0,cuda-sim:1".parse().unwrap(),
        ..cell()
    };
    let s = settings();
    let reference = harness::regress::run_cell(&model, text, &cell, &s)
        .unwrap()
        .logits_sha256;
    let cases = [
        (1, 7, InjectedError::IllegalAddress),
        (0, 14, InjectedError::Launch),
        (1, 3, InjectedError::PeerCopy),
        (0, 21, InjectedError::Event),
    ];
    for (device, op, error) in cases {
        let spec = FaultSpec {
            device,
            op,
            kind: InjectKind::Driver(error),
        };
        let r = run_with_fault(&model, text, &cell, &s, spec, Duration::from_secs(30)).unwrap();
        let e = r.error.clone().unwrap_or_default();
        assert!(r.fired && r.named, "{spec}: {r:?}");
        assert!(e.contains(error.code().name()), "{spec}: {e}");
        assert_eq!(r.leaked_bytes, 0, "{spec}: {r:?}");
        assert!(r.seconds < 30.0, "{spec}: {r:?}");
        let again = harness::regress::run_cell(&model, text, &cell, &s).unwrap();
        assert_eq!(again.logits_sha256, reference, "{spec}: the run after it");
    }
}

#[test]
fn a_driver_error_on_a_cpu_device_is_refused() {
    let model = harness::synthetic::cached_model(DType::Q4_1).unwrap();
    let mut config = RunConfig::simple("cpu:2".parse().unwrap(), SplitMode::Layer, 1, 2);
    config.inject_fault = Some(
        "1:0:illegal-address"
            .parse::<FaultSpec>()
            .unwrap()
            .injector(),
    );
    let e = Session::open(&model, config).unwrap_err().to_string();
    assert!(
        e.contains("raised by cuda-sim's driver") && e.contains("device 1 is cpu"),
        "{e}"
    );
}
