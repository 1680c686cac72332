//! Faults mid-graph on the synthetic model: a CPU layer split with two pipeline slots and
//! micro-batches (so another pass is in flight when a fault hits). Every injected fault
//! comes back as an error naming the device, the op and the cause, in time, without
//! leaks, and a clean run afterwards gives the bits of a run without faults. (The full
//! sweep, every op and cuda-sim too: `cargo xtask faults`.)

use std::time::Duration;

use ggml_core::DType;
use ggml_sched::FaultKind;
use harness::faults::{run_with_fault, sweep, FaultSpec, SweepOptions};
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
        kind: FaultKind::Kernel,
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
    config.inject_fault = Some("2:0:kernel".parse().unwrap());
    let e = Session::open(&model, config).unwrap_err().to_string();
    assert!(e.contains("device 2 of 2"), "{e}");
}
