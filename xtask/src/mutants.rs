//! `cargo xtask mutants`: cargo-mutants on the files whose exactness the project rests on
//! (cuda-sim's arithmetic and engine, ggml-core's quantisers, ggml-cpu's reference ops,
//! ggml-sched's planner and race checker), each group tested by its own crate's tests, then
//! a table per file of mutants caught, missed, timed out and unviable, the score
//! (caught + timeout over the viable ones) and the missed mutants by name. Exits non-zero
//! when a file scores under 90 %. Not in CI: a full run is hours of two cores (about 10 s a
//! mutant, 4,000 mutants); `--shard K/N` runs every N-th mutant of each group as a sample.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use xshell::{cmd, Cmd, Shell};

use crate::fetch::Result;

/// The lowest score a file may have, in percent of viable mutants caught.
const MIN_SCORE: f64 = 90.0;

/// One group of files mutated together and tested by one package's tests.
struct Group {
    /// The name `--only` takes and the folder under `target/mutants/`.
    name: &'static str,
    package: &'static str,
    files: &'static [&'static str],
    exclude: &'static [&'static str],
}

const GROUPS: [Group; 6] = [
    Group {
        name: "arith",
        package: "cuda-sim",
        files: &["cuda-sim/src/exec/arith.rs"],
        exclude: &[],
    },
    Group {
        name: "engine",
        package: "cuda-sim",
        files: &[
            "cuda-sim/src/exec/engine.rs",
            "cuda-sim/src/exec/engine/*.rs",
        ],
        exclude: &[],
    },
    Group {
        name: "quant",
        package: "ggml-core",
        files: &["ggml-core/src/quant/*.rs"],
        exclude: &["ggml-core/src/quant/tests.rs"],
    },
    Group {
        name: "reference",
        package: "ggml-cpu",
        files: &["ggml-cpu/src/reference/*.rs"],
        exclude: &["ggml-cpu/src/reference/tests.rs"],
    },
    Group {
        name: "plan",
        package: "ggml-sched",
        files: &["ggml-sched/src/plan/*.rs"],
        exclude: &[],
    },
    Group {
        name: "check",
        package: "ggml-sched",
        files: &["ggml-sched/src/check.rs"],
        exclude: &[],
    },
];

const USAGE: &str =
    "usage: cargo xtask mutants [--only GROUP]... [--shard K/N] [--in-place] [--report-only]
groups: arith, engine (cuda-sim), quant (ggml-core), reference (ggml-cpu), plan, check (ggml-sched)
  --shard K/N     every N-th mutant of each group, starting at K (a sample; the table says so)
  --in-place      mutate this checkout instead of a copy (faster: reuses target/; use a
                  checkout nobody edits meanwhile)
  --report-only   print the table of the last run's results without running anything";

struct Options {
    groups: Vec<&'static Group>,
    shard: Option<String>,
    in_place: bool,
    report_only: bool,
}

fn parse_args(args: &[String]) -> Result<Options> {
    let mut opts = Options {
        groups: Vec::new(),
        shard: None,
        in_place: false,
        report_only: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--only" => {
                let name = it.next().ok_or("--only needs a group name")?;
                let g = GROUPS
                    .iter()
                    .find(|g| g.name == name)
                    .ok_or_else(|| format!("--only {name}: no such group\n{USAGE}"))?;
                opts.groups.push(g);
            }
            "--shard" => {
                let s = it.next().ok_or("--shard needs K/N")?;
                let ok = s.split_once('/').is_some_and(|(k, n)| {
                    matches!((k.parse::<u32>(), n.parse::<u32>()), (Ok(k), Ok(n)) if k < n)
                });
                if !ok {
                    return Err(format!("--shard {s}: expected K/N with 0 <= K < N"));
                }
                opts.shard = Some(s.clone());
            }
            "--in-place" => opts.in_place = true,
            "--report-only" => opts.report_only = true,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument '{other}'\n{USAGE}")),
        }
    }
    if opts.groups.is_empty() {
        opts.groups = GROUPS.iter().collect();
    }
    Ok(opts)
}

/// Entry point.
pub fn mutants(root: &Path, args: &[String]) -> Result<()> {
    let opts = parse_args(args)?;
    let out_root = root.join("target/mutants");
    if !opts.report_only {
        let sh = Shell::new().map_err(|e| e.to_string())?;
        sh.change_dir(root);
        ensure_cargo_mutants(&sh)?;
        for g in &opts.groups {
            run_group(&sh, &out_root, g, &opts)?;
        }
    }
    let mut report = String::new();
    let mut low = Vec::new();
    for g in &opts.groups {
        let tally = read_outcomes(&outcomes_path(&out_root, g))?;
        report.push_str(&group_report(g, &tally, &mut low));
    }
    print!("{report}");
    let summary = out_root.join("summary.md");
    std::fs::write(&summary, &report)
        .map_err(|e| format!("cannot write {}: {e}", summary.display()))?;
    eprintln!("mutants: table written to {}", summary.display());
    if low.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "under {MIN_SCORE} % of viable mutants caught in: {}",
            low.join(", ")
        ))
    }
}

fn ensure_cargo_mutants(sh: &Shell) -> Result<()> {
    if cmd!(sh, "cargo mutants --version")
        .quiet()
        .ignore_stderr()
        .read()
        .is_err()
    {
        eprintln!("mutants: installing cargo-mutants");
        cmd!(sh, "cargo install cargo-mutants --locked")
            .run()
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The cargo-mutants command line of group `g`, its outcomes written under `out`.
fn mutants_cmd<'a>(sh: &'a Shell, out: &Path, g: &Group, opts: &Options) -> Cmd<'a> {
    let package = g.package;
    let files = g.files.iter().flat_map(|f| ["--file", f]);
    let excludes = g.exclude.iter().flat_map(|e| ["--exclude", e]);
    let shard = opts
        .shard
        .iter()
        .flat_map(|s| ["--shard", s, "--sharding", "round-robin"]);
    let in_place = opts.in_place.then_some("--in-place");
    cmd!(
        sh,
        "cargo mutants --package {package} --test-tool nextest --output {out} {files...} {excludes...} {shard...} {in_place...}"
    )
}

fn run_group(sh: &Shell, out_root: &Path, g: &Group, opts: &Options) -> Result<()> {
    let out = out_root.join(g.name);
    std::fs::create_dir_all(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    // One function changes per mutant: incremental builds make each rebuild seconds
    // instead of a minute, whatever the caller's setting.
    let _incremental = sh.push_env("CARGO_INCREMENTAL", "1");
    let mutants = mutants_cmd(sh, &out, g, opts);
    eprintln!("\n==> mutants: {} ({})", g.name, g.files.join(", "));
    // Run through std to read the exit code (xshell's `run` only says non-zero).
    let status = Command::from(mutants)
        .status()
        .map_err(|e| format!("cannot run cargo mutants: {e}"))?;
    // cargo-mutants: 0 all caught, 2 some missed, 3 some timed out; anything else (the
    // baseline failing, bad arguments) means the table would be empty or stale.
    match status.code() {
        Some(0 | 2 | 3) => Ok(()),
        other => Err(format!(
            "cargo mutants for group {} failed (exit {other:?}); see {}",
            g.name,
            out.join("mutants.out/debug.log").display()
        )),
    }
}

/// What happened to the mutants of one file.
#[derive(Debug, Default)]
struct FileTally {
    caught: u32,
    missed: Vec<String>,
    timeout: u32,
    unviable: u32,
}

impl FileTally {
    fn viable(&self) -> u32 {
        self.caught + self.missed.len() as u32 + self.timeout
    }

    /// Percent of viable mutants caught (a timeout counts as caught: the mutant made the
    /// tests hang, which a run notices).
    fn score(&self) -> f64 {
        match self.viable() {
            0 => 100.0,
            v => 100.0 * f64::from(self.caught + self.timeout) / f64::from(v),
        }
    }
}

#[derive(Debug)]
struct Tally {
    files: BTreeMap<String, FileTally>,
    sampled: bool,
}

fn read_outcomes(path: &Path) -> Result<Tally> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read {}: {e} (run without --report-only first)",
            path.display()
        )
    })?;
    parse_outcomes(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn parse_outcomes(text: &str) -> Result<Tally> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let outcomes = v["outcomes"]
        .as_array()
        .ok_or("no \"outcomes\" array (a cargo-mutants version this does not read?)")?;
    let mut files: BTreeMap<String, FileTally> = BTreeMap::new();
    for o in outcomes {
        let Some(m) = o["scenario"].get("Mutant") else {
            continue; // the baseline
        };
        let file = m["file"].as_str().ok_or("a mutant without a file")?;
        let t = files.entry(file.to_string()).or_default();
        match o["summary"].as_str() {
            Some("CaughtMutant") => t.caught += 1,
            Some("MissedMutant") => t
                .missed
                .push(m["name"].as_str().unwrap_or(file).to_string()),
            Some("Timeout") => t.timeout += 1,
            Some("Unviable") => t.unviable += 1,
            other => return Err(format!("unknown outcome {other:?} for a mutant of {file}")),
        }
    }
    let total = v["total_mutants"].as_u64().unwrap_or(0);
    let tested: u64 = files
        .values()
        .map(|t| u64::from(t.viable() + t.unviable))
        .sum();
    Ok(Tally {
        files,
        sampled: tested < total,
    })
}

fn group_report(g: &Group, tally: &Tally, low: &mut Vec<String>) -> String {
    let mut s = format!(
        "\n## {} (tests of {}){}\n\n| file | caught | missed | timeout | unviable | score |\n|---|---:|---:|---:|---:|---:|\n",
        g.name,
        g.package,
        if tally.sampled {
            ", a sample: not every mutant ran"
        } else {
            ""
        }
    );
    for (file, t) in &tally.files {
        let score = t.score();
        if score < MIN_SCORE {
            low.push(format!("{file} ({score:.1} %)"));
        }
        let _ = writeln!(
            s,
            "| {file} | {} | {} | {} | {} | {score:.1} % |",
            t.caught,
            t.missed.len(),
            t.timeout,
            t.unviable
        );
    }
    let missed: Vec<&String> = tally.files.values().flat_map(|t| &t.missed).collect();
    if !missed.is_empty() {
        s.push_str("\nmissed:\n");
        for m in missed {
            let _ = writeln!(s, "- {m}");
        }
    }
    s
}

/// Where cargo-mutants writes a group's results.
fn outcomes_path(out_root: &Path, g: &Group) -> PathBuf {
    out_root.join(g.name).join("mutants.out/outcomes.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"{"total_mutants": 5, "outcomes": [
        {"scenario": "Baseline", "summary": "Success"},
        {"scenario": {"Mutant": {"name": "a.rs:1:1: replace f with 0", "file": "a.rs"}}, "summary": "CaughtMutant"},
        {"scenario": {"Mutant": {"name": "a.rs:2:1: replace g with 1", "file": "a.rs"}}, "summary": "MissedMutant"},
        {"scenario": {"Mutant": {"name": "b.rs:3:1: replace < with <=", "file": "b.rs"}}, "summary": "Timeout"},
        {"scenario": {"Mutant": {"name": "b.rs:4:1: replace h with ()", "file": "b.rs"}}, "summary": "Unviable"}
    ]}"#;

    #[test]
    fn the_command_line_names_the_group_and_the_options() {
        let sh = Shell::new().unwrap();
        let args: Vec<String> = ["--only", "quant", "--shard", "1/4", "--in-place"]
            .map(String::from)
            .into();
        let opts = parse_args(&args).unwrap();
        let line = mutants_cmd(&sh, Path::new("o"), opts.groups[0], &opts).to_string();
        assert_eq!(
            line,
            "cargo mutants --package ggml-core --test-tool nextest --output o \
             --file ggml-core/src/quant/*.rs --exclude ggml-core/src/quant/tests.rs \
             --shard 1/4 --sharding round-robin --in-place"
        );
        let opts = parse_args(&["--only".into(), "check".into()]).unwrap();
        let line = mutants_cmd(&sh, Path::new("o"), opts.groups[0], &opts).to_string();
        assert_eq!(
            line,
            "cargo mutants --package ggml-sched --test-tool nextest --output o \
             --file ggml-sched/src/check.rs"
        );
    }

    #[test]
    fn outcomes_are_tallied_per_file_and_a_short_run_is_a_sample() {
        let t = parse_outcomes(SAMPLE).unwrap();
        let a = &t.files["a.rs"];
        assert_eq!(
            (a.caught, a.missed.len(), a.timeout, a.unviable),
            (1, 1, 0, 0)
        );
        assert_eq!(a.score(), 50.0);
        let b = &t.files["b.rs"];
        assert_eq!(
            (b.caught, b.missed.len(), b.timeout, b.unviable),
            (0, 0, 1, 1)
        );
        assert_eq!(b.score(), 100.0);
        assert!(t.sampled, "4 of 5 mutants ran");
        let mut low = Vec::new();
        let table = group_report(&GROUPS[0], &t, &mut low);
        assert_eq!(low, ["a.rs (50.0 %)"]);
        assert!(table.contains("a sample"));
        assert!(table.contains("- a.rs:2:1: replace g with 1"));
    }

    #[test]
    fn unknown_outcomes_and_bad_arguments_are_errors() {
        let bad = SAMPLE.replace("\"Unviable\"", "\"Exploded\"");
        assert!(parse_outcomes(&bad).unwrap_err().contains("Exploded"));
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(parse_args(&args(&["--only", "nope"])).is_err());
        assert!(parse_args(&args(&["--shard", "4/4"])).is_err());
        assert!(parse_args(&args(&["--shard", "x"])).is_err());
        let o = parse_args(&args(&["--only", "check", "--shard", "0/8"])).unwrap();
        assert_eq!(o.groups.len(), 1);
        assert_eq!(
            outcomes_path(Path::new("t"), o.groups[0]),
            Path::new("t/check/mutants.out/outcomes.json")
        );
    }
}
