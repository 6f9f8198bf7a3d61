//! A Garage cluster on loopback for tests (`ci/garage`), stopped on drop:
//! shared by the tests of this crate and of the `casblk` binary.
//!
//! The binary is the one `ci/setup --garage` builds ($CASBLK_GARAGE_BIN, or
//! the one in $CASBLK_VM_CACHE). Without it a test fails, saying how to
//! build it: a missing binary must not pass for a working tier. A
//! developer who means to run without it sets CASBLK_SKIP_GARAGE=1; each
//! test then skipped says so on stderr and is counted, one line each, in
//! `target/test-skips.txt` (ci/test fails on any line there).

use crate::RemoteConfig;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A running cluster, stopped on drop.
pub struct GarageCluster {
    dir: PathBuf,
    config: RemoteConfig,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/garage")
}

/// The Garage binary, if built.
pub fn garage_bin() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("CASBLK_GARAGE_BIN") {
        return Some(PathBuf::from(bin));
    }
    let cache = std::env::var_os("CASBLK_VM_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/casblk-vm")))?;
    let bin = cache.join("garage/bin/garage");
    bin.exists().then_some(bin)
}

impl GarageCluster {
    /// Starts `nodes` nodes with their state in `dir`, or None when there
    /// is no Garage binary and CASBLK_SKIP_GARAGE=1 says to skip (the skip
    /// is printed and counted). Panics if there is no binary otherwise, or
    /// if the cluster does not start.
    pub fn start(dir: &Path, nodes: u32) -> Option<GarageCluster> {
        let Some(bin) = garage_bin() else {
            assert!(
                std::env::var("CASBLK_SKIP_GARAGE").as_deref() == Ok("1"),
                "no Garage binary: run ci/setup --garage (or set CASBLK_SKIP_GARAGE=1 to skip the Garage tests)"
            );
            record_skip(dir);
            return None;
        };
        // One start at a time: each picks free ports, and two starting
        // together could pick the same one before either listens on it.
        static STARTING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = STARTING.lock().unwrap_or_else(|p| p.into_inner());
        let out = Command::new(script())
            .args(["start", "--nodes", &nodes.to_string(), "--dir"])
            .arg(dir)
            .env("CASBLK_GARAGE_BIN", &bin)
            .output()
            .expect("run ci/garage");
        assert!(out.status.success(), "ci/garage start: {}", String::from_utf8_lossy(&out.stderr));
        let config = RemoteConfig::from_garage_env(&dir.join("env")).unwrap_or_else(|e| panic!("{e}"));
        Some(GarageCluster { dir: dir.to_path_buf(), config })
    }

    /// How to reach the bucket `ci/garage` made.
    pub fn config(&self) -> RemoteConfig {
        self.config.clone()
    }

    /// `ci/garage kill N` or `restart N`.
    pub fn node(&self, what: &str, n: u32) {
        let out = Command::new(script())
            .args([what, &n.to_string(), "--dir"])
            .arg(&self.dir)
            .env("CASBLK_GARAGE_BIN", garage_bin().expect("binary"))
            .output()
            .expect("run ci/garage");
        assert!(out.status.success(), "ci/garage {what} {n}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

/// Where skipped tests are counted: `target/test-skips.txt` of the workspace.
pub fn skips_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-skips.txt")
}

/// Says on stderr that the test whose cluster would live in `dir` is
/// skipped, and appends a line to `skips_file()`.
fn record_skip(dir: &Path) {
    let what = format!("skipped (CASBLK_SKIP_GARAGE=1, no Garage binary): {}", dir.display());
    eprintln!("{what}");
    use std::io::Write;
    let file = std::fs::OpenOptions::new().create(true).append(true).open(skips_file());
    if let Ok(mut f) = file {
        let _ = writeln!(f, "{what}");
    }
}

impl Drop for GarageCluster {
    fn drop(&mut self) {
        let _ = Command::new(script()).args(["stop", "--dir"]).arg(&self.dir).output();
    }
}
