//! Temporary files and folders that remove themselves when dropped, named per process
//! and per use, so that parallel tests and test binaries never share one by accident.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A unique path in the system's temporary folder: `ggml-rs-{tag}-{pid}-{n}` with `n`
/// counting the paths this process asked for.
fn unique_path(tag: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("ggml-rs-{tag}-{}-{n}", std::process::id()))
}

/// A new, empty folder, removed with everything in it when dropped.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates the folder; `tag` names it for whoever finds it left over (after a
    /// crash). Panics when it cannot be created: a test cannot go on without it.
    pub fn new(tag: &str) -> TempDir {
        let path = unique_path(tag);
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        TempDir(path)
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `name` in the folder (not created).
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A path for a file in the temporary folder (not created), removed when dropped if
/// something made it.
#[derive(Debug)]
pub struct TempFile(PathBuf);

impl TempFile {
    /// A fresh path ending in `name` (a file name, with its extension).
    pub fn new(name: &str) -> TempFile {
        let base = unique_path("file");
        let mut file = base.into_os_string();
        file.push(format!("-{name}"));
        TempFile(PathBuf::from(file))
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_are_distinct_and_removed() {
        let (a, b) = (TempDir::new("kit"), TempDir::new("kit"));
        assert_ne!(a.path(), b.path());
        std::fs::write(a.join("x.bin"), b"x").unwrap();
        let kept = a.path().to_path_buf();
        assert!(kept.join("x.bin").exists());
        drop(a);
        assert!(!kept.exists());
    }

    #[test]
    fn files_are_removed() {
        let f = TempFile::new("m.gguf");
        assert!(f.path().to_string_lossy().ends_with("-m.gguf"));
        assert!(!f.path().exists());
        std::fs::write(f.path(), b"GGUF").unwrap();
        let p = f.path().to_path_buf();
        drop(f);
        assert!(!p.exists());
        // Never created: dropping is no error.
        drop(TempFile::new("never"));
    }
}
