//! `cargo xtask fuzz --minutes N`: every cargo-fuzz target of the project for N minutes
//! in all (shared equally), each from its committed seeds, then a table of what ran and
//! what crashed. Needs `cargo-fuzz` (installed here if missing) and runs on stable Rust
//! with `RUSTC_BOOTSTRAP=1`, which cargo-fuzz's sanitizer flags need.

use std::path::Path;

use xshell::{cmd, Shell};

use crate::fetch::Result;

/// (package folder, target, extra libFuzzer arguments).
const TARGETS: [(&str, &str, &[&str]); 6] = [
    ("ggml-core/fuzz", "gguf_parse", &["-dict=gguf.dict"]),
    ("harness/fuzz", "matrix_parse", &[]),
    ("harness/fuzz", "devices_parse", &[]),
    ("harness/fuzz", "tokenizer_text", &[]),
    ("harness/fuzz", "gguf_roundtrip", &[]),
    ("harness/fuzz", "kl_base", &[]),
];

/// Entry point.
pub fn fuzz(root: &Path, args: &[String]) -> Result<()> {
    let minutes: f64 = match args {
        [flag, n] if flag == "--minutes" => n
            .parse()
            .ok()
            .filter(|m: &f64| *m > 0.0)
            .ok_or_else(|| format!("--minutes {n}: expected a positive number"))?,
        _ => return Err("usage: cargo xtask fuzz --minutes N".into()),
    };
    let sh = Shell::new().map_err(|e| e.to_string())?;
    if cmd!(sh, "cargo fuzz --version")
        .quiet()
        .ignore_stderr()
        .read()
        .is_err()
    {
        eprintln!("fuzz: installing cargo-fuzz");
        cmd!(sh, "cargo install cargo-fuzz --locked")
            .run()
            .map_err(|e| e.to_string())?;
    }
    let seconds = ((minutes * 60.0) / TARGETS.len() as f64).ceil().max(1.0) as u64;
    let _bootstrap = sh.push_env("RUSTC_BOOTSTRAP", "1");
    let mut rows = Vec::new();
    for (dir, target, extra) in TARGETS {
        sh.change_dir(root.join(dir));
        let corpus = format!("corpus/{target}");
        std::fs::create_dir_all(root.join(dir).join(&corpus))
            .map_err(|e| format!("cannot create {dir}/{corpus}: {e}"))?;
        let seeds = format!("seeds/{target}");
        let dirs: Vec<String> = if root.join(dir).join(&seeds).is_dir() {
            vec![corpus, seeds]
        } else {
            vec![corpus]
        };
        let time = format!("-max_total_time={seconds}");
        eprintln!("\n==> fuzz {dir} {target} for {seconds} s");
        let ok = cmd!(sh, "cargo fuzz run {target} {dirs...} -- {time} {extra...}")
            .run()
            .is_ok();
        let artifacts = root.join(dir).join("artifacts").join(target);
        let crashes = std::fs::read_dir(&artifacts)
            .map(|d| d.flatten().count())
            .unwrap_or(0);
        rows.push((dir, target, ok, crashes));
    }
    println!("\n| target | seconds | result | files in artifacts/ |");
    println!("|---|---|---|---|");
    for (dir, target, ok, crashes) in &rows {
        let result = if *ok { "no crash" } else { "CRASH" };
        println!("| {dir} {target} | {seconds} | {result} | {crashes} |");
    }
    if rows.iter().all(|r| r.2) {
        Ok(())
    } else {
        Err("a fuzz target crashed: reproduce with `RUSTC_BOOTSTRAP=1 cargo fuzz run TARGET ARTIFACT` in its folder, fix it, and add the input as a regression test".into())
    }
}
