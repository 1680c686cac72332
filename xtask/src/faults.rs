//! `cargo xtask faults`: the whole fault sweep (`ggml-harness fault-sweep`): every op of
//! a forward pass of the synthetic model, every fault kind, every device, on `cpu:2` and
//! on two emulated GPUs (`cuda-sim:0,cuda-sim:1`, where the emulated driver's errors are
//! injected too), layer splits with two pipeline slots and micro-batches; then the
//! summary table of both, per fault kind.

use std::path::Path;

use xshell::{cmd, Shell};

use crate::fetch::Result;

/// (devices, every N-th op, seconds the host waits for a hung device). cuda-sim runs a
/// pass in seconds, so its waits are longer and it samples every 4th op.
const SETUPS: [(&str, &str, &str); 2] =
    [("cpu:2", "1", "0.5"), ("cuda-sim:0,cuda-sim:1", "4", "30")];

/// Entry point.
pub fn faults(root: &Path, args: &[String]) -> Result<()> {
    if !args.is_empty() {
        return Err("usage: cargo xtask faults".into());
    }
    let sh = Shell::new().map_err(|e| e.to_string())?;
    sh.change_dir(root);
    cmd!(
        sh,
        "cargo build --quiet --release -p harness --bin ggml-harness"
    )
    .run()
    .map_err(|e| e.to_string())?;
    let bin = root.join("target/release/ggml-harness");
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for (devices, every, wait) in SETUPS {
        eprintln!("\n==> fault sweep on {devices} (every {every}. op, hang timeout {wait} s)");
        let out = cmd!(
            sh,
            "{bin} fault-sweep --devices {devices} --every {every} --wait-timeout {wait}"
        )
        .ignore_status()
        .output()
        .map_err(|e| e.to_string())?;
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        rows.extend(
            text.lines()
                .filter(|l| l.starts_with(&format!("| {devices} |")))
                .map(str::to_string),
        );
        if !out.status.success() {
            failed.push(devices);
        }
    }
    println!(
        "| devices | kind | faults injected | errors reported | hangs | leaks | later runs correct |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    match failed.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "the fault sweep found problems on {}",
            failed.join(" and ")
        )),
    }
}
