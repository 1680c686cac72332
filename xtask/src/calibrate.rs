//! `cargo xtask calibrate DIR [-- ARGS]`: fits the cost model's constants for the GPU a
//! calibration folder was measured on (`probes.json` and `kernels.json`, written by the
//! kit's `ggml-harness calibrate` step), by running `ggml-harness fit-cost-model` on
//! cuda-sim with the model the kit used. The report (every row's error, the constants
//! before and after, and, where the kit's `tuning-default.json` lies in DIR, its measured
//! pp512 and tg128 beside the modelled ones) goes to the terminal and to `DIR/fit.json`;
//! the constants themselves change only by hand in `cuda-sim/src/cost/spec.rs`, in a
//! commit that cites DIR.

use std::path::{Path, PathBuf};

use xshell::{cmd, Shell};

use crate::fetch::{self, Result};

/// The constants fitted by default: the probes set DRAM efficiency, L2 bandwidth, global
/// latency and the stream launch cost directly; a free shared-memory latency runs to 0
/// on the H100's data (harness/reference/cuda-h100.md), so it is left out. The graph-node
/// cost is fitted, not taken from its probe: the probe times empty kernels, and both
/// kits' kernels timed alone show about 3.5 µs a kernel more (fitted free, it halves the
/// rms error on both kits' data; a free L2 bandwidth then runs off to no bound at all:
/// harness/reference/cuda-modelled.md, "How far to trust the constants").
const TUNABLES: &str = "alu-latency,special-latency,launch-graph-node";

/// The kit's end-to-end bench of the default tuning, in the results folder beside
/// `probes.json` and `kernels.json`.
const DEFAULT_BENCH: &str = "tuning-default.json";

/// `calibrate DIR [-- ARGS]`.
pub fn calibrate(root: &Path, args: &[String]) -> Result<()> {
    let (dir, extra) = match args {
        [dir, rest @ ..] if !dir.starts_with('-') => {
            let rest = rest.strip_prefix(&["--".to_string()]).unwrap_or(rest);
            (PathBuf::from(dir), rest)
        }
        _ => return Err("usage: cargo xtask calibrate DIR [-- ARGS]".into()),
    };
    let dir = std::fs::canonicalize(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let probes = std::fs::read_to_string(dir.join("probes.json"))
        .map_err(|e| format!("{}: {e}", dir.join("probes.json").display()))?;
    if !dir.join("kernels.json").is_file() {
        return Err(format!("{}: no kernels.json", dir.display()));
    }
    let gpu = gpu_of(&probes)?;
    let out = dir.join("fit.json");
    let user_tunables = extra.iter().any(|a| a.starts_with("--tunables"));
    let mut defaults: Vec<String> = if user_tunables {
        Vec::new()
    } else {
        vec!["--tunables".into(), TUNABLES.into()]
    };
    // The default tuning's end-to-end figures, unless another tuning or bench is asked for.
    let bench = dir.join(DEFAULT_BENCH);
    let user_bench = extra
        .iter()
        .any(|a| a.starts_with("--bench") || a.starts_with("--cuda-tuning"));
    if bench.is_file() && !user_bench {
        defaults.extend(["--bench".into(), bench.display().to_string()]);
    }
    fetch::fetch_model()?;
    let sh = Shell::new().map_err(|e| e.to_string())?;
    sh.change_dir(root);
    cmd!(
        sh,
        "cargo run --quiet --release -p harness --bin ggml-harness -- fit-cost-model --gpu {gpu} --dir {dir} --devices cuda-sim:0 --out {out} {defaults...} {extra...}"
    )
    .run()
    .map_err(|e| e.to_string())
}

/// The cost model's name for the GPU a `probes.json` names (`"device": "NVIDIA H100 ..."`).
fn gpu_of(probes: &str) -> Result<&'static str> {
    let v: serde_json::Value =
        serde_json::from_str(probes).map_err(|e| format!("probes.json: {e}"))?;
    let device = v["device"].as_str().ok_or("probes.json names no device")?;
    if device.contains("H200") {
        Ok("h200")
    } else if device.contains("H100") {
        Ok("h100-sxm")
    } else {
        Err(format!(
            "probes.json was measured on '{device}': the cost model knows the H100 SXM and the H200"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpu_is_read_off_the_probes() {
        let p = |d: &str| format!("{{\"commit\":\"x\",\"device\":\"{d}\",\"probes\":[]}}");
        assert_eq!(gpu_of(&p("NVIDIA H100 80GB HBM3")).unwrap(), "h100-sxm");
        assert_eq!(gpu_of(&p("NVIDIA H200")).unwrap(), "h200");
        assert!(gpu_of(&p("NVIDIA A100-SXM4-40GB"))
            .unwrap_err()
            .contains("A100"));
        assert!(gpu_of("{}").is_err());
    }

    #[test]
    fn the_committed_h100_run_names_its_gpu() {
        let dir = crate::workspace_root().join("harness/reference/cuda-h100-a5a7363");
        let probes = std::fs::read_to_string(dir.join("probes.json")).unwrap();
        assert_eq!(gpu_of(&probes).unwrap(), "h100-sxm");
        assert!(dir.join("kernels.json").is_file());
    }
}
