//! Chunk store crash and fault tests.
//!
//! A sequence of inserts and syncs (spanning several packs, index flushes
//! and a merge of index runs) is cut after every possible number of storage operations,
//! with both crash modes. After reopening, every chunk whose `sync`
//! returned is present and correct, and every index entry reads back with
//! a valid checksum and hash (no entry to lost or garbage bytes).
//! EIO / ENOSPC on each kind of operation gives an error, never damage.

mod chunk_support;

use cas::chunk::{ChunkHash, ChunkStore, ChunkStoreOptions, CHUNK_BYTES, PACK_HEADER_BYTES};
use cas::storage::{CrashMode, Fault, FaultOp, MemStorage, Storage};
use cas::Error;
use chunk_support::{block, block_hash, crash_at_every_op, crashing, Cuts};
use std::path::Path;
use std::sync::Arc;

fn opts() -> ChunkStoreOptions {
    ChunkStoreOptions {
        pack_bytes: PACK_HEADER_BYTES + 8 * CHUNK_BYTES as u64,
        index_checkpoint_min_bytes: 2048,
        ..Default::default()
    }
}

fn open(storage: Arc<dyn Storage>) -> cas::Result<ChunkStore> {
    ChunkStore::open(storage, Path::new("/s/chunks"), opts())
}

/// Merges of index runs in line, so that the storage operations come in
/// one order and every cut point is reached.
fn open_in_line(storage: Arc<dyn Storage>) -> cas::Result<ChunkStore> {
    ChunkStore::open(
        storage,
        Path::new("/s/chunks"),
        ChunkStoreOptions { index_merge_in_background: false, ..opts() },
    )
}

fn insert(c: &ChunkStore, ids: std::ops::Range<u64>) -> cas::Result<()> {
    let blocks: Vec<Vec<u8>> = ids.clone().map(block).collect();
    let items: Vec<(ChunkHash, &[u8])> = ids.zip(&blocks).map(|(id, b)| (block_hash(id), &b[..])).collect();
    c.insert_missing(&c.pin(), &items).map(|_| ())
}

/// Chunks the workload writes (the last 10 never synced).
const TOTAL: u64 = 84;

/// The workload: batches of inserts, each followed by a sync; returns the
/// ids acknowledged durable (sync returned) before the first failure.
/// Enough syncs for more than `FAN_IN` (8) index flushes, so runs merge.
fn workload(c: &ChunkStore, acked: &mut Vec<u64>) -> cas::Result<()> {
    let batches = [0..5, 5..20, 3..30, 30..31, 31..32, 32..33, 33..50];
    let singles = (50..TOTAL - 10).map(|i| i..i + 1);
    for ids in batches.into_iter().chain(singles) {
        insert(c, ids.clone())?;
        c.sync()?;
        acked.extend(ids);
    }
    insert(c, TOTAL - 10..TOTAL) // never synced
}

#[test]
fn crash_at_every_point_keeps_what_sync_acknowledged() {
    crash_at_every_point(open_in_line);
}

/// The same with merges on their own thread: the cut points fall wherever
/// that thread's operations interleave with the syncs'; whatever the order,
/// nothing acknowledged is lost.
#[test]
fn crash_at_every_point_with_background_merges() {
    crash_at_every_point(open);
}

fn crash_at_every_point(open: fn(Arc<dyn Storage>) -> cas::Result<ChunkStore>) {
    // The workload includes a journal checkpoint: without one, its 7
    // batches (512 bytes at least each) and header would exceed 4096 bytes.
    let c = open(Arc::new(MemStorage::new())).unwrap();
    workload(&c, &mut Vec::new()).unwrap();
    assert!(c.stats().index_journal_bytes < 4096, "no flush in the workload");
    // The workload's merge is installed by a later sync, in either mode.
    for extra in 0..100 {
        if c.stats().index_merges >= 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        insert(&c, 1000 + extra..1001 + extra).unwrap();
        c.sync().unwrap();
    }
    assert!(c.stats().index_merges >= 1, "no merge installed: {:?}", c.stats());
    drop(c);
    let c = open_in_line(Arc::new(MemStorage::new())).unwrap();
    workload(&c, &mut Vec::new()).unwrap();
    let st = c.stats();
    assert!(st.index_merges >= 1 && st.index_runs < 8, "no merge of runs in the workload: {st:?}");
    drop(c);
    let budget = crash_at_every_op(Cuts::every(5000), |budget, mode| {
        let mem = MemStorage::new();
        let (storage, ctl) = crashing(&mem, budget);
        let mut acked = Vec::new();
        // The store is dropped (a running merge joined) before `died`.
        let result = open(storage).and_then(|c| workload(&c, &mut acked));
        if !ctl.died() {
            result.unwrap();
            return true;
        }
        mem.crash(mode);
        let what = format!("crash after {budget} ops ({mode:?})");
        let c = open(Arc::new(mem.clone())).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
        let n = c.verify(true).unwrap_or_else(|e| panic!("{what}: {e}"));
        let mut out = vec![0u8; CHUNK_BYTES];
        for &id in &acked {
            c.read(&block_hash(id), &mut out).unwrap_or_else(|e| panic!("{what}: acked chunk {id}: {e}"));
            assert_eq!(out, block(id), "{what}");
        }
        assert!(n <= TOTAL, "{what}");
        // The store carries on, and finds every chunk it has by dedup.
        let before = c.len();
        insert(&c, 0..TOTAL).unwrap();
        c.sync().unwrap();
        assert_eq!(c.verify(true).unwrap(), TOTAL, "{what}");
        assert_eq!(c.len() - before, TOTAL - n, "{what}: a stored chunk was stored again");
        false
    });
    assert!(budget > 20, "the workload took only {budget} operations");
}

fn fault(op: FaultOp, path: &str, errno: i32, skip: u64) -> Fault {
    Fault { op, path_contains: Some(path.into()), skip, errno, sticky: false }
}

#[test]
fn enospc_on_pack_writes_is_an_error_and_the_store_carries_on() {
    let mem = MemStorage::new();
    let c = open(Arc::new(mem.clone())).unwrap();
    insert(&c, 0..4).unwrap();
    c.sync().unwrap();
    for (op, skip) in [(FaultOp::Write, 0), (FaultOp::Write, 1), (FaultOp::Open, 0)] {
        mem.inject(fault(op, "pack", libc::ENOSPC, skip));
        // 4..20 spans a pack rotation (8 slots per pack).
        let e = insert(&c, 4..20).unwrap_err();
        assert!(e.is_no_space(), "{op:?}: {e}");
        mem.clear_faults();
        assert!(c.verify(true).is_ok());
    }
    insert(&c, 4..20).unwrap();
    c.sync().unwrap();
    mem.crash(CrashMode::LoseUnsynced);
    let c = open(Arc::new(mem.clone())).unwrap();
    assert_eq!(c.verify(true).unwrap(), 20);
}

#[test]
fn eio_on_sync_or_journal_poisons_and_reopen_is_consistent() {
    for (op, path) in [
        (FaultOp::Sync, "pack"),
        (FaultOp::Write, "index"),
        (FaultOp::Sync, "index"),
        (FaultOp::Namespace, "chunks"),
    ] {
        let mem = MemStorage::new();
        let c = open(Arc::new(mem.clone())).unwrap();
        insert(&c, 0..4).unwrap();
        c.sync().unwrap();
        insert(&c, 4..12).unwrap(); // creates a pack: the sync syncs the directory
        mem.inject(fault(op, path, libc::EIO, 0));
        let e = c.sync().unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{op:?} {path}: {e}");
        assert!(matches!(c.sync(), Err(Error::Unavailable(..))), "{op:?} {path}: not poisoned");
        assert!(matches!(insert(&c, 20..21), Err(Error::Unavailable(..))), "{op:?} {path}: not poisoned");
        mem.clear_faults();
        mem.crash(CrashMode::LoseUnsynced);
        let c = open(Arc::new(mem.clone())).unwrap_or_else(|e| panic!("{op:?} {path}: {e}"));
        let n = c.verify(true).unwrap();
        assert!((4..=12).contains(&n), "{op:?} {path}: {n} chunks");
    }
}

/// A merge that fails (ENOSPC writing its run) is dropped, not fatal: the
/// store carries on with the unmerged runs, deletes the partial run, and a
/// later flush merges them; nothing is lost, before or after a reopen.
#[test]
fn a_failed_merge_is_dropped_and_retried() {
    let mem = MemStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    let c = open_in_line(storage.clone()).unwrap();
    let dir = Path::new("/s/chunks");
    let ids = |prefix: &str| -> Vec<u64> {
        let names = storage.list_dir(dir).unwrap();
        names
            .iter()
            .filter_map(|n| n.strip_prefix(prefix))
            .filter_map(|h| u64::from_str_radix(h, 16).ok())
            .collect()
    };
    let mut next = 0u64;
    let step = |c: &ChunkStore, next: &mut u64| {
        insert(c, *next..*next + 1).unwrap();
        c.sync().unwrap();
        *next += 1;
    };
    while c.stats().index_runs < 7 {
        step(&c, &mut next);
        assert!(next < 200, "no seventh run: {:?}", c.stats());
    }
    // The next flush writes run S+1 and slots S+2; its merge reserves S+3.
    let slots = *ids("index-slots-").iter().max().expect("a slots file");
    let merge_run = format!("index-run-{:016x}", slots + 3);
    mem.inject(fault(FaultOp::Write, &merge_run, libc::ENOSPC, 0));
    while c.stats().index_runs < 8 {
        step(&c, &mut next);
        assert!(next < 400, "no eighth run: {:?}", c.stats());
    }
    let st = c.stats();
    assert_eq!((st.index_runs, st.index_merges), (8, 0), "the merge should have failed: {st:?}");
    assert!(!ids("index-run-").contains(&(slots + 3)), "the failed merge's run is left");
    // The next flush retries it.
    let flushed = ids("index-slots-").into_iter().max();
    while ids("index-slots-").into_iter().max() == flushed {
        step(&c, &mut next);
        assert!(next < 600, "no later flush: {:?}", c.stats());
    }
    let st = c.stats();
    assert!(st.index_merges >= 1 && st.index_runs < 8, "not merged on retry: {st:?}");
    let mut out = vec![0u8; CHUNK_BYTES];
    for id in 0..next {
        c.read(&block_hash(id), &mut out).unwrap();
    }
    drop(c);
    mem.crash(CrashMode::LoseUnsynced);
    let c = open(Arc::new(mem.clone())).unwrap();
    assert_eq!(c.verify(true).unwrap(), next);
    for id in 0..next {
        c.read(&block_hash(id), &mut out).unwrap();
        assert_eq!(out, block(id));
    }
}
