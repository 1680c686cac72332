//! `cargo xtask all-gather`: the exact tensor split with whole all-gathers (`concat`)
//! beside the ring pipelined with the products (`ring`), in one run: wall time of a
//! perplexity run (alternating, so drifts of the machine hit both alike), and from one
//! traced run each the copy time per pass that the destination computed through (hidden)
//! or waited for (exposed).

use std::path::Path;
use std::time::Instant;

use serde_json::Value;
use xshell::{cmd, Shell};

use crate::fetch::Result;

const HELP: &str = "usage: cargo xtask all-gather [--devices cpu:2,cpu:3] [--threads N]
                              [--chunks C] [--rounds K]

For each device list (tensor split, N threads in all, default 2), runs `ggml-harness
perplexity --chunks C` (default 4) with --all-gather concat and ring alternately, K rounds
(default 3), then once more each with --trace, and prints per setup: the median wall time,
the copy time per pass exposed and hidden behind the destination's compute, and whether
both gave the same logits.";

struct Opts {
    devices: Vec<String>,
    threads: usize,
    chunks: usize,
    rounds: usize,
}

fn parse(args: &[String]) -> Result<Option<Opts>> {
    let mut o = Opts {
        devices: vec!["cpu:2".into(), "cpu:3".into()],
        threads: 2,
        chunks: 4,
        rounds: 3,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if matches!(flag.as_str(), "-h" | "--help") {
            println!("{HELP}");
            return Ok(None);
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n\n{HELP}"))?;
        let number = || -> Result<usize> {
            value
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{flag} {value}: expected a positive integer"))
        };
        match flag.as_str() {
            "--devices" => o.devices = value.split(',').map(str::to_string).collect(),
            "--threads" => o.threads = number()?,
            "--chunks" => o.chunks = number()?,
            "--rounds" => o.rounds = number()?,
            _ => return Err(format!("unknown option {flag}\n\n{HELP}")),
        }
    }
    Ok(Some(o))
}

/// One perplexity run; returns (wall seconds, logits sha256).
fn run(
    sh: &Shell,
    bin: &Path,
    o: &Opts,
    dev: &str,
    gather: &str,
    trace: Option<&Path>,
) -> Result<(f64, String)> {
    let (threads, chunks) = (o.threads.to_string(), o.chunks.to_string());
    let trace_args: Vec<String> = match trace {
        Some(p) => vec!["--trace".into(), p.display().to_string()],
        None => Vec::new(),
    };
    let t = Instant::now();
    let out = cmd!(
        sh,
        "{bin} perplexity --devices {dev} --split-mode tensor --all-gather {gather} --threads {threads} --chunks {chunks} --json {trace_args...}"
    )
    .quiet()
    .ignore_stderr()
    .read()
    .map_err(|e| e.to_string())?;
    let secs = t.elapsed().as_secs_f64();
    let v: Value = serde_json::from_str(out.lines().last().unwrap_or(""))
        .map_err(|e| format!("perplexity printed no JSON: {e}"))?;
    Ok((secs, v["logits_sha256"].as_str().unwrap_or("").to_string()))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Entry point.
pub fn all_gather(root: &Path, args: &[String]) -> Result<()> {
    let Some(o) = parse(args)? else {
        return Ok(());
    };
    let sh = Shell::new().map_err(|e| e.to_string())?;
    sh.change_dir(root);
    cmd!(
        sh,
        "cargo build --quiet --release -p harness --bin ggml-harness"
    )
    .run()
    .map_err(|e| e.to_string())?;
    let bin = root.join("target/release/ggml-harness");
    let dir = root.join("target/all-gather");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut table = String::from(
        "| devices | all-gather | wall s (median) | copy ms/pass | exposed ms/pass | hidden | same logits |\n|---|---|---|---|---|---|---|\n",
    );
    for dev in &o.devices {
        let mut times = [Vec::new(), Vec::new()];
        let mut hashes = [String::new(), String::new()];
        for round in 0..o.rounds {
            for (i, g) in ["concat", "ring"].iter().enumerate() {
                let (s, h) = run(&sh, &bin, &o, dev, g, None)?;
                eprintln!("all-gather: {dev} {g} round {round}: {s:.2} s");
                times[i].push(s);
                hashes[i] = h;
            }
        }
        for (i, g) in ["concat", "ring"].iter().enumerate() {
            let path = dir.join(format!("{}-{g}.trace.json", dev.replace([':', ','], "_")));
            run(&sh, &bin, &o, dev, g, Some(&path))?;
            let p = path.display().to_string();
            let s = cmd!(sh, "{bin} trace-summary {p} --json")
                .quiet()
                .read()
                .map_err(|e| e.to_string())?;
            let v: Value = serde_json::from_str(&s).map_err(|e| e.to_string())?;
            let total = &v["copy_total"];
            let passes = v["copies"].as_array().map_or(1, |a| a.len().max(1)) as f64;
            let copy = total["copy_ms"].as_f64().unwrap_or(0.0);
            let hidden = total["hidden_ms"].as_f64().unwrap_or(0.0);
            let exposed = total["exposed_ms"].as_f64().unwrap_or(0.0);
            table.push_str(&format!(
                "| {dev} | {g} | {:.2} | {:.2} | {:.2} | {:.0} % | {} |\n",
                median(times[i].clone()),
                copy / passes,
                exposed / passes,
                if copy > 0.0 {
                    100.0 * hidden / copy
                } else {
                    0.0
                },
                if hashes[0] == hashes[1] { "yes" } else { "NO" },
            ));
        }
    }
    println!("{table}");
    println!("traces in {}", dir.display());
    Ok(())
}
