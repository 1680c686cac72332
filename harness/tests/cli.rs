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
#[case::generate_against_garbage(
    &["generate", "--model", "{tiny}", "-p", "a", "--against", "{dir}/garbage.json"],
    "not JSON"
)]
#[case::generate_against_a_bench_file(
    &["generate", "--model", "{tiny}", "-p", "a", "--against", "{dir}/bench-no-pdl.json"],
    "no \"prompt_tokens\" list"
)]
#[case::generate_against_when_sampling(
    &["generate", "--model", "{tiny}", "-p", "a", "--temp", "0.5", "--against", "{dir}/x.json"],
    "leave --temp at 0"
)]
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

/// `generate -p hello -n 12 --json` on the CPU with `extra` flags: its JSON output.
fn generate_json(extra: &[&str]) -> serde_json::Value {
    let out = bin()
        .args([
            "generate",
            "--model",
            &synthetic(),
            "-p",
            "hello",
            "-n",
            "12",
        ])
        .args(["--json", "--devices", "cpu"])
        .args(extra)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{extra:?}: {err}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `generate --against`: the same greedy run agrees with itself; a token changed where
/// the run was clear of a tie fails; the same change where the other run records a
/// near tie passes and says so; another prompt is refused.
#[test]
fn generate_against_tells_a_near_tie_from_a_difference() {
    let dir = scratch();
    let mut record = generate_json(&["--gaps"]);
    let n = record["tokens"].as_array().unwrap().len();
    assert_eq!(record["gaps"].as_array().unwrap().len(), n);
    assert!(n >= 2, "{record}");
    let write = |name: &str, v: &serde_json::Value| {
        std::fs::write(dir.join(name), v.to_string()).unwrap();
    };
    write("same.json", &record);
    let against = |file: &str, prompt: &str| {
        let args = [
            "generate",
            "--model",
            "{tiny}",
            "-p",
            prompt,
            "-n",
            "12",
            "--devices",
            "cpu",
            "--against",
            file,
        ];
        run(&args, &dir)
    };
    let (code, err) = against("{dir}/same.json", "hello");
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains(&format!("the same {n} greedy tokens")),
        "{err}"
    );
    // A run compared --against (which records the gaps) can be compared against in turn.
    let same = dir.join("same.json").display().to_string();
    write("chained.json", &generate_json(&["--against", &same]));
    let (code, err) = against("{dir}/chained.json", "hello");
    assert_eq!(code, Some(0), "{err}");

    // The last token changed; this run's gap there is its own (clear of 1e-9 unless the
    // synthetic model ties exactly, which its gaps would show).
    let last = n - 1;
    let gap = record["gaps"][last].as_f64().unwrap();
    assert!(
        gap > 1e-6,
        "the synthetic model ties at token {last}: {record}"
    );
    let tok = record["tokens"][last].as_u64().unwrap();
    record["tokens"][last] = serde_json::json!((tok + 1) % 256);
    record["gaps"][last] = serde_json::json!(gap);
    write("differs.json", &record);
    let (code, err) = against("{dir}/differs.json", "hello");
    assert_ne!(code, Some(0), "{err}");
    assert!(
        err.contains(&format!("greedy token {last} differs")),
        "{err}"
    );
    assert!(err.contains("neither run was near a tie"), "{err}");

    // The other run was 0.001 from a tie there: a near tie, not a failure.
    record["gaps"][last] = serde_json::json!(0.001);
    write("near.json", &record);
    let (code, err) = against("{dir}/near.json", "hello");
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains(&format!("the same {last} greedy tokens, then a near tie")),
        "{err}"
    );

    let (code, err) = against("{dir}/same.json", "goodbye");
    assert_ne!(code, Some(0), "{err}");
    assert!(err.contains("another prompt"), "{err}");
}
