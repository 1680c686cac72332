//! `cargo xtask bench-vs-llama`: our `ggml-harness bench` against llama.cpp's
//! `llama-bench` on the same model and thread count, run alternately (ours, theirs, ours,
//! theirs, ...) so that drifts of the machine hit both alike, with the ratios, the
//! weight bandwidth of generation and the machine's memory copy bandwidth.

use std::path::{Path, PathBuf};

use serde_json::Value;
use xshell::{cmd, Shell};

use crate::fetch::{self, Result};

const HELP: &str = "usage: cargo xtask bench-vs-llama [--threads N] [-r R] [--rounds K]
                                  [-p P] [-n G] [--model M[,M...]]

Runs `ggml-harness bench` and llama.cpp's `llama-bench` (built by
../shared/tools/llama-cpp.sh) alternately, K rounds of R repetitions each (defaults:
2 threads, R = 5, K = 2, pp512 and tg128, the cached SmolLM2 Q4_1), then prints tokens/s
of both and the ratios ours/llama.cpp, and for generation the weight bytes each token
reads times tokens/s (GB/s) of both beside the machine's streaming-read bandwidth with
the same threads (ggml-harness bench's probe), as fractions of it.

--model takes GGUF paths or model names, comma-separated, measured one after the other:
smollm2-135m, gemma3-270m (downloaded into the cache), smollm2-moe (SmolLM2 upcycled into
4 experts, 2 used: built into the cache by `ggml-harness make-moe`), or `all` for the
three.";

/// The models `--model all` measures, in order.
const ALL_MODELS: [&str; 3] = ["smollm2-135m", "gemma3-270m", "smollm2-moe"];

/// Options of the command.
struct Opts {
    threads: usize,
    reps: usize,
    rounds: usize,
    n_prompt: usize,
    n_gen: usize,
    /// Paths or names; empty: the cached SmolLM2.
    models: Vec<String>,
}

fn parse(args: &[String]) -> Result<Option<Opts>> {
    let mut o = Opts {
        threads: 2,
        reps: 5,
        rounds: 2,
        n_prompt: 512,
        n_gen: 128,
        models: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        if matches!(flag, "-h" | "--help") {
            println!("{HELP}");
            return Ok(None);
        }
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("{flag} needs a value\n\n{HELP}"))
        };
        let mut number = |min: usize| -> Result<usize> {
            let v = value()?;
            match v.parse::<usize>() {
                Ok(n) if n >= min => Ok(n),
                _ => Err(format!("{flag}: '{v}' is not a number >= {min}")),
            }
        };
        match flag {
            "--threads" | "-t" => o.threads = number(1)?,
            "-r" | "--repetitions" => o.reps = number(1)?,
            "--rounds" => o.rounds = number(1)?,
            "-p" | "--n-prompt" => o.n_prompt = number(0)?,
            "-n" | "--n-gen" => o.n_gen = number(0)?,
            "--model" | "-m" => {
                for m in value()?.split(',').filter(|m| !m.is_empty()) {
                    if m == "all" {
                        o.models.extend(ALL_MODELS.map(String::from));
                    } else {
                        o.models.push(m.to_string());
                    }
                }
            }
            _ => return Err(format!("unknown argument '{a}'\n\n{HELP}")),
        }
    }
    if o.n_prompt == 0 && o.n_gen == 0 {
        return Err("-p and -n are both 0: nothing to measure".into());
    }
    Ok(Some(o))
}

/// Tokens/s samples of one test (`pp512`, `tg128`) for ours and llama.cpp's.
#[derive(Default)]
struct Samples {
    ours: Vec<f64>,
    theirs: Vec<f64>,
}

/// Runs the comparison; `args` are the command's arguments.
pub fn bench_vs_llama(root: &Path, args: &[String]) -> Result<()> {
    let Some(o) = parse(args)? else {
        return Ok(());
    };
    let sh = Shell::new().map_err(|e| e.to_string())?;
    sh.change_dir(root);
    // Names are checked before anything is built or measured.
    for m in &o.models {
        if !Path::new(m).is_file() && m != MOE_MODEL && fetch::known_model(m).is_none() {
            return Err(format!(
                "model {m}: no such file, and not a known model ({}, {MOE_MODEL})",
                fetch::known_model_names()
            ));
        }
    }
    let llama_bench = llama_bench(&sh, root)?;
    eprintln!("bench-vs-llama: building ggml-harness (release)");
    cmd!(
        sh,
        "cargo build --quiet --release -p harness --bin ggml-harness"
    )
    .run()
    .map_err(|e| format!("building ggml-harness: {e}"))?;
    let ours_bin = target_dir(root).join("release").join("ggml-harness");
    if o.models.is_empty() {
        let model = fetch::fetch_model()?;
        return compare(&sh, &o, &ours_bin, &llama_bench, &model);
    }
    for m in &o.models {
        let model = if Path::new(m).is_file() {
            PathBuf::from(m)
        } else if m == MOE_MODEL {
            // ggml-harness builds it from the cached SmolLM2 on first use.
            let out = cmd!(sh, "{ours_bin} fetch-model --model {m}")
                .read()
                .map_err(|e| format!("ggml-harness fetch-model --model {m}: {e}"))?;
            PathBuf::from(out.trim())
        } else {
            let known = fetch::known_model(m).expect("checked above");
            fetch::fetch(known)?
        };
        compare(&sh, &o, &ours_bin, &llama_bench, &model)?;
    }
    Ok(())
}

/// The name `ggml-harness` gives the upcycled SmolLM2 mixture of experts.
const MOE_MODEL: &str = "smollm2-moe";

/// The alternated runs of both on `model`, and their table.
fn compare(sh: &Shell, o: &Opts, ours_bin: &Path, llama_bench: &Path, model: &Path) -> Result<()> {
    let (t, r, p, n) = (
        o.threads.to_string(),
        o.reps.to_string(),
        o.n_prompt.to_string(),
        o.n_gen.to_string(),
    );
    let mut pp = Samples::default();
    let mut tg = Samples::default();
    let mut weight_bytes = None;
    let mut probe: Vec<f64> = Vec::new();
    for round in 1..=o.rounds {
        eprintln!("bench-vs-llama: round {round}/{}: ggml-harness", o.rounds);
        let out = cmd!(
            sh,
            "{ours_bin} bench --model {model} -p {p} -n {n} --threads {t} -r {r} --json"
        )
        .read()
        .map_err(|e| format!("ggml-harness bench: {e}"))?;
        let v = first_json(&out).map_err(|e| format!("ggml-harness bench output: {e}"))?;
        probe.extend(v["read_probe_bytes_per_s"].as_f64());
        for res in v["results"].as_array().map_or(&[][..], Vec::as_slice) {
            let test = res["test"].as_str().unwrap_or("");
            let s = numbers(res, "samples");
            if test.starts_with("pp") {
                pp.ours.extend(s);
            } else if test.starts_with("tg") {
                tg.ours.extend(s);
                weight_bytes = weight_bytes.or(res["weight_bytes_per_token"].as_f64());
            }
        }

        eprintln!("bench-vs-llama: round {round}/{}: llama-bench", o.rounds);
        let out = cmd!(
            sh,
            "{llama_bench} -m {model} -p {p} -n {n} -t {t} -r {r} -o json"
        )
        .ignore_stderr()
        .read()
        .map_err(|e| format!("llama-bench: {e}"))?;
        let v = first_json(&out).map_err(|e| format!("llama-bench output: {e}"))?;
        for res in v.as_array().map_or(&[][..], Vec::as_slice) {
            let num = |k: &str| res[k].as_f64().unwrap_or(0.0);
            let s = numbers(res, "samples_ts");
            if num("n_prompt") > 0.0 && num("n_gen") == 0.0 {
                pp.theirs.extend(s);
            } else if num("n_gen") > 0.0 && num("n_prompt") == 0.0 {
                tg.theirs.extend(s);
            }
        }
    }

    println!(
        "\n{} threads, {} rounds x {} repetitions, model {}\n",
        o.threads,
        o.rounds,
        o.reps,
        model.display()
    );
    println!("| test | ours t/s | llama.cpp t/s | ours/llama.cpp |");
    println!("|---|---|---|---|");
    for (name, s, on) in [
        (format!("pp{}", o.n_prompt), &pp, o.n_prompt > 0),
        (format!("tg{}", o.n_gen), &tg, o.n_gen > 0),
    ] {
        if !on {
            continue;
        }
        let (om, os) = mean_sd(&s.ours);
        let (tm, ts) = mean_sd(&s.theirs);
        println!(
            "| {name} | {om:.2} ± {os:.2} | {tm:.2} ± {ts:.2} | {:.3} |",
            om / tm
        );
    }
    println!();
    if o.n_gen > 0 {
        let best_probe = probe.iter().copied().fold(0.0, f64::max);
        match weight_bytes {
            Some(b) if best_probe > 0.0 => {
                let (om, _) = mean_sd(&tg.ours);
                let (tm, _) = mean_sd(&tg.theirs);
                println!(
                    "weights read per generated token: {:.1} MB (routed experts only, for a mixture of experts)",
                    b / 1e6
                );
                println!(
                    "tg{} weight bandwidth: ours {:.2} GB/s ({:.0} %), llama.cpp {:.2} GB/s ({:.0} %) of the {:.2} GB/s {} thread(s) read streaming (best probe of {})",
                    o.n_gen,
                    b * om / 1e9,
                    100.0 * b * om / best_probe,
                    b * tm / 1e9,
                    100.0 * b * tm / best_probe,
                    best_probe / 1e9,
                    o.threads,
                    probe.len()
                );
            }
            _ => println!("weight bandwidth: ggml-harness bench reported no weight bytes or probe"),
        }
    }
    Ok(())
}

/// `llama-bench` from `../shared/tools/llama-cpp.sh` (which builds it once, cached).
fn llama_bench(sh: &Shell, root: &Path) -> Result<PathBuf> {
    let bin = llama_cpu_tools(sh, root)?.join("llama-bench");
    if !bin.is_file() {
        return Err(format!("llama-cpp.sh did not produce {}", bin.display()));
    }
    Ok(bin)
}

/// The folder of llama.cpp's CPU tools that `../shared/tools/llama-cpp.sh` builds once
/// (cached); the source it built them from is `../../src` beside it.
pub fn llama_cpu_tools(sh: &Shell, root: &Path) -> Result<PathBuf> {
    let script = root.join("../shared/tools/llama-cpp.sh");
    if !script.is_file() {
        return Err(format!(
            "{} not found: it builds llama.cpp's CPU tools (llama-bench)",
            script.display()
        ));
    }
    eprintln!(
        "xtask: {} (builds llama.cpp once, ~8 min)",
        script.display()
    );
    let dir = cmd!(sh, "bash {script}")
        .read()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    Ok(PathBuf::from(dir.trim()))
}

/// Cargo's target directory (`CARGO_TARGET_DIR` or `target` in the workspace).
pub(crate) fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => root.join(d),
        None => root.join("target"),
    }
}

fn mean_sd(x: &[f64]) -> (f64, f64) {
    if x.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let n = x.len() as f64;
    let m = x.iter().sum::<f64>() / n;
    let var = if x.len() > 1 {
        x.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (m, var.sqrt())
}

/// The first JSON value in `s`; text before it (log lines) is skipped.
fn first_json(s: &str) -> Result<Value> {
    let start = s
        .find(['{', '['])
        .ok_or_else(|| format!("no JSON in {:?}", s.chars().take(200).collect::<String>()))?;
    match serde_json::Deserializer::from_str(&s[start..])
        .into_iter::<Value>()
        .next()
    {
        Some(v) => v.map_err(|e| e.to_string()),
        None => Err("no JSON value".into()),
    }
}

/// The numbers of the array member `k` of `v` (others skipped).
fn numbers(v: &Value, k: &str) -> Vec<f64> {
    v[k].as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_outputs() {
        let ours = r#"{"model":"m","results":[{"test":"pp512","samples":[1.5,2e2]}]}"#;
        let v = first_json(ours).unwrap();
        let r = &v["results"][0];
        assert_eq!(r["test"].as_str(), Some("pp512"));
        assert_eq!(numbers(r, "samples"), vec![1.5, 200.0]);
        let theirs = "log line\n[\n {\"n_prompt\": 0, \"n_gen\": 128, \"ok\": true, \
                      \"samples_ts\": [ 137.1, -1 ], \"x\": null }\n] trailing";
        let v = first_json(theirs).unwrap();
        assert_eq!(v[0]["n_gen"].as_f64(), Some(128.0));
        assert_eq!(numbers(&v[0], "samples_ts"), vec![137.1, -1.0]);
        assert!(first_json("[1,").is_err());
        assert!(first_json("no json").is_err());
    }
}
