//! `cargo xtask aarch64 --count`: guest instructions per token of prompt processing and
//! generation on SmolLM2, ours (`ggml-harness bench`, cross-built for aarch64, at each
//! level) against llama.cpp's `llama-bench` (the version `../shared/tools/llama-cpp.sh`
//! builds, cross-built for an Armv8.2-A target with the dot product and the 8-bit matrix
//! multiply, `-march=armv8.2-a+dotprod+i8mm`), both under `qemu-aarch64 -cpu max` with a
//! TCG plugin that counts executed instructions (`insn_count.c`, compiled against the
//! plugin header of the installed qemu's Debian source).
//!
//! A test's instructions per token are the difference between its run (one repetition,
//! no warm-up) and the same run with one token, over the tokens between them: loading,
//! the tokenizer and the first token's pass cancel, so the figure is the cost of tokens
//! 2..N of a pp512 batch or of a 128-token generation (the first token's share of the
//! whole is under 0.2 %). One compute thread in both (`-t 1`): the counter is exact for a
//! guest that runs one thread at a time.
//!
//! Instructions are a proxy for speed, not a measure of it: they weigh a load that misses
//! every cache like an add. The table says so.

use std::path::{Path, PathBuf};

use xshell::{cmd, Shell};

use super::{LINKER, QEMU, SYSROOT, TARGET};
use crate::bench_vs_llama::target_dir;
use crate::fetch::{self, Result};

/// llama.cpp's target: what the issue names for the comparison.
const LLAMA_MARCH: &str = "armv8.2-a+dotprod+i8mm";
/// The plugin's source.
const PLUGIN_C: &str = include_str!("insn_count.c");

/// What to count.
#[derive(Debug, PartialEq)]
pub struct CountArgs {
    /// Our levels (`GGML_RS_ISA`), each counted on its own.
    pub levels: Vec<String>,
    /// Prompt tokens of the pp test.
    pub n_prompt: usize,
    /// Generated tokens of the tg test.
    pub n_gen: usize,
    /// Also count per function and print each test's costliest functions.
    pub symbols: bool,
}

impl Default for CountArgs {
    fn default() -> Self {
        CountArgs {
            levels: vec!["dotprod".into(), "i8mm".into()],
            n_prompt: 512,
            n_gen: 128,
            symbols: false,
        }
    }
}

/// One count: who, at which level, which test, instructions per token.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub who: String,
    pub level: String,
    pub test: String,
    pub per_token: f64,
    /// The costliest functions' instructions per token (with `--symbols`).
    pub functions: Vec<(String, f64)>,
}

/// Runs the counts and prints (and writes) the table.
pub fn count(sh: &Shell, root: &Path, args: &CountArgs) -> Result<()> {
    if !super::have_tool(sh, "cmake") {
        eprintln!("aarch64 --count: installing cmake with pip");
        cmd!(sh, "python3 -m pip install -q cmake")
            .run()
            .map_err(|e| format!("installing cmake: {e}"))?;
    }
    for tool in [
        "cmake",
        "curl",
        "tar",
        "python3",
        "gcc",
        "aarch64-linux-gnu-g++",
    ] {
        if !super::have_tool(sh, tool) {
            return Err(format!(
                "cannot count: {tool} is missing (apt-get install curl g++-aarch64-linux-gnu)"
            ));
        }
    }
    let dir = target_dir(root).join("aarch64-count");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut plugin = PathBuf::new();
    crate::step("the instruction-counting qemu plugin", || {
        plugin = build_plugin(sh, &dir)?;
        Ok(())
    })?;
    let mut llama = PathBuf::new();
    crate::step(
        &format!("llama.cpp's llama-bench for aarch64 (-march={LLAMA_MARCH})"),
        || {
            llama = build_llama(sh, root, &dir)?;
            Ok(())
        },
    )?;
    crate::step("ggml-harness for aarch64 (release)", || {
        let _linker = sh.push_env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", LINKER);
        cmd!(
            sh,
            "cargo build --locked --release --target {TARGET} -p harness --bin ggml-harness"
        )
        .run()
        .map_err(|e| e.to_string())
    })?;
    let ours = target_dir(root)
        .join(TARGET)
        .join("release")
        .join("ggml-harness");
    let model = fetch::fetch_model()?;
    let m = model.display().to_string();
    let mut rows = Vec::new();
    for (test, tokens) in [("pp", args.n_prompt), ("tg", args.n_gen)] {
        if tokens < 2 {
            continue;
        }
        let name = format!("{test}{tokens}");
        // The test with `t` tokens: `-p t -n 0` or `-p 0 -n t`, once, no warm-up.
        let sizes = |t: usize| -> [String; 4] {
            let (p, n) = if test == "pp" { (t, 0) } else { (0, t) };
            ["-p".into(), p.to_string(), "-n".into(), n.to_string()]
        };
        let common = ["-r", "1", "-t", "1", "--no-warmup"].map(String::from);
        let llama_cmd = |t: usize| -> Vec<String> {
            let head = [llama.display().to_string(), "-m".into(), m.clone()];
            [&head[..], &sizes(t), &common].concat()
        };
        // No wait limit for ours: a pass under qemu takes longer than the default 300 s.
        let ours_cmd = |t: usize| -> Vec<String> {
            let head = [
                ours.display().to_string(),
                "bench".into(),
                "--model".into(),
                m.clone(),
                "--wait-timeout".into(),
                "0".into(),
            ];
            [&head[..], &sizes(t), &common].concat()
        };
        let runs = std::iter::once((
            "llama.cpp",
            LLAMA_MARCH,
            None,
            &llama_cmd as &dyn Fn(usize) -> Vec<String>,
        ))
        .chain(args.levels.iter().map(|l| {
            (
                "ours",
                l.as_str(),
                Some(l.as_str()),
                &ours_cmd as &dyn Fn(usize) -> Vec<String>,
            )
        }));
        for (who, level, isa, command) in runs {
            let (per, functions) =
                per_token(sh, &plugin, &dir, isa, command, tokens, args.symbols)?;
            eprintln!("aarch64 --count: {who} at {level} {name}: {per:.0} instructions per token");
            rows.push(Row {
                who: who.into(),
                level: level.into(),
                test: name.clone(),
                per_token: per,
                functions,
            });
        }
    }
    let table = table(&rows);
    println!("{table}");
    let out = dir.join("count.md");
    std::fs::write(&out, &table).map_err(|e| format!("{}: {e}", out.display()))?;
    eprintln!("aarch64 --count: table written to {}", out.display());
    Ok(())
}

/// Instructions per token of a test of `tokens` tokens: the run of the test less the
/// same run with one token (loading, the tokenizer and the rest of a run cancel), over
/// the `tokens - 1` tokens between them.
fn per_token(
    sh: &Shell,
    plugin: &Path,
    dir: &Path,
    level: Option<&str>,
    command: &dyn Fn(usize) -> Vec<String>,
    tokens: usize,
    symbols: bool,
) -> Result<(f64, Vec<(String, f64)>)> {
    let one = run_counted(sh, plugin, dir, level, &command(1), symbols)?;
    let all = run_counted(sh, plugin, dir, level, &command(tokens), symbols)?;
    let more = all.total.checked_sub(one.total).ok_or_else(|| {
        format!(
            "{tokens} tokens counted fewer instructions ({}) than 1 ({})",
            all.total, one.total
        )
    })?;
    let between = (tokens - 1) as f64;
    let mut functions: Vec<(String, f64)> = all
        .functions
        .iter()
        .map(|(name, n)| {
            let base = one
                .functions
                .iter()
                .find(|(m, _)| m == name)
                .map_or(0, |f| f.1);
            (name.clone(), n.saturating_sub(base) as f64 / between)
        })
        .collect();
    functions.sort_by(|a, b| b.1.total_cmp(&a.1));
    functions.truncate(TOP_FUNCTIONS);
    Ok((more as f64 / between, functions))
}

/// Functions listed per test with `--symbols`.
const TOP_FUNCTIONS: usize = 12;

/// What the plugin counted: the total, and per function with `symbols=on`.
#[derive(Debug)]
struct Counted {
    total: u64,
    functions: Vec<(String, u64)>,
}

/// Runs `argv` under qemu with the counting plugin; the instructions it executed.
fn run_counted(
    sh: &Shell,
    plugin: &Path,
    dir: &Path,
    level: Option<&str>,
    argv: &[String],
    symbols: bool,
) -> Result<Counted> {
    let out = dir.join("last-count.txt");
    let _ = std::fs::remove_file(&out);
    let by_symbol = if symbols { ",symbols=on" } else { "" };
    let plugin_arg = format!("{},out={}{by_symbol}", plugin.display(), out.display());
    let _isa = sh.push_env("GGML_RS_ISA", level.unwrap_or(""));
    cmd!(
        sh,
        "{QEMU} -L {SYSROOT} -cpu max -plugin {plugin_arg} {argv...}"
    )
    .ignore_stdout()
    .run()
    .map_err(|e| format!("{}: {e}", argv.join(" ")))?;
    let text = std::fs::read_to_string(&out)
        .map_err(|e| format!("the plugin wrote no count ({}): {e}", out.display()))?;
    parse_count(&text)
}

/// The plugin's output: `instructions N`, then `symbol COUNT NAME` lines.
fn parse_count(text: &str) -> Result<Counted> {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("").trim();
    let total = first
        .strip_prefix("instructions ")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("not a count: '{first}'"))?;
    let mut functions = Vec::new();
    for line in lines {
        let parsed = line.strip_prefix("symbol ").and_then(|rest| {
            let (n, name) = rest.split_once(' ')?;
            Some((name.to_string(), n.parse().ok()?))
        });
        functions.push(parsed.ok_or_else(|| format!("not a function's count: '{line}'"))?);
    }
    Ok(Counted { total, functions })
}

/// The markdown table: per test, llama.cpp's count, then ours per level with the ratio.
pub fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "Guest instructions per token under qemu-aarch64 -cpu max (a proxy for speed, not a \
         measure of it), one thread: a test's run less the same run with one token, over \
         the tokens between.\n\n\
         | test | who | level | instructions per token | ours / llama.cpp |\n\
         |---|---|---|---:|---:|\n",
    );
    for r in rows {
        let theirs = rows
            .iter()
            .find(|l| l.who == "llama.cpp" && l.test == r.test)
            .map(|l| l.per_token);
        let ratio = match (r.who.as_str(), theirs) {
            ("ours", Some(t)) if t > 0.0 => format!("{:.2}", r.per_token / t),
            _ => String::new(),
        };
        s += &format!(
            "| {} | {} | {} | {:.0} | {} |\n",
            r.test, r.who, r.level, r.per_token, ratio
        );
    }
    for r in rows.iter().filter(|r| !r.functions.is_empty()) {
        s += &format!(
            "\n{} {} ({}): the costliest functions, instructions per token\n\n\
             | function | instructions per token | share |\n|---|---:|---:|\n",
            r.test, r.who, r.level
        );
        for (name, n) in &r.functions {
            s += &format!("| `{name}` | {n:.0} | {:.1} % |\n", 100.0 * n / r.per_token);
        }
    }
    s
}

/// Compiles the plugin against the installed qemu's plugin header (downloaded once from
/// its Debian source); the shared object's path.
fn build_plugin(sh: &Shell, dir: &Path) -> Result<PathBuf> {
    let so = dir.join("libinsn_count.so");
    let header_dir = dir.join("qemu-include");
    let header = header_dir.join("qemu-plugin.h");
    if !header.is_file() {
        let upstream = qemu_upstream_version(sh)?;
        let url =
            format!("http://deb.debian.org/debian/pool/main/q/qemu/qemu_{upstream}.orig.tar.xz");
        let tarball = dir.join("qemu.orig.tar.xz");
        eprintln!("aarch64 --count: downloading {url} (for qemu-plugin.h)");
        cmd!(sh, "curl -fsSL -o {tarball} {url}")
            .run()
            .map_err(|e| format!("{url}: {e}"))?;
        std::fs::create_dir_all(&header_dir).map_err(|e| e.to_string())?;
        cmd!(
            sh,
            "tar -xJf {tarball} -C {header_dir} --strip-components=3 --wildcards */include/qemu/qemu-plugin.h"
        )
        .run()
        .map_err(|e| format!("extracting qemu-plugin.h: {e}"))?;
        let _ = std::fs::remove_file(&tarball);
    }
    let src = dir.join("insn_count.c");
    std::fs::write(&src, PLUGIN_C).map_err(|e| e.to_string())?;
    cmd!(
        sh,
        "gcc -shared -fPIC -O2 -Wall -Wextra -Werror -I {header_dir} {src} -o {so}"
    )
    .run()
    .map_err(|e| format!("compiling the qemu plugin: {e}"))?;
    Ok(so)
}

/// The upstream version of the installed qemu-user in Debian's spelling, as its source
/// tarball is named: `1:7.2+dfsg-7+deb12u18+b3` gives `7.2+dfsg`.
fn qemu_upstream_version(sh: &Shell) -> Result<String> {
    let format = "-f=${Version}";
    let v = cmd!(sh, "dpkg-query -W {format} qemu-user")
        .read()
        .map_err(|e| format!("the installed qemu-user's version: {e}"))?;
    upstream_of(&v).ok_or_else(|| format!("cannot read a Debian version from '{v}'"))
}

/// `[epoch:]upstream[-revision]` -> `upstream`.
fn upstream_of(debian: &str) -> Option<String> {
    let v = debian.trim();
    let v = v.split_once(':').map_or(v, |(_, rest)| rest);
    let v = v.rsplit_once('-').map_or(v, |(up, _)| up);
    (!v.is_empty()).then(|| v.to_string())
}

/// llama.cpp's source (the llama-cpp-python sdist that `llama-cpp.sh` builds from, same
/// version) cross-built for aarch64: the path of its static `llama-bench`.
fn build_llama(sh: &Shell, root: &Path, dir: &Path) -> Result<PathBuf> {
    let version = llama_py_version(root)?;
    let src = dir.join(format!("llama-src-{version}"));
    let build = dir.join(format!("llama-build-{version}"));
    let bin = build.join("bin").join("llama-bench");
    if bin.is_file() {
        return Ok(bin);
    }
    if !src.join("CMakeLists.txt").is_file() {
        let tmp = dir.join("sdist");
        let _ = std::fs::remove_dir_all(&tmp);
        let spec = format!("llama-cpp-python=={version}");
        // pip prepares an sdist's metadata before saving it, with the build backend
        // installed (as llama-cpp.sh does); without it the download itself says why.
        let _ = cmd!(sh, "python3 -m pip install -q scikit-build-core")
            .quiet()
            .run();
        cmd!(
            sh,
            "python3 -m pip download --no-deps --no-build-isolation --no-binary :all: {spec} -d {tmp}"
        )
        .run()
        .map_err(|e| format!("pip download {spec}: {e}"))?;
        let sdist = std::fs::read_dir(&tmp)
            .map_err(|e| e.to_string())?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.to_string_lossy().ends_with(".tar.gz"))
            .ok_or(format!("pip left no sdist of {spec} in {}", tmp.display()))?;
        cmd!(sh, "tar xzf {sdist} -C {tmp}")
            .run()
            .map_err(|e| e.to_string())?;
        let vendored = tmp
            .join(format!("llama_cpp_python-{version}"))
            .join("vendor")
            .join("llama.cpp");
        std::fs::rename(&vendored, &src).map_err(|e| format!("{}: {e}", vendored.display()))?;
        let _ = std::fs::remove_dir_all(&tmp);
    }
    let march = format!("-DGGML_CPU_ARM_ARCH={LLAMA_MARCH}");
    cmd!(
        sh,
        "cmake -S {src} -B {build} -DCMAKE_BUILD_TYPE=Release -DCMAKE_SYSTEM_NAME=Linux
         -DCMAKE_SYSTEM_PROCESSOR=aarch64 -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc
         -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ -DGGML_NATIVE=OFF {march}
         -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
         -DLLAMA_BUILD_TESTS=OFF -DGGML_CCACHE=OFF"
    )
    .run()
    .map_err(|e| format!("configuring llama.cpp for aarch64: {e}"))?;
    let jobs = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .to_string();
    cmd!(sh, "cmake --build {build} -j{jobs} --target llama-bench")
        .run()
        .map_err(|e| format!("building llama-bench for aarch64: {e}"))?;
    if !bin.is_file() {
        return Err(format!("the build left no {}", bin.display()));
    }
    Ok(bin)
}

/// The llama-cpp-python version `llama-cpp.sh` builds: `LLAMA_CPP_PY_VERSION`, or the
/// script's default.
fn llama_py_version(root: &Path) -> Result<String> {
    if let Ok(v) = std::env::var("LLAMA_CPP_PY_VERSION") {
        return Ok(v);
    }
    let script = root.join("../shared/tools/llama-cpp.sh");
    let text =
        std::fs::read_to_string(&script).map_err(|e| format!("{}: {e}", script.display()))?;
    script_default_version(&text)
        .ok_or_else(|| format!("no default version in {}", script.display()))
}

/// The default in the script's `version=${LLAMA_CPP_PY_VERSION:-X}` line.
fn script_default_version(script: &str) -> Option<String> {
    script.lines().find_map(|l| {
        l.trim()
            .strip_prefix("version=${LLAMA_CPP_PY_VERSION:-")
            .and_then(|r| r.strip_suffix('}'))
            .map(str::to_string)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_debian_and_script_versions_and_counts() {
        assert_eq!(
            upstream_of("1:7.2+dfsg-7+deb12u18+b3").as_deref(),
            Some("7.2+dfsg")
        );
        assert_eq!(upstream_of("10.0.2+ds-2").as_deref(), Some("10.0.2+ds"));
        assert_eq!(upstream_of(""), None);
        let script = "set -e\nversion=${LLAMA_CPP_PY_VERSION:-0.3.36}\ncache=x\n";
        assert_eq!(script_default_version(script).as_deref(), Some("0.3.36"));
        assert_eq!(script_default_version("version=0.1"), None);
        assert_eq!(
            parse_count("instructions 6086882\n").unwrap().total,
            6_086_882
        );
        assert!(parse_count("nothing").is_err());
        let c = parse_count("instructions 10\nsymbol 7 main\nsymbol 3 ?\n").unwrap();
        assert_eq!(
            c.functions,
            vec![("main".to_string(), 7), ("?".to_string(), 3)]
        );
        assert!(parse_count("instructions 10\nsymbol x main\n").is_err());
    }

    #[test]
    fn table_gives_ours_over_llama_per_test() {
        let row = |who: &str, level: &str, test: &str, per_token: f64| Row {
            who: who.into(),
            level: level.into(),
            test: test.into(),
            per_token,
            functions: Vec::new(),
        };
        let t = table(&[
            row("llama.cpp", LLAMA_MARCH, "pp512", 2.0e6),
            row("ours", "i8mm", "pp512", 1.5e6),
            row("llama.cpp", LLAMA_MARCH, "tg128", 4.0e6),
            row("ours", "i8mm", "tg128", 5.0e6),
        ]);
        assert!(
            t.contains("| pp512 | ours | i8mm | 1500000 | 0.75 |"),
            "{t}"
        );
        assert!(
            t.contains("| tg128 | ours | i8mm | 5000000 | 1.25 |"),
            "{t}"
        );
        assert!(t.contains("| pp512 | llama.cpp | armv8.2-a+dotprod+i8mm | 2000000 |  |"));
        assert!(t.contains("a proxy for speed"));
        let mut r = row("ours", "i8mm", "pp512", 2.0e6);
        r.functions = vec![("tile_quant".into(), 1.5e6)];
        let t = table(&[r]);
        assert!(t.contains("| `tile_quant` | 1500000 | 75.0 % |"), "{t}");
    }
}
