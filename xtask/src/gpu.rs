//! `cargo xtask gpu-test`: the checks that need an NVIDIA GPU, run in place or packed into
//! a self-contained folder for a GPU machine without Rust or network.
//!
//! The checks, in both forms:
//! 1. every ggml-cuda GPU test (kernels without `.approx` instructions against their host
//!    mirrors bit for bit, the others with test-backend-ops' NMSE thresholds, invariant
//!    2, copies and events) with `GGML_RS_REQUIRE_GPU=1`, so a missing GPU fails instead
//!    of skipping;
//! 2. the perplexity of the real model on `cuda:0` within 0.5 % of the CPU's;
//! 3. the built-in CUDA regression matrix (`cuda:0`, `cuda:0x2`, layer split) with the
//!    race checker, compared with `harness/goldens.json` (and the 2-GPU matrix where two
//!    GPUs exist);
//! 4. emulator vs hardware: the same kernel tests run on cuda-sim (approx results
//!    correctly rounded) record a digest of every GPU output (`GGML_RS_KERNEL_RESULTS`),
//!    each marked `exact` or `approx` (whether a kernel of its graph reaches an `.approx`
//!    instruction), and the GPU's digests are compared with them output by output. An
//!    exact output that differs, or an output on one side only, fails the check; approx
//!    outputs that differ are listed per test.
//! 5. speed: `bench` on `cuda:0` (pp512, tg128) with the GPU time per op; the prepared
//!    folder also builds llama.cpp's CUDA tools on the GPU machine (its nvcc, in the
//!    background while the checks run) and alternates `llama-bench -ngl 99` with ours.

use std::path::{Path, PathBuf};

use xshell::{cmd, Shell};

use crate::fetch::{self, Result};

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
    let cmp = compare_kernel_results(&read(&sim_file)?, &read(&gpu_file)?);
    let report_file = out.join("emulator-vs-gpu.txt");
    std::fs::write(&report_file, &cmp.report)
        .map_err(|e| format!("{}: {e}", report_file.display()))?;
    eprint!(
        "emulator vs GPU ({}):\n{}",
        report_file.display(),
        cmp.report
    );
    // The other checks still run (a lent GPU is scarce); this one fails at the end.
    let kernel_failure = cmp.failed.then(|| {
        format!(
            "emulator vs GPU: exact kernel outputs differ or are missing (see {})",
            report_file.display()
        )
    });
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
    if let Some(why) = kernel_failure {
        return Err(why);
    }
    eprintln!("gpu-test: all checks passed");
    Ok(())
}

/// The ggml-cuda test targets that run on a GPU (tests/sim.rs is cuda-sim's alone).
pub(crate) const GPU_TESTS: &[&str] = &[
    "gpu",
    "backend",
    "coverage",
    "moe",
    "graphs",
    "attn_decode",
    "rope_store",
    "qkv_rope",
    "fusion",
    "argmax",
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

/// The outcome of [`compare_kernel_results`].
#[derive(Debug, PartialEq, Eq)]
struct KernelComparison {
    /// Counts of exact and approx outputs, equal and differing, then the exact outputs
    /// that differ, the outputs on one side only and, per test, the approx outputs that
    /// differ. The same text as [`COMPARE_SH`] prints.
    report: String,
    /// Whether an exact output differs or an output is on one side only.
    failed: bool,
}

/// Compares the `TEST#N SHA256 BYTES KIND` lines of a cuda-sim run and a GPU run, output
/// by output. An output is approx when both runs say `approx` (a kernel of its graph
/// reaches an `.approx` instruction), exact otherwise (a line without KIND counts as
/// exact). Exact outputs must be bit-identical and every output must be in both runs;
/// approx outputs that differ are listed, not failed.
fn compare_kernel_results(sim: &str, gpu: &str) -> KernelComparison {
    use std::collections::{BTreeMap, BTreeSet};
    // TEST#N -> (SHA256 BYTES, KIND)
    let parse = |text: &str| -> BTreeMap<String, (String, String)> {
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                match f.as_slice() {
                    [key, sha, bytes, rest @ ..] => Some((
                        key.to_string(),
                        (
                            format!("{sha} {bytes}"),
                            rest.first().unwrap_or(&"").to_string(),
                        ),
                    )),
                    _ => None,
                }
            })
            .collect()
    };
    let (sim, gpu) = (parse(sim), parse(gpu));
    let (mut exact_eq, mut approx_eq) = (0usize, 0usize);
    let mut exact_differ = BTreeSet::new();
    let mut one_side = BTreeMap::new();
    let mut approx_differ = BTreeMap::<String, usize>::new();
    let keys: BTreeSet<&String> = sim.keys().chain(gpu.keys()).collect();
    for k in keys {
        match (sim.get(k), gpu.get(k)) {
            (Some((a, ka)), Some((b, kb))) => {
                let approx = ka == "approx" && kb == "approx";
                match (approx, a == b) {
                    (false, true) => exact_eq += 1,
                    (false, false) => {
                        exact_differ.insert(k.clone());
                    }
                    (true, true) => approx_eq += 1,
                    (true, false) => {
                        let test = k.rsplit_once('#').map_or(k.as_str(), |(t, _)| t);
                        *approx_differ.entry(test.to_string()).or_default() += 1;
                    }
                }
            }
            (Some(_), None) => {
                one_side.insert(k.clone(), "only on cuda-sim");
            }
            _ => {
                one_side.insert(k.clone(), "only on the GPU");
            }
        }
    }
    let n_approx_differ: usize = approx_differ.values().sum();
    let mut s = format!(
        "exact outputs: {exact_eq} bit-identical, {} differ\n\
         approx outputs: {approx_eq} bit-identical, {n_approx_differ} differ (allowed: .approx results)\n\
         outputs on one side only: {}\n",
        exact_differ.len(),
        one_side.len()
    );
    if !exact_differ.is_empty() {
        s.push_str("exact outputs that differ (failures):\n");
        for k in &exact_differ {
            s.push_str(&format!("  {k}\n"));
        }
    }
    if !one_side.is_empty() {
        s.push_str("outputs on one side only (failures):\n");
        for (k, side) in &one_side {
            s.push_str(&format!("  {k}: {side}\n"));
        }
    }
    if !approx_differ.is_empty() {
        s.push_str("approx outputs that differ, per test (listed, not failures):\n");
        for (t, n) in &approx_differ {
            s.push_str(&format!("  {t}: {n}\n"));
        }
    }
    let failed = !exact_differ.is_empty() || !one_side.is_empty();
    if failed {
        s.push_str(&format!(
            "FAILED: {} exact output(s) differ, {} output(s) on one side only\n",
            exact_differ.len(),
            one_side.len()
        ));
    } else {
        s.push_str("OK: every exact output is bit-identical\n");
    }
    KernelComparison { report: s, failed }
}

/// `compare_digests SIM GPU DIR`, the shell form of [`compare_kernel_results`] for
/// `run.sh`: joins the two digest files output by output into `DIR/emulator-vs-gpu.txt`
/// (key, then cuda-sim's SHA256, BYTES, KIND, then the GPU's), prints the same report
/// (also to `DIR/emulator-vs-gpu-report.txt`) and fails as it does.
const COMPARE_SH: &str = r##"compare_digests() {
  local sim=$1 gpu=$2 dir=$3
  LC_ALL=C sort "$sim" > "$dir/sim.sorted" || return 1
  LC_ALL=C sort "$gpu" > "$dir/gpu.sorted" || return 1
  LC_ALL=C join -a1 -a2 -e MISSING -o 0,1.2,1.3,1.4,2.2,2.3,2.4     "$dir/sim.sorted" "$dir/gpu.sorted" > "$dir/emulator-vs-gpu.txt" || return 1
  LC_ALL=C awk '
    function emit(arr,   keys, n, i, j, k, tmp) {
      n = 0
      for (k in arr) keys[++n] = k
      for (i = 2; i <= n; i++) {
        tmp = keys[i]
        for (j = i - 1; j >= 1 && keys[j] > tmp; j--) keys[j + 1] = keys[j]
        keys[j + 1] = tmp
      }
      for (i = 1; i <= n; i++) print "  " keys[i] (arr[keys[i]] == "" ? "" : ": " arr[keys[i]])
    }
    {
      if ($2 == "MISSING" || $5 == "MISSING") {
        miss++
        side[$1] = ($2 == "MISSING") ? "only on the GPU" : "only on cuda-sim"
        next
      }
      same = ($2 == $5 && $3 == $6)
      if ($4 == "approx" && $7 == "approx") {
        if (same) ae++
        else { ad++; split($1, t, "#"); per[t[1]]++ }
      } else {
        if (same) ee++
        else { ed++; bad[$1] = "" }
      }
    }
    END {
      printf "exact outputs: %d bit-identical, %d differ\n", ee, ed
      printf "approx outputs: %d bit-identical, %d differ (allowed: .approx results)\n", ae, ad
      printf "outputs on one side only: %d\n", miss
      if (ed) { print "exact outputs that differ (failures):"; emit(bad) }
      if (miss) { print "outputs on one side only (failures):"; emit(side) }
      if (ad) { print "approx outputs that differ, per test (listed, not failures):"; emit(per) }
      if (ed + miss) {
        printf "FAILED: %d exact output(s) differ, %d output(s) on one side only\n", ed, miss
        exit 1
      }
      print "OK: every exact output is bit-identical"
    }' "$dir/emulator-vs-gpu.txt" | tee "$dir/emulator-vs-gpu-report.txt"
}"##;

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
    let commit = commit_id(sh)?;

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

    // The modelled per-launch tables of this commit, written before the run so that the
    // run's measurements say how far the model was from the hardware.
    let model_arg = model.display().to_string();
    for gpu in MODELLED_GPUS {
        for tuning in MODELLED_TUNINGS {
            let out = kit.join(format!("modelled-{gpu}-{tuning}.json"));
            eprintln!("gpu-test: modelling {tuning} on {gpu} (cuda-sim profile)");
            let json = cmd!(
                sh,
                "{harness} profile --model {model_arg} --devices cuda-sim:0 --gpu {gpu} --cuda-tuning {tuning} --json"
            )
            .read()
            .map_err(err)?;
            std::fs::write(&out, json).map_err(|e| io("cannot write", &out, e))?;
        }
    }
    let names: Vec<String> = MODELLED_GPUS
        .iter()
        .flat_map(|g| {
            MODELLED_TUNINGS
                .iter()
                .map(move |t| format!("modelled-{g}-{t}.json"))
        })
        .collect();
    let hashes = {
        let _dir = sh.push_dir(&kit);
        cmd!(sh, "sha256sum {names...}").read().map_err(err)?
    };
    eprintln!("gpu-test: modelled tables (sha256):\n{hashes}");

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

    let run = dir.join("run.sh");
    std::fs::write(&run, run_script(fetch::MODEL_SHA256, &tests, &commit))
        .map_err(|e| io("cannot write", &run, e))?;
    set_executable(&run)?;
    let mut sized: Vec<(PathBuf, u64)> = [run.clone(), kit_xz, llama_xz]
        .into_iter()
        .map(|f| {
            let n = std::fs::metadata(&f)
                .map_err(|e| io("cannot read", &f, e))?
                .len();
            Ok((f, n))
        })
        .collect::<Result<_>>()?;
    let tree = repository_bytes(sh)?;
    let room = CALL_LIMIT.saturating_sub(tree + CALL_MARGIN);

    // The model in parts (fetch_model verified it against its checksum), cut so that the
    // first part fills the first transfer and each later one a transfer of its own.
    let bytes = std::fs::read(&model).map_err(|e| io("cannot read", &model, e))?;
    let first_room = room.saturating_sub(sized.iter().map(|(_, n)| n).sum::<u64>());
    let mut at = 0;
    for (i, len) in part_sizes(bytes.len() as u64, first_room, room)
        .into_iter()
        .enumerate()
    {
        let p = dir.join("model").join(format!("part-{i:02}"));
        let end = at + len as usize;
        std::fs::write(&p, &bytes[at..end]).map_err(|e| io("cannot write", &p, e))?;
        at = end;
        sized.push((p, len));
    }
    let calls = plan_calls(&sized, room)?;
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
            format!(
                "GPU_LLAMA_WAIT=<seconds> GPU_DEADLINE=<seconds> bash {}",
                rel(&run)
            )
        } else if i == 0 {
            format!("bash {} --tests", rel(&run))
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

/// The short hash of HEAD, with `-dirty` when the work tree differs from it (the kit is
/// built from the work tree).
fn commit_id(sh: &Shell) -> Result<String> {
    let head = cmd!(sh, "git rev-parse --short=12 HEAD")
        .read()
        .map_err(|e| format!("git rev-parse: {e}"))?;
    let dirty = !cmd!(sh, "git status --porcelain --untracked-files=no")
        .read()
        .map_err(|e| format!("git status: {e}"))?
        .trim()
        .is_empty();
    Ok(if dirty { format!("{head}-dirty") } else { head })
}

/// Sizes of the parts a model of `total` bytes is cut into: the first fills what the first
/// transfer has left (`first_room`; none when under 1 MiB), each later one a transfer of
/// `room` bytes, the last what remains.
fn part_sizes(total: u64, first_room: u64, room: u64) -> Vec<u64> {
    let mut parts = Vec::new();
    let mut left = total;
    if first_room >= 1 << 20 && left > 0 {
        let n = left.min(first_room);
        parts.push(n);
        left -= n;
    }
    while left > 0 {
        let n = left.min(room.max(1));
        parts.push(n);
        left -= n;
    }
    parts
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
fn run_script(model_sha256: &str, tests: &[String], commit: &str) -> String {
    RUN_SH
        .replace("@COMMIT@", commit)
        .replace("@TUNINGS@", &TUNINGS.join(" "))
        .replace("@MODEL_SHA256@", model_sha256)
        .replace("@TESTS@", &tests.join(" "))
        .replace("@KERNEL_RESULTS_VAR@", KERNEL_RESULTS_VAR)
        .replace("@PPL_TOLERANCE@", PPL_TOLERANCE)
        .replace("@COMPARE_DIGESTS@", COMPARE_SH)
}

/// The GPUs whose modelled tables the kit carries (the lent GPU is one of them).
const MODELLED_GPUS: [&str; 2] = ["h100-sxm", "h200"];
/// The settings modelled for each: the current kernels and the first ones.
const MODELLED_TUNINGS: [&str; 2] = ["default", "legacy"];

/// `run.sh`, with `@NAME@` for what [`run_script`] fills in.
const RUN_SH: &str = include_str!("gpu_run.sh");

/// The `--cuda-tuning` settings the kit benches one after another, so one run shows each
/// step's effect: everything on, each feature off alone, the first kernels, and the
/// backend as first measured. (`no-attn-row-split` is left out: it only changes
/// `flash_attn_dec`, which a decode reaches under `no-row-attn` alone.)
pub const TUNINGS: &[&str] = &[
    "default",
    "no-graphs",
    "no-pdl",
    "no-fuse",
    "no-fuse-norm",
    "no-fuse-qkv",
    "no-fuse-rope-store",
    "no-fuse-qkv-rope",
    "no-fuse-glu",
    "no-fuse-add",
    "no-qgemm",
    "no-mma-attn",
    "no-row-attn",
    "no-decode-lanes",
    "no-specialize",
    "specialize-dtype",
    "q8-window",
    "legacy-products",
    "legacy-decode-attn",
    "legacy-prompt-attn",
    "legacy",
];

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
    fn every_ggml_cuda_test_file_but_the_emulators_runs_on_the_gpu() {
        let dir = crate::workspace_root().join("ggml-cuda/tests");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| {
                let name = e.unwrap().file_name().into_string().unwrap();
                name.strip_suffix(".rs").map(str::to_string)
            })
            .filter(|n| n != "sim")
            .collect();
        files.sort();
        let mut listed: Vec<String> = GPU_TESTS.iter().map(|s| s.to_string()).collect();
        listed.sort();
        assert_eq!(
            files, listed,
            "GPU_TESTS must list every test file of ggml-cuda"
        );
    }

    #[test]
    fn reads_ppl_from_harness_json() {
        let j = r#"{"chunks":[1.0],"ppl":18.366217457172645,"ppl_f64_bits":"40325dc06d61c7e2"}"#;
        assert_eq!(json_ppl(j).unwrap(), 18.366217457172645);
        assert!(json_ppl("{}").is_err());
        assert!(json_ppl(r#"{"ppl":"x"}"#).is_err());
    }

    #[test]
    fn run_script_checks_the_model_and_runs_every_test() {
        let s = run_script("abc", &["gpu".into(), "backend".into()], "0123abcd");
        let placeholder = s
            .split('@')
            .skip(1)
            .any(|rest| rest.starts_with(|c: char| c.is_ascii_uppercase()));
        assert!(!placeholder, "a placeholder left: {s}");
        assert!(s.contains("echo \"abc  ../model.gguf\" | sha256sum -c -"));
        assert!(s.contains("at commit 0123abcd"));
        assert!(s.contains("for t in gpu backend; do"));
        assert!(s.contains("GGML_RS_REQUIRE_GPU=1 step"));
        assert!(s.contains("matrix matrices/cuda-1gpu.toml"));
        assert!(s.contains("export GGML_RS_KERNEL_RESULTS=\"$res/gpu-kernel-results.txt\""));
        assert!(
            s.contains("compare_digests sim-kernel-results.txt \"$res/gpu-kernel-results.txt\"")
        );
        assert!(s.contains("step \"emulator vs driver: exact outputs bit-identical\""));
        assert!(s.contains("compare_digests() {"));
        assert!(s.contains("-v tol=0.005"));
        assert!(s.contains("--op-times"));
        assert!(s.contains("--json --gaps --cuda-tuning legacy"));
        assert!(s.contains("--against \"$res/generate$i-legacy.json\""));
        assert!(s.contains("step \"greedy text: $dev"));
        assert!(s.contains("--page source --csv --print-source sass"));
        assert!(s.contains("step \"ncu: per-instruction stalls of the decode kernels\" ncu_stalls"));
        assert!(s.contains("llama-bench\" -m $model -ngl 99 -p $bench_pp -n $bench_tg"));
        assert!(s.contains("$H calibrate --model $model --devices $dev"));
        assert!(s.contains(&format!("for t in {}; do", TUNINGS.join(" "))));
        assert!(s.contains("--sim) mode=sim"));
        assert!(s.contains("results.tgz"));
        assert!(s.contains("--tests) only_tests=1"));
        assert!(s.contains("deadline=${GPU_DEADLINE:-0}"));
        // The timed steps come after the wait for llama.cpp's build, the untimed before.
        assert!(s.contains("llama_wait=${GPU_LLAMA_WAIT:-0}"));
        let at = |needle: &str| s.find(needle).unwrap_or_else(|| panic!("{needle}"));
        let wait = at("step \"wait for llama.cpp's build");
        assert!(at("step \"regression matrix cuda-1gpu\"") < wait);
        assert!(at("ppl_check\n") < wait);
        assert!(wait < at("step \"speed: ggml-harness bench"));
        assert!(wait < at("step \"calibration:"));
        assert!(wait < at("step \"each step's effect"));
        assert!(s.contains("local base=(--section SpeedOfLight"));
        assert!(s.contains("--metrics sm__cycles_active.max"));
        assert!(s.contains("run_ncu \"${base[@]}\"; }"));
        assert!(s.contains("-k regex:'qmm|flash_attn_dec|flash_attn_row|rope_store'"));
        // A failing step is reported at the end instead of stopping the later ones.
        assert!(s.contains("set -uo pipefail"));
        assert!(s.contains("step \"regression matrix cuda-1gpu\""));
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
        let s = run_script("abc", &["gpu".into()], "0123abcd");
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
        assert!(child.wait().unwrap().success());
    }

    /// The model's parts fill the first transfer's rest and then whole transfers, so a
    /// 94 MiB model beside 11 MiB of kit travels in two transfers of 54 MiB, not three.
    #[test]
    fn model_parts_fill_each_transfer() {
        const MIB: u64 = 1 << 20;
        let parts = part_sizes(94 * MIB, 43 * MIB, 54 * MIB);
        assert_eq!(parts, [43 * MIB, 51 * MIB]);
        let mut files = vec![(PathBuf::from("kit"), 11 * MIB)];
        files.extend(parts.iter().map(|&n| (PathBuf::from("part"), n)));
        assert_eq!(plan_calls(&files, 54 * MIB).unwrap().len(), 2);
        // No room worth a part in the first transfer: the model starts in the second.
        assert_eq!(
            part_sizes(10 * MIB, MIB / 2, 4 * MIB),
            [4 * MIB, 4 * MIB, 2 * MIB]
        );
        assert_eq!(part_sizes(0, 43 * MIB, 54 * MIB), Vec::<u64>::new());
        assert_eq!(part_sizes(5, 43 * MIB, 54 * MIB), [5]);
    }

    #[test]
    fn transfers_are_planned_in_order_within_the_room() {
        let f = |n: u64| (PathBuf::from(format!("f{n}")), n);
        let files = [f(5), f(30), f(20), f(48), f(10)];
        assert_eq!(plan_calls(&files, 60).unwrap(), [vec![0, 1, 2], vec![3, 4]]);
        assert_eq!(plan_calls(&files, 48).unwrap().len(), 4);
        assert!(plan_calls(&files, 47).unwrap_err().contains("f48"));
    }

    /// Digests with every case: exact equal and differing, approx equal and differing
    /// (two in one test), an old line without a kind, outputs on either side only, and
    /// an output approx on one side but exact on the other (exact: it must agree).
    const SIM: &str = "a#0 x 4 exact\na#1 y 4 exact\nb#0 z 8 approx\nb#1 z 8 approx\n\
        b#2 q 8 approx\nc#0 w 2 exact\nd#0 v 4\ne#0 u 4 approx\nf#0 t 4 approx\n";
    const GPU: &str = "a#0 x 4 exact\na#1 Y 4 exact\nb#0 Z 8 approx\nb#1 z 8 approx\n\
        b#2 Q 8 approx\nd#0 v 4\ne#0 u 4 approx\nf#0 T 4 exact\ng#0 s 4 exact\n";

    #[test]
    fn kernel_results_fail_on_exact_differences_and_missing_outputs() {
        let r = compare_kernel_results(SIM, GPU);
        assert!(r.failed);
        assert_eq!(
            r.report,
            "exact outputs: 2 bit-identical, 2 differ\n\
             approx outputs: 2 bit-identical, 2 differ (allowed: .approx results)\n\
             outputs on one side only: 2\n\
             exact outputs that differ (failures):\n  a#1\n  f#0\n\
             outputs on one side only (failures):\n  c#0: only on cuda-sim\n  g#0: only on the GPU\n\
             approx outputs that differ, per test (listed, not failures):\n  b: 2\n\
             FAILED: 2 exact output(s) differ, 2 output(s) on one side only\n"
        );
        // Only approx outputs differ: listed, not failed.
        let gpu = SIM.replace("b#0 z 8", "b#0 Z 8");
        let r = compare_kernel_results(SIM, &gpu);
        assert!(!r.failed, "{}", r.report);
        assert!(r
            .report
            .starts_with("exact outputs: 4 bit-identical, 0 differ\n"));
        assert!(r.report.contains("\n  b: 1\n"));
        assert!(r
            .report
            .ends_with("OK: every exact output is bit-identical\n"));
        // A byte count that differs is a difference.
        let r = compare_kernel_results("a#0 x 4 exact\n", "a#0 x 8 exact\n");
        assert!(r.failed);
    }

    /// run.sh's `compare_digests` prints the report the Rust comparison makes, and fails
    /// when it does (where bash, sort, join and awk are installed).
    #[test]
    fn the_script_compares_digests_as_the_rust_code() {
        let dir = std::env::temp_dir().join(format!("xtask-digests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let only_approx = SIM.replace("b#0 z 8", "b#0 Z 8");
        for (gpu, fails) in [(GPU, true), (only_approx.as_str(), false), (SIM, false)] {
            std::fs::write(dir.join("sim.txt"), SIM).unwrap();
            std::fs::write(dir.join("gpu.txt"), gpu).unwrap();
            let script = format!(
                "set -o pipefail\n{COMPARE_SH}\ncompare_digests {d}/sim.txt {d}/gpu.txt {d}",
                d = dir.display()
            );
            let Ok(out) = std::process::Command::new("bash")
                .arg("-c")
                .arg(&script)
                .output()
            else {
                return;
            };
            let rust = compare_kernel_results(SIM, gpu);
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                rust.report,
                "stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(!out.status.success(), fails, "{}", rust.report);
            assert_eq!(rust.failed, fails);
            let saved = std::fs::read_to_string(dir.join("emulator-vs-gpu-report.txt")).unwrap();
            assert_eq!(saved, rust.report);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
