//! `ci/bench index`: what the chunk index costs (issue 17), written to
//! `target/bench/index.json` and printed.
//!
//! Two arms, each in its own process (so one's heap does not blur the
//! other's resident memory), over the same `BENCH_INDEX_CHUNKS` (default
//! 64 M) synthetic chunk hashes, one thread:
//! - `dedup`: the index the store uses (`cas::chunk::bench::DedupBench`:
//!   memtable, sorted runs written to disk and merged as the store does,
//!   the in-memory summary);
//! - `memory`: the whole-index-in-memory layout the store used before it
//!   (`IndexBench`, 48-byte entries in swiss tables, baseline.rs), the
//!   baseline.
//!
//! Each arm runs with the daemon's memory settings
//! (`serve::process_memory`). Per arm: resident bytes gained while
//! inserting (VmRSS), `insert_per_s`
//! (flushes and merges included), `lookup_per_s` for hits and for misses.
//!
//! `ram_gib_per_tib_unique` is the dedup arm's resident bytes per chunk
//! after its last flush (summary, fences, heap slack), times the 2^28
//! chunks of a TiB, plus what does not grow with the chunks: the largest
//! memtable a store keeps, and the slot bits (2 bits per chunk). Each part
//! is reported.
//!
//! Also:
//! - `open_ms`: `ChunkStore::open` of a synthetic store of
//!   `BENCH_OPEN_CHUNKS` (default 16 M) chunks as a flush leaves it (one
//!   run, a slots file, an empty journal, sparse packs);
//! - `read_path_index_lookups`: `ChunkStats::read_index_lookups` during a
//!   full read of an image compacted, partly rewritten and repacked by GC
//!   in the same run, beside the chunk reads it made and those that
//!   followed forward tables;
//! - `dedup_loss_pct`: chunks stored beyond exact dedup, in percent of the
//!   unique chunks, through a real store with the default memory budget,
//!   for (a) the compaction benchmark's data (half the blocks duplicate
//!   others) and (b) a tar of a real OS file tree (`BENCH_INDEX_TREE`,
//!   default /usr/share, at most `BENCH_INDEX_TREE_MIB`, default 1024)
//!   written into two images; the larger is the figure.

mod baseline;

use baseline::IndexBench;
use cas::chunk::bench::{memtable_cap_bytes, slot_bits_bytes, write_synthetic_store, DedupBench};
use cas::chunk::{ChunkHash, ChunkStore, ChunkStoreOptions};
use cas::storage::{FsStorage, Storage};
use cas::{Store, StoreOptions};
use casblk_ci::compaction_data::{block_content, key_of};
use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

const TIB_CHUNKS: f64 = (1u64 << 28) as f64;
const GIB: f64 = (1u64 << 30) as f64;
const MIB: u64 = 1 << 20;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A synthetic chunk hash: blake3-like uniform bytes from a counter.
fn hash_of(i: u64, salt: u64) -> ChunkHash {
    let mut x = (i ^ salt.rotate_left(32)).wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut b = [0u8; ChunkHash::BYTES];
    for w in b.chunks_exact_mut(8) {
        x ^= x >> 30;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 27;
        x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
        w.copy_from_slice(&x.to_le_bytes());
    }
    ChunkHash::from_bytes(b)
}

/// A field of /proc/self/status in bytes (VmRSS, VmHWM).
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib << 10)
}

fn per_s(n: u64, since: Instant) -> f64 {
    n as f64 / since.elapsed().as_secs_f64()
}

/// What both arms answer to.
trait Arm {
    fn insert(&mut self, i: u64) -> bool;
    fn found(&mut self, hash: &ChunkHash) -> bool;
    /// After the last insert (the dedup index flushes its memtable).
    fn finish(&mut self) {}
}

impl Arm for IndexBench {
    fn insert(&mut self, i: u64) -> bool {
        IndexBench::insert(self, &hash_of(i, 1), (i >> 14) as u32 + 1, (i & 0x3fff) as u32, i as u32)
    }
    fn found(&mut self, hash: &ChunkHash) -> bool {
        self.get(&hash.tag()).is_some()
    }
}

impl Arm for DedupBench {
    fn insert(&mut self, i: u64) -> bool {
        DedupBench::insert(self, &hash_of(i, 1), (i >> 14) as u32 + 1, (i & 0x3fff) as u32, i as u32)
            .expect("dedup index insert")
    }
    fn found(&mut self, hash: &ChunkHash) -> bool {
        self.lookup(hash).expect("dedup index lookup").is_some()
    }
    fn finish(&mut self) {
        self.flush().expect("dedup index flush");
        self.merge_runs(true).expect("dedup index merges");
    }
}

/// Inserts `chunks` hashes, then looks up inserted and other hashes.
fn rates(arm: &mut dyn Arm, chunks: u64) -> serde_json::Value {
    let before = status_bytes("VmRSS:");
    let started = Instant::now();
    let mut new = 0u64;
    for i in 0..chunks {
        new += u64::from(arm.insert(i));
    }
    arm.finish();
    let insert_per_s = per_s(chunks, started);
    assert_eq!(new, chunks, "synthetic hashes are distinct");
    let resident = status_bytes("VmRSS:").saturating_sub(before);
    let peak = status_bytes("VmHWM:").saturating_sub(before);
    let probes = chunks.min(1 << 20);
    let step = (chunks / probes).max(1);
    let started = Instant::now();
    let mut found = 0u64;
    for k in 0..probes {
        found += u64::from(arm.found(&hash_of(k * step, 1)));
    }
    let hits_per_s = per_s(probes, started);
    assert_eq!(found, probes, "every inserted hash is found");
    let started = Instant::now();
    let mut false_hits = 0u64;
    for k in 0..probes {
        false_hits += u64::from(arm.found(&hash_of(k, 2)));
    }
    let misses_per_s = per_s(probes, started);
    serde_json::json!({
        "chunks_inserted": chunks,
        "resident_bytes": resident,
        "peak_resident_bytes": peak,
        "ram_bytes_per_chunk": resident as f64 / chunks as f64,
        "insert_per_s": insert_per_s,
        "lookup_per_s": { "hits": hits_per_s, "misses": misses_per_s },
        "false_hits": false_hits,
    })
}

/// The `memory` arm (in this process).
fn memory_arm(chunks: u64) -> serde_json::Value {
    let mut index = IndexBench::default();
    let mut v = rates(&mut index, chunks);
    v["table_load"] = serde_json::json!(chunks as f64 / index.buckets() as f64);
    v["ram_gib_per_tib_unique"] =
        serde_json::json!(v["ram_bytes_per_chunk"].as_f64().unwrap_or(0.0) * TIB_CHUNKS / GIB);
    v
}

/// The `dedup` arm (in this process): runs under `dir`.
fn dedup_arm(chunks: u64, dir: &Path) -> serde_json::Value {
    let _ = std::fs::remove_dir_all(dir);
    let storage: Arc<dyn Storage> = Arc::new(FsStorage::new());
    let budget = ChunkStoreOptions::default().index_memory_budget_bytes;
    let mut index = DedupBench::new(storage, dir, budget).expect("dedup index");
    let mut v = rates(&mut index, chunks);
    let per_chunk = v["ram_bytes_per_chunk"].as_f64().unwrap_or(0.0);
    let fixed = memtable_cap_bytes() as f64 + slot_bits_bytes(1 << 28) as f64;
    v["runs"] = serde_json::json!(index.runs());
    v["flushes"] = serde_json::json!(index.flushes);
    v["install_ms_max"] = serde_json::json!(index.install_ms_max);
    v["install_total_ms_max"] = serde_json::json!(index.install_total_ms_max);
    v["flush_ms_max"] = serde_json::json!(index.flush_ms_max);
    v["merges"] = serde_json::json!(index.merges);
    v["merge_ms_max"] = serde_json::json!(index.merge_ms_max);
    v["merge_waits"] = serde_json::json!(index.merge_waits);
    v["page_reads"] = serde_json::json!(index.page_reads);
    v["index_estimate_bytes"] = serde_json::json!(index.memory_bytes());
    v["summary_fraction"] = serde_json::json!(index.summary_fraction());
    v["per_tib"] = serde_json::json!({
        "summary_and_fences_gib": per_chunk * TIB_CHUNKS / GIB,
        "memtable_gib": memtable_cap_bytes() as f64 / GIB,
        "slot_bits_gib": slot_bits_bytes(1 << 28) as f64 / GIB,
    });
    v["ram_gib_per_tib_unique"] = serde_json::json!((per_chunk * TIB_CHUNKS + fixed) / GIB);
    drop(index);
    let _ = std::fs::remove_dir_all(dir);
    v
}

/// Runs this program again as one arm and returns what it printed.
fn run_arm(arm: &str) -> serde_json::Value {
    let exe = std::env::current_exe().expect("own path");
    let out = std::process::Command::new(exe).arg("--arm").arg(arm).output().expect("run an arm");
    assert!(out.status.success(), "arm {arm} failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("an arm prints JSON")
}

fn open_time(dir: &Path, chunks: u64) -> cas::Result<serde_json::Value> {
    let storage: Arc<dyn Storage> = Arc::new(FsStorage::new());
    let _ = std::fs::remove_dir_all(dir);
    let slots = ((ChunkStoreOptions::default().pack_bytes - cas::chunk::PACK_HEADER_BYTES) / 4096) as u32;
    let started = Instant::now();
    write_synthetic_store(storage.as_ref(), dir, chunks, slots, |i| hash_of(i, 3))?;
    let write_ms = started.elapsed().as_millis() as u64;
    let started = Instant::now();
    let store = ChunkStore::open(storage, dir, ChunkStoreOptions::default())?;
    let open_ms = started.elapsed().as_millis() as u64;
    let entries = store.len();
    let report = store.open_report();
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
    Ok(serde_json::json!({
        "open_chunks": entries,
        "open_ms": open_ms,
        "open_report": report,
        "synthetic_store_write_ms": write_ms,
    }))
}

/// Writes `bytes` of image "img": MiB `m` holds content `m + salt`, except
/// every fourth MiB, which repeats content `salt` (shared chunks).
fn write_image(image: &cas::Image, bytes: u64, salt: u64, keep: impl Fn(u64) -> bool) -> cas::Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    for (m, off) in (0..bytes).step_by(buf.len()).enumerate() {
        if !keep(m as u64) {
            continue;
        }
        let id = if m % 4 == 3 { salt } else { m as u64 + salt };
        for (k, b) in buf.chunks_exact_mut(8).enumerate() {
            b.copy_from_slice(&(id << 32 | k as u64).to_le_bytes());
        }
        image.write(off, &buf, false)?;
    }
    image.flush()
}

/// A 64 MiB image compacted, two MiB in three overwritten and compacted
/// again, GC repacking the mostly dead packs (1 MiB packs, no chunk cache),
/// then read whole: how many reads asked the index, followed forward
/// tables, and went to a pack at all.
fn read_path(dir: &Path) -> cas::Result<serde_json::Value> {
    let _ = std::fs::remove_dir_all(dir);
    let storage: Arc<dyn Storage> = Arc::new(FsStorage::new());
    let opts = StoreOptions {
        background_compaction: false,
        gc_auto: cas::gc::AutoGcOptions::off(),
        pack_bytes: 1 << 20,
        chunk_cache_bytes: 0,
        ..StoreOptions::default()
    };
    let store = Store::create(storage, dir, opts)?;
    let bytes = 64u64 << 20;
    store.create_image("img", bytes)?;
    let image = store.open_image("img")?;
    write_image(&image, bytes, 0, |_| true)?;
    store.compact_once(&image)?;
    write_image(&image, bytes, 1000, |m| m % 3 != 0)?;
    store.compact_once(&image)?;
    let gc = store.gc_with(&cas::gc::GcOptions { repack_dead_fraction: 0.3, ..Default::default() })?;
    let before = store.chunk_stats();
    let mut buf = vec![0u8; 1 << 20];
    for off in (0..bytes).step_by(buf.len()) {
        image.read(off, &mut buf)?;
    }
    let after = store.chunk_stats();
    drop(image);
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
    Ok(serde_json::json!({
        "read_path_blocks": bytes / 4096,
        "read_path_chunk_reads": after.cache_misses - before.cache_misses,
        "read_path_index_lookups": after.read_index_lookups - before.read_index_lookups,
        "read_path_reads_forwarded": after.reads_forwarded - before.reads_forwarded,
        "read_path_gc_chunks_moved": gc.chunks_moved,
    }))
}

/// Writes `images` (each a list of 1 MiB pieces from `piece`) into a store
/// with the default memory budget, compacting as the log fills, and
/// returns (chunks stored, unique non-zero blocks by exact blake3).
fn stored_vs_unique(
    dir: &Path,
    images: &[(&str, u64)],
    piece: &mut dyn FnMut(&str, u64, &mut [u8]) -> bool,
) -> cas::Result<(u64, u64, u64)> {
    let _ = std::fs::remove_dir_all(dir);
    let storage: Arc<dyn Storage> = Arc::new(FsStorage::new());
    let opts = StoreOptions {
        background_compaction: false,
        gc_auto: cas::gc::AutoGcOptions::off(),
        ..StoreOptions::default()
    };
    let quota = opts.log_quota_bytes;
    let store = Store::create(storage, dir, opts)?;
    let mut unique: HashSet<ChunkHash> = HashSet::new();
    let mut blocks = 0u64;
    let mut buf = vec![0u8; MIB as usize];
    for &(name, mib) in images {
        store.create_image(name, mib * MIB)?;
        let image = store.open_image(name)?;
        let mut logged = 0;
        for m in 0..mib {
            if !piece(name, m, &mut buf) {
                break;
            }
            for b in buf.chunks_exact(4096) {
                if !cas::chunk::is_zero_block(b) {
                    blocks += 1;
                    unique.insert(ChunkHash::of(b));
                }
            }
            image.write(m * MIB, &buf, false)?;
            logged += MIB;
            if logged >= quota / 2 {
                image.flush()?;
                store.compact_once(&image)?;
                logged = 0;
            }
        }
        image.flush()?;
        store.compact_once(&image)?;
    }
    let stored = store.chunk_stats().chunks;
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
    Ok((stored, unique.len() as u64, blocks))
}

fn loss_json(stored: u64, unique: u64, blocks: u64) -> serde_json::Value {
    serde_json::json!({
        "blocks": blocks,
        "unique_chunks": unique,
        "stored_chunks": stored,
        "dedup_loss_pct": (stored as f64 - unique as f64) / unique as f64 * 100.0,
    })
}

/// Data set (a): the compaction benchmark's 1 GiB (half duplicates).
fn loss_compaction_data(dir: &Path) -> cas::Result<serde_json::Value> {
    let mib = env_u64("BENCH_INDEX_COMPACTION_MIB", 1024);
    let blocks = mib * MIB / 4096;
    let mut piece = |_: &str, m: u64, buf: &mut [u8]| {
        for (k, b) in buf.chunks_exact_mut(4096).enumerate() {
            block_content(key_of(m * 256 + k as u64, blocks), b);
        }
        true
    };
    let (stored, unique, n) = stored_vs_unique(dir, &[("data", mib)], &mut piece)?;
    Ok(loss_json(stored, unique, n))
}

/// Data set (b): a tar of an OS file tree, written into two images.
fn loss_os_tree(dir: &Path) -> cas::Result<serde_json::Value> {
    let tree = std::env::var("BENCH_INDEX_TREE").unwrap_or_else(|_| "/usr/share".into());
    let cap_mib = env_u64("BENCH_INDEX_TREE_MIB", 1024);
    let tar_path = dir.with_extension("tar");
    let status = std::process::Command::new("tar")
        .args(["-cf"])
        .arg(&tar_path)
        .args(["--ignore-failed-read", "-C"])
        .arg(&tree)
        .arg(".")
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| cas::Error::io("tar", e))?;
    let len = std::fs::metadata(&tar_path).map_err(|e| cas::Error::io(&tar_path, e))?.len();
    if len == 0 {
        return Err(cas::Error::InvalidArgument(format!("tar of {tree} failed ({status})")));
    }
    let mib = len.div_ceil(MIB).min(cap_mib);
    let mut file = std::fs::File::open(&tar_path).map_err(|e| cas::Error::io(&tar_path, e))?;
    let mut current = String::new();
    let mut piece = |name: &str, m: u64, buf: &mut [u8]| {
        use std::io::Seek;
        if name != current {
            current = name.to_string();
        }
        buf.fill(0);
        file.seek(std::io::SeekFrom::Start(m * MIB)).expect("seek the tar");
        let mut got = 0;
        while got < buf.len() {
            match file.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) => panic!("reading the tar: {e}"),
            }
        }
        got > 0
    };
    let (stored, unique, n) = stored_vs_unique(dir, &[("copy-a", mib), ("copy-b", mib)], &mut piece)?;
    let _ = std::fs::remove_file(&tar_path);
    let mut v = loss_json(stored, unique, n);
    v["tree"] = serde_json::json!(tree);
    v["tar_mib"] = serde_json::json!(mib);
    Ok(v)
}

fn main() -> cas::Result<()> {
    let chunks = env_u64("BENCH_INDEX_CHUNKS", 64 << 20);
    let scratch = PathBuf::from("target/bench/index-data");
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some("--arm") {
        // As the daemon holds its memory (no THP; freed buffers unmapped).
        serve::process_memory::daemon_mode();
        let v = match args.next().as_deref() {
            Some("dedup") => dedup_arm(chunks, &scratch.join("dedup-arm")),
            Some("memory") => memory_arm(chunks),
            other => panic!("unknown arm {other:?}"),
        };
        println!("{v}");
        return Ok(());
    }
    let open_chunks = env_u64("BENCH_OPEN_CHUNKS", 16 << 20);
    eprintln!("bench index: read path");
    let read = read_path(&scratch.join("read"))?;
    eprintln!("bench index: dedup loss, compaction data");
    let loss_a = loss_compaction_data(&scratch.join("loss-a"))?;
    eprintln!("bench index: dedup loss, OS tree");
    let loss_b = loss_os_tree(&scratch.join("loss-b"))?;
    eprintln!("bench index: open of {open_chunks} chunks");
    let open = open_time(&scratch.join("open"), open_chunks)?;
    eprintln!("bench index: {chunks} hashes into the on-disk index");
    let dedup = run_arm("dedup");
    eprintln!("bench index: {chunks} hashes into the in-memory baseline");
    let memory = run_arm("memory");
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    let loss = f(&loss_a, "dedup_loss_pct").max(f(&loss_b, "dedup_loss_pct"));
    let mut report = serde_json::json!({
        "index": "on disk: sorted runs, a 4-byte-per-entry summary, slot bits (cas::dedup)",
        "ram_gib_per_tib_unique": dedup["ram_gib_per_tib_unique"],
        "dedup_loss_pct": loss,
        "dedup_loss": { "compaction_data": loss_a, "os_tree_two_images": loss_b },
        "insert_per_s": dedup["insert_per_s"],
        "lookup_per_s": dedup["lookup_per_s"],
        "insert_vs_baseline": f(&dedup, "insert_per_s") / f(&memory, "insert_per_s"),
        "dedup_arm": dedup,
        "baseline_in_memory": memory,
    });
    for part in [open, read] {
        report.as_object_mut().expect("an object").extend(part.as_object().expect("an object").clone());
    }
    let ram = f(&report, "ram_gib_per_tib_unique");
    let lookups = report["read_path_index_lookups"].as_u64().unwrap_or(u64::MAX);
    let chunk_reads = report["read_path_chunk_reads"].as_u64().unwrap_or(0);
    report["targets"] = serde_json::json!({
        "ram_gib_per_tib_unique <= 1.5": ram <= 1.5,
        "dedup_loss_pct <= 2": loss <= 2.0,
        "insert_per_s >= 0.5x baseline": f(&report, "insert_vs_baseline") >= 0.5,
        "read_path_index_lookups == 0": lookups == 0 && chunk_reads > 0,
    });
    let out = serde_json::to_string_pretty(&report).expect("json");
    std::fs::create_dir_all("target/bench").ok();
    std::fs::write("target/bench/index.json", &out).map_err(|e| cas::Error::io("target/bench", e))?;
    println!("{out}");
    Ok(())
}
