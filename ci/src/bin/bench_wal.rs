//! `ci/bench wal`: the WAL against raw file writes on the same filesystem.
//!
//! In one run:
//! 1. 1 MiB sequential writes into an image's WAL vs 1 MiB sequential
//!    writes to a plain file in the same directory (both end with one
//!    fdatasync / FLUSH, both timed to the end of it); three rounds each,
//!    alternating which goes first, best of each kept;
//! 2. 4 KiB random reads served from the overlay (the WAL just written),
//!    with random 4 KiB preads of the plain file as the baseline;
//! 3. FLUSH from 64 concurrent flushers, each writing 4 KiB then flushing;
//!    baseline: one fdatasync per flush, and its mean latency here.
//!
//! Writes `target/bench/wal.json`. Targets: `write_ratio >= 0.8`,
//! `syncs_per_flush <= 0.125`; exits 1 if either is missed.
//! `CAS_BENCH_WAL_MIB` sets the bytes written per round (default 512).

use cas::storage::{FsStorage, OpenMode, Storage, StorageFile};
use cas::{Image, Store, StoreOptions};
use casblk_ci::{filesystem_of, secs, write_results, Scratch, XorShift};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

const MIB: u64 = 1 << 20;
const FLUSHERS: u64 = 64;
const FLUSHES_PER_FLUSHER: u64 = 40;
const READS: u64 = 200_000;
/// Write rounds (raw and WAL each); the best of each is kept.
const ROUNDS: usize = 3;

fn chunk(i: u64) -> Vec<u8> {
    vec![(i % 251) as u8 + 1; MIB as usize]
}

/// Sequential 1 MiB writes to a plain file, then one fdatasync: MiB/s.
fn raw_write(storage: &dyn Storage, path: &Path, total_mib: u64) -> (f64, Arc<dyn StorageFile>) {
    let data: Vec<Vec<u8>> = (0..4).map(chunk).collect();
    let f = storage.open(path, OpenMode::CreateNew).expect("create raw file");
    let t = Instant::now();
    for i in 0..total_mib {
        f.write_all_at(&data[(i % 4) as usize], i * MIB).expect("raw write");
    }
    let w = secs(t);
    f.sync_data().expect("raw sync");
    println!("    raw: writes {w:.3} s, sync {:.3} s", secs(t) - w);
    (total_mib as f64 / secs(t), f)
}

/// Sequential 1 MiB image writes, then one FLUSH: MiB/s.
fn wal_write(store: &Store, name: &str, total_mib: u64) -> (f64, Arc<Image>) {
    let data: Vec<Vec<u8>> = (0..4).map(chunk).collect();
    store.create_image(name, total_mib * MIB).expect("create image");
    let image = store.open_image(name).expect("open image");
    let t = Instant::now();
    for i in 0..total_mib {
        image.write(i * MIB, &data[(i % 4) as usize], false).expect("wal write");
    }
    let w = secs(t);
    image.flush().expect("flush");
    println!("    wal: writes {w:.3} s, flush {:.3} s", secs(t) - w);
    (total_mib as f64 / secs(t), image)
}

/// Random 4 KiB reads through `read`, checking each against the pattern.
fn random_reads(total_mib: u64, mut read: impl FnMut(u64, &mut [u8])) -> f64 {
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let mut buf = vec![0u8; 4096];
    let blocks = total_mib * MIB / 4096;
    let t = Instant::now();
    for _ in 0..READS {
        let block = rng.next_u64() % blocks;
        read(block * 4096, &mut buf);
        let want = ((block * 4096 / MIB) % 4 % 251) as u8 + 1;
        assert!(buf.iter().all(|&b| b == want), "read of block {block} returned wrong data");
    }
    READS as f64 / secs(t)
}

/// Mean fdatasync latency after a 4 KiB write, in µs (the flush baseline).
fn fdatasync_us(storage: &dyn Storage, path: &Path) -> f64 {
    let f = storage.open(path, OpenMode::CreateNew).expect("create sync file");
    let block = [7u8; 4096];
    let n = 200u64;
    let t = Instant::now();
    for i in 0..n {
        f.write_all_at(&block, (i % 64) * 4096).expect("write");
        f.sync_data().expect("sync");
    }
    secs(t) * 1e6 / n as f64
}

fn concurrent_flushes(store: &Store) -> (u64, u64, u64, f64) {
    let size = FLUSHERS * FLUSHES_PER_FLUSHER * 4096;
    store.create_image("flush", size).expect("create flush image");
    let image = store.open_image("flush").expect("open flush image");
    let before = image.stats();
    let t = Instant::now();
    let threads: Vec<_> = (0..FLUSHERS)
        .map(|th| {
            let image = image.clone();
            std::thread::spawn(move || {
                let block = vec![th as u8; 4096];
                for i in 0..FLUSHES_PER_FLUSHER {
                    image.write((th * FLUSHES_PER_FLUSHER + i) * 4096, &block, false).expect("write");
                    image.flush().expect("flush");
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().expect("flusher"));
    let elapsed = secs(t);
    let after = image.stats();
    let flushes = after.flushes - before.flushes;
    (flushes, after.syncs - before.syncs, after.sync_rounds - before.sync_rounds, flushes as f64 / elapsed)
}

fn main() {
    let total_mib: u64 = std::env::var("CAS_BENCH_WAL_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(512);
    let scratch = Scratch::new("wal");
    let fs_type = filesystem_of(&scratch.0);
    println!("bench wal: {total_mib} MiB per round in {} ({fs_type})", scratch.0.display());
    let fs = FsStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(fs.clone());
    let opts = StoreOptions {
        log_quota_bytes: (total_mib * MIB * 2).max(64 * MIB).div_ceil(8 * MIB) * 8 * MIB,
        // The WAL alone: no compaction competing for the CPU and the disk.
        background_compaction: false,
        gc_auto: cas::gc::AutoGcOptions::off(),
        ..StoreOptions::default()
    };
    let store = Store::create(storage, &scratch.0.join("store"), opts).expect("create store");

    let (mut raw_runs, mut wal_runs) = (Vec::new(), Vec::new());
    let mut raw_file = None;
    let mut wal_image = None;
    for round in 0..ROUNDS {
        // Alternate which goes first, so neither always inherits the
        // other's writeback.
        let raw_path = scratch.0.join(format!("raw{round}"));
        let (raw, f, wal, image) = if round % 2 == 0 {
            let (raw, f) = raw_write(&fs, &raw_path, total_mib);
            let (wal, image) = wal_write(&store, &format!("seq{round}"), total_mib);
            (raw, f, wal, image)
        } else {
            let (wal, image) = wal_write(&store, &format!("seq{round}"), total_mib);
            let (raw, f) = raw_write(&fs, &raw_path, total_mib);
            (raw, f, wal, image)
        };
        println!("  round {round}: raw {raw:.0} MiB/s, wal {wal:.0} MiB/s");
        raw_runs.push(raw);
        wal_runs.push(wal);
        if let Some(old) = wal_image.replace(image) {
            let name = old.name().to_string();
            drop(old);
            store.remove_image(&name).expect("remove image");
        }
        if let Some(old) = raw_file.replace(f) {
            drop(old);
            let prev = scratch.0.join(format!("raw{}", round - 1));
            fs.remove_file(&prev).expect("remove raw file");
        }
    }
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let (raw_mib_s, wal_mib_s) = (best(&raw_runs), best(&wal_runs));
    let write_ratio = wal_mib_s / raw_mib_s;

    let image = wal_image.expect("an image was written");
    let overlay_read_iops = random_reads(total_mib, |off, buf| image.read(off, buf).expect("overlay read"));
    let raw_file = raw_file.expect("a raw file was written");
    let raw_read_iops =
        random_reads(total_mib, |off, buf| raw_file.read_exact_at(buf, off).expect("raw read"));
    let overlay_extents = image.stats().overlay_extents;
    drop(image);

    let sync_us = fdatasync_us(&fs, &scratch.0.join("syncprobe"));
    let (flushes, syncs, sync_rounds, flush_rate) = concurrent_flushes(&store);
    let syncs_per_flush = syncs as f64 / flushes as f64;

    let write_ok = write_ratio >= 0.8;
    let flush_ok = syncs_per_flush <= 0.125;
    println!("1 MiB sequential writes:   wal {wal_mib_s:.0} MiB/s vs raw file {raw_mib_s:.0} MiB/s (baseline): ratio {write_ratio:.3} (target >= 0.8: {})", if write_ok { "met" } else { "MISSED" });
    println!("4 KiB random reads:        overlay {overlay_read_iops:.0} IOPS vs raw pread {raw_read_iops:.0} IOPS (baseline), {overlay_extents} extents");
    println!("FLUSH, {FLUSHERS} flushers:        {flushes} flushes, {syncs} syncs in {sync_rounds} rounds: {syncs_per_flush:.4} syncs/flush (baseline 1.0 without group commit; target <= 0.125: {}), {flush_rate:.0} flushes/s, fdatasync {sync_us:.0} us mean", if flush_ok { "met" } else { "MISSED" });

    let results = json!({
        "wal_write_mib_s": wal_mib_s,
        "raw_write_mib_s": raw_mib_s,
        "write_ratio": write_ratio,
        "overlay_read_iops": overlay_read_iops,
        "flushes": flushes,
        "syncs": syncs,
        "syncs_per_flush": syncs_per_flush,
        "raw_read_iops": raw_read_iops,
        "sync_rounds": sync_rounds,
        "flush_threads": FLUSHERS,
        "flushes_per_s": flush_rate,
        "fdatasync_us_mean": sync_us,
        "write_mib_per_round": total_mib,
        "wal_write_mib_s_runs": wal_runs,
        "raw_write_mib_s_runs": raw_runs,
        "filesystem": fs_type,
        "targets": { "write_ratio_min": 0.8, "syncs_per_flush_max": 0.125, "met": write_ok && flush_ok },
    });
    let path = write_results("wal", &results);
    println!("wrote {}", path.display());
    // Exiting below skips destructors: remove the scratch data first.
    drop(scratch);
    if !(write_ok && flush_ok) {
        std::process::exit(1);
    }
}
