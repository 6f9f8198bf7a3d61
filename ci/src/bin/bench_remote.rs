//! `ci/bench remote` (issue 18), native, against a 3-node Garage on
//! loopback (`ci/garage`, replication factor 3). So far it measures the
//! upload side, the figures the rest of the design depends on:
//!
//! - `local_pack_append_mib_s`: `insert_missing` of `BENCH_MIB` MiB
//!   (default 512) of unique chunks into a chunk store on this filesystem,
//!   with a `sync` (fdatasync) every 64 MiB: the local write path uploads
//!   have to keep up with;
//! - `upload_mib_s`: PUT of the sealed pack files that wrote (64 MiB
//!   objects, whole) through `S3Objects`, with 1, 4 and 8 PUTs in flight;
//!   the best is the figure, each is in `upload_by_in_flight`;
//! - `pipeline`: the chunk store's own uploader (4 threads) beside the
//!   appends, with the upload bound: the append rate under uploads, and
//!   the rate packs reach the bucket, first append to last upload.
//!
//! `BENCH_NODES=1` runs one node instead (replication factor 1),
//! `BENCH_UNSIGNED=1` sends unsigned payloads.
//!
//! Target: `upload_mib_s >= 0.5 * local_pack_append_mib_s`. The read and
//! cross-host figures of the issue wait for remote reads and the uploader
//! (docs/plans/remote.md) and are null here. Writes
//! `target/bench/remote.json` and prints it.

use cas::chunk::remote::RemoteOptions;
use cas::chunk::{ChunkHash, ChunkStore, ChunkStoreOptions, CHUNK_BYTES};
use cas::objects::Objects;
use cas::storage::FsStorage;
use casblk_ci::compaction_data::block_content;
use casblk_ci::{results_dir, workspace_root, write_results};
use casblk_remote::{RemoteConfig, S3Objects};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

const SYNC_EVERY_MIB: u64 = 64;
const BATCH_CHUNKS: u64 = 1024;

fn mib_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / secs
}

/// Runs `ci/garage` with `args`; its stdout.
fn garage(args: &[&str]) -> String {
    let out = std::process::Command::new(workspace_root().join("ci/garage"))
        .args(args)
        .output()
        .expect("run ci/garage");
    assert!(out.status.success(), "ci/garage {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Appends `mib` MiB of unique chunks to a chunk store under `dir`,
/// syncing every 64 MiB (with a remote, waiting for upload room before
/// each batch, as compaction does); the store, MiB/s, and when the first
/// append began (after the open, which claims a host slot with a remote).
fn append(dir: &Path, mib: u64, remote: Option<RemoteOptions>) -> (ChunkStore, f64, Instant) {
    let _ = std::fs::remove_dir_all(dir);
    let opts = ChunkStoreOptions { remote, ..ChunkStoreOptions::default() };
    let store = ChunkStore::open(Arc::new(FsStorage::new()), &dir.join("chunks"), opts)
        .expect("open the chunk store");
    let total = mib * 256;
    let mut blocks = vec![0u8; (BATCH_CHUNKS as usize) * CHUNK_BYTES];
    let started = Instant::now();
    let mut id = 0u64;
    while id < total {
        let n = BATCH_CHUNKS.min(total - id);
        for (k, b) in blocks.chunks_exact_mut(CHUNK_BYTES).take(n as usize).enumerate() {
            block_content(id + k as u64, b);
        }
        let items: Vec<(ChunkHash, &[u8])> =
            blocks.chunks_exact(CHUNK_BYTES).take(n as usize).map(|b| (ChunkHash::of(b), b)).collect();
        store.wait_upload_room().expect("wait for upload room");
        store.insert_missing(&store.pin(), &items).expect("insert");
        id += n;
        if id.is_multiple_of(SYNC_EVERY_MIB * 256) || id == total {
            store.sync().expect("sync");
        }
    }
    let rate = mib_s(total * CHUNK_BYTES as u64, started.elapsed().as_secs_f64());
    (store, rate, started)
}

/// Appends `mib` MiB locally; MiB/s and the pack files written.
fn local_append(dir: &Path, mib: u64) -> (f64, Vec<PathBuf>) {
    let (store, rate, _) = append(dir, mib, None);
    drop(store);
    let mut packs: Vec<PathBuf> = std::fs::read_dir(dir.join("chunks"))
        .expect("list the chunk store")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pack"))
        .collect();
    packs.sort();
    (rate, packs)
}

/// The chunk store's own uploader (`threads` PUTs in flight) running
/// beside the appends: the append rate under uploads and the upload
/// bound, and the rate at which packs reach the bucket (from the first
/// append until the last pack is confirmed).
fn pipeline(dir: &Path, mib: u64, objects: Arc<S3Objects>, threads: usize) -> serde_json::Value {
    let remote = RemoteOptions { upload_threads: threads, ..RemoteOptions::new(objects) };
    let (store, append_rate, started) = append(dir, mib, Some(remote));
    store.seal_active().expect("seal the last pack");
    while store.remote_stats().expect("remote").sealed_packs > 0 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let total_s = started.elapsed().as_secs_f64();
    let st = store.remote_stats().expect("remote");
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
    serde_json::json!({
        "append_mib_s": append_rate,
        "upload_mib_s": mib_s(st.uploaded_bytes, total_s),
        "upload_threads": threads,
        "packs_uploaded": st.uploaded_packs,
        "upload_errors": st.upload_errors,
        "upload_waits": st.upload_waits,
        "upload_wait_ms": st.upload_wait_ms,
    })
}

/// PUTs every pack with `in_flight` at a time; MiB/s.
fn upload(objects: &Arc<S3Objects>, packs: &[PathBuf], in_flight: usize) -> f64 {
    let next = AtomicUsize::new(0);
    let bytes: u64 = packs.iter().map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)).sum();
    let started = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..in_flight {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(path) = packs.get(i) else { break };
                let data = std::fs::read(path).expect("read a pack");
                let key = format!("packs/{}", path.file_name().expect("name").to_string_lossy());
                objects.put(&key, &data).unwrap_or_else(|e| panic!("{e}"));
            });
        }
    });
    let rate = mib_s(bytes, started.elapsed().as_secs_f64());
    for path in packs {
        let key = format!("packs/{}", path.file_name().expect("name").to_string_lossy());
        objects.delete(&key).unwrap_or_else(|e| panic!("{e}"));
    }
    rate
}

fn main() {
    let mib: u64 = std::env::var("BENCH_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(512);
    let root = results_dir();
    let garage_dir = root.join("remote-garage");
    // BENCH_NODES=1: the same against one node (how much replication costs).
    let nodes = std::env::var("BENCH_NODES").unwrap_or_else(|_| "3".into());
    let env_path = garage(&["start", "--nodes", &nodes, "--dir", &garage_dir.to_string_lossy()]);
    let mut cfg = RemoteConfig::from_garage_env(std::path::Path::new(env_path.trim()))
        .unwrap_or_else(|e| panic!("{e}"));
    // BENCH_UNSIGNED=1: requests sign no body hash (RemoteConfig::unsigned_payload).
    let unsigned = std::env::var("BENCH_UNSIGNED").is_ok_and(|v| v == "1");
    cfg.unsigned_payload = unsigned;
    let objects = Arc::new(S3Objects::open(cfg).unwrap_or_else(|e| panic!("{e}")));

    let (append, packs) = local_append(&root.join("remote-store"), mib);
    let mut by_in_flight = serde_json::Map::new();
    let mut best = (0.0f64, 0usize);
    for in_flight in [1usize, 4, 8] {
        let rate = upload(&objects, &packs, in_flight);
        by_in_flight.insert(in_flight.to_string(), serde_json::json!(rate));
        if rate > best.0 {
            best = (rate, in_flight);
        }
    }
    let pipeline = pipeline(&root.join("remote-store"), mib, objects.clone(), 4);
    garage(&["stop", "--dir", &garage_dir.to_string_lossy()]);
    let _ = std::fs::remove_dir_all(root.join("remote-store"));
    let ratio = best.0 / append;
    let v = serde_json::json!({
        "local_pack_append_mib_s": append,
        "upload_mib_s": best.0,
        "upload_in_flight": best.1,
        "upload_by_in_flight": by_in_flight,
        "upload_over_append": ratio,
        "pipeline": pipeline,
        "input_mib": mib,
        "pack_objects": packs.len(),
        "local_read_p99_us": null,
        "cached_read_p99_us": null,
        "cold_remote_read_p99_us": null,
        "cross_host_stored_over_unique": null,
        "not_measured_yet": "remote reads, the read cache and cross-host dedup: docs/plans/remote.md stages 3-6",
        "garage": { "version": "2.5.0", "nodes": nodes.parse::<u32>().unwrap_or(0), "replication_factor": nodes.parse::<u32>().unwrap_or(0), "features": "bundled-libs,lmdb" },
        "unsigned_payload": unsigned,
        "targets": { "upload_over_append_min": 0.5, "met": ratio >= 0.5 },
    });
    write_results("remote", &v);
    println!("{}", serde_json::to_string_pretty(&v).expect("json"));
}
