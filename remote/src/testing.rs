//! A Garage cluster on loopback for tests (`ci/garage`), stopped on drop:
//! shared by the tests of this crate and of the `casblk` binary.
//!
//! The binary is the one `ci/setup --garage` builds ($CASBLK_GARAGE_BIN, or
//! the one in $CASBLK_VM_CACHE). Without it a test is skipped with a line
//! that says so, unless CASBLK_REQUIRE_GARAGE=1 (CI), where its absence
//! fails the test.

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
    /// Starts `nodes` nodes with their state in `dir`, or None (after
    /// saying why) when there is no Garage binary and CI does not require
    /// one. Panics if the cluster does not start.
    pub fn start(dir: &Path, nodes: u32) -> Option<GarageCluster> {
        let Some(bin) = garage_bin() else {
            assert!(
                std::env::var("CASBLK_REQUIRE_GARAGE").as_deref() != Ok("1"),
                "CASBLK_REQUIRE_GARAGE=1 but no Garage binary: run ci/setup --garage"
            );
            eprintln!("skipped: no Garage binary (ci/setup --garage builds it)");
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

impl Drop for GarageCluster {
    fn drop(&mut self) {
        let _ = Command::new(script()).args(["stop", "--dir"]).arg(&self.dir).output();
    }
}
