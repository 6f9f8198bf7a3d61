//! Micro-benchmark of compaction's storage half: the chunk store and the
//! manifest, on the real filesystem, single-threaded.
//!
//! Input: `BENCH_MIB` MiB (default 1024) of 4 KiB blocks in which half the
//! blocks duplicate earlier ones (as in the compaction benchmark), held in
//! memory. It measures, in one run:
//! - `blake3_4k_mib_s`: blake3 of the unique 4 KiB blocks, one core;
//! - `drain_mib_s`: hash every block, `insert_missing` in 4 MiB batches,
//!   `set_range` into the manifest, and every 64 MiB `sync` the chunks and
//!   commit the manifest (what a single-threaded compactor does after it
//!   has read the log);
//! - the time split between hashing, inserting, editing and committing,
//!   the cost of a manifest lookup and of a chunk read (mostly cache
//!   misses served from the page cache),
//!   the chunk store's bytes against the unique bytes, and the work
//!   counters per input MiB.
//!
//! Writes `target/bench/chunkstore.json` and prints it. This is not the
//! issue's `ci/bench compaction` (which reads a WAL); the keys that match
//! its keys mean the same.

use cas::chunk::{ChunkHash, ChunkRef, ChunkStore, ChunkStoreOptions, CHUNK_BYTES};
use cas::manifest::{Manifest, ManifestOptions};
use cas::storage::{FsStorage, Storage};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BATCH_BLOCKS: usize = 1024;
const COMMIT_EVERY_BLOCKS: u64 = 64 * 256;

fn fill(id: u64, out: &mut [u8]) {
    let mut x = id.wrapping_add(0x9E37_79B9).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for w in out.chunks_exact_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes());
    }
}

fn mib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
}

fn main() -> cas::Result<()> {
    let input_mib: u64 = std::env::var("BENCH_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(1024);
    let blocks = input_mib * 256;
    let unique = blocks / 2;
    // Unique contents, then the input order: even blocks are new content,
    // odd blocks repeat an earlier one.
    let mut pool = vec![0u8; unique as usize * CHUNK_BYTES];
    for (i, b) in pool.chunks_exact_mut(CHUNK_BYTES).enumerate() {
        fill(i as u64, b);
    }
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let order: Vec<u32> = (0..blocks)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i % 2 == 0 {
                (i / 2) as u32
            } else {
                (x % (i / 2 + 1)) as u32
            }
        })
        .collect();
    let block = |i: u64| &pool[order[i as usize] as usize * CHUNK_BYTES..][..CHUNK_BYTES];

    // blake3 of 4 KiB inputs, one core, same run.
    let t = Instant::now();
    let mut sink = 0u8;
    for b in pool.chunks_exact(CHUNK_BYTES) {
        sink ^= ChunkHash::of(b).as_bytes()[0];
    }
    let blake3_4k_mib_s = mib_s(pool.len() as u64, t.elapsed());

    let dir = PathBuf::from("target/bench/chunkstore-data");
    let storage: Arc<dyn Storage> = Arc::new(FsStorage::new());
    if storage.exists(&dir) {
        storage.remove_dir_all(&dir)?;
    }
    storage.create_dir_all(&dir.join("img"))?;
    let chunks = ChunkStore::open(storage.clone(), &dir.join("chunks"), ChunkStoreOptions::default())?;
    let manifest = Manifest::open(storage.clone(), &dir.join("img/manifest"), ManifestOptions::default())?;

    let (mut t_hash, mut t_insert, mut t_edit, mut t_commit) =
        (Duration::ZERO, Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let (mut pages, mut leaves, mut initialized, mut manifest_syncs) = (0u64, 0u64, 0u64, 0u64);
    let start = Instant::now();
    let mut first = 0u64;
    let mut covered = 0;
    let mut pin = chunks.pin();
    let mut edit = manifest.begin();
    let mut items: Vec<(ChunkHash, &[u8])> = Vec::with_capacity(BATCH_BLOCKS);
    let mut refs: Vec<ChunkRef> = Vec::with_capacity(BATCH_BLOCKS);
    let mut entries: Vec<Option<ChunkRef>> = Vec::with_capacity(BATCH_BLOCKS);
    while first < blocks {
        let n = (BATCH_BLOCKS as u64).min(blocks - first);
        let t = Instant::now();
        items.clear();
        entries.clear();
        for i in first..first + n {
            let b = block(i);
            let h = ChunkHash::of(b);
            items.push((h, b));
        }
        t_hash += t.elapsed();
        let t = Instant::now();
        chunks.insert_located(&pin, &items, &mut refs)?;
        t_insert += t.elapsed();
        let t = Instant::now();
        entries.extend(refs.iter().map(|&r| Some(r)));
        edit.set_range(first, &entries)?;
        t_edit += t.elapsed();
        first += n;
        if first.is_multiple_of(COMMIT_EVERY_BLOCKS) || first == blocks {
            let t = Instant::now();
            chunks.sync()?;
            covered += 1;
            let done = std::mem::replace(&mut edit, manifest.begin());
            let st = done.commit(covered)?;
            drop(std::mem::replace(&mut pin, chunks.pin()));
            t_commit += t.elapsed();
            pages += st.pages_written;
            leaves += st.leaf_pages_touched;
            initialized += st.bytes_initialized;
            manifest_syncs += st.syncs;
        }
    }
    drop(edit);
    drop(pin);
    let elapsed = start.elapsed();

    // Read-path costs: single-block lookups, then a chunk read through the
    // clean cache, over a strided sample of blocks.
    let sample: Vec<u64> = (0..blocks).step_by(7).collect();
    let t = Instant::now();
    let mut found = Vec::with_capacity(sample.len());
    for &b in &sample {
        found.push(manifest.lookup(b)?.expect("every block is mapped"));
    }
    let lookup_ns = t.elapsed().as_nanos() as f64 / sample.len() as f64;
    let mut out = vec![0u8; CHUNK_BYTES];
    let t = Instant::now();
    for h in &found {
        chunks.read_ref(h, &mut out)?;
    }
    let read_ns = t.elapsed().as_nanos() as f64 / found.len() as f64;
    let stats = chunks.stats();
    let input_bytes = blocks * CHUNK_BYTES as u64;
    let per_mib = |v: u64| v as f64 / input_mib as f64;
    let report = serde_json::json!({
        "input_mib": input_mib,
        "blake3_4k_mib_s": blake3_4k_mib_s,
        "drain_mib_s": mib_s(input_bytes, elapsed),
        "drain_over_blake3": mib_s(input_bytes, elapsed) / blake3_4k_mib_s,
        "hash_s": t_hash.as_secs_f64(),
        "insert_s": t_insert.as_secs_f64(),
        "edit_s": t_edit.as_secs_f64(),
        "sync_commit_s": t_commit.as_secs_f64(),
        "insert_mib_s": mib_s(input_bytes, t_insert),
        "stored_over_unique": stats.stored_bytes as f64 / (unique * CHUNK_BYTES as u64) as f64,
        "manifest_pages_per_input_mib": per_mib(pages),
        "distinct_leaf_pages_per_input_mib": per_mib(leaves),
        "initialized_bytes_per_input_mib": per_mib(initialized),
        "syncs_per_input_mib": per_mib(manifest_syncs + stats.syncs),
        "manifest_lookup_ns": lookup_ns,
        "chunk_read_ns": read_ns,
        "index_memory_bytes": stats.index_memory_bytes,
        "chunks": stats.chunks,
    });
    let out = serde_json::to_string_pretty(&report).expect("json");
    println!("{out}");
    std::fs::create_dir_all("target/bench").ok();
    std::fs::write("target/bench/chunkstore.json", &out).map_err(|e| cas::Error::io("target/bench", e))?;
    storage.remove_dir_all(&dir)?;
    std::hint::black_box(sink);
    Ok(())
}
