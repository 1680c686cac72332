//! The `ggml-harness` binary as a new user meets it: every subcommand given a bad flag,
//! a bad value or a missing or malformed file fails with an error that says what, a
//! non-zero exit status, and no panic.

use std::path::{Path, PathBuf};
use std::process::Command;

use ggml_core::DType;
use harness::model::Arch;
use rstest::rstest;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ggml-harness"))
}

/// A scratch folder of this test binary, with a garbage file and the synthetic model.
fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ggml-harness-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("garbage.gguf"), b"GGUF\x03\x00\x00\x00garbage").unwrap();
    std::fs::write(dir.join("garbage.json"), b"{ not json").unwrap();
    std::fs::write(dir.join("bad.toml"), b"[settings]\nmodel = 3\n").unwrap();
    std::fs::write(
        dir.join("bench-no-pdl.json"),
        br#"{"cuda_tuning": "no-pdl", "results": [{"test": "tg128", "tps_mean": 1000.0}]}"#,
    )
    .unwrap();
    dir
}

fn synthetic() -> String {
    harness::synthetic::cached_model_of(Arch::Llama, DType::Q4_1)
        .unwrap()
        .display()
        .to_string()
}

/// Runs the binary with `args` (`{dir}` is the scratch folder, `{tiny}` the synthetic
/// model) and returns (exit code, stderr).
fn run(args: &[&str], dir: &Path) -> (Option<i32>, String) {
    let tiny = synthetic();
    let args: Vec<String> = args
        .iter()
        .map(|a| {
            a.replace("{dir}", &dir.display().to_string())
                .replace("{tiny}", &tiny)
        })
        .collect();
    let out = bin()
        .args(&args)
        .env("GGML_RS_CACHE", dir.join("no-cache"))
        .output()
        .expect("the binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[rstest]
#[case::ppl_ctx_zero(&["perplexity", "--ctx", "0"], "--ctx 0: must be even")]
#[case::ppl_ctx_odd(&["perplexity", "--ctx", "7"], "--ctx 7")]
#[case::ppl_chunks_zero(&["perplexity", "--chunks", "0"], "--chunks 0")]
#[case::ppl_batch_zero(&["perplexity", "--batch", "0"], "--batch 0")]
#[case::ppl_no_model(&["perplexity", "--model", "{dir}/none.gguf"], "no such file")]
#[case::ppl_garbage_model(&["perplexity", "--model", "{dir}/garbage.gguf"], "garbage.gguf")]
#[case::ppl_bad_device(&["perplexity", "--model", "{tiny}", "--devices", "tpu:0"], "tpu")]
#[case::ppl_bad_ubatch(&["perplexity", "--model", "{tiny}", "--ubatch", "0"], "--ubatch")]
#[case::ppl_bad_tuning(&["perplexity", "--cuda-tuning", "fast"], "unknown CUDA tuning item 'fast'")]
#[case::ppl_no_corpus(&["perplexity", "--model", "{tiny}", "--file", "{dir}/none.txt"], "none.txt")]
#[case::ppl_fault_never_fires(
    &["perplexity", "--model", "{tiny}", "--devices", "cpu:2", "--split-mode", "layer",
      "--inject-fault", "1:100000:alloc", "--ctx", "64", "--chunks", "1"],
    "never happened: device 1 made"
)]
#[case::ppl_fault_bad_device(
    &["perplexity", "--model", "{tiny}", "--inject-fault", "3:1:kernel"],
    "--inject-fault"
)]
#[case::tokenize_no_file(&["tokenize", "--model", "{tiny}", "--file", "{dir}/none.txt"], "none.txt")]
#[case::regress_no_matrix(&["regress", "--matrix", "{dir}/none.toml"], "none.toml")]
#[case::regress_bad_matrix(&["regress", "--matrix", "{dir}/bad.toml"], "bad.toml")]
#[case::regress_unknown_builtin(&["regress", "--devices-matrix", "tpu"], "tpu")]
#[case::regress_bless_needs_golden(&["regress", "--bless"], "--golden")]
#[case::bench_no_reps(&["bench", "--model", "{tiny}", "-r", "0", "-p", "8", "-n", "0"], "-r")]
#[case::calibrate_on_cpu(&["calibrate", "--devices", "cpu", "--out", "{dir}/cal"], "one CUDA device")]
#[case::plan_bad_slot(&["plan", "--model", "{tiny}", "--slot", "5"], "--slot 5")]
#[case::fetch_unknown(&["fetch-model", "--model", "llama-7b"], "llama-7b")]
#[case::synth_bad_arch(&["synth-model", "--arch", "rwkv", "--out", "{dir}/x.gguf"], "rwkv")]
#[case::synth_bad_dtype(&["synth-model", "--dtype", "q9_9", "--out", "{dir}/x.gguf"], "q9_9")]
#[case::moe_no_model(&["make-moe", "--model", "{dir}/none.gguf", "--out", "{dir}/m.gguf"], "none.gguf")]
#[case::trace_no_file(&["trace-summary", "{dir}/none.json"], "none.json")]
#[case::trace_garbage(&["trace-summary", "{dir}/garbage.json"], "garbage.json")]
#[case::profile_against_another_tuning(
    &["profile", "--model", "{tiny}", "--devices", "cuda-sim:0", "--against", "{dir}/bench-no-pdl.json"],
    "measured with --cuda-tuning no-pdl, this profile runs default"
)]
#[case::profile_against_garbage(&["profile", "--against", "{dir}/garbage.json"], "garbage.json")]
#[case::unknown_subcommand(&["frobnicate"], "frobnicate")]
fn bad_input_is_a_clear_error(#[case] args: &[&str], #[case] says: &str) {
    let dir = scratch();
    let (code, err) = run(args, &dir);
    assert!(!err.contains("panicked"), "{args:?} panicked:\n{err}");
    assert!(
        matches!(code, Some(c) if c != 0 && c != 101),
        "{args:?}: exit status {code:?}\n{err}"
    );
    assert!(err.contains("error"), "{args:?}: no error message:\n{err}");
    assert!(
        err.contains(says),
        "{args:?}: the error does not say '{says}':\n{err}"
    );
    // Our own errors are one line (clap's parse errors add a usage hint).
    if let Some(line) = err.lines().find(|l| l.starts_with("ggml-harness: error:")) {
        let after: Vec<&str> = err
            .lines()
            .skip_while(|l| !l.starts_with("ggml-harness: error:"))
            .skip(1)
            .filter(|l| !l.trim().is_empty())
            .collect();
        assert!(
            after.is_empty(),
            "{args:?}: more after the error line '{line}': {after:?}"
        );
    }
}
