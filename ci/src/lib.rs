//! Shared helpers for casblk's native benchmark binaries (`ci/bench NAME`
//! runs `src/bin/bench_NAME.rs`).
#![deny(unsafe_code)]

use std::path::PathBuf;
use std::time::Instant;

/// The workspace root (the benchmarks run from anywhere).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// Where results go: `$CASBLK_BENCH_DIR`, else the workspace's `target/bench`.
pub fn results_dir() -> PathBuf {
    let dir = match std::env::var_os("CASBLK_BENCH_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => workspace_root().join("target").join("bench"),
    };
    std::fs::create_dir_all(&dir).expect("create target/bench");
    dir
}

/// A fresh scratch directory for one run under `target/bench/` (on the
/// build's disk, not /tmp, which may be tmpfs). Removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = results_dir().join(format!("scratch-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The filesystem type of `path` as /proc/mounts names it (longest mount
/// prefix), for the report.
pub fn filesystem_of(path: &std::path::Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_dev, mnt, fs) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(mnt).then(|| (mnt.len(), fs.to_string()))
        })
        .max()
        .map(|(_, fs)| fs)
        .unwrap_or_else(|| "unknown".into())
}

/// CPU seconds (user + system, every thread) process `pid` has used
/// (`"self"` for this one), from `/proc/PID/stat` (10 ms clock ticks);
/// None once it is gone.
pub fn process_cpu_secs(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the whole line.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// CPU nanoseconds this process has used: every thread, those that exited
/// included (`CLOCK_PROCESS_CPUTIME_ID`; exact, where
/// [`process_cpu_secs`] counts 10 ms ticks).
pub fn process_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Writes `target/bench/NAME.json` and returns its path.
pub fn write_results(name: &str, value: &serde_json::Value) -> PathBuf {
    let path = results_dir().join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(value).expect("json");
    std::fs::write(&path, text + "\n").expect("write results");
    path
}

/// The median of `values` (of an even count, the mean of the middle two);
/// NaN sorts last. Panics on none.
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    (v[(v.len() - 1) / 2] + v[v.len() / 2]) / 2.0
}

/// Seconds since `t`.
pub fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// A small deterministic generator (xorshift) for benchmark offsets.
pub struct XorShift(pub u64);

impl XorShift {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The compaction benchmark's data (`ci/bench compaction`, and the dedup
/// loss of `ci/bench index`): block `i` of `blocks` has content
/// `key_of(i, blocks)`; even blocks are all distinct, each odd block
/// repeats a scattered even one, so exactly half the blocks are unique.
pub mod counting_storage;
pub mod engine;
// Hands tag buffers to the request path as a frontend does (`unsafe` by
// `serve::TagBuffers`' contract).
#[allow(unsafe_code)]
pub mod frontend;

pub mod compaction_data {
    /// Fills `out` (4 KiB) with the content named `key`.
    pub fn block_content(key: u64, out: &mut [u8]) {
        let mut x = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for w in out.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
    }

    /// The content key of block `i` of `blocks`.
    pub fn key_of(i: u64, blocks: u64) -> u64 {
        let half = blocks / 2;
        if i.is_multiple_of(2) {
            i / 2
        } else {
            (i / 2).wrapping_mul(7919).wrapping_add(104_729) % half
        }
    }
}
