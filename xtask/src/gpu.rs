//! `cargo xtask gpu-test`: the checks that need an NVIDIA GPU, run in place or packed into
//! a self-contained folder for a GPU machine without Rust or network.
//!
//! The checks, in both forms:
//! 1. every ggml-cuda GPU test (kernels against host references with test-backend-ops'
//!    NMSE thresholds, invariant 2, copies and events) with `GGML_RS_REQUIRE_GPU=1`, so a
//!    missing GPU fails instead of skipping;
//! 2. the perplexity of the real model on `cuda:0` within 0.5 % of the CPU's;
//! 3. the built-in CUDA regression matrix (`cuda:0`, `cuda:0x2`, layer split) with the
//!    race checker, compared with `harness/goldens.json` (and the 2-GPU matrix where two
//!    GPUs exist);
//! 4. emulator vs hardware: the same kernel tests run on cuda-sim (approx results
//!    correctly rounded) record a digest of every GPU output (`GGML_RS_KERNEL_RESULTS`),
//!    and the GPU's digests are compared with them output by output. Exact instructions
//!    must agree; the report lists the tests whose bits differ (expected only where a
//!    kernel uses `.approx` instructions).

use std::path::{Path, PathBuf};

use xshell::{cmd, Shell};

use crate::fetch::{self, Result};

/// Largest model part in a prepared folder (transfers may be limited to 64 MiB).
const PART_BYTES: usize = 48 << 20;
/// What a prepared folder without the model should stay under.
const FOLDER_LIMIT: u64 = 64 << 20;
/// Allowed relative PPL difference between `cuda:0` and the CPU.
const PPL_TOLERANCE: &str = "0.005";

/// Entry point: no arguments runs the checks here; `--prepare DIR` packs them.
pub fn gpu_test(sh: &Shell, root: &Path, args: &[String]) -> Result<()> {
    match args {
        [] => run_here(sh, root),
        [flag, dir] if flag == "--prepare" => prepare(sh, root, Path::new(dir)),
        _ => Err("usage: cargo xtask gpu-test [--prepare DIR]".into()),
    }
}

fn run_here(sh: &Shell, root: &Path) -> Result<()> {
    sh.change_dir(root);
    let model = fetch::fetch_model()?;
    let err = |e: xshell::Error| e.to_string();
    let out = root.join("target/gpu-test");
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let (sim_file, gpu_file) = (
        out.join("sim-kernel-results.txt"),
        out.join("gpu-kernel-results.txt"),
    );
    for (file, on_gpu) in [(&sim_file, false), (&gpu_file, true)] {
        let _ = std::fs::remove_file(file);
        let _results = sh.push_env(KERNEL_RESULTS_VAR, file);
        let _checks = (!on_gpu).then(|| sh.push_env("CUDA_SIM_CHECKS", SIM_CHECKS));
        let _gpu = on_gpu.then(|| sh.push_env("GGML_RS_REQUIRE_GPU", "1"));
        cmd!(
            sh,
            "cargo test --release --locked -p ggml-cuda --test gpu --test backend --test coverage --test moe -- --test-threads 1"
        )
        .run()
        .map_err(err)?;
    }
    let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()));
    let report = compare_kernel_results(&read(&sim_file)?, &read(&gpu_file)?);
    let report_file = out.join("emulator-vs-gpu.txt");
    std::fs::write(&report_file, &report).map_err(|e| format!("{}: {e}", report_file.display()))?;
    eprint!("emulator vs GPU ({}):\n{report}", report_file.display());
    let _gpu = sh.push_env("GGML_RS_REQUIRE_GPU", "1");
    let harness = |args: &[&str]| -> Result<String> {
        cmd!(
            sh,
            "cargo run --quiet --release --locked -p harness --bin ggml-harness -- {args...}"
        )
        .read()
        .map_err(err)
    };
    let model_arg = model.display().to_string();
    let cpu = harness(&[
        "perplexity",
        "--model",
        &model_arg,
        "--devices",
        "cpu",
        "--json",
    ])?;
    let gpu = harness(&[
        "perplexity",
        "--model",
        &model_arg,
        "--devices",
        "cuda:0",
        "--json",
    ])?;
    let (cpu, gpu) = (json_ppl(&cpu)?, json_ppl(&gpu)?);
    let rel = (gpu - cpu).abs() / cpu;
    eprintln!("perplexity: cpu {cpu:.4}, cuda:0 {gpu:.4} (relative difference {rel:.2e})");
    if rel > PPL_TOLERANCE.parse::<f64>().expect("a number") {
        return Err(format!(
            "cuda:0 perplexity {gpu} is not within {PPL_TOLERANCE} of the CPU's {cpu}"
        ));
    }
    let golden = root.join("harness/goldens.json").display().to_string();
    for matrix in ["cuda", "cuda-2gpu"] {
        if matrix == "cuda-2gpu" && gpu_count(sh) < 2 {
            eprintln!("cuda-2gpu matrix skipped: fewer than 2 GPUs");
            continue;
        }
        harness(&[
            "regress",
            "--devices-matrix",
            matrix,
            "--model",
            &model_arg,
            "--check-races",
            "--golden",
            &golden,
        ])
        .map(|out| print!("{out}"))?;
    }
    eprintln!("gpu-test: all checks passed");
    Ok(())
}

/// Where the kernel tests append their output digests (see ggml-cuda/tests/common).
const KERNEL_RESULTS_VAR: &str = "GGML_RS_KERNEL_RESULTS";
/// cuda-sim's checks for the reference digests: all but approx, whose deliberately
/// bound-edge results no GPU would produce.
const SIM_CHECKS: &str = "memcheck,racecheck,synccheck,initcheck";

/// Compares the `TEST#N SHA256 BYTES` lines of a cuda-sim run and a GPU run: the counts
/// of equal and differing outputs, then one line per test with differing or missing
/// outputs.
fn compare_kernel_results(sim: &str, gpu: &str) -> String {
    use std::collections::BTreeMap;
    let parse = |text: &str| -> BTreeMap<String, String> {
        text.lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let (sim, gpu) = (parse(sim), parse(gpu));
    let (mut equal, mut differ) = (0usize, BTreeMap::<String, (usize, usize)>::new());
    let keys: std::collections::BTreeSet<&String> = sim.keys().chain(gpu.keys()).collect();
    for k in keys {
        let test = k
            .rsplit_once('#')
            .map_or(k.as_str(), |(t, _)| t)
            .to_string();
        match (sim.get(k), gpu.get(k)) {
            (Some(a), Some(b)) if a == b => equal += 1,
            (Some(_), Some(_)) => differ.entry(test).or_default().0 += 1,
            _ => differ.entry(test).or_default().1 += 1,
        }
    }
    let n_differ: usize = differ.values().map(|(d, _)| d).sum();
    let mut s = format!(
        "{equal} outputs bit-identical, {n_differ} differ, in {} tests\n",
        differ.len()
    );
    for (test, (d, missing)) in differ {
        s.push_str(&format!("  {test}: {d} differ"));
        if missing > 0 {
            s.push_str(&format!(", {missing} only in one run"));
        }
        s.push('\n');
    }
    s
}

/// GPUs `nvidia-smi -L` lists (0 when it is missing).
fn gpu_count(sh: &Shell) -> usize {
    cmd!(sh, "nvidia-smi -L")
        .quiet()
        .ignore_stderr()
        .read()
        .map(|s| s.lines().filter(|l| l.starts_with("GPU ")).count())
        .unwrap_or(0)
}

/// The `"ppl"` field of `ggml-harness perplexity --json`.
fn json_ppl(json: &str) -> Result<f64> {
    let rest = json
        .split("\"ppl\":")
        .nth(1)
        .ok_or_else(|| format!("no \"ppl\" in the harness output: {json}"))?;
    let num: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'))
        .collect();
    num.parse()
        .map_err(|_| format!("bad \"ppl\" in the harness output: {json}"))
}

/// Builds the release test binaries and `ggml-harness`, and writes them, the CUDA
/// matrices, the goldens, the model in parts and `run.sh` into `dir`.
fn prepare(sh: &Shell, root: &Path, dir: &Path) -> Result<()> {
    sh.change_dir(root);
    let err = |e: xshell::Error| e.to_string();
    let io = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    let bin = dir.join("bin");
    for d in [
        dir.to_path_buf(),
        bin.clone(),
        dir.join("model"),
        dir.join("matrices"),
    ] {
        std::fs::create_dir_all(&d).map_err(|e| io("cannot create", &d, e))?;
    }
    let model = fetch::fetch_model()?;

    // Test binaries: the executables cargo reports for the ggml-cuda GPU tests.
    let json = cmd!(
        sh,
        "cargo test --release --locked -p ggml-cuda --test gpu --test backend --test coverage --test moe --no-run --message-format=json-render-diagnostics"
    )
    .read()
    .map_err(err)?;
    let mut tests = Vec::new();
    for line in json.lines().filter(|l| l.contains("\"executable\":\"")) {
        let exe = line
            .split("\"executable\":\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .ok_or("unexpected cargo output")?;
        let exe = PathBuf::from(exe);
        let name = exe
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or("test binary without a name")?;
        // Cargo names them `<test>-<hash>`; keep the test name.
        let short = name.rsplit_once('-').map_or(name, |(n, _)| n).to_string();
        let to = bin.join(format!("test-{short}"));
        std::fs::copy(&exe, &to).map_err(|e| io("cannot copy", &exe, e))?;
        strip_debug(sh, &to);
        tests.push(short);
    }
    if tests.is_empty() {
        return Err("cargo built no ggml-cuda test binaries".into());
    }
    cmd!(
        sh,
        "cargo build --release --locked -p harness --bin ggml-harness"
    )
    .run()
    .map_err(err)?;
    let harness = root.join("target/release/ggml-harness");
    std::fs::copy(&harness, bin.join("ggml-harness"))
        .map_err(|e| io("cannot copy", &harness, e))?;
    strip_debug(sh, &bin.join("ggml-harness"));
    for f in ["cuda-1gpu.toml", "cuda-2gpu.toml"] {
        let from = root.join("harness/matrices").join(f);
        std::fs::copy(&from, dir.join("matrices").join(f))
            .map_err(|e| io("cannot copy", &from, e))?;
    }
    let goldens = root.join("harness/goldens.json");
    std::fs::copy(&goldens, dir.join("goldens.json"))
        .map_err(|e| io("cannot copy", &goldens, e))?;

    // The model in parts, with its checksum.
    let bytes = std::fs::read(&model).map_err(|e| io("cannot read", &model, e))?;
    for (i, part) in bytes.chunks(PART_BYTES).enumerate() {
        let p = dir.join("model").join(format!("part-{i:02}"));
        std::fs::write(&p, part).map_err(|e| io("cannot write", &p, e))?;
    }
    // fetch_model verified the file against this checksum.
    // The reference digests: the same test binaries on cuda-sim, here.
    let sim_results = dir.join("sim-kernel-results.txt");
    let _ = std::fs::remove_file(&sim_results);
    {
        let _results = sh.push_env(KERNEL_RESULTS_VAR, &sim_results);
        let _checks = sh.push_env("CUDA_SIM_CHECKS", SIM_CHECKS);
        for t in &tests {
            let exe = bin.join(format!("test-{t}"));
            cmd!(sh, "{exe} --test-threads 1").run().map_err(err)?;
        }
    }
    let run = dir.join("run.sh");
    std::fs::write(&run, run_script(fetch::MODEL_SHA256, &tests))
        .map_err(|e| io("cannot write", &run, e))?;
    set_executable(&run)?;

    let size = folder_size(dir, &dir.join("model"))?;
    eprintln!(
        "gpu-test: prepared {} ({} MiB without the model, {} model parts); run {} on the GPU machine",
        dir.display(),
        size >> 20,
        bytes.len().div_ceil(PART_BYTES),
        run.display()
    );
    if size > FOLDER_LIMIT {
        eprintln!(
            "!!! WARNING: the folder without the model is {} MiB, over the 64 MiB a transfer may carry",
            size >> 20
        );
    }
    Ok(())
}

/// The script that runs every check on the GPU machine from the prepared folder.
fn run_script(model_sha256: &str, tests: &[String]) -> String {
    let tests = tests.join(" ");
    format!(
        r##"#!/usr/bin/env bash
# Generated by `cargo xtask gpu-test --prepare`: the GPU checks of ggml-rs, without Rust.
# A failing step does not stop the later ones (a lent GPU is scarce: one run should show
# everything); the script fails at the end, naming the steps that failed.
set -uo pipefail
cd "$(dirname "$0")"
out="${{OUT:-.}}"
failed=()
step() {{ local name=$1; shift; "$@" || {{ echo "!! FAILED: $name"; failed+=("$name"); }}; }}

cat model/part-* > model.gguf
echo "{model_sha256}  model.gguf" | sha256sum -c - || exit 1

export GGML_RS_REQUIRE_GPU=1
export {KERNEL_RESULTS_VAR}="$out/gpu-kernel-results.txt"
rm -f "${KERNEL_RESULTS_VAR}"
for t in {tests}; do
  echo "== ggml-cuda tests: $t"
  step "tests $t" "bin/test-$t" --test-threads 1
done
unset {KERNEL_RESULTS_VAR}

echo "== emulator vs GPU, output by output (cuda-sim's digests made by --prepare)"
LC_ALL=C sort sim-kernel-results.txt > "$out/sim.sorted"
LC_ALL=C sort "$out/gpu-kernel-results.txt" > "$out/gpu.sorted"
LC_ALL=C join -a1 -a2 -e MISSING -o 0,1.2,2.2 "$out/sim.sorted" "$out/gpu.sorted" \
  > "$out/emulator-vs-gpu.txt"
awk '{{ if ($2 == $3) eq++; else {{ ne++; split($1, t, "#"); d[t[1]]++ }} }}
  END {{ printf "%d outputs bit-identical, %d differ\n", eq, ne
        for (k in d) printf "  %s: %d differ\n", k, d[k] }}' "$out/emulator-vs-gpu.txt"

echo "== perplexity: cpu vs cuda:0"
cpu=$(bin/ggml-harness perplexity --model model.gguf --devices cpu --json)
gpu=$(bin/ggml-harness perplexity --model model.gguf --devices cuda:0 --json)
echo "cpu:    $cpu"
echo "cuda:0: $gpu"
ppl() {{ sed -n 's/.*"ppl":\([-0-9.eE+]*\).*/\1/p' <<<"$1"; }}
step "perplexity within {PPL_TOLERANCE}" awk -v a="$(ppl "$cpu")" -v b="$(ppl "$gpu")" -v tol={PPL_TOLERANCE} 'BEGIN {{
  d = (b - a) / a; if (d < 0) d = -d
  printf "relative difference %.3e (limit %s)\n", d, tol
  exit (d <= tol) ? 0 : 1 }}'

echo "== regression matrix: cuda-1gpu"
step "matrix cuda-1gpu" bin/ggml-harness regress --model model.gguf --matrix matrices/cuda-1gpu.toml \
  --check-races --golden goldens.json --report "$out/regress-cuda-1gpu.json"
if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" -ge 2 ]; then
  echo "== regression matrix: cuda-2gpu"
  step "matrix cuda-2gpu" bin/ggml-harness regress --model model.gguf --matrix matrices/cuda-2gpu.toml \
    --check-races --golden goldens.json --report "$out/regress-cuda-2gpu.json"
fi
if [ ${{#failed[@]}} -gt 0 ]; then
  echo "gpu-test: ${{#failed[@]}} step(s) failed: ${{failed[*]}}"
  exit 1
fi
echo "gpu-test: all checks passed"
"##
    )
}

/// Drops the debug line tables from a carried binary (about 8x smaller; symbol names stay
/// for backtraces). Without `strip` the binary is carried as it is.
fn strip_debug(sh: &Shell, exe: &Path) {
    if cmd!(sh, "strip --strip-debug {exe}").quiet().run().is_err() {
        eprintln!(
            "gpu-test: could not strip {} (carried with debug info)",
            exe.display()
        );
    }
}

#[cfg(unix)]
fn set_executable(p: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("cannot make {} executable: {e}", p.display()))
}

#[cfg(not(unix))]
fn set_executable(_: &Path) -> Result<()> {
    Ok(())
}

/// Bytes under `dir`, not counting `skip`.
fn folder_size(dir: &Path, skip: &Path) -> Result<u64> {
    let mut total = 0;
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for e in entries {
        let e = e.map_err(|e| e.to_string())?;
        let p = e.path();
        if p == skip {
            continue;
        }
        let meta = e.metadata().map_err(|e| e.to_string())?;
        total += if meta.is_dir() {
            folder_size(&p, skip)?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ppl_from_harness_json() {
        let j = r#"{"chunks":[1.0],"ppl":18.366217457172645,"ppl_f64_bits":"40325dc06d61c7e2"}"#;
        assert_eq!(json_ppl(j).unwrap(), 18.366217457172645);
        assert!(json_ppl("{}").is_err());
        assert!(json_ppl(r#"{"ppl":"x"}"#).is_err());
    }

    #[test]
    fn run_script_checks_the_model_and_runs_every_test() {
        let s = run_script("abc", &["gpu".into(), "backend".into()]);
        assert!(s.contains("echo \"abc  model.gguf\" | sha256sum -c -"));
        assert!(s.contains("for t in gpu backend; do"));
        assert!(s.contains("GGML_RS_REQUIRE_GPU=1"));
        assert!(s.contains("--matrix matrices/cuda-1gpu.toml"));
        assert!(s.contains("export GGML_RS_KERNEL_RESULTS=\"$out/gpu-kernel-results.txt\""));
        assert!(s.contains("sort sim-kernel-results.txt"));
        // A failing step is reported at the end instead of stopping the later ones.
        assert!(s.contains("set -uo pipefail"));
        assert!(s.contains("step \"tests $t\" \"bin/test-$t\""));
        assert!(s.contains("step \"matrix cuda-1gpu\""));
        assert!(s.contains("step(s) failed"));
    }

    #[test]
    fn kernel_results_are_compared_output_by_output() {
        let sim = "a#0 x 4\na#1 y 4\nb#0 z 8\nc#0 w 2\n";
        let gpu = "a#0 x 4\na#1 Y 4\nb#0 z 8\n";
        let r = compare_kernel_results(sim, gpu);
        assert_eq!(
            r,
            "2 outputs bit-identical, 1 differ, in 2 tests\n  a: 1 differ\n  c: 0 differ, 1 only in one run\n"
        );
        assert!(compare_kernel_results(sim, sim).starts_with("4 outputs bit-identical, 0 differ"));
    }
}
