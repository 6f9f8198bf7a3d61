//! Recovery of a compacted image: the covered prefix of the log may be
//! partly or wholly gone (reclaimed, or a reclamation cut short in any
//! order) without the image being refused, while damage to records above
//! the covered seq is still refused.

mod common;

use cas::compact::{PassControl, StopAt};
use cas::storage::{CrashMode, MemStorage, OpenMode, Storage};
use cas::wal::recovery::{read_segment_file, scan_segment};
use cas::{Error, Store, StoreOptions};
use common::*;
use std::sync::Arc;

fn opts() -> StoreOptions {
    StoreOptions {
        log_segment_bytes: 1 << 20,
        log_quota_bytes: 32 << 20,
        background_compaction: false,
        // One batch takes the whole log: a stop after "the" commit covers all.
        compaction_batch_bytes: 64 << 20,
        ..StoreOptions::default()
    }
}

fn segments(mem: &MemStorage) -> Vec<u64> {
    let mut v: Vec<u64> = mem
        .list_dir(&wal_dir("i"))
        .unwrap()
        .iter()
        .filter_map(|n| u64::from_str_radix(n.strip_suffix(".wal")?, 16).ok())
        .collect();
    v.sort_unstable();
    v
}

fn remove_segment(mem: &MemStorage, index: u64) {
    mem.remove_file(&segment_path("i", index)).unwrap();
    mem.sync_dir(&wal_dir("i")).unwrap();
}

/// Writes `n` 900 KiB writes (about one segment each) with tokens from
/// `token0`, then flushes.
fn big_writes(image: &cas::Image, token0: u64, n: u64) {
    for k in 0..n {
        let first = (k % 8) * 2048;
        image.write(first * 512, &payload(token0 + k, first, 1800), false).unwrap();
    }
    image.flush().unwrap();
}

fn setup() -> (MemStorage, Arc<Store>, Arc<cas::Image>) {
    let mem = MemStorage::new();
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), opts()).unwrap();
    store.create_image("i", 8 << 20).unwrap();
    let image = store.open_image("i").unwrap();
    (mem, store, image)
}

#[test]
fn covered_segments_left_in_any_order_are_skipped_and_deleted() {
    let (mem, store, image) = setup();
    big_writes(&image, 1, 6);
    // Commit, but stop before the reclamation.
    let ctl = PassControl { stop_at: StopAt::AfterCommit, ..PassControl::default() };
    let r = store.compact_with(&image, &ctl).unwrap();
    assert!(r.covered_after > 0);
    image.write(0, &payload(100, 0, 8), false).unwrap();
    image.flush().unwrap();
    let want = read_tokens(&image).unwrap();
    let segs = segments(&mem);
    assert!(segs.len() >= 5, "{segs:?}");
    // A reclamation whose deletions reached the disk out of order: a gap
    // among the covered segments.
    remove_segment(&mem, segs[1]);
    remove_segment(&mem, segs[3]);
    drop((image, store));
    mem.crash(CrashMode::LoseUnsynced);
    let store = reopen(&mem, opts()).unwrap();
    let image = store.open_image("i").unwrap();
    same_tokens(&read_tokens(&image).unwrap(), &want, "after recovery");
    let rec = image.stats().recovery;
    assert!(rec.covered_segments_deleted >= 2, "{rec:?}");
    assert_eq!(rec.replayed_records, 1, "{rec:?}");
    assert!(segments(&mem).len() <= 2, "covered segments were deleted: {:?}", segments(&mem));
}

#[test]
fn a_missing_segment_above_the_covered_seq_is_refused() {
    let (mem, store, image) = setup();
    big_writes(&image, 1, 3);
    store.compact_once(&image).unwrap();
    big_writes(&image, 10, 4);
    let segs = segments(&mem);
    assert!(segs.len() >= 4, "{segs:?}");
    remove_segment(&mem, segs[segs.len() - 2]);
    drop((image, store));
    let store = reopen(&mem, opts()).unwrap();
    let e = store.open_image("i").unwrap_err();
    assert!(matches!(e, Error::Corruption { .. }), "{e}");
    assert!(e.to_string().contains("missing"), "{e}");
}

#[test]
fn a_damaged_durable_record_above_the_covered_seq_is_refused() {
    let (mem, store, image) = setup();
    big_writes(&image, 1, 3);
    store.compact_once(&image).unwrap();
    let covered = store.compaction(&image).unwrap().manifest().covered();
    // Small flushed writes: each later record proves the earlier durable.
    for k in 0..6u64 {
        image.write(k * 4096, &payload(50 + k, k * 8, 8), false).unwrap();
        image.flush().unwrap();
    }
    let last = *segments(&mem).last().unwrap();
    let path = segment_path("i", last);
    let bytes = read_segment_file(&*mem.open(&path, OpenMode::Existing).unwrap()).unwrap();
    let first_seq = u64::from_le_bytes(bytes[40..48].try_into().unwrap());
    let mut victim = None;
    scan_segment(&bytes, first_seq, &mut |pos, h| {
        if h.seq == covered + 2 {
            victim = Some(pos);
        }
    });
    let pos = victim.expect("record covered + 2 is in the last segment");
    drop((image, store));
    mem.corrupt(&path, pos + 64 + 100, 0x40).unwrap();
    let store = reopen(&mem, opts()).unwrap();
    let e = store.open_image("i").unwrap_err();
    assert!(matches!(e, Error::Corruption { .. }), "{e}");
    assert!(e.to_string().contains("corruption in the middle of the log"), "{e}");
}

/// Only covered records survive (the rest of the log is gone, or cut off
/// inside the covered part as if torn): the log restarts after the covered
/// seq, and new writes are not mistaken for covered ones on the next
/// recovery.
#[test]
fn a_log_holding_only_covered_records_restarts_after_them() {
    for cut in [false, true] {
        let (mem, store, image) = setup();
        big_writes(&image, 1, 3);
        let ctl = PassControl { stop_at: StopAt::AfterCommit, ..PassControl::default() };
        store.compact_with(&image, &ctl).unwrap();
        let want = read_tokens(&image).unwrap();
        drop((image, store));
        let segs = segments(&mem);
        if cut {
            // The last segment loses its tail (covered records) as a torn
            // write would, with no later record to prove it was durable.
            let f = mem.open(&segment_path("i", *segs.last().unwrap()), OpenMode::Existing).unwrap();
            f.set_len(4096).unwrap();
            f.sync_data().unwrap();
        } else {
            segs.iter().for_each(|&s| remove_segment(&mem, s));
        }
        let store = reopen(&mem, opts()).unwrap();
        let image = store.open_image("i").unwrap();
        same_tokens(&read_tokens(&image).unwrap(), &want, &format!("cut {cut}"));
        if cut {
            let rec = image.stats().recovery;
            assert_eq!(rec.covered_segments_deleted as usize, segs.len(), "{rec:?}");
        }
        image.write(4096, &payload(77, 8, 8), true).unwrap();
        drop((image, store));
        mem.crash(CrashMode::LoseUnsynced);
        let store = reopen(&mem, opts()).unwrap();
        let image = store.open_image("i").unwrap();
        assert_eq!(read_tokens(&image).unwrap()[8], 77, "cut {cut}");
    }
}
