//! `ci/bench index`: what the chunk index costs (issue 17), written to
//! `target/bench/index.json` and printed.
//!
//! - `ram_gib_per_tib_unique`: resident bytes the index gains while
//!   `BENCH_INDEX_CHUNKS` (default 64 M) synthetic chunk hashes are
//!   inserted, per chunk, times the 2^28 chunks of a TiB of 4 KiB chunks;
//! - `insert_per_s`, `lookup_per_s` (hits, and misses of other hashes):
//!   over the same index, one thread;
//! - `open_ms`: `ChunkStore::open` of a synthetic store of
//!   `BENCH_OPEN_CHUNKS` (default 16 M) chunks (journal plus sparse packs);
//! - `read_path_index_lookups`: `ChunkStats::read_index_lookups` during a
//!   full read of an image compacted, partly rewritten and repacked by GC
//!   in the same run (FsStorage), beside the chunk reads it made and those
//!   that followed forward tables.
//!
//! The memory figure depends on where the tables stand in their doubling:
//! `table_load` (entries over buckets) says which. At 64 M chunks each
//! shard has just doubled (about 50% full: the worst case).
//!
//! The index measured is the one in use: the whole index in memory
//! (`cas::chunk::bench::IndexBench`, the store's own shards). The on-disk
//! index of issue 17's stage 2 does not exist yet, so there is no second
//! arm, and `dedup_loss_pct` is 0 by construction (exact dedup): reported
//! as null until there is an index that can lose dedup.

use cas::chunk::bench::{write_synthetic_store, IndexBench};
use cas::chunk::{ChunkHash, ChunkStore, ChunkStoreOptions};
use cas::storage::{FsStorage, Storage};
use cas::{Store, StoreOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

const TIB_CHUNKS: f64 = (1u64 << 28) as f64;
const GIB: f64 = (1u64 << 30) as f64;

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

/// Resident bytes of this process (VmRSS).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib << 10)
}

fn per_s(n: u64, since: Instant) -> f64 {
    n as f64 / since.elapsed().as_secs_f64()
}

fn memory_and_rates(chunks: u64) -> serde_json::Value {
    let before = rss_bytes();
    let mut index = IndexBench::default();
    let started = Instant::now();
    for i in 0..chunks {
        index.insert(&hash_of(i, 1), (i >> 14) as u32 + 1, (i & 0x3fff) as u32, i as u32);
    }
    let insert_per_s = per_s(chunks, started);
    let resident = rss_bytes().saturating_sub(before);
    let probes = chunks.min(4 << 20);
    let step = (chunks / probes).max(1);
    let started = Instant::now();
    let mut found = 0u64;
    for k in 0..probes {
        found += u64::from(index.get(&hash_of(k * step, 1).tag()).is_some());
    }
    let hits_per_s = per_s(probes, started);
    assert_eq!(found, probes, "every inserted hash is found");
    let started = Instant::now();
    for k in 0..probes {
        found += u64::from(index.get(&hash_of(k, 2).tag()).is_some());
    }
    let misses_per_s = per_s(probes, started);
    let bytes_per_chunk = resident as f64 / chunks as f64;
    serde_json::json!({
        "chunks_inserted": chunks,
        "resident_bytes": resident,
        "estimated_table_bytes": index.table_bytes(),
        "table_load": chunks as f64 / index.buckets() as f64,
        "ram_bytes_per_chunk": bytes_per_chunk,
        "ram_gib_per_tib_unique": bytes_per_chunk * TIB_CHUNKS / GIB,
        "insert_per_s": insert_per_s,
        "lookup_per_s": { "hits": hits_per_s, "misses": misses_per_s },
        "false_hits": found - probes,
    })
}

fn open_time(dir: &Path, chunks: u64) -> cas::Result<serde_json::Value> {
    let storage: Arc<dyn Storage> = Arc::new(FsStorage::new());
    let _ = std::fs::remove_dir_all(dir);
    let slots = ((ChunkStoreOptions::default().pack_bytes - cas::chunk::PACK_HEADER_BYTES) / 4096) as u32;
    let started = Instant::now();
    write_synthetic_store(storage.as_ref(), dir, chunks, slots, |i| hash_of(i, 3))?;
    let write_ms = started.elapsed().as_millis() as u64;
    let opts = ChunkStoreOptions { index_memory_budget_bytes: 8 << 30, ..ChunkStoreOptions::default() };
    let started = Instant::now();
    let store = ChunkStore::open(storage, dir, opts)?;
    let open_ms = started.elapsed().as_millis() as u64;
    let entries = store.len();
    drop(store);
    let _ = std::fs::remove_dir_all(dir);
    Ok(
        serde_json::json!({ "open_chunks": entries, "open_ms": open_ms, "synthetic_store_write_ms": write_ms }),
    )
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

fn main() -> cas::Result<()> {
    let chunks = env_u64("BENCH_INDEX_CHUNKS", 64 << 20);
    let open_chunks = env_u64("BENCH_OPEN_CHUNKS", 16 << 20);
    let scratch = PathBuf::from("target/bench/index-data");
    let read = read_path(&scratch.join("read"))?;
    let open = open_time(&scratch.join("open"), open_chunks)?;
    let mem = memory_and_rates(chunks);
    let mut report = serde_json::json!({
        "index": "in memory (the whole index; issue 17's on-disk index is not built yet)",
        "dedup_loss_pct": null,
    });
    for part in [mem, open, read] {
        report.as_object_mut().expect("an object").extend(part.as_object().expect("an object").clone());
    }
    let ram = report["ram_gib_per_tib_unique"].as_f64().unwrap_or(f64::NAN);
    let lookups = report["read_path_index_lookups"].as_u64().unwrap_or(u64::MAX);
    let chunk_reads = report["read_path_chunk_reads"].as_u64().unwrap_or(0);
    report["targets"] = serde_json::json!({
        "ram_gib_per_tib_unique <= 1.5": ram <= 1.5,
        "read_path_index_lookups == 0": lookups == 0 && chunk_reads > 0,
    });
    let out = serde_json::to_string_pretty(&report).expect("json");
    std::fs::create_dir_all("target/bench").ok();
    std::fs::write("target/bench/index.json", &out).map_err(|e| cas::Error::io("target/bench", e))?;
    println!("{out}");
    Ok(())
}
