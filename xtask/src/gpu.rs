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
//! 5. speed: `bench` on `cuda:0` (pp512, tg128) with the GPU time per op; the prepared
//!    folder also builds llama.cpp's CUDA tools on the GPU machine (its nvcc, in the
//!    background while the checks run) and alternates `llama-bench -ngl 99` with ours.

use std::path::{Path, PathBuf};

use xshell::{cmd, Shell};

use crate::fetch::{self, Result};

/// Largest model part in a prepared folder (transfers may be limited to 64 MiB).
const PART_BYTES: usize = 48 << 20;
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
    let targets = gpu_test_targets();
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
        let targets = &targets;
        cmd!(
            sh,
            "cargo test --release --locked -p ggml-cuda {targets...} -- --test-threads 1"
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
    harness(&[
        "bench",
        "--model",
        &model_arg,
        "--devices",
        "cuda:0",
        "-p",
        "512",
        "-n",
        "128",
        "--op-times",
    ])
    .map(|out| print!("{out}"))?;
    eprintln!("gpu-test: all checks passed");
    Ok(())
}

/// The ggml-cuda test targets that run on a GPU (tests/sim.rs is cuda-sim's alone).
const GPU_TESTS: &[&str] = &[
    "gpu",
    "backend",
    "coverage",
    "moe",
    "attn_decode",
    "rope_store",
];

/// `--test NAME` for each of [`GPU_TESTS`].
fn gpu_test_targets() -> Vec<String> {
    GPU_TESTS
        .iter()
        .flat_map(|t| ["--test".to_string(), t.to_string()])
        .collect()
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

/// What one transfer to a lent GPU machine may carry, the repository included.
const CALL_LIMIT: u64 = 64 << 20;
/// Room kept free in each planned transfer.
const CALL_MARGIN: u64 = 2 << 20;
/// llama.cpp's source folders its CUDA tools need (the rest of the sdist is models,
/// docs and other backends).
const LLAMA_SOURCE: &[&str] = &[
    "CMakeLists.txt",
    "LICENSE",
    "cmake",
    "common",
    "ggml",
    "include",
    "licenses",
    "src",
    "tools",
    "vendor",
    "tests",
    "examples",
];
/// Backends of ggml's source tree that a CUDA build never reads.
const LLAMA_EXCLUDE: &[&str] = &[
    "ggml-vulkan",
    "ggml-sycl",
    "ggml-metal",
    "ggml-opencl",
    "ggml-hexagon",
    "ggml-et",
    "ggml-cann",
    "ggml-webgpu",
    "ggml-openvino",
    "ggml-zdnn",
    "ggml-musa",
];

/// Builds the release test binaries and `ggml-harness`, records cuda-sim's digests of
/// every kernel test, and writes into `dir`: `kit.tar.xz` (binaries, matrices, goldens,
/// corpus, digests), `llama-src.tar.xz` (llama.cpp's source, built on the GPU machine
/// with its nvcc), `model/part-*` and `run.sh`; then prints how to carry them.
fn prepare(sh: &Shell, root: &Path, dir: &Path) -> Result<()> {
    sh.change_dir(root);
    let err = |e: xshell::Error| e.to_string();
    let io = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    let kit = dir.join("kit");
    let bin = kit.join("bin");
    // A stale part would be joined into the model; a stale kit would be packed.
    for stale in [dir.join("model"), kit.clone()] {
        if stale.exists() {
            std::fs::remove_dir_all(&stale).map_err(|e| io("cannot remove", &stale, e))?;
        }
    }
    for d in [bin.clone(), kit.join("matrices"), dir.join("model")] {
        std::fs::create_dir_all(&d).map_err(|e| io("cannot create", &d, e))?;
    }
    let model = fetch::fetch_model()?;

    // Test binaries: the executables cargo reports for the ggml-cuda GPU tests.
    let targets = gpu_test_targets();
    let json = cmd!(
        sh,
        "cargo test --release --locked -p ggml-cuda {targets...} --no-run --message-format=json-render-diagnostics"
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
        std::fs::copy(&from, kit.join("matrices").join(f))
            .map_err(|e| io("cannot copy", &from, e))?;
    }
    for (from, to) in [
        ("harness/goldens.json", "goldens.json"),
        ("harness/data/gpl-3.txt", "gpl-3.txt"),
    ] {
        let from = root.join(from);
        std::fs::copy(&from, kit.join(to)).map_err(|e| io("cannot copy", &from, e))?;
    }

    // The reference digests: the same test binaries on cuda-sim, here.
    let sim_results = kit.join("sim-kernel-results.txt");
    {
        let _results = sh.push_env(KERNEL_RESULTS_VAR, &sim_results);
        let _checks = sh.push_env("CUDA_SIM_CHECKS", SIM_CHECKS);
        for t in &tests {
            let exe = bin.join(format!("test-{t}"));
            cmd!(sh, "{exe} --test-threads 1").run().map_err(err)?;
        }
    }
    let kit_xz = dir.join("kit.tar.xz");
    cmd!(sh, "tar cJf {kit_xz} -C {kit} .").run().map_err(err)?;
    std::fs::remove_dir_all(&kit).map_err(|e| io("cannot remove", &kit, e))?;

    // llama.cpp's source, from the sdist that ../shared/tools/llama-cpp.sh unpacked.
    let llama_xz = dir.join("llama-src.tar.xz");
    let src = crate::bench_vs_llama::llama_cpu_tools(sh, root)?.join("../../src");
    let excludes: Vec<String> = LLAMA_EXCLUDE
        .iter()
        .map(|b| format!("--exclude=ggml/src/{b}"))
        .collect();
    cmd!(
        sh,
        "tar cJf {llama_xz} -C {src} {excludes...} {LLAMA_SOURCE...}"
    )
    .run()
    .map_err(err)?;

    // The model in parts (fetch_model verified it against its checksum).
    let bytes = std::fs::read(&model).map_err(|e| io("cannot read", &model, e))?;
    let mut parts = Vec::new();
    for (i, part) in bytes.chunks(PART_BYTES).enumerate() {
        let p = dir.join("model").join(format!("part-{i:02}"));
        std::fs::write(&p, part).map_err(|e| io("cannot write", &p, e))?;
        parts.push(p);
    }
    let run = dir.join("run.sh");
    std::fs::write(&run, run_script(fetch::MODEL_SHA256, &tests))
        .map_err(|e| io("cannot write", &run, e))?;
    set_executable(&run)?;

    let mut files = vec![run.clone(), kit_xz, llama_xz];
    files.extend(parts);
    let sized: Vec<(PathBuf, u64)> = files
        .into_iter()
        .map(|f| {
            let n = std::fs::metadata(&f)
                .map_err(|e| io("cannot read", &f, e))?
                .len();
            Ok((f, n))
        })
        .collect::<Result<_>>()?;
    let tree = repository_bytes(sh)?;
    let calls = plan_calls(&sized, CALL_LIMIT.saturating_sub(tree + CALL_MARGIN))?;
    let rel = |p: &Path| p.strip_prefix(root).unwrap_or(p).display().to_string();
    eprintln!(
        "gpu-test: prepared {}. To a lent GPU machine, {} MiB a transfer with this repository's {} MiB:",
        dir.display(),
        CALL_LIMIT >> 20,
        tree.div_ceil(1 << 20)
    );
    let last = calls.len() - 1;
    for (i, call) in calls.iter().enumerate() {
        let names: Vec<String> = call.iter().map(|&k| rel(&sized[k].0)).collect();
        let mib = call
            .iter()
            .map(|&k| sized[k].1)
            .sum::<u64>()
            .div_ceil(1 << 20);
        let command = if i == last {
            format!("bash {}", rel(&run))
        } else {
            format!("bash {} --start-build", rel(&run))
        };
        eprintln!(
            "  call {}: carry {} ({mib} MiB), run `{command}`",
            i + 1,
            names.join(" ")
        );
    }
    eprintln!("  (files stay on a warm machine between calls; run.sh unpacks and joins them)");
    Ok(())
}

/// Groups `files` (in order) into transfers of at most `room` bytes each.
fn plan_calls(files: &[(PathBuf, u64)], room: u64) -> Result<Vec<Vec<usize>>> {
    let mut calls: Vec<Vec<usize>> = Vec::new();
    let mut used = u64::MAX;
    for (i, (f, n)) in files.iter().enumerate() {
        if *n > room {
            return Err(format!(
                "{} ({} MiB) does not fit in one transfer ({} MiB free)",
                f.display(),
                n >> 20,
                room >> 20
            ));
        }
        if used.saturating_add(*n) > room {
            calls.push(Vec::new());
            used = 0;
        }
        calls.last_mut().expect("a call").push(i);
        used += n;
    }
    Ok(calls)
}

/// Bytes of the files a transfer sends besides the carried ones: tracked and untracked
/// files git does not ignore.
fn repository_bytes(sh: &Shell) -> Result<u64> {
    let list = cmd!(sh, "git ls-files --cached --others --exclude-standard")
        .read()
        .map_err(|e| e.to_string())?;
    Ok(list
        .lines()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum())
}

/// The script that runs every check on the GPU machine from the prepared folder.
fn run_script(model_sha256: &str, tests: &[String]) -> String {
    RUN_SH
        .replace("@MODEL_SHA256@", model_sha256)
        .replace("@TESTS@", &tests.join(" "))
        .replace("@KERNEL_RESULTS_VAR@", KERNEL_RESULTS_VAR)
        .replace("@PPL_TOLERANCE@", PPL_TOLERANCE)
}

/// `run.sh`, with `@NAME@` for what [`run_script`] fills in.
const RUN_SH: &str = r##"#!/usr/bin/env bash
# Generated by `cargo xtask gpu-test --prepare`: the GPU checks of ggml-rs on a machine
# without Rust or network, and their speed beside llama.cpp's CUDA build.
#
#   run.sh --start-build   starts building llama.cpp's CUDA tools (with this machine's
#                          nvcc, at low priority) in the background and returns: call it
#                          while the model's last parts are still to come
#   run.sh                 every check, then speed (waits up to 5 minutes for that build)
#
# A failing step does not stop the later ones (a lent GPU is scarce: one run should show
# everything); the script fails at the end, naming the steps that failed. Results go to
# $OUT (default: ./out).
set -uo pipefail
cd "$(dirname "$0")"
here=$PWD
out="${OUT:-$here/out}"
mkdir -p "$out" work
failed=()
step() { local name=$1; shift; "$@" || { echo "!! FAILED: $name"; failed+=("$name"); }; }

start_build() {
  [ -e work/llama/.started ] && return 0
  local nvcc
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  if [ ! -x "$nvcc" ] || [ ! -e llama-src.tar.xz ]; then
    echo "llama.cpp: no nvcc or no llama-src.tar.xz here; its CUDA tools are not built"
    return 0
  fi
  rm -rf work/llama && mkdir -p work/llama && tar xJf llama-src.tar.xz -C work/llama || return 1
  touch work/llama/.started
  local gen=""
  command -v ninja >/dev/null && gen="-G Ninja"
  (cd work/llama && PATH="$(dirname "$nvcc"):$PATH" setsid nohup nice -n 19 bash -c "
    { cmake -S . -B build $gen -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=\${LLAMA_CUDA_ARCH:-native} -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=ON \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
        -DGGML_CCACHE=OFF \
      && cmake --build build -j \$(nproc) --target llama-bench llama-perplexity test-backend-ops
      echo \"build exit \$?\"; } > build.log 2>&1
    touch build.done" >/dev/null 2>&1 </dev/null &)
}
if [ "${1:-}" = --start-build ]; then
  start_build
  echo "llama.cpp: building in the background (work/llama/build.log)"
  exit 0
fi
start_build

rm -rf work/kit && mkdir -p work/kit && tar xJf kit.tar.xz -C work/kit || exit 1
cat model/part-* > work/model.gguf
echo "@MODEL_SHA256@  work/model.gguf" | sha256sum -c - || exit 1
cd work/kit
model=../model.gguf
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv | tee "$out/gpu.txt"

export GGML_RS_REQUIRE_GPU=1
export @KERNEL_RESULTS_VAR@="$out/gpu-kernel-results.txt"
rm -f "$@KERNEL_RESULTS_VAR@"
for t in @TESTS@; do
  echo "== ggml-cuda tests: $t"
  step "tests $t" "bin/test-$t" --test-threads 1
done
unset @KERNEL_RESULTS_VAR@

echo "== emulator vs GPU, output by output (cuda-sim's digests made by --prepare)"
LC_ALL=C sort sim-kernel-results.txt > "$out/sim.sorted"
LC_ALL=C sort "$out/gpu-kernel-results.txt" > "$out/gpu.sorted"
LC_ALL=C join -a1 -a2 -e MISSING -o 0,1.2,2.2 "$out/sim.sorted" "$out/gpu.sorted" \
  > "$out/emulator-vs-gpu.txt"
awk '{ if ($2 == $3) eq++; else { ne++; split($1, t, "#"); d[t[1]]++ } }
  END { printf "%d outputs bit-identical, %d differ\n", eq, ne
        for (k in d) printf "  %s: %d differ\n", k, d[k] }' "$out/emulator-vs-gpu.txt"

echo "== perplexity: cpu vs cuda:0"
cpu=$(bin/ggml-harness perplexity --model $model --devices cpu --json)
gpu=$(bin/ggml-harness perplexity --model $model --devices cuda:0 --json)
echo "cpu:    $cpu"
echo "cuda:0: $gpu"
ppl() { sed -n 's/.*"ppl":\([-0-9.eE+]*\).*/\1/p' <<<"$1"; }
step "perplexity within @PPL_TOLERANCE@" awk -v a="$(ppl "$cpu")" -v b="$(ppl "$gpu")" -v tol=@PPL_TOLERANCE@ 'BEGIN {
  d = (b - a) / a; if (d < 0) d = -d
  printf "relative difference %.3e (limit %s)\n", d, tol
  exit (d <= tol) ? 0 : 1 }'

echo "== regression matrix: cuda-1gpu"
step "matrix cuda-1gpu" bin/ggml-harness regress --model $model --matrix matrices/cuda-1gpu.toml \
  --check-races --golden goldens.json --report "$out/regress-cuda-1gpu.json"
if [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')" -ge 2 ]; then
  echo "== regression matrix: cuda-2gpu"
  step "matrix cuda-2gpu" bin/ggml-harness regress --model $model --matrix matrices/cuda-2gpu.toml \
    --check-races --golden goldens.json --report "$out/regress-cuda-2gpu.json"
fi

echo "== speed: ggml-harness bench and llama-bench, alternated"
L=$here/work/llama
if [ -e "$L/.started" ]; then
  for _ in $(seq 300); do [ -e "$L/build.done" ] && break; sleep 1; done
  tail -n 2 "$L/build.log"
fi
for round in 1 2; do
  extra=""
  [ $round = 1 ] && extra="--op-times"
  step "bench cuda:0" bin/ggml-harness bench --model $model --devices cuda:0 -p 512 -n 128 -r 5 $extra
  if [ -x "$L/build/bin/llama-bench" ]; then
    "$L/build/bin/llama-bench" -m $model -ngl 99 -p 512 -n 128 -r 5
  fi
done
if [ -x "$L/build/bin/llama-perplexity" ]; then
  echo "== llama-perplexity on CUDA (the same corpus, ctx 512)"
  "$L/build/bin/llama-perplexity" -m $model -f gpl-3.txt -c 512 -b 512 -ngl 99 2>&1 \
    | grep -E "Final estimate"
fi

if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu-test: ${#failed[@]} step(s) failed: ${failed[*]}"
  exit 1
fi
echo "gpu-test: all checks passed"
"##;

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
        let placeholder = s
            .split('@')
            .skip(1)
            .any(|rest| rest.starts_with(|c: char| c.is_ascii_uppercase()));
        assert!(!placeholder, "a placeholder left: {s}");
        assert!(s.contains("echo \"abc  work/model.gguf\" | sha256sum -c -"));
        assert!(s.contains("for t in gpu backend; do"));
        assert!(s.contains("GGML_RS_REQUIRE_GPU=1"));
        assert!(s.contains("--matrix matrices/cuda-1gpu.toml"));
        assert!(s.contains("export GGML_RS_KERNEL_RESULTS=\"$out/gpu-kernel-results.txt\""));
        assert!(s.contains("sort sim-kernel-results.txt"));
        assert!(s.contains("-v tol=0.005"));
        assert!(s.contains("--op-times"));
        assert!(s.contains("llama-bench\" -m $model -ngl 99 -p 512 -n 128"));
        // A failing step is reported at the end instead of stopping the later ones.
        assert!(s.contains("set -uo pipefail"));
        assert!(s.contains("step \"tests $t\" \"bin/test-$t\""));
        assert!(s.contains("step \"matrix cuda-1gpu\""));
        assert!(s.contains("step(s) failed"));
    }

    /// The script is valid bash (where bash is installed).
    #[test]
    fn run_script_parses() {
        let Ok(mut child) = std::process::Command::new("bash")
            .arg("-n")
            .stdin(std::process::Stdio::piped())
            .spawn()
        else {
            return;
        };
        use std::io::Write;
        let s = run_script("abc", &["gpu".into()]);
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
        assert!(child.wait().unwrap().success());
    }

    #[test]
    fn transfers_are_planned_in_order_within_the_room() {
        let f = |n: u64| (PathBuf::from(format!("f{n}")), n);
        let files = [f(5), f(30), f(20), f(48), f(10)];
        assert_eq!(plan_calls(&files, 60).unwrap(), [vec![0, 1, 2], vec![3, 4]]);
        assert_eq!(plan_calls(&files, 48).unwrap().len(), 4);
        assert!(plan_calls(&files, 47).unwrap_err().contains("f48"));
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
