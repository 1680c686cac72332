//! `bench`'s measurements that are not timings: the weight bytes one generated token
//! reads (dense and mixture of experts), the read-bandwidth probe, and its report line.

use ggml_core::DType;
use harness::bench::{bandwidth_lines, read_bandwidth, BenchResult};
use harness::gguf_file::GgufFile;
use harness::model::Model;

fn model(path: &std::path::Path) -> Model {
    Model::from_gguf(&GgufFile::open(path).unwrap()).unwrap()
}

/// Every weight descriptor's bytes, the embedding matrix counted as one row.
fn all_but_embedding_rows(m: &Model) -> u64 {
    let total: u64 = m.weights.iter().map(|t| t.nbytes() as u64).sum();
    let embd = &m.weights[m.tok_embd.index()];
    total - embd.nbytes() as u64 + (embd.nbytes() / embd.ne[1]) as u64
}

#[test]
fn a_dense_token_reads_every_weight_once_and_one_embedding_row() {
    let m = model(&harness::synthetic::cached_model(DType::Q4_1).unwrap());
    assert!(m.layers.iter().all(|l| l.ffn_gate_inp.is_none()));
    assert_eq!(m.weight_bytes_per_token(), all_but_embedding_rows(&m));
}

#[test]
fn a_moe_token_reads_only_its_routed_experts() {
    let m = model(&harness::synthetic::cached_moe_model(DType::Q4_1).unwrap());
    let (used, all) = (m.hp.n_expert_used as u64, m.hp.n_expert as u64);
    assert!(used < all, "{used} of {all}");
    let experts: u64 = m
        .layers
        .iter()
        .filter(|l| l.ffn_gate_inp.is_some())
        .flat_map(|l| [l.ffn_gate, l.ffn_up, l.ffn_down])
        .map(|id| m.weights[id.index()].nbytes() as u64)
        .sum();
    assert!(experts > 0);
    let unread = experts - experts * used / all;
    assert_eq!(
        m.weight_bytes_per_token(),
        all_but_embedding_rows(&m) - unread
    );
}

#[test]
fn the_probe_measures_a_plausible_read_bandwidth() {
    let bw = read_bandwidth(1);
    // Between a slow DRAM channel and more than any cache-free read could give.
    assert!((1e8..1e12).contains(&bw), "{bw}");
}

#[test]
fn the_bandwidth_line_gives_the_fraction_of_the_probe() {
    let r = BenchResult {
        test: "tg128".into(),
        n_tokens: 128,
        tps_mean: 100.0,
        tps_stddev: 1.0,
        samples: vec![100.0],
        bytes_moved_per_token: 0.0,
        host_syncs_per_token: 1.0,
        weight_bytes_per_token: 97e6,
        cuda_host: None,
    };
    let pp = BenchResult {
        test: "pp512".into(),
        weight_bytes_per_token: 0.0,
        ..r.clone()
    };
    let s = bandwidth_lines(&[pp.clone(), r.clone()], Some(38.8e9), 2);
    assert_eq!(
        s,
        "tg128: 97.0 MB of weights per token at 100.00 t/s = 9.70 GB/s, 25 % of the 38.80 GB/s 2 thread(s) read streaming (probe)\n"
    );
    assert_eq!(
        bandwidth_lines(&[pp, r], None, 2),
        "tg128: 97.0 MB of weights per token at 100.00 t/s = 9.70 GB/s (weights in GPU memory: the host read probe does not apply)\n"
    );
}

/// `bench --op-times` on two CPU devices (layer split): each device reports the ops of
/// its layers, within the run's wall time, and timing is off again afterwards.
#[test]
fn op_profile_on_cpu_devices() {
    use harness::session::{RunConfig, Session, SplitMode};
    let path = harness::synthetic::cached_model(DType::Q4_1).unwrap();
    let config = RunConfig::simple("cpu:2".parse().unwrap(), SplitMode::Layer, 1, 2);
    let session = Session::open(&path, config).unwrap();
    let devices = session.timed_backends();
    assert_eq!(devices.len(), 2);
    let mut kv = session.kv_cache(16).unwrap();
    let mut exec = session.executor().unwrap();
    let profiles =
        harness::bench::op_profile(&session.model, exec.as_mut(), &mut kv, &devices, 8, 2).unwrap();
    assert_eq!(profiles.len(), 4, "pp and tg on each device");
    for p in &profiles {
        let ops: Vec<String> = p.ops.iter().map(|o| o.to_string()).collect();
        assert!(
            ops.iter().any(|o| o == "MUL_MAT q4_1"),
            "{} {}: {ops:?}",
            p.test,
            p.device
        );
        let timed: f64 = p.ops.iter().map(|o| o.ms).sum();
        assert!(timed > 0.0 && timed <= p.wall_ms * 1.01, "{p:?}");
    }
    for d in &devices {
        assert!(d.take_op_times().unwrap().is_empty(), "timing left on");
    }
}

/// The line after the table: the CUDA devices' host counters per token or pass.
#[test]
fn the_host_counter_line_reports_per_token_and_per_pass() {
    use harness::bench::{host_counter_lines, CudaHostCounts};
    let c = ggml_cuda::HostCounters {
        kernel_launches: 787 * 4,
        graph_launches: 4,
        graph_nodes: 788 * 4,
        host_syncs: 8,
        h2d_bytes: 4 * 600,
        d2h_bytes: 4 * 196_856,
        calls: ggml_cuda::DriverCalls {
            graph_launch: 4,
            event_record: 8,
            other: 24,
            ..Default::default()
        },
        graph_compute_calls: 4,
        graph_compute_nodes: 4 * 575,
        graph_compute_ns: 4 * 575 * 70,
        ..Default::default()
    };
    let per = CudaHostCounts::per(&c, 4);
    assert_eq!(per.driver_calls, 9.0);
    assert_eq!(per.calls_by_kind["event_record"], 2.0);
    let r = BenchResult {
        test: "tg128".into(),
        n_tokens: 128,
        tps_mean: 100.0,
        tps_stddev: 1.0,
        samples: vec![100.0],
        bytes_moved_per_token: 0.0,
        host_syncs_per_token: 1.0,
        weight_bytes_per_token: 97e6,
        cuda_host: Some(per),
    };
    let pp = BenchResult {
        test: "pp512".into(),
        weight_bytes_per_token: 0.0,
        cuda_host: None,
        ..r.clone()
    };
    assert_eq!(
        host_counter_lines(&[pp, r]),
        "tg128 on CUDA, per generated token: 1.0 splits, 787.0 kernel launches, 1.00 graph \
         launches (788.0 graph nodes), 9.0 driver calls (0.0 cuLaunchKernel), 2.00 host syncs, \
         H2D 600 B, D2H 196856 B, graph_compute 0.07 µs of host time per node\n"
    );
}
