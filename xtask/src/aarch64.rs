//! `cargo xtask aarch64`: ggml-cpu's tests cross-built for aarch64 Linux (in profile
//! `ub-checks`: std's UB checks on in its unsafe kernels) and run under qemu-user, once per
//! emulated CPU model, each model with the instruction-set levels it
//! must run (`GGML_RS_REQUIRE_ISA`) and the best one detection must pick
//! (`GGML_RS_EXPECT_ISA`), so that a level whose kernels did not run fails the run. Then,
//! on each model, a sample of the CPU regression matrix on the synthetic model
//! ([`MATRIX_SAMPLE`], built in the same profile, so the two builds share their host
//! proc-macros and common dependencies) at the level detection picks, against the
//! committed CPU golden that x86 gives: every aarch64 level must give the same bits end
//! to end.
//!
//! Needs the Rust target `aarch64-unknown-linux-gnu`, a cross linker
//! (`aarch64-linux-gnu-gcc`, Debian's `gcc-aarch64-linux-gnu`, whose C library under
//! `/usr/aarch64-linux-gnu` qemu loads the binaries with) and `qemu-aarch64` (Debian's
//! `qemu-user`); `.ci/run` installs them.

use std::time::Instant;

use xshell::{cmd, Shell};

use crate::fetch::Result;

mod count;

/// The Rust target.
const TARGET: &str = "aarch64-unknown-linux-gnu";
/// The cross linker.
const LINKER: &str = "aarch64-linux-gnu-gcc";
/// The user-mode emulator.
const QEMU: &str = "qemu-aarch64";
/// The target's C library (dynamic loader and libc), for qemu's `-L`.
const SYSROOT: &str = "/usr/aarch64-linux-gnu";

/// The harness test that runs the sample of the CPU matrix against the CPU golden.
const MATRIX_SAMPLE: &str = "cpu_matrix_sample_matches_the_cpu_golden";

/// An emulated CPU and the levels ggml-cpu must find on it.
#[derive(Debug, PartialEq)]
pub struct CpuModel {
    /// qemu's `-cpu` name.
    pub qemu_cpu: &'static str,
    /// Every level it must run, lowest first (the last is the one detection picks).
    pub levels: &'static [&'static str],
}

/// One model per aarch64 level: Armv8.0 (NEON only), Armv8.2 with the dot product, and
/// qemu's `max` (Armv9 with the 8-bit matrix multiply).
pub const MODELS: [CpuModel; 3] = [
    CpuModel {
        qemu_cpu: "cortex-a53",
        levels: &["scalar", "neon"],
    },
    CpuModel {
        qemu_cpu: "cortex-a76",
        levels: &["scalar", "neon", "dotprod"],
    },
    CpuModel {
        qemu_cpu: "max",
        levels: &["scalar", "neon", "dotprod", "i8mm"],
    },
];

const USAGE: &str = "usage: cargo xtask aarch64 [--cpu MODEL]... [-- TEST_FILTER...]
       cargo xtask aarch64 --count [--level L]... [-p N] [-n N] [--symbols]
  MODEL: cortex-a53 (neon), cortex-a76 (dotprod) or max (i8mm); default: all three
  TEST_FILTER: arguments for ggml-cpu's test binaries; with one, the matrix sample is skipped
  --count: instructions per token of pp and tg on SmolLM2 under qemu, ours at each level L
           (neon, dotprod, i8mm; default dotprod and i8mm) against llama.cpp built for
           dotprod+i8mm;
           -p and -n: prompt and generated tokens (default 512 and 128; 0 skips);
           --symbols: also per function, each test's costliest listed";

/// The parsed command line: the models to run and the arguments for the test binaries,
/// or the instruction counts.
#[derive(Debug, PartialEq)]
struct Args {
    models: Vec<&'static CpuModel>,
    test_args: Vec<String>,
    count: Option<count::CountArgs>,
}

fn parse(args: &[String]) -> Result<Args> {
    let mut models = Vec::new();
    let mut it = args.iter();
    let mut test_args = Vec::new();
    let mut count: Option<count::CountArgs> = None;
    let mut levels = Vec::new();
    let tokens = |flag: &str, v: Option<&String>| -> Result<usize> {
        v.and_then(|v| v.parse().ok())
            .ok_or(format!("{flag} needs a token count\n{USAGE}"))
    };
    let (mut n_prompt, mut n_gen) = (None, None);
    let mut symbols = false;
    while let Some(a) = it.next() {
        match a.as_str() {
            "--count" => count = Some(count::CountArgs::default()),
            "--symbols" => symbols = true,
            "--level" => {
                let l = it.next().ok_or(format!("--level needs a level\n{USAGE}"))?;
                if !["neon", "dotprod", "i8mm"].contains(&l.as_str()) {
                    return Err(format!("unknown level '{l}'\n{USAGE}"));
                }
                levels.push(l.clone());
            }
            "-p" => n_prompt = Some(tokens("-p", it.next())?),
            "-n" => n_gen = Some(tokens("-n", it.next())?),
            "--cpu" => {
                let name = it.next().ok_or(format!("--cpu needs a model\n{USAGE}"))?;
                let m = MODELS
                    .iter()
                    .find(|m| m.qemu_cpu == name)
                    .ok_or(format!("unknown CPU model '{name}'\n{USAGE}"))?;
                if !models.contains(&m) {
                    models.push(m);
                }
            }
            "--" => {
                test_args = it.by_ref().cloned().collect();
            }
            other => return Err(format!("unknown argument '{other}'\n{USAGE}")),
        }
    }
    let counting = (
        !levels.is_empty() || symbols,
        n_prompt.is_some(),
        n_gen.is_some(),
    );
    match count.as_mut() {
        Some(c) => {
            if !levels.is_empty() {
                c.levels = levels;
            }
            c.n_prompt = n_prompt.unwrap_or(c.n_prompt);
            c.n_gen = n_gen.unwrap_or(c.n_gen);
            c.symbols = symbols;
            if !models.is_empty() || !test_args.is_empty() {
                return Err(format!("--count takes no --cpu or test filter\n{USAGE}"));
            }
        }
        None if counting != (false, false, false) => {
            return Err(format!("--level, -p and -n go with --count\n{USAGE}"));
        }
        None => {}
    }
    if models.is_empty() {
        models = MODELS.iter().collect();
    }
    Ok(Args {
        models,
        test_args,
        count,
    })
}

/// Whether `tool` runs (`tool --version`).
fn have_tool(sh: &Shell, tool: &str) -> bool {
    cmd!(sh, "{tool} --version")
        .quiet()
        .ignore_stdout()
        .ignore_stderr()
        .run()
        .is_ok()
}

/// Runs a `cargo test` command, echoing its output; the number of tests that passed, or
/// an error when any failed, none ran, or the output lacks `expect` (when given).
fn run_tests(test: xshell::Cmd<'_>, expect: Option<&str>) -> Result<usize> {
    let out = test.ignore_status().output().map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    print!("{stdout}");
    eprint!("{stderr}");
    let (passed, failed) = count_tests(&stdout);
    if !out.status.success() {
        return Err(format!("{failed} tests failed ({})", out.status));
    }
    if passed == 0 {
        return Err("no test ran".into());
    }
    if let Some(e) = expect {
        if !stdout.contains(e) && !stderr.contains(e) {
            return Err(format!("the output does not say `{e}`"));
        }
    }
    Ok(passed)
}

/// The number of tests `cargo test`'s output says passed and failed.
fn count_tests(out: &str) -> (usize, usize) {
    let mut passed = 0;
    let mut failed = 0;
    for line in out.lines() {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            continue;
        };
        for part in rest.split(['.', ';']) {
            let mut w = part.split_whitespace();
            if let (Some(n), Some(what)) = (w.next(), w.next()) {
                let n: usize = n.parse().unwrap_or(0);
                match what {
                    "passed" => passed += n,
                    "failed" => failed += n,
                    _ => {}
                }
            }
        }
    }
    (passed, failed)
}

/// Entry point.
pub fn aarch64(sh: &Shell, args: &[String]) -> Result<()> {
    let args = parse(args)?;
    let mut missing = Vec::new();
    if !crate::have_target(sh, TARGET) {
        missing.push(format!(
            "the Rust target {TARGET} (rustup target add {TARGET})"
        ));
    }
    if !have_tool(sh, LINKER) {
        missing.push(format!(
            "the linker {LINKER} (apt-get install gcc-aarch64-linux-gnu)"
        ));
    }
    if !have_tool(sh, QEMU) {
        missing.push(format!("{QEMU} (apt-get install qemu-user)"));
    }
    if !std::path::Path::new(SYSROOT).join("lib").is_dir() {
        missing.push(format!(
            "the aarch64 C library in {SYSROOT} (apt-get install gcc-aarch64-linux-gnu)"
        ));
    }
    if !missing.is_empty() {
        return Err(format!(
            "cannot run the aarch64 tests; missing: {}",
            missing.join("; ")
        ));
    }
    if let Some(c) = &args.count {
        return count::count(sh, &crate::workspace_root(), c);
    }
    let _linker = sh.push_env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", LINKER);
    // The tests choose their levels themselves; a level forced from outside would not
    // change them, but keep backends created with defaults on the detected one.
    let _isa = sh.push_env("GGML_RS_ISA", "");
    let matrix = args.test_args.is_empty();
    // ggml-cpu's tests in profile `ub-checks`: with std's UB checks (debug assertions) on
    // in its unsafe kernels, which the workspace's test profile turns off for speed.
    crate::step(
        "build ggml-cpu's tests for aarch64 (profile ub-checks)",
        || {
            cmd!(
                sh,
                "cargo test -p ggml-cpu --locked --target {TARGET} --profile ub-checks --no-run"
            )
            .run()
            .map_err(|e| e.to_string())
        },
    )?;
    if matrix {
        // Same profile: the host proc-macros and the shared dependencies build once, and
        // the matrix sample too runs ggml-cpu with the UB checks.
        crate::step(
            "build the harness's matrix tests for aarch64 (profile ub-checks)",
            || {
                cmd!(
                sh,
                "cargo test -p harness --locked --target {TARGET} --profile ub-checks --test matrix --no-run"
            )
            .run()
            .map_err(|e| e.to_string())
            },
        )?;
    }
    let mut summary = Vec::new();
    for m in &args.models {
        let cpu = m.qemu_cpu;
        let runner = format!("{QEMU} -L {SYSROOT} -cpu {cpu}");
        let _runner = sh.push_env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER", &runner);
        let _require = sh.push_env("GGML_RS_REQUIRE_ISA", m.levels.join(","));
        let best = m.levels.last().copied().unwrap_or("scalar");
        let _expect = sh.push_env("GGML_RS_EXPECT_ISA", best);
        let test_args = &args.test_args;
        let t = Instant::now();
        let mut passed = 0;
        crate::step(
            &format!(
                "ggml-cpu tests on qemu -cpu {cpu} (levels {})",
                m.levels.join(", ")
            ),
            || {
                let out = cmd!(
                    sh,
                    "cargo test -p ggml-cpu --locked --target {TARGET} --profile ub-checks -- {test_args...}"
                );
                passed = run_tests(out, None)?;
                Ok(())
            },
        )?;
        summary.push(format!(
            "  qemu -cpu {cpu:<10} levels {:<28} {passed} tests passed in {:.0} s",
            m.levels.join(","),
            t.elapsed().as_secs_f64()
        ));
        if !matrix {
            continue;
        }
        let t = Instant::now();
        crate::step(
            &format!("CPU matrix sample on qemu -cpu {cpu} (level {best}) against the CPU golden"),
            || {
                let out = cmd!(
                    sh,
                    "cargo test -p harness --locked --target {TARGET} --profile ub-checks --test matrix -- {MATRIX_SAMPLE} --exact --nocapture"
                );
                match run_tests(out, Some(&format!("this run: {best})")))? {
                    1 => Ok(()),
                    n => Err(format!("{n} tests ran, expected {MATRIX_SAMPLE} alone")),
                }
            },
        )?;
        summary.push(format!(
            "  qemu -cpu {cpu:<10} level  {best:<28} CPU matrix sample equal to the CPU golden in {:.0} s",
            t.elapsed().as_secs_f64()
        ));
    }
    if !matrix {
        summary.push("  CPU matrix sample skipped (a test filter was given)".into());
    }
    eprintln!("\nxtask aarch64: all passed\n{}", summary.join("\n"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_models_and_test_args() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.models.len(), 3);
        assert!(a.test_args.is_empty());
        let a = parse(&strings(&["--cpu", "max", "--", "simd::", "--nocapture"])).unwrap();
        assert_eq!(a.models, vec![&MODELS[2]]);
        assert_eq!(a.test_args, strings(&["simd::", "--nocapture"]));
        assert!(parse(&strings(&["--cpu", "cortex-x9"])).is_err());
        assert!(parse(&strings(&["--cpu"])).is_err());
        assert!(parse(&strings(&["--fast"])).is_err());
    }

    #[test]
    fn parses_the_count_mode() {
        assert_eq!(parse(&[]).unwrap().count, None);
        let c = parse(&strings(&["--count"])).unwrap().count.unwrap();
        assert_eq!(c, count::CountArgs::default());
        assert_eq!(c.levels, strings(&["dotprod", "i8mm"]));
        let c = parse(&strings(&[
            "--count", "--level", "i8mm", "-p", "64", "-n", "0",
        ]))
        .unwrap()
        .count
        .unwrap();
        assert_eq!((c.levels, c.n_prompt, c.n_gen), (strings(&["i8mm"]), 64, 0));
        assert!(parse(&strings(&["--count", "--level", "sve"])).is_err());
        assert!(parse(&strings(&["--count", "-p", "many"])).is_err());
        assert!(parse(&strings(&["-p", "64"])).is_err());
        assert!(parse(&strings(&["--symbols"])).is_err());
        let c = parse(&strings(&["--count", "--symbols"]))
            .unwrap()
            .count
            .unwrap();
        assert!(c.symbols);
        assert!(parse(&strings(&["--count", "--cpu", "max"])).is_err());
    }

    /// Each model's levels are the aarch64 chain's prefix up to its best level.
    #[test]
    fn models_cover_every_level_once() {
        let chain = ["scalar", "neon", "dotprod", "i8mm"];
        for (i, m) in MODELS.iter().enumerate() {
            assert_eq!(m.levels, &chain[..i + 2], "{}", m.qemu_cpu);
        }
    }

    #[test]
    fn counts_cargo_test_results() {
        let out = [
            "running 3 tests",
            "test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; \
             finished in 0.5s",
            "test result: FAILED. 10 passed; 2 failed; 1 ignored; 0 measured; 4 filtered out",
        ]
        .join("\n");
        let out = out.as_str();
        assert_eq!(count_tests(out), (13, 2));
        assert_eq!(count_tests("nothing"), (0, 0));
    }
}
