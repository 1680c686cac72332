//! `ggml-harness calibrate`: what a lent GPU is measured for, written as files that the
//! cost model is fitted from (`cargo xtask calibrate DIR`).
//!
//! - `probes.json`: ggml-cuda's microbenchmarks ([`ggml_cuda::CudaBackend::calibrate`]):
//!   launch cost, a logits-sized read back, DRAM and L2 bandwidth and latency, FMA / dp4a
//!   / special-function rates, shared-memory bank conflicts.
//! - `kernels.json`: every kernel of one prompt pass and one generated token of the
//!   model, each relaunched alone between timed events ([`ggml_cuda::CudaBackend::time_launches`]),
//!   cold (L2 flushed) and warm, keyed by pass, node, op and kernel so that a cuda-sim
//!   profile of the same commit can be joined row by row.

use std::path::Path;

use ggml_cuda::{Calibration, CudaBackend, LaunchTime, ProbeSize};
use serde_json::{json, Value};

use crate::batch::Batch;
use crate::error::{HarnessError, Result};
use crate::executor::Executor;
use crate::model::Model;
use crate::placement::KvCache;

/// Bytes written before each cold launch: more than any L2 (H100/H200: 50 MB).
pub const FLUSH_BYTES: usize = 256 << 20;

/// `probes.json`'s content.
pub fn probes_json(c: &Calibration, commit: &str) -> Value {
    json!({
        "device": c.device,
        "compute_capability": [c.compute_capability.0, c.compute_capability.1],
        "driver_version": c.driver_version,
        "size": match c.size { ProbeSize::Full => "full", ProbeSize::Tiny => "tiny" },
        "commit": commit,
        "probes": c.probes.iter().map(|p| json!({
            "name": p.name,
            "unit": p.unit,
            "work": p.work,
            "seconds": p.seconds,
            "rate_per_s": p.rate(),
            "samples": p.samples,
            "detail": p.detail,
        })).collect::<Vec<_>>(),
    })
}

/// One pass's launches as `kernels.json` rows.
pub fn launch_rows(pass: &str, device: &str, times: &[LaunchTime]) -> Vec<Value> {
    times
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({
                "pass": pass,
                "device": device,
                "index": i,
                "node": t.node.as_str(),
                "op": t.op.0,
                "weights": t.op.1,
                "kernel": t.kernel.entry().1,
                "grid": [t.dims.grid.0, t.dims.grid.1, t.dims.grid.2],
                "block": [t.dims.block.0, t.dims.block.1, t.dims.block.2],
                "shared": t.dims.shared,
                "cold_us": finite(t.cold_us),
                "warm_us": finite(t.warm_us),
            })
        })
        .collect()
}

/// `x` as JSON, `null` for NaN (no cold runs).
fn finite(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        Value::Null
    }
}

/// Runs `pass` once on `exec` with every CUDA backend recording its launches, then
/// relaunches each alone `reps` times, cold and warm. Returns (device, times) per backend.
pub fn time_pass(
    backends: &[&CudaBackend],
    pass: impl FnOnce() -> Result<()>,
    reps: usize,
    flush_bytes: usize,
) -> Result<Vec<(String, Vec<LaunchTime>)>> {
    for b in backends {
        b.record_launches(true);
    }
    let ran = pass();
    let recorded: Vec<_> = backends
        .iter()
        .map(|b| {
            let l = b.take_recorded_launches();
            b.record_launches(false);
            l
        })
        .collect();
    ran?;
    let mut out = Vec::new();
    for (b, launches) in backends.iter().zip(recorded) {
        let times = b.time_launches(&launches, reps, flush_bytes)?;
        out.push((b.device_name().to_string(), times));
    }
    Ok(out)
}

/// The two passes of `kernels.json`: a prompt of `n_prompt` tokens into an empty cache
/// (`pp{n_prompt}`), then one token decoded at position 0 (`tg`, the shape of every
/// token of a short generation: one query, 128 KV cells).
pub fn time_model_kernels(
    model: &Model,
    exec: &mut dyn Executor,
    kv: &mut KvCache,
    backends: &[&CudaBackend],
    n_prompt: usize,
    reps: usize,
    flush_bytes: usize,
) -> Result<Vec<Value>> {
    if n_prompt == 0 {
        return Err(HarnessError::Usage("-p must be at least 1".into()));
    }
    let mut rows = Vec::new();
    let prompt = crate::bench::prompt_batch(model, n_prompt);
    let mut time = |batch: &Batch| {
        kv.clear();
        time_pass(
            backends,
            || {
                exec.forward(model, kv, batch)
                    .map(|_| ())
                    .map_err(Into::into)
            },
            reps,
            flush_bytes,
        )
    };
    for (dev, t) in &time(&prompt)? {
        rows.extend(launch_rows(&format!("pp{n_prompt}"), dev, t));
    }
    let mut one = Batch::default();
    one.push(crate::bench::bench_token(model, 0), 0, 0, true);
    let tg = time(&one)?;
    for (dev, t) in &tg {
        rows.extend(launch_rows("tg", dev, t));
    }
    Ok(rows)
}

/// Per pass and op (and weight type): launches and summed cold and warm µs, as a
/// Markdown table.
pub fn summary_table(rows: &[Value]) -> String {
    use std::collections::BTreeMap;
    let mut sums: BTreeMap<(String, String), (usize, f64, f64)> = BTreeMap::new();
    for r in rows {
        let op = match r["weights"].as_str() {
            Some(w) => format!("{} {w}", r["op"].as_str().unwrap_or("?")),
            None => r["op"].as_str().unwrap_or("?").to_string(),
        };
        let key = (r["pass"].as_str().unwrap_or("?").to_string(), op);
        let e = sums.entry(key).or_default();
        e.0 += 1;
        e.1 += r["cold_us"].as_f64().unwrap_or(f64::NAN);
        e.2 += r["warm_us"].as_f64().unwrap_or(f64::NAN);
    }
    let mut s =
        String::from("| pass | op | launches | cold µs | warm µs |\n|---|---|---|---|---|\n");
    for ((pass, op), (n, cold, warm)) in sums {
        s.push_str(&format!(
            "| {pass} | {op} | {n} | {cold:.1} | {warm:.1} |\n"
        ));
    }
    s
}

/// Writes `value` as pretty JSON to `dir/name`.
pub fn write_json(dir: &Path, name: &str, value: &Value) -> Result<()> {
    let path = dir.join(name);
    let text = serde_json::to_string_pretty(value).expect("JSON values serialise");
    std::fs::write(&path, text + "\n").map_err(|source| HarnessError::Io {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_sums_per_pass_and_op() {
        let rows = vec![
            json!({"pass": "tg", "op": "MUL_MAT", "weights": "q4_1", "cold_us": 2.0, "warm_us": 1.0}),
            json!({"pass": "tg", "op": "MUL_MAT", "weights": "q4_1", "cold_us": 3.0, "warm_us": 1.5}),
            json!({"pass": "tg", "op": "ADD", "weights": null, "cold_us": 1.0, "warm_us": 0.5}),
        ];
        let t = summary_table(&rows);
        assert!(t.contains("| tg | MUL_MAT q4_1 | 2 | 5.0 | 2.5 |"), "{t}");
        assert!(t.contains("| tg | ADD | 1 | 1.0 | 0.5 |"), "{t}");
        assert!(finite(f64::NAN).is_null());
    }
}
