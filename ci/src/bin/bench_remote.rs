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
//!   the rate packs reach the bucket, first append to last upload;
//! - reads of every 32nd chunk written, shuffled, with no clean chunk
//!   cache: after the uploads, the store is reopened with no local copy
//!   kept and reads them by ranged GETs of 64 KiB extents
//!   (`cold_remote_read_p99_us`); then 5 rounds alternate reading them
//!   from the extent cache (1 GiB here) and reading the same data from
//!   the local-only store's packs: `cached_read_p99_us` and
//!   `local_read_p99_us` are the medians of the rounds' p99s. Target:
//!   cached <= 1.5 x local.
//!
//! - `upload_cpu`: where the best upload arm's CPU went (this process
//!   and the Garage nodes, core-seconds per GiB from /proc), whether the
//!   cores were all busy, and the rate they allow with no client cost at
//!   all: three replicas on the client's own cores bound the upload.
//!
//! `BENCH_NODES=1` runs one node instead (replication factor 1),
//! `BENCH_UNSIGNED=1` sends unsigned payloads.
//!
//! - cross-host dedup, under a prefix of its own: host A appends half of
//!   `BENCH_MIB` of unique chunks and uploads them; host B (another chunk
//!   store, another host slot) imports A's slot indexes
//!   (`import_foreign`), then appends the same chunks plus an eighth as
//!   many of its own and uploads; `cross_host_stored_over_unique` is the
//!   bytes of every `packs/` and `packidx/` object over the unique bytes
//!   (target <= 1.02).
//!
//! Targets: `upload_mib_s >= 0.5 * local_pack_append_mib_s`,
//! `cached_read_p99_us <= 1.5 * local_read_p99_us`,
//! `cross_host_stored_over_unique <= 1.02`. Writes
//! `target/bench/remote.json` and prints it.

use cas::bucket::packs::{open_chunks, PackTier};
use cas::bucket::RemoteOptions;
use cas::chunk::{ChunkHash, ChunkRef, ChunkStore, ChunkStoreOptions, CHUNK_BYTES};
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
/// each batch, as compaction does); the store, MiB/s, when the first
/// append began (after the open, which claims a host slot with a remote),
/// and where every `SAMPLE_EVERY`th chunk went.
fn append(dir: &Path, mib: u64, remote: Option<RemoteOptions>) -> (Opened, f64, Instant, Vec<ChunkRef>) {
    let _ = std::fs::remove_dir_all(dir);
    let (store, tier) = open(&dir.join("chunks"), remote.as_ref());
    let total = mib * 256;
    let mut blocks = vec![0u8; (BATCH_CHUNKS as usize) * CHUNK_BYTES];
    let started = Instant::now();
    let mut id = 0u64;
    let (mut refs, mut samples) = (Vec::new(), Vec::new());
    while id < total {
        let n = BATCH_CHUNKS.min(total - id);
        for (k, b) in blocks.chunks_exact_mut(CHUNK_BYTES).take(n as usize).enumerate() {
            block_content(id + k as u64, b);
        }
        let items: Vec<(ChunkHash, &[u8])> =
            blocks.chunks_exact(CHUNK_BYTES).take(n as usize).map(|b| (ChunkHash::of(b), b)).collect();
        if let Some(tier) = &tier {
            tier.wait_upload_room(&store).expect("wait for upload room");
        }
        store.insert_located(&store.pin(), &items, &mut refs).expect("insert");
        samples.extend(refs.iter().step_by(SAMPLE_EVERY).copied());
        id += n;
        if id.is_multiple_of(SYNC_EVERY_MIB * 256) || id == total {
            store.sync().expect("sync");
        }
    }
    let rate = mib_s(total * CHUNK_BYTES as u64, started.elapsed().as_secs_f64());
    ((store, tier), rate, started, samples)
}

/// A chunk store, with its pack tier when it has a remote.
type Opened = (ChunkStore, Option<Arc<PackTier>>);

/// Opens the chunk store in `dir` (with `remote`, its bucket).
fn open(dir: &Path, remote: Option<&RemoteOptions>) -> Opened {
    open_chunks(Arc::new(FsStorage::new()), dir, read_opts(), remote).expect("open the chunk store")
}

/// Every `SAMPLE_EVERY`th chunk appended is read back in the read arms.
const SAMPLE_EVERY: usize = 32;

/// The chunk store's options for the read arms: no clean chunk cache, so
/// every read goes to a pack (local file, extent cache or GET).
fn read_opts() -> ChunkStoreOptions {
    ChunkStoreOptions { cache_bytes: 0, ..ChunkStoreOptions::default() }
}

/// Reads `refs` in a shuffled order; p50 and p99 in microseconds.
fn read_us(store: &ChunkStore, refs: &[ChunkRef]) -> (f64, f64) {
    let mut order: Vec<usize> = (0..refs.len()).collect();
    let mut rng = casblk_ci::XorShift(0x9e37_79b9_7f4a_7c15);
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let mut out = vec![0u8; CHUNK_BYTES];
    let mut ns: Vec<u64> = order
        .iter()
        .map(|&i| {
            let t = Instant::now();
            store.read_ref(&refs[i], &mut out).expect("read a chunk");
            t.elapsed().as_nanos() as u64
        })
        .collect();
    ns.sort_unstable();
    let at = |q: usize| ns[(ns.len() * q / 100).min(ns.len() - 1)] as f64 / 1000.0;
    (at(50), at(99))
}

/// Appends `mib` MiB locally; MiB/s, the pack files written, and the
/// store (kept open: the local arm of the read figures) with its samples.
fn local_append(dir: &Path, mib: u64) -> (f64, Vec<PathBuf>, ChunkStore, Vec<ChunkRef>) {
    let ((store, _), rate, _, samples) = append(dir, mib, None);
    let mut packs: Vec<PathBuf> = std::fs::read_dir(dir.join("chunks"))
        .expect("list the chunk store")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pack"))
        .collect();
    packs.sort();
    (rate, packs, store, samples)
}

/// The chunk store's own uploader (`threads` PUTs in flight) running
/// beside the appends: the append rate under uploads and the upload
/// bound, and the rate at which packs reach the bucket (from the first
/// append until the last pack is confirmed).
/// Read rounds, alternating local and cached reads (medians reported).
const READ_ROUNDS: usize = 5;

/// The median of `v`.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn pipeline(
    dir: &Path,
    mib: u64,
    objects: Arc<S3Objects>,
    threads: usize,
    local: &(ChunkStore, Vec<ChunkRef>),
) -> serde_json::Value {
    let remote = RemoteOptions {
        upload_threads: threads,
        local_keep_bytes: u64::MAX,
        cache_bytes: 1 << 30,
        ..RemoteOptions::new(objects)
    };
    let ((store, tier), append_rate, started, samples) = append(dir, mib, Some(remote.clone()));
    let tier = tier.expect("remote");
    store.seal_active().expect("seal the last pack");
    while tier.stats().sealed_packs > 0 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let total_s = started.elapsed().as_secs_f64();
    let st = tier.stats();
    // Reads: reopened with no local copy kept, from the bucket (cold);
    // then rounds of the same reads from the extent cache, alternating
    // with reads of the local store's packs.
    drop((store, tier));
    let (store, tier) = open(&dir.join("chunks"), Some(&RemoteOptions { local_keep_bytes: 0, ..remote }));
    let tier = tier.expect("remote");
    let evicted = tier.stats().evicted_packs;
    let cold_read = read_us(&store, &samples);
    let (mut local_rounds, mut cached_rounds) = (Vec::new(), Vec::new());
    for _ in 0..READ_ROUNDS {
        local_rounds.push(read_us(&local.0, &local.1));
        cached_rounds.push(read_us(&store, &samples));
    }
    let p50 = |r: &[(f64, f64)]| median(r.iter().map(|x| x.0).collect());
    let p99 = |r: &[(f64, f64)]| median(r.iter().map(|x| x.1).collect());
    let local_read = (p50(&local_rounds), p99(&local_rounds));
    let cached_read = (p50(&cached_rounds), p99(&cached_rounds));
    let reads = tier.stats();
    drop((store, tier));
    let _ = std::fs::remove_dir_all(dir);
    serde_json::json!({
        "local_read_p99_us": local_read.1,
        "cached_read_p99_us": cached_read.1,
        "cold_remote_read_p99_us": cold_read.1,
        "local_read_p50_us": local_read.0,
        "cached_read_p50_us": cached_read.0,
        "cold_remote_read_p50_us": cold_read.0,
        "reads": samples.len(),
        "read_rounds": READ_ROUNDS,
        "local_read_p99_us_by_round": local_rounds.iter().map(|x| x.1).collect::<Vec<_>>(),
        "cached_read_p99_us_by_round": cached_rounds.iter().map(|x| x.1).collect::<Vec<_>>(),
        "packs_evicted": evicted,
        "gets": reads.gets,
        "cache_hits": reads.cache_hits,
        "append_mib_s": append_rate,
        "upload_mib_s": mib_s(st.uploaded_bytes, total_s),
        "upload_threads": threads,
        "packs_uploaded": st.uploaded_packs,
        "upload_errors": st.upload_errors,
        "upload_waits": st.upload_waits,
        "upload_wait_ms": st.upload_wait_ms,
    })
}

/// Inserts the chunks of ids `first..first + count` (syncing every 64 MiB)
/// and uploads them all.
fn insert_and_upload((store, tier): &Opened, first: u64, count: u64) {
    let tier = tier.as_ref().expect("remote");
    let mut blocks = vec![0u8; (BATCH_CHUNKS as usize) * CHUNK_BYTES];
    let mut id = first;
    while id < first + count {
        let n = BATCH_CHUNKS.min(first + count - id);
        for (k, b) in blocks.chunks_exact_mut(CHUNK_BYTES).take(n as usize).enumerate() {
            block_content(id + k as u64, b);
        }
        let items: Vec<(ChunkHash, &[u8])> =
            blocks.chunks_exact(CHUNK_BYTES).take(n as usize).map(|b| (ChunkHash::of(b), b)).collect();
        tier.wait_upload_room(store).expect("wait for upload room");
        store.insert_missing(&store.pin(), &items).expect("insert");
        id += n;
        if (id - first).is_multiple_of(SYNC_EVERY_MIB * 256) {
            store.sync().expect("sync");
        }
    }
    store.sync().expect("sync");
    store.seal_active().expect("seal the last pack");
    while tier.stats().sealed_packs > 0 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The cross-host dedup arm (see the module docs), with the bucket under
/// its own prefix.
fn cross_host(dir: &Path, mut cfg: RemoteConfig, mib: u64) -> serde_json::Value {
    cfg.prefix = "cross-host/".into();
    let objects = Arc::new(S3Objects::open(cfg).unwrap_or_else(|e| panic!("{e}")));
    let _ = std::fs::remove_dir_all(dir);
    let open = |name: &str| {
        let remote = RemoteOptions { upload_threads: 4, ..RemoteOptions::new(objects.clone()) };
        open(&dir.join(name), Some(&remote))
    };
    let (shared, own) = (mib * 256, mib * 256 / 8);
    let a = open("a");
    insert_and_upload(&a, 0, shared);
    let b = open("b");
    let started = Instant::now();
    let imported = b.1.as_ref().expect("remote").import_foreign(&b.0).expect("import A's slot indexes");
    let import_ms = started.elapsed().as_millis() as u64;
    insert_and_upload(&b, 0, shared);
    insert_and_upload(&b, 1 << 40, own);
    let new_on_b = b.0.len() - imported.entries;
    let sum = |prefix: &str| -> u64 {
        let mut total = 0;
        let mut after: Option<String> = None;
        loop {
            let page = objects.list(prefix, after.as_deref(), 1000).expect("list");
            let Some(last) = page.last() else { break };
            after = Some(last.key.clone());
            total += page.iter().map(|o| o.size).sum::<u64>();
        }
        total
    };
    let (pack_bytes, index_bytes) = (sum("packs/"), sum("packidx/"));
    let unique = (shared + own) * CHUNK_BYTES as u64;
    drop((a, b));
    let _ = std::fs::remove_dir_all(dir);
    serde_json::json!({
        "stored_over_unique": (pack_bytes + index_bytes) as f64 / unique as f64,
        "unique_mib": unique >> 20,
        "pack_object_bytes": pack_bytes,
        "packidx_object_bytes": index_bytes,
        "imported_entries": imported.entries,
        "imported_packs": imported.packs,
        "import_ms": import_ms,
        "chunks_new_on_b": new_on_b,
        "chunks_own_on_b": own,
    })
}

/// CPU seconds used so far by this process and by the Garage nodes whose
/// pid files are under `garage_dir` (`nN/pid`).
fn cpu_now(garage_dir: &Path) -> (f64, f64) {
    let client = casblk_ci::process_cpu_secs("self").unwrap_or(0.0);
    let nodes = std::fs::read_dir(garage_dir).into_iter().flatten().flatten();
    let garage = nodes
        .filter_map(|e| std::fs::read_to_string(e.path().join("pid")).ok())
        .filter_map(|pid| casblk_ci::process_cpu_secs(pid.trim()))
        .sum();
    (client, garage)
}

/// One upload arm: its rate and where its CPU went.
struct Upload {
    mib_s: f64,
    wall_s: f64,
    bytes: u64,
    client_cpu_s: f64,
    garage_cpu_s: f64,
}

/// PUTs every pack with `in_flight` at a time.
fn upload(objects: &Arc<S3Objects>, garage_dir: &Path, packs: &[PathBuf], in_flight: usize) -> Upload {
    let next = AtomicUsize::new(0);
    let bytes: u64 = packs.iter().map(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0)).sum();
    let cpu = cpu_now(garage_dir);
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
    let wall_s = started.elapsed().as_secs_f64();
    let after = cpu_now(garage_dir);
    for path in packs {
        let key = format!("packs/{}", path.file_name().expect("name").to_string_lossy());
        objects.delete(&key).unwrap_or_else(|e| panic!("{e}"));
    }
    Upload {
        mib_s: mib_s(bytes, wall_s),
        wall_s,
        bytes,
        client_cpu_s: after.0 - cpu.0,
        garage_cpu_s: after.1 - cpu.1,
    }
}

/// Where the best upload arm's CPU went, per GiB uploaded, and the rates
/// this machine's cores allow: `ceiling_mib_s` with every core busy at
/// that cost, `garage_only_ceiling_mib_s` if the client cost nothing (the
/// most any client change could reach with these nodes on these cores).
fn cpu_report(u: &Upload) -> serde_json::Value {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let gib = u.bytes as f64 / (1u64 << 30) as f64;
    let (client, garage) = (u.client_cpu_s / gib, u.garage_cpu_s / gib);
    serde_json::json!({
        "machine_cores": cores,
        "client_core_s_per_gib": client,
        "garage_core_s_per_gib": garage,
        "busy_cores": (u.client_cpu_s + u.garage_cpu_s) / u.wall_s,
        "ceiling_mib_s": cores * 1024.0 / (client + garage),
        "garage_only_ceiling_mib_s": cores * 1024.0 / garage,
    })
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
    let objects = Arc::new(S3Objects::open(cfg.clone()).unwrap_or_else(|e| panic!("{e}")));

    let cross = cross_host(&root.join("remote-cross"), cfg, mib / 2);
    let (append, packs, local_store, local_samples) = local_append(&root.join("remote-local"), mib);
    let mut by_in_flight = serde_json::Map::new();
    let mut best: Option<(Upload, usize)> = None;
    for in_flight in [1usize, 4, 8] {
        let u = upload(&objects, &garage_dir, &packs, in_flight);
        by_in_flight.insert(in_flight.to_string(), serde_json::json!(u.mib_s));
        if best.as_ref().is_none_or(|(b, _)| u.mib_s > b.mib_s) {
            best = Some((u, in_flight));
        }
    }
    let (best, best_in_flight) = best.expect("three upload arms");
    let upload_cpu = cpu_report(&best);
    let local = (local_store, local_samples);
    let pipeline = pipeline(&root.join("remote-store"), mib, objects.clone(), 4, &local);
    drop(local);
    let _ = std::fs::remove_dir_all(root.join("remote-local"));
    garage(&["stop", "--dir", &garage_dir.to_string_lossy()]);
    let _ = std::fs::remove_dir_all(root.join("remote-store"));
    let ratio = best.mib_s / append;
    let fig = |k: &str| pipeline[k].as_f64().unwrap_or(f64::NAN);
    let (local_read, cached_read) = (fig("local_read_p99_us"), fig("cached_read_p99_us"));
    let cached_ratio = cached_read / local_read;
    let v = serde_json::json!({
        "local_pack_append_mib_s": append,
        "upload_mib_s": best.mib_s,
        "upload_in_flight": best_in_flight,
        "upload_cpu": upload_cpu,
        "upload_by_in_flight": by_in_flight,
        "upload_over_append": ratio,
        "pipeline": pipeline,
        "input_mib": mib,
        "pack_objects": packs.len(),
        "local_read_p99_us": local_read,
        "cached_read_p99_us": cached_read,
        "cold_remote_read_p99_us": fig("cold_remote_read_p99_us"),
        "cached_over_local_read_p99": cached_ratio,
        "cross_host_stored_over_unique": cross["stored_over_unique"],
        "cross_host": cross,
        "garage": { "version": "2.5.0", "nodes": nodes.parse::<u32>().unwrap_or(0), "replication_factor": nodes.parse::<u32>().unwrap_or(0), "features": "bundled-libs,lmdb" },
        "unsigned_payload": unsigned,
        "targets": {
            "upload_over_append_min": 0.5,
            "upload_met": ratio >= 0.5,
            "cached_over_local_read_p99_max": 1.5,
            "cached_read_met": cached_ratio <= 1.5,
            "cross_host_stored_over_unique_max": 1.02,
            "cross_host_met": cross["stored_over_unique"].as_f64().is_some_and(|r| r <= 1.02),
        },
    });
    write_results("remote", &v);
    println!("{}", serde_json::to_string_pretty(&v).expect("json"));
}
