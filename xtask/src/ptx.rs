//! `cargo xtask ptx-check`: assembles every hand-written PTX file of ggml-cuda with
//! NVIDIA's `ptxas` for sm_80 and sm_90, without a CUDA toolkit install.
//!
//! `ptxas` comes from the PyPI wheel `nvidia-cuda-nvcc-cu12` (pinned below), fetched with
//! `pip download` into `$GGML_RS_CACHE/ptxas` (default `~/.cache/ggml-rs/ptxas`) and
//! unpacked there once. Any ptxas error or warning fails the check with ptxas' message.
//! The `-v` figures (registers, shared memory, spills) make the checked-in table
//! [`RESOURCE_TABLE`]; the check fails if it is out of date (`--write` rewrites it).

use std::path::{Path, PathBuf};

use cuda_sim::cost::ResourceTable;
use xshell::{cmd, Shell};

/// The wheel that provides `ptxas` (CUDA 12.9: accepts PTX ISA 8.x, targets sm_80/sm_90).
pub const PTXAS_PACKAGE: &str = "nvidia-cuda-nvcc-cu12";
/// Its pinned version.
pub const PTXAS_VERSION: &str = "12.9.86";
/// The architectures every kernel must assemble for.
pub const ARCHS: [&str; 2] = ["sm_80", "sm_90"];

/// The cache directory: `ptxas/` in the model cache (`$GGML_RS_CACHE` or
/// `~/.cache/ggml-rs`).
pub fn cache_dir() -> Result<PathBuf, String> {
    Ok(crate::fetch::cache_dir()?.join("ptxas"))
}

/// Returns the path of a working `ptxas`, downloading and unpacking the wheel on first use.
pub fn ensure_ptxas(sh: &Shell) -> Result<PathBuf, String> {
    let dir = cache_dir()?;
    let unpacked = dir.join(format!("{PTXAS_PACKAGE}-{PTXAS_VERSION}"));
    let ptxas = unpacked.join("nvidia/cuda_nvcc/bin/ptxas");
    if ptxas.is_file() {
        return Ok(ptxas);
    }
    let wheels = dir.join("wheels");
    std::fs::create_dir_all(&wheels)
        .map_err(|e| format!("cannot create {}: {e}", wheels.display()))?;
    let spec = format!("{PTXAS_PACKAGE}=={PTXAS_VERSION}");
    let have_wheel = find_wheel(&wheels).is_some();
    if !have_wheel {
        let pip = pip_command(sh)?;
        let (prog, rest) = (&pip[0], &pip[1..]);
        cmd!(
            sh,
            "{prog} {rest...} download --no-deps --only-binary=:all: --dest {wheels} {spec}"
        )
        .run()
        .map_err(|e| format!("pip download {spec} failed: {e}"))?;
    }
    let wheel = find_wheel(&wheels)
        .ok_or_else(|| format!("no {PTXAS_PACKAGE} wheel in {}", wheels.display()))?;
    std::fs::create_dir_all(&unpacked)
        .map_err(|e| format!("cannot create {}: {e}", unpacked.display()))?;
    cmd!(
        sh,
        "unzip -o -q {wheel} nvidia/cuda_nvcc/bin/ptxas -d {unpacked}"
    )
    .run()
    .map_err(|e| format!("unzip of {} failed: {e}", wheel.display()))?;
    set_executable(&ptxas)?;
    if !ptxas.is_file() {
        return Err(format!(
            "{} has no nvidia/cuda_nvcc/bin/ptxas",
            wheel.display()
        ));
    }
    Ok(ptxas)
}

fn pip_command(sh: &Shell) -> Result<Vec<String>, String> {
    let candidates: [&[&str]; 3] = [&["pip3"], &["pip"], &["python3", "-m", "pip"]];
    for argv in candidates {
        let (prog, rest) = (argv[0], &argv[1..]);
        let works = cmd!(sh, "{prog} {rest...} --version")
            .quiet()
            .ignore_stdout()
            .ignore_stderr()
            .run()
            .is_ok();
        if works {
            return Ok(argv.iter().map(|s| s.to_string()).collect());
        }
    }
    Err("no pip found (tried pip3, pip, python3 -m pip); install Python's pip".to_string())
}

fn find_wheel(dir: &Path) -> Option<PathBuf> {
    let prefix = format!("{}-{PTXAS_VERSION}-", PTXAS_PACKAGE.replace('-', "_"));
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".whl"))
        })
}

#[cfg(unix)]
fn set_executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mut perm = std::fs::metadata(path)
        .map_err(|e| format!("cannot stat {}: {e}", path.display()))?
        .permissions();
    perm.set_mode(perm.mode() | 0o755);
    std::fs::set_permissions(path, perm).map_err(|e| format!("chmod {}: {e}", path.display()))
}

#[cfg(not(unix))]
fn set_executable(_path: &Path) -> Result<(), String> {
    Ok(())
}

/// The PTX files of ggml-cuda under the workspace `root`, sorted by name.
pub fn ptx_files(root: &Path) -> Result<Vec<PathBuf>, String> {
    let dir = root.join("ggml-cuda").join("kernels");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "ptx"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("no .ptx files in {}", dir.display()));
    }
    Ok(files)
}

/// The checked-in table of every kernel's `ptxas -v` resources, relative to the
/// workspace root.
pub const RESOURCE_TABLE: &str = "ggml-cuda/kernels/ptxas-resources.txt";

/// Whether a line of `ptxas -v` output is information (not a warning or an error).
fn is_info(line: &str) -> bool {
    let l = line.trim_start();
    l.is_empty()
        || l.starts_with("ptxas info")
        || (line.starts_with(' ') && l.contains("bytes stack frame"))
}

/// Assembles every `ggml-cuda/kernels/*.ptx` under the workspace `root` for sm_80 and
/// sm_90 with `-v`. Fails with ptxas' own message on any error or warning; prints one
/// line per file and architecture otherwise. From the `-v` output it builds the table
/// of every kernel's registers, static shared memory and spills
/// ([`RESOURCE_TABLE`]): with `write` it writes the table, without it fails if the
/// checked-in table differs.
pub fn ptx_check(sh: &Shell, root: &Path, write: bool) -> Result<(), String> {
    let ptxas = ensure_ptxas(sh)?;
    let version = cmd!(sh, "{ptxas} --version")
        .quiet()
        .read()
        .map_err(|e| format!("{} does not run: {e}", ptxas.display()))?;
    let release = version
        .lines()
        .find(|l| l.contains("release"))
        .unwrap_or("unknown release");
    println!("ptx-check: {} ({release})", ptxas.display());
    let out_dir = cache_dir()?.join("out");
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;
    let mut failures = Vec::new();
    let mut table = ResourceTable::new();
    for file in ptx_files(root)? {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        for arch in ARCHS {
            let cubin = out_dir.join(format!("{name}.{arch}.cubin"));
            let arch_flag = format!("-arch={arch}");
            // The text a GPU of this architecture is given (ggml-cuda loads it so):
            // sm_90-only lines commented out below sm_90, retargeted from sm_90 on.
            let sm: u32 = arch.trim_start_matches("sm_").parse().unwrap_or(0);
            let variant = out_dir.join(format!("{name}.{arch}.ptx"));
            std::fs::write(&variant, cuda_sim::ptx::for_arch(&text, sm).as_bytes())
                .map_err(|e| format!("cannot write {}: {e}", variant.display()))?;
            let output = cmd!(sh, "{ptxas} {arch_flag} -O3 -v {variant} -o {cubin}")
                .quiet()
                .ignore_status()
                .output()
                .map_err(|e| format!("cannot run ptxas: {e}"))?;
            let msg = format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
            let complaints: Vec<&str> = msg.lines().filter(|l| !is_info(l)).collect();
            if !output.status.success() || !complaints.is_empty() {
                failures.push(format!("{name} ({arch}):\n{}", complaints.join("\n")));
                println!("ptx-check: {name} {arch} FAILED");
                continue;
            }
            if let Err(e) = table.add_ptxas_verbose(&name, arch, &msg) {
                failures.push(e.to_string());
                println!("ptx-check: {name} {arch} FAILED (resources)");
            } else {
                println!("ptx-check: {name} {arch} ok");
            }
        }
    }
    if !failures.is_empty() {
        return Err(format!(
            "ptxas rejected {} file/arch pair(s):\n{}",
            failures.len(),
            failures.join("\n")
        ));
    }
    let generated =
        format!("cargo xtask ptx-check --write, ptxas {PTXAS_VERSION} -O3 -v; do not edit");
    let text = table.to_text(&[
        "Static resources of every kernel of ggml-cuda/kernels/*.ptx, as ptxas reports them.",
        &generated,
        "Read by cuda_sim::cost::ResourceTable for occupancy and waves.",
    ]);
    let path = root.join(RESOURCE_TABLE);
    if write {
        std::fs::write(&path, &text)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!(
            "ptx-check: wrote {RESOURCE_TABLE} ({} kernels x archs)",
            table.len()
        );
        return Ok(());
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current != text {
        let old = ResourceTable::parse(&current).unwrap_or_default();
        return Err(format!(
            "{RESOURCE_TABLE} differs from what ptxas reports ({} rows checked in, {} now{}): \
             run `cargo xtask ptx-check --write` and commit it",
            old.len(),
            table.len(),
            if old == table {
                ", same figures, different text"
            } else {
                ""
            }
        ));
    }
    println!(
        "ptx-check: {RESOURCE_TABLE} up to date ({} rows)",
        table.len()
    );
    Ok(())
}

/// Writes generated PTX `text` to `out` (relative to `root`) unless it is already there,
/// saying which (`cargo xtask gen-ptx`).
pub fn write_generated(root: &Path, out: &str, text: &str) -> Result<(), String> {
    let path = root.join(out);
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    if old == text {
        println!("gen-ptx: {out} is up to date");
        return Ok(());
    }
    std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("gen-ptx: wrote {out}");
    Ok(())
}

/// Fails (a test) unless the checked-in `out` is `text`, what its generator writes now.
#[cfg(test)]
pub fn assert_checked_in(out: &str, text: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let on_disk = std::fs::read_to_string(root.join(out)).unwrap_or_else(|e| panic!("{out}: {e}"));
    assert!(
        on_disk == text,
        "{out} is stale: run `cargo xtask gen-ptx` and commit the result"
    );
}

#[cfg(test)]
mod tests {
    use super::{is_info, ARCHS, RESOURCE_TABLE};
    use cuda_sim::cost::ResourceTable;

    #[test]
    fn the_checked_in_table_parses_and_covers_both_archs() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let text = std::fs::read_to_string(root.join(RESOURCE_TABLE)).expect("table exists");
        let table = ResourceTable::parse(&text).expect("parses");
        assert!(!table.is_empty());
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let f: Vec<&str> = line.split_whitespace().collect();
            for arch in ARCHS {
                let r = table.get(f[0], f[1], arch);
                assert!(
                    r.is_some_and(|r| r.registers > 0),
                    "{} {} {arch}",
                    f[0],
                    f[1]
                );
            }
        }
    }

    #[test]
    fn verbose_lines_are_info_and_warnings_are_not() {
        assert!(is_info(
            "ptxas info    : Used 22 registers, used 0 barriers"
        ));
        assert!(is_info(
            "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads"
        ));
        assert!(is_info(""));
        assert!(!is_info("ptxas warning : Unresolved extern function 'f'"));
        assert!(!is_info("ptxas fatal   : Unresolved extern function 'f'"));
        assert!(!is_info(
            "ptxas /tmp/x.ptx, line 3; error   : Unknown symbol"
        ));
    }
}
