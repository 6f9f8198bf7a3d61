//! Shared helpers for casblk's native benchmark binaries (`ci/bench NAME`
//! runs `bench_NAME`; each writes `target/bench/NAME.json`).
#![deny(unsafe_code)]

use std::path::PathBuf;

/// Where benchmark JSON goes: `$CASBLK_BENCH_DIR`, else the workspace's
/// `target/bench`.
pub fn bench_dir() -> PathBuf {
    match std::env::var_os("CASBLK_BENCH_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join("target").join("bench"),
    }
}

/// Writes `value` (pretty JSON) to `bench_dir()/NAME.json`; returns the path.
pub fn write_bench_json(name: &str, value: &serde_json::Value) -> std::io::Result<PathBuf> {
    let dir = bench_dir();
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
    std::fs::write(&path, text + "\n")?;
    Ok(path)
}
