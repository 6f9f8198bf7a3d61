//! `ci/bench compaction`: drain 1 GiB of logged writes, half of whose
//! blocks duplicate others, into chunks and the manifest.
//!
//! In one run:
//! 1. the baseline: single-core blake3 over 4 KiB inputs (best of 3);
//! 2. per round (3 by default, each on a fresh store on the build's disk,
//!    `FsStorage` under target/bench): 1 MiB sequential writes of 1 GiB
//!    into one image's log, FLUSH, then one timed `Store::compact_once`
//!    (read, hash, insert, chunk sync, manifest commits, log reclamation:
//!    everything until the log is free again), then a read-back check.
//!
//! Block `i`'s content is key(i): even blocks `i / 2` (all distinct), odd
//! blocks a scattered earlier or later even block's key, so the unique
//! bytes are exactly half the input. Reports the best round's drain rate
//! and all rounds; work counters per input MiB from the same round.
//!
//! Then write amplification, on a store of its own whose storage counts
//! the bytes written to its files by class (log, packs, index, manifest):
//! `CAS_BENCH_WRITE_AMP_MIB` (default 256) of all-new blocks written and
//! compacted into one image, then the same blocks into a second image
//! (every block a duplicate). Bytes written per logical byte are
//! `write_amp_unique` and `write_amp_duplicate`, split by class in
//! `write_amp_split`, with /proc/self/io's `write_bytes` beside them as a
//! check that nothing bypassed the storage layer.
//!
//! Writes `target/bench/compaction.json`. Targets: `drain_mib_s >= 0.5 *
//! blake3_4k_mib_s`, `stored_over_unique <= 1.02`, manifest pages written
//! within 1.1x of the leaf pages the commits touched, write amplification
//! at most 2.15 (unique) and 1.15 (duplicate); exits 1 if missed.
//! `CAS_BENCH_COMPACTION_MIB` (default 1024), `..._ROUNDS` (default 3) and
//! `..._THREADS` (the store's `compaction_threads` in the main rounds,
//! default 3; the drain with 1 and 2 threads is measured beside them,
//! `drain_2_threads_over_1`, target >= 1.6 on this 2-core machine, printed
//! and recorded, not yet an exit condition) and
//! `..._BATCH_MIB` (its `compaction_batch_bytes`, default the store's).

use cas::storage::{FsStorage, Storage};
use cas::{CompactReport, Store, StoreOptions};
use casblk_ci::compaction_data::{block_content, key_of};
use casblk_ci::counting_storage::{CountingStorage, FileClass};
use casblk_ci::{filesystem_of, secs, write_results, Scratch};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

const MIB: u64 = 1 << 20;
const BLOCK: usize = 4096;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Single-core blake3 over distinct 4 KiB blocks of a 64 MiB buffer: MiB/s.
fn blake3_4k_mib_s() -> f64 {
    let mut buf = vec![0u8; 64 << 20];
    for (i, b) in buf.chunks_mut(BLOCK).enumerate() {
        block_content(i as u64 + 7, b);
    }
    let mut best: f64 = 0.0;
    let mut sink = 0u8;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..4 {
            for b in buf.chunks(BLOCK) {
                sink ^= cas::chunk::ChunkHash::of(b).as_bytes()[0];
            }
        }
        best = best.max(256.0 / secs(t));
    }
    std::hint::black_box(sink);
    best
}

struct Round {
    drain_mib_s: f64,
    write_mib_s: f64,
    secs: f64,
    stored_bytes: u64,
    report: CompactReport,
}

/// Writes `mib` MiB into `image` from offset 0 in 1 MiB writes, block `i`
/// holding the content named `key(i)`, then FLUSHes.
fn write_blocks(image: &cas::Image, mib: u64, key: impl Fn(u64) -> u64) {
    let per_mib = MIB / BLOCK as u64;
    let mut buf = vec![0u8; MIB as usize];
    for m in 0..mib {
        for (k, b) in buf.chunks_mut(BLOCK).enumerate() {
            block_content(key(m * per_mib + k as u64), b);
        }
        image.write(m * MIB, &buf, false).expect("write");
    }
    image.flush().expect("flush");
}

fn round(storage: &Arc<dyn Storage>, dir: &std::path::Path, total_mib: u64, threads: u64) -> Round {
    let opts = StoreOptions {
        log_quota_bytes: (total_mib + 256) * MIB,
        background_compaction: false,
        gc_auto: cas::gc::AutoGcOptions::off(),
        compaction_threads: threads,
        compaction_batch_bytes: env(
            "CAS_BENCH_COMPACTION_BATCH_MIB",
            StoreOptions::default().compaction_batch_bytes / MIB,
        ) * MIB,
        ..StoreOptions::default()
    };
    let store = Store::create(storage.clone(), dir, opts).expect("create store");
    store.create_image("bench", total_mib * MIB).expect("create image");
    let image = store.open_image("bench").expect("open image");
    let blocks = total_mib * MIB / BLOCK as u64;
    let t = Instant::now();
    write_blocks(&image, total_mib, |i| key_of(i, blocks));
    let write_mib_s = total_mib as f64 / secs(t);

    let t = Instant::now();
    let report = store.compact_once(&image).expect("compaction");
    let elapsed = secs(t);
    assert_eq!(report.covered_after, image.durable_seq(), "the whole durable log was compacted");
    assert_eq!(image.stats().log_segments, 1, "the covered log was reclaimed");

    // Check a sample of blocks from the chunks.
    let (mut want, mut got) = (vec![0u8; BLOCK], vec![0u8; BLOCK]);
    for i in (0..blocks).step_by(1021) {
        block_content(key_of(i, blocks), &mut want);
        image.read(i * BLOCK as u64, &mut got).expect("read back");
        assert!(got == want, "block {i} reads back wrong after compaction");
    }
    let stored_bytes = store.chunk_stats().stored_bytes;
    Round { drain_mib_s: total_mib as f64 / elapsed, write_mib_s, secs: elapsed, stored_bytes, report }
}

/// Bytes written to the store's files, by class, while `mib` MiB of
/// 1 MiB writes went into a fresh image and were compacted (log write,
/// FLUSH, one `compact_once`), and the process's `write_bytes` from
/// /proc/self/io over the same span.
struct Amp {
    by_class: [u64; 5],
    proc_write_bytes: u64,
}

fn proc_write_bytes() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").expect("read /proc/self/io");
    io.lines().find_map(|l| l.strip_prefix("write_bytes: ")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// Writes `mib` MiB to image `name` (blocks `first_key..`, all distinct),
/// flushes and compacts it; what that wrote.
fn amp_phase(store: &Store, counting: &CountingStorage, name: &str, mib: u64, first_key: u64) -> Amp {
    store.create_image(name, mib * MIB).expect("create image");
    let image = store.open_image(name).expect("open image");
    let (before, proc_before) = (counting.written.snapshot(), proc_write_bytes());
    write_blocks(&image, mib, |i| first_key + i);
    let report = store.compact_once(&image).expect("compaction");
    assert_eq!(report.covered_after, image.durable_seq(), "the whole durable log was compacted");
    let after = counting.written.snapshot();
    Amp {
        by_class: std::array::from_fn(|i| after[i] - before[i]),
        proc_write_bytes: proc_write_bytes() - proc_before,
    }
}

/// Write amplification on a store of its own: unique data (every block
/// new), then the same data again into a second image (every block a
/// duplicate of a stored chunk).
fn write_amp(dir: &std::path::Path, mib: u64) -> (Amp, Amp) {
    let counting = Arc::new(CountingStorage::new(Arc::new(FsStorage::new())));
    let opts = StoreOptions {
        log_quota_bytes: (mib + 256) * MIB,
        background_compaction: false,
        gc_auto: cas::gc::AutoGcOptions::off(),
        ..StoreOptions::default()
    };
    let storage: Arc<dyn Storage> = counting.clone();
    let store = Store::create(storage, dir, opts).expect("create store");
    let unique = amp_phase(&store, &counting, "unique", mib, 1 << 40);
    let duplicate = amp_phase(&store, &counting, "duplicate", mib, 1 << 40);
    (unique, duplicate)
}

fn main() {
    let total_mib = env("CAS_BENCH_COMPACTION_MIB", 1024);
    let rounds = env("CAS_BENCH_COMPACTION_ROUNDS", 3).max(1);
    let threads = env("CAS_BENCH_COMPACTION_THREADS", 3);
    let scratch = Scratch::new("compaction");
    let fs_type = filesystem_of(&scratch.0);
    println!("bench compaction: {total_mib} MiB of logged 1 MiB writes, half the blocks duplicates, in {} ({fs_type})", scratch.0.display());
    let blake3 = blake3_4k_mib_s();
    println!("  baseline: blake3 of 4 KiB inputs on one core: {blake3:.0} MiB/s");
    let storage: Arc<dyn Storage> = Arc::new(FsStorage::new());
    let mut all = Vec::new();
    for r in 0..rounds {
        let dir = scratch.0.join(format!("store{r}"));
        let res = round(&storage, &dir, total_mib, threads);
        println!(
            "  round {r}: wrote the log at {:.0} MiB/s; compaction drained it in {:.3} s: {:.0} MiB/s (hash {:.2} s, insert {:.2} s, commit {:.2} s on their threads)",
            res.write_mib_s,
            res.secs,
            res.drain_mib_s,
            res.report.work.hash_ns as f64 / 1e9,
            res.report.work.insert_ns as f64 / 1e9,
            res.report.work.commit_ns as f64 / 1e9
        );
        std::fs::remove_dir_all(&dir).expect("remove the round's store");
        all.push(res);
    }
    // Queues that scale (issue 50): the drain with one and two threads per
    // pass, best of the same number of rounds, in this run.
    let mut drain_by_threads = serde_json::Map::new();
    for t in [1u64, 2] {
        let best = (0..rounds)
            .map(|r| {
                let dir = scratch.0.join(format!("store-t{t}-{r}"));
                let res = round(&storage, &dir, total_mib, t);
                std::fs::remove_dir_all(&dir).expect("remove the round's store");
                res.drain_mib_s
            })
            .fold(0.0, f64::max);
        println!("  {t} compaction thread(s): drained at {best:.0} MiB/s (best of {rounds})");
        drain_by_threads.insert(t.to_string(), json!(best));
    }
    let drain_of = |t: &str| drain_by_threads[t].as_f64().unwrap_or(0.0);
    let two_over_one = drain_of("2") / drain_of("1");
    let amp_mib = env("CAS_BENCH_WRITE_AMP_MIB", 256);
    let amp_dir = scratch.0.join("write-amp");
    let (unique, duplicate) = write_amp(&amp_dir, amp_mib);
    std::fs::remove_dir_all(&amp_dir).expect("remove the write amplification store");
    let logical = (amp_mib * MIB) as f64;
    let split = |a: &Amp| {
        FileClass::ALL
            .iter()
            .map(|c| (c.name().to_owned(), json!(a.by_class[*c as usize] as f64 / logical)))
            .collect::<serde_json::Map<_, _>>()
    };
    let total = |a: &Amp| a.by_class.iter().sum::<u64>() as f64;
    let (amp_unique, amp_duplicate) = (total(&unique) / logical, total(&duplicate) / logical);
    // The storage layer's count is the figure; /proc/self/io checks that
    // nothing wrote past it (within 5%: the filesystem's own metadata).
    let proc_ok =
        [&unique, &duplicate].iter().all(|a| (a.proc_write_bytes as f64 - total(a)).abs() <= 0.05 * total(a));
    if !proc_ok {
        println!(
            "write amplification: /proc/self/io disagrees with the storage layer's count by more than 5%"
        );
    }
    let amp_unique_ok = amp_unique <= 2.15 && proc_ok;
    let amp_duplicate_ok = amp_duplicate <= 1.15 && proc_ok;
    let best = all.iter().max_by(|a, b| a.drain_mib_s.total_cmp(&b.drain_mib_s)).expect("a round");
    let w = &best.report.work;
    let input_mib = w.input_bytes as f64 / MIB as f64;
    let unique_bytes = total_mib * MIB / 2;
    let stored_over_unique = best.stored_bytes as f64 / unique_bytes as f64;
    let dedup_ratio = w.input_bytes as f64 / w.chunk_bytes_written.max(1) as f64;
    let pages = w.manifest_pages_written as f64 / input_mib;
    // Leaves each commit edited, summed over the commits (a leaf a batch
    // boundary splits counts twice), and the image's distinct leaves.
    let leaves = w.manifest_leaf_pages_touched as f64 / input_mib;
    let image_leaves =
        (total_mib * MIB / BLOCK as u64).div_ceil(cas::manifest::LEAF_ENTRIES as u64) as f64 / input_mib;
    let init = w.bytes_initialized as f64 / input_mib;
    let syncs = w.syncs as f64 / input_mib;
    let reads = w.background_reads as f64 / input_mib;
    let drain_ok = best.drain_mib_s >= 0.5 * blake3;
    let dedup_ok = stored_over_unique <= 1.02;
    let pages_ok = w.manifest_pages_written as f64 <= 1.1 * w.manifest_leaf_pages_touched as f64;
    let met = |ok: bool| if ok { "met" } else { "MISSED" };
    println!(
        "drain:   {:.0} MiB/s (best of {rounds}) vs blake3 4 KiB {blake3:.0} MiB/s (baseline): {:.2}x (target >= 0.5x: {})",
        best.drain_mib_s,
        best.drain_mib_s / blake3,
        met(drain_ok)
    );
    println!(
        "dedup:   stored {} bytes for {unique_bytes} unique bytes: {stored_over_unique:.4} (target <= 1.02: {}); input/written {dedup_ratio:.2}",
        best.stored_bytes,
        met(dedup_ok)
    );
    println!(
        "per input MiB: manifest pages {pages:.3} vs distinct leaf pages {leaves:.3} per commit ({:.3}x, target <= 1.1x: {}; {image_leaves:.3} distinct in the image: {:.3}x), initialised {:.3} MiB, background reads {reads:.2}, syncs {syncs:.3}",
        pages / leaves,
        met(pages_ok),
        pages / image_leaves,
        init / MIB as f64
    );
    for (what, a, amp, ok, max) in [
        ("unique", &unique, amp_unique, amp_unique_ok, 2.15),
        ("duplicate", &duplicate, amp_duplicate, amp_duplicate_ok, 1.15),
    ] {
        let parts: Vec<String> = FileClass::ALL
            .iter()
            .map(|c| format!("{} {:.3}", c.name(), a.by_class[*c as usize] as f64 / logical))
            .collect();
        println!(
            "write amplification, {what} data ({amp_mib} MiB): {amp:.3} bytes to the store per byte written (target <= {max}: {}): {}; /proc/self/io write_bytes {:.3}",
            met(ok),
            parts.join(", "),
            a.proc_write_bytes as f64 / logical
        );
    }
    println!(
        "threads: 2 threads drain {two_over_one:.2}x one (target >= 1.6x: {}); {threads} (this run's setting) {:.2}x",
        met(two_over_one >= 1.6),
        best.drain_mib_s / drain_of("1")
    );
    let results = json!({
        "drain_mib_s_by_threads": drain_by_threads,
        "drain_2_threads_over_1": two_over_one,
        "compaction_threads": threads,
        "write_amp_unique": amp_unique,
        "write_amp_duplicate": amp_duplicate,
        "write_amp_split": {"unique": split(&unique), "duplicate": split(&duplicate)},
        "write_amp_proc_io": {
            "unique": unique.proc_write_bytes as f64 / logical,
            "duplicate": duplicate.proc_write_bytes as f64 / logical,
        },
        "write_amp_mib": amp_mib,
        "drain_mib_s": best.drain_mib_s,
        "blake3_4k_mib_s": blake3,
        "stored_over_unique": stored_over_unique,
        "manifest_pages_per_input_mib": pages,
        "distinct_leaf_pages_per_input_mib": leaves,
        "initialized_bytes_per_input_mib": init,
        "syncs_per_input_mib": syncs,
        "background_reads_per_input_mib": reads,
        "initialized_mib_per_input_mib": init / MIB as f64,
        "image_leaf_pages_per_input_mib": image_leaves,
        "dedup_ratio": dedup_ratio,
        "stored_bytes": best.stored_bytes,
        "unique_bytes": unique_bytes,
        "input_mib": input_mib,
        "drain_over_blake3": best.drain_mib_s / blake3,
        "drain_mib_s_rounds": all.iter().map(|r| r.drain_mib_s).collect::<Vec<_>>(),
        "log_write_mib_s_rounds": all.iter().map(|r| r.write_mib_s).collect::<Vec<_>>(),
        "work": best.report.work,
        "filesystem": fs_type,
        "targets": {
            "drain_over_blake3_min": 0.5,
            "stored_over_unique_max": 1.02,
            "manifest_pages_over_leaf_pages_max": 1.1,
            "write_amp_unique_max": 2.15,
            "write_amp_duplicate_max": 1.15,
            "drain_2_threads_over_1_min": 1.6,
            "met": drain_ok && dedup_ok && pages_ok && amp_unique_ok && amp_duplicate_ok,
        },
    });
    let path = write_results("compaction", &results);
    println!("wrote {}", path.display());
    // Exiting below skips destructors: remove the scratch data first.
    drop(scratch);
    if !(drain_ok && dedup_ok && pages_ok && amp_unique_ok && amp_duplicate_ok) {
        std::process::exit(1);
    }
}
