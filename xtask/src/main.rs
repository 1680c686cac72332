//! `cargo xtask <command>`: the project's automation, in Rust so it runs wherever cargo does.
//!
//! Commands:
//! - `aarch64`: ggml-cpu's tests cross-built for aarch64 and run under qemu-user, once
//!   per emulated CPU model (NEON, dotprod, i8mm); `--count`: instructions per token,
//!   ours against llama.cpp, under qemu;
//! - `all-gather`: the exact tensor split with whole and ring all-gathers side by side;
//! - `bench-vs-llama`: ggml-harness bench against llama.cpp's llama-bench, alternately;
//! - `faults`: the fault sweep on CPU and emulated GPUs;
//! - `ci`: everything CI checks (format, lints, tests, the no_std build, docs, packaging);
//! - `fetch-model [--model NAME]`: download a known GGUF (SmolLM2 by default, or
//!   gemma3-270m) into the cache and print its path;
//! - `gen-ptx`: write the generated PTX (`ggml-cuda/kernels/qmm.ptx`, `fattn_mma.ptx`,
//!   `fattn_row.ptx`) from its generators;
//! - `ptx-check`: assemble every PTX kernel with `ptxas` for sm_80 and sm_90;
//! - `ppl [-- ARGS]`: the main job, a perplexity run of the default model on the
//!   embedded corpus (`ggml-harness perplexity ARGS`).

mod aarch64;
mod all_gather;
mod bench_vs_llama;
mod calibrate;
mod fattn_ptx;
mod fattn_row_ptx;
mod faults;
mod fetch;
mod fuzz;
mod gen_ci;
mod gpu;
mod mutants;
mod ptx;
mod qmm_ptx;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use xshell::{cmd, Shell};

use fetch::Result;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  aarch64 [--cpu MODEL]... [-- TEST_FILTER...]
                 ggml-cpu's tests cross-built for aarch64-unknown-linux-gnu and run
                 under qemu-aarch64, once per CPU model (cortex-a53: neon, cortex-a76:
                 dotprod, max: i8mm), each failing if one of its levels did not run;
                 needs gcc-aarch64-linux-gnu and qemu-user (.ci/run installs them)
  aarch64 --count [--level L]... [-p N] [-n N]
                 guest instructions per token of pp512 and tg128 on SmolLM2 under
                 qemu (a proxy for speed), ours at each level against llama.cpp
                 cross-built for dotprod+i8mm; also needs cmake, curl, g++ for aarch64
  all-gather [--devices cpu:2,cpu:3] [--threads N] [--chunks C] [--rounds K]
                 the exact tensor split with --all-gather concat and ring side by
                 side: wall time, copy time per pass exposed and hidden, same bits
  bench-vs-llama [--threads N] [-r R] [--rounds K]
                 `ggml-harness bench` and llama.cpp's llama-bench run alternately
                 (pp512, tg128): tokens/s, ratios, tg weight bandwidth vs memcpy
  ci             format check, clippy, tests (nextest), no_std build of ggml-core,
                 fuzz targets compile, aarch64 check of ggml-cpu, workflows, ptx-check,
                 docs and packaging checks: what CI runs
  faults         inject every fault kind at every op of a forward pass (cpu:2 and
                 two cuda-sim GPUs, layer split, two slots): errors, hangs, leaks
  fetch-model [--model NAME]
                 download a known model (smollm2-135m, the default: SmolLM2-135M-
                 Instruct Q4_1; gemma3-270m: Gemma 3 270M Q4_K_M) into
                 $GGML_RS_CACHE (default ~/.cache/ggml-rs), verify it, print its path
  gpu-test [--prepare DIR]
                 on a machine with an NVIDIA GPU: ggml-cuda's GPU tests, cuda:0
                 perplexity within 0.5 % of the CPU's, the CUDA regression matrix;
                 --prepare packs them (binaries, model in 48 MiB parts, DIR/run.sh)
                 for a GPU machine without Rust
  fuzz --minutes N
                 every cargo-fuzz target (GGUF parser, matrix files, --devices,
                 tokenizer text, GGUF writer round trip) for N minutes in all
  mutants [--only GROUP]... [--shard K/N] [--in-place] [--report-only]
                 cargo-mutants on the exactness-critical files (cuda-sim arith and
                 engine, ggml-core quant, ggml-cpu reference, ggml-sched plan and
                 check): caught / missed / timeout / unviable and score per file, fails
                 under 90 %; hours on two cores, not in CI (--shard samples)
  gen-ci [--check]
                 write .github/workflows from harness/matrices (a CPU job, and a
                 GPU job for each matrix with [ci] runs_on labels); --check fails
                 if the committed files differ, then lints them with actionlint
  calibrate DIR [-- ARGS]
                 fit the cost model's constants to a GPU run's calibration folder
                 (probes.json, kernels.json from `gpu-test`), profiling the same
                 passes on cuda-sim; prints every row's error and, with the kit's
                 tuning-default.json in DIR, the measured pp512 and tg128 beside the
                 modelled ones; writes DIR/fit.json
  gen-ptx        write ggml-cuda/kernels/qmm.ptx (the quantised products, one loop per
                 weight dtype) from xtask/src/qmm_ptx.rs, fattn_mma.ptx (prompt
                 attention on tensor cores) from xtask/src/fattn_ptx.rs and
                 fattn_row.ptx (decode attention, a query row a block) from
                 xtask/src/fattn_row_ptx.rs; a test fails while one is stale
  ptx-check [--write]
                 assemble every ggml-cuda PTX kernel with ptxas (from PyPI) for
                 sm_80 and sm_90; fail if ggml-cuda/kernels/ptxas-resources.txt
                 (registers, shared memory, spills from ptxas -v) is out of date,
                 or with --write rewrite it
  ppl [-- ARGS]  perplexity of the default model on the embedded corpus
                 (ARGS go to `ggml-harness perplexity`, see its --help)
  regress [-- ARGS]
                 a regression matrix (default: the 80-cell CPU one; --matrix FILE
                 for another, e.g. harness/matrices/cuda-1gpu.toml) on the real
                 model and corpus, with the race checker, compared with
                 harness/goldens.json (--bless records into it); ARGS go to
                 `ggml-harness regress` (e.g. --chaos 1 --seeds 100 --chunks 1)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("aarch64") => Shell::new().map_err(|e| e.to_string()).and_then(|sh| {
            sh.change_dir(workspace_root());
            aarch64::aarch64(&sh, &args[1..])
        }),
        Some("all-gather") => all_gather::all_gather(&workspace_root(), &args[1..]),
        Some("bench-vs-llama") => bench_vs_llama::bench_vs_llama(&workspace_root(), &args[1..]),
        Some("calibrate") => calibrate::calibrate(&workspace_root(), &args[1..]),
        Some("ci") => ci(),
        Some("ppl") => ppl(&args[1..]),
        Some("regress") => regress(&args[1..]),
        Some("gpu-test") => Shell::new()
            .map_err(|e| e.to_string())
            .and_then(|sh| gpu::gpu_test(&sh, &workspace_root(), &args[1..])),
        Some("gen-ptx") => {
            let root = workspace_root();
            qmm_ptx::gen_ptx(&root)
                .and_then(|()| fattn_ptx::gen_ptx(&root))
                .and_then(|()| fattn_row_ptx::gen_ptx(&root))
        }
        Some("ptx-check") => Shell::new().map_err(|e| e.to_string()).and_then(|sh| {
            let write = match args.get(1).map(String::as_str) {
                None => Ok(false),
                Some("--write") => Ok(true),
                Some(other) => Err(format!("ptx-check: unknown argument '{other}'")),
            }?;
            ptx::ptx_check(&sh, &workspace_root(), write)
        }),
        Some("fuzz") => fuzz::fuzz(&workspace_root(), &args[1..]),
        Some("mutants") => mutants::mutants(&workspace_root(), &args[1..]),
        Some("faults") => faults::faults(&workspace_root(), &args[1..]),
        Some("gen-ci") => gen_ci::gen_ci(&workspace_root(), &args[1..]),
        Some("fetch-model") => fetch_model_cmd(&args[1..]),
        Some("-h" | "--help" | "help") | None => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => Err(format!("unknown command '{other}'\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `fetch-model [--model NAME]`.
fn fetch_model_cmd(args: &[String]) -> Result<()> {
    let model = match args {
        [] => &fetch::SMOLLM2,
        [flag, name] if flag == "--model" => fetch::known_model(name).ok_or_else(|| {
            format!(
                "unknown model '{name}'; known models: {}",
                fetch::known_model_names()
            )
        })?,
        _ => {
            return Err(format!(
                "usage: cargo xtask fetch-model [--model NAME]\n\n{USAGE}"
            ))
        }
    };
    fetch::fetch(model).map(|p| println!("{}", p.display()))
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// Runs one named step, printing a header and the time it took.
fn step(name: &str, f: impl FnOnce() -> Result<()>) -> Result<()> {
    eprintln!("\n==> {name}");
    let t = std::time::Instant::now();
    let r = f();
    eprintln!(
        "<== {name}: {} in {:.1}s",
        if r.is_ok() { "ok" } else { "FAILED" },
        t.elapsed().as_secs_f64()
    );
    r.map_err(|e| format!("{name}: {e}"))
}

fn ppl(args: &[String]) -> Result<()> {
    let sh = Shell::new().map_err(|e| e.to_string())?;
    sh.change_dir(workspace_root());
    let args = args.strip_prefix(&["--".to_string()]).unwrap_or(args);
    cmd!(
        sh,
        "cargo run --quiet --release -p harness --bin ggml-harness -- perplexity {args...}"
    )
    .run()
    .map_err(|e| e.to_string())
}

fn regress(args: &[String]) -> Result<()> {
    let sh = Shell::new().map_err(|e| e.to_string())?;
    sh.change_dir(workspace_root());
    let args = args.strip_prefix(&["--".to_string()]).unwrap_or(args);
    let args = absolute_path_args(
        args,
        &["--matrix", "--report", "--golden", "--update-golden"],
    )?;
    let golden = workspace_root().join("harness/goldens.json");
    // A cell without a golden for this hardware fails unless the run records goldens.
    let blessing = args
        .iter()
        .any(|a| a == "--bless" || a.starts_with("--update-golden"));
    let require: Vec<&str> = if blessing {
        Vec::new()
    } else {
        vec!["--require-golden"]
    };
    let golden_args: Vec<String> = if args
        .iter()
        .any(|a| a.starts_with("--update-golden") || a.starts_with("--golden"))
    {
        Vec::new()
    } else {
        vec!["--golden".into(), golden.display().to_string()]
    };
    fetch::fetch_model()?;
    cmd!(
        sh,
        "cargo run --quiet --release -p harness --bin ggml-harness -- regress --check-races {require...} {golden_args...} {args...}"
    )
    .run()
    .map_err(|e| e.to_string())
}

/// `args` with the values of the `flags` (`--flag VALUE` or `--flag=VALUE`) made
/// absolute: the harness runs from the workspace root, not where xtask was invoked.
fn absolute_path_args(args: &[String], flags: &[&str]) -> Result<Vec<String>> {
    let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    let absolute = |p: &str| cwd.join(p).display().to_string();
    let mut out = Vec::with_capacity(args.len());
    let mut next_is_path = false;
    for a in args {
        if next_is_path {
            out.push(absolute(a));
            next_is_path = false;
        } else if flags.contains(&a.as_str()) {
            out.push(a.clone());
            next_is_path = true;
        } else if let Some((flag, value)) = a.split_once('=').filter(|(f, _)| flags.contains(f)) {
            out.push(format!("{flag}={}", absolute(value)));
        } else {
            out.push(a.clone());
        }
    }
    Ok(out)
}

fn ci() -> Result<()> {
    let sh = Shell::new().map_err(|e| e.to_string())?;
    sh.change_dir(workspace_root());
    let run = |c: xshell::Cmd<'_>| c.run().map_err(|e| e.to_string());

    step("fmt", || run(cmd!(sh, "cargo fmt --all --check")))?;
    step("clippy", || {
        run(cmd!(
            sh,
            "cargo clippy --workspace --all-targets --locked -- -D warnings"
        ))
    })?;
    step("tests", || {
        run(cmd!(
            sh,
            "cargo nextest run --workspace --locked --no-fail-fast"
        ))
    })?;
    step("doctests", || {
        run(cmd!(sh, "cargo test --workspace --locked --doc"))
    })?;
    step("no_std build of ggml-core", || no_std_build(&sh))?;
    step("fuzz targets compile (cargo xtask fuzz runs them)", || {
        for dir in ["ggml-core/fuzz", "harness/fuzz"] {
            let manifest = format!("{dir}/Cargo.toml");
            run(cmd!(
                sh,
                "cargo check --quiet --locked --manifest-path {manifest} --bins"
            ))?;
        }
        Ok(())
    })?;
    step("aarch64 check of ggml-cpu (NEON paths)", || {
        aarch64_check(&sh)
    })?;
    step("workflows: gen-ci --check, actionlint", || {
        gen_ci::gen_ci(&workspace_root(), &["--check".to_string()])
    })?;
    step("ptx-check (sm_80, sm_90)", || {
        ptx::ptx_check(&sh, &workspace_root(), false)
    })?;
    step("docs", || {
        let _env = sh.push_env("RUSTDOCFLAGS", "-D warnings");
        run(cmd!(sh, "cargo doc --workspace --no-deps --locked"))
    })?;
    step("package ggml-core", || {
        run(cmd!(
            sh,
            "cargo package -p ggml-core --locked --allow-dirty"
        ))
    })?;
    eprintln!("\nxtask ci: all checks passed");
    Ok(())
}

const AARCH64_TARGET: &str = "aarch64-unknown-linux-gnu";

/// Whether rustup has `target`, installing it if it can.
fn have_target(sh: &Shell, target: &str) -> bool {
    let installed = cmd!(sh, "rustup target list --installed")
        .quiet()
        .read()
        .map(|s| s.lines().any(|l| l.trim() == target))
        .unwrap_or(false);
    installed || cmd!(sh, "rustup target add {target}").run().is_ok()
}

/// Clippy over ggml-cpu for aarch64, so the NEON kernels at least compile warning-free.
fn aarch64_check(sh: &Shell) -> Result<()> {
    if !have_target(sh, AARCH64_TARGET) {
        eprintln!(
            "\n!!! WARNING: the {AARCH64_TARGET} target could not be installed; the NEON\n\
             !!! paths of ggml-cpu are NOT compile-checked in this run.\n"
        );
        return Ok(());
    }
    cmd!(
        sh,
        "cargo clippy -p ggml-cpu --locked --target {AARCH64_TARGET} -- -D warnings"
    )
    .run()
    .map_err(|e| e.to_string())
}

const NO_STD_TARGET: &str = "thumbv7em-none-eabihf";

fn no_std_build(sh: &Shell) -> Result<()> {
    if have_target(sh, NO_STD_TARGET) {
        cmd!(
            sh,
            "cargo build -p ggml-core --locked --target {NO_STD_TARGET}"
        )
        .run()
        .map_err(|e| e.to_string())
    } else {
        eprintln!(
            "\n!!! WARNING: the {NO_STD_TARGET} target could not be installed; the no_std\n\
             !!! build is NOT checked on a bare-metal target. Checking a host build of the\n\
             !!! #![no_std] crate instead (it still forbids std, but not a missing allocator).\n"
        );
        cmd!(sh, "cargo build -p ggml-core --locked")
            .run()
            .map_err(|e| e.to_string())
    }
}
