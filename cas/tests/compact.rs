//! Compaction through the store: data moves from the log into chunks and
//! the manifest, the covered log is reclaimed, only durable data is
//! compacted, reads and recovery see the same bytes throughout.

mod common;

use cas::compact::{PassControl, StopAt};
use cas::storage::{CrashMode, MemStorage};
use cas::{Error, Store, StoreOptions};
use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn opts() -> StoreOptions {
    StoreOptions {
        log_segment_bytes: 1 << 20,
        log_quota_bytes: 16 << 20,
        background_compaction: false,
        compaction_batch_bytes: 1 << 20,
        ..StoreOptions::default()
    }
}

/// Sectors of a mixed workload: whole blocks, sub-4K writes, zeroes and
/// discards, some overwritten within the same batch.
fn mixed_writes(image: &cas::Image, token0: u64) -> u64 {
    let mut t = token0;
    let mut w = |first: u64, n: u64| {
        image.write(first * 512, &payload(t, first, n), false).unwrap();
        t += 1;
    };
    w(0, 64); // blocks 0..8
    w(3, 2); // inside block 0
    w(70, 20); // straddles blocks 8..11, partial at both ends
    w(200, 8); // block 25 whole
    w(201, 1);
    image.write_zeroes(16 * 512, 8 * 512, false).unwrap(); // block 2 zeroed
    image.discard(44 * 512, 4 * 512).unwrap(); // half of block 5
    image.write(300 * 512, &vec![0u8; 4096], false).unwrap(); // zeros as data
    t
}

#[test]
fn compaction_moves_durable_data_and_reclaims_the_log() {
    let mem = MemStorage::new();
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), opts()).unwrap();
    store.create_image("i", 4 << 20).unwrap();
    let image = store.open_image("i").unwrap();
    let mut t = mixed_writes(&image, 1);
    // Fill a few segments so that some can be reclaimed.
    for i in 0..12u64 {
        image.write((1 << 20) + i * (128 << 10), &payload(t, 2048 + i * 256, 256), false).unwrap();
        t += 1;
    }
    let before = read_tokens(&image).unwrap();
    let r = store.compact_once(&image).unwrap();
    assert_eq!(r.covered_after, 0, "nothing is durable yet: nothing compacted");
    image.flush().unwrap();
    let segs_before = image.stats().log_segments;
    let r = store.compact_once(&image).unwrap();
    assert_eq!(r.covered_after, image.durable_seq());
    assert!(r.work.batches >= 2, "{r:?}");
    assert!(r.work.blocks_merged >= 3, "{r:?}");
    assert!(r.work.blocks_holes >= 2, "{r:?}");
    // The inserter had nothing queued when the first sub-batch began, so
    // it hashed that one's whole blocks (the reads below check them).
    assert!(r.work.blocks_hashed_by_inserter > 0, "{r:?}");
    assert!(r.work.segments_reclaimed >= 1, "{r:?}");
    assert!(image.stats().log_segments < segs_before);
    same_tokens(&read_tokens(&image).unwrap(), &before, "reads after compaction");
    assert!(image.stats().read_chunk_bytes > 0);
    let st = store.image_stats(&image);
    assert_eq!(st.compaction.batches, r.work.batches);

    // More writes on top, half durable, then a crash.
    image.write(0, &payload(t, 0, 3), false).unwrap();
    image.flush().unwrap();
    image.write(8 * 512, &payload(t + 1, 8, 8), false).unwrap();
    let mut want = read_tokens(&image).unwrap();
    drop((image, store));
    mem.crash(CrashMode::LoseUnsynced);
    let store = reopen(&mem, opts()).unwrap();
    let image = store.open_image("i").unwrap();
    want[8..16].copy_from_slice(&before[8..16]);
    same_tokens(&read_tokens(&image).unwrap(), &want, "after the crash");
    assert!(image.stats().recovery.replayed_records <= 2, "{:?}", image.stats().recovery);
}

#[test]
fn a_pass_stopped_after_its_commit_leaves_a_consistent_image() {
    for stop in [StopAt::AfterInsert, StopAt::AfterChunkSync, StopAt::AfterCommit] {
        for torn in [false, true] {
            let mem = MemStorage::new();
            let store = Store::create(Arc::new(mem.clone()), &store_dir(), opts()).unwrap();
            store.create_image("i", 4 << 20).unwrap();
            let image = store.open_image("i").unwrap();
            let t = mixed_writes(&image, 1);
            for i in 0..10u64 {
                image.write(i * (256 << 10), &payload(t + i, i * 512, 512), false).unwrap();
            }
            image.flush().unwrap();
            let want = read_tokens(&image).unwrap();
            let ctl = PassControl { stop_at: stop, ..PassControl::default() };
            store.compact_with(&image, &ctl).unwrap();
            same_tokens(&read_tokens(&image).unwrap(), &want, &format!("{stop:?}"));
            drop((image, store));
            mem.crash(if torn { CrashMode::Torn { seed: 7 } } else { CrashMode::LoseUnsynced });
            let store = reopen(&mem, opts()).unwrap();
            let image = store.open_image("i").unwrap();
            same_tokens(&read_tokens(&image).unwrap(), &want, &format!("{stop:?} torn {torn}"));
            // The next pass finishes the job.
            store.compact_once(&image).unwrap();
            same_tokens(&read_tokens(&image).unwrap(), &want, &format!("{stop:?} torn {torn}, recompacted"));
            assert_eq!(image.stats().log_segments, 1);
        }
    }
}

/// On a slow device the commit thread falls behind the inserter: the
/// batches queued behind a commit join the next one (one chunk sync, one
/// manifest commit), and the image is the same, before and after a crash.
/// The last commit's log reclamation runs before the pass returns.
#[test]
fn batches_queued_behind_a_slow_commit_are_committed_together() {
    let mem = MemStorage::new();
    let o = StoreOptions { compaction_threads: 3, compaction_batch_bytes: 64 << 10, ..opts() };
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), o.clone()).unwrap();
    store.create_image("i", 4 << 20).unwrap();
    let image = store.open_image("i").unwrap();
    let t = mixed_writes(&image, 1);
    for i in 0..48u64 {
        image.write((512 << 10) + i * (64 << 10), &payload(t + i, 1024 + i * 128, 128), false).unwrap();
    }
    image.flush().unwrap();
    let want = read_tokens(&image).unwrap();
    let syncs_before = mem.sync_count();
    mem.set_sync_delay(Duration::from_millis(5));
    let r = store.compact_once(&image).unwrap();
    mem.set_sync_delay(Duration::ZERO);
    let w = &r.work;
    assert!(w.grouped_batches >= 1 && w.grouped_batches < w.batches, "{w:?}");
    assert!(mem.sync_count() - syncs_before <= 5 * (w.batches - w.grouped_batches), "{w:?}");
    assert_eq!(r.covered_after, image.durable_seq());
    assert_eq!(image.stats().log_segments, 1, "every covered segment reclaimed: {w:?}");
    committed_survives_a_crash(&mem, (store, image), o, &want, "grouped commits");
}

/// Image `i` reads `want` before and after a crash that loses what was
/// not synced, and its recovery replays no record: the commits covered
/// the whole log.
fn committed_survives_a_crash(
    mem: &MemStorage,
    (store, image): (Arc<Store>, Arc<cas::Image>),
    o: StoreOptions,
    want: &[u64],
    what: &str,
) {
    same_tokens(&read_tokens(&image).unwrap(), want, &format!("after {what}"));
    drop((image, store));
    mem.crash(CrashMode::LoseUnsynced);
    let store = reopen(mem, o).unwrap();
    let image = store.open_image("i").unwrap();
    same_tokens(&read_tokens(&image).unwrap(), want, &format!("after {what} and a crash"));
    assert_eq!(image.stats().recovery.replayed_records, 0, "{:?}", image.stats().recovery);
}

#[test]
fn with_a_reader_thread_two_half_batches_make_one_commit() {
    for threads in [1u64, 2, 3] {
        // compaction_batch_bytes 1 MiB: commits of 1 MiB of records.
        let o = StoreOptions { compaction_threads: threads, ..opts() };
        let (mem, store) = mem_store(o.clone());
        store.create_image("i", 8 << 20).unwrap();
        let image = store.open_image("i").unwrap();
        // 4 MiB of whole blocks, 128 KiB per record: nothing to merge, so
        // no held job is handed on early.
        for i in 0..32u64 {
            image.write(i * (128 << 10), &payload(i + 1, i * 256, 256), false).unwrap();
        }
        image.flush().unwrap();
        let want = read_tokens(&image).unwrap();
        let r = store.compact_once(&image).unwrap();
        let w = &r.work;
        let commits = w.batches - w.grouped_batches;
        if threads == 1 {
            assert!(w.batches >= 4 && w.batches <= 5 && w.grouped_batches == 0, "1 MiB batches: {w:?}");
        } else {
            assert!(w.batches >= 8, "{threads} threads read 512 KiB batches: {w:?}");
            assert!(commits <= w.batches.div_ceil(2), "{threads} threads commit them in pairs: {w:?}");
        }
        assert_eq!(r.covered_after, image.durable_seq());
        committed_survives_a_crash(&mem, (store, image), o, &want, "paired commits");
    }
}

/// A store whose image `i` holds mixed writes, flushed and compacted.
fn compacted_once(mem: &MemStorage) -> (Arc<Store>, Arc<cas::Image>) {
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), opts()).unwrap();
    store.create_image("i", 4 << 20).unwrap();
    let image = store.open_image("i").unwrap();
    mixed_writes(&image, 1);
    image.flush().unwrap();
    store.compact_once(&image).unwrap();
    (store, image)
}

/// More mixed writes over what `compacted_once` wrote, flushed.
fn write_over(image: &cas::Image) {
    let t = mixed_writes(image, 100);
    image.write(1 << 20, &payload(t, 2048, 16), false).unwrap();
    image.flush().unwrap();
}

#[test]
fn a_stale_cursor_falls_back_to_a_scan() {
    let mem = MemStorage::new();
    let (store, image) = compacted_once(&mem);
    write_over(&image);
    let want = read_tokens(&image).unwrap();
    store.compaction(&image).expect("compacted image").forget_cursor();
    let r = store.compact_once(&image).unwrap();
    assert_eq!(r.work.cursor_fallbacks, 1);
    assert_eq!(r.covered_after, image.durable_seq());
    same_tokens(&read_tokens(&image).unwrap(), &want, "after the fallback");
}

/// The store, not the image, keeps an image's compaction state, and only
/// while the image is open: `Image::stats` has no compaction part, the
/// store's `image_stats` has it, and a reopened image starts with fresh
/// state (counters from zero, the cursor from recovery).
#[test]
fn the_store_keeps_compaction_state_while_the_image_is_open() {
    let mem = MemStorage::new();
    let (store, image) = compacted_once(&mem);
    let st = store.image_stats(&image);
    assert_eq!((st.compaction.passes, st.covered_seq), (1, image.durable_seq()));
    let own = image.stats();
    assert_eq!((own.compaction.passes, own.covered_seq), (0, 0), "the image counts only its own work");
    let state = store.compaction(&image).expect("compacted image");
    state.forget_cursor();
    let closed = Arc::downgrade(&state);
    drop((state, image));
    let image = store.open_image("i").unwrap();
    assert!(closed.upgrade().is_none(), "the closed image's compaction state is gone");
    write_over(&image);
    let r = store.compact_once(&image).unwrap();
    assert_eq!(r.work.cursor_fallbacks, 0, "the reopened image compacts from recovery's cursor");
    assert_eq!(store.image_stats(&image).compaction, r.work);
}

#[test]
fn images_opened_with_a_custom_view_are_not_compacted() {
    let mem = MemStorage::new();
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), opts()).unwrap();
    store.create_image("i", 1 << 20).unwrap();
    let image = store.open_image_with("i", Arc::new(MapManifest::default())).unwrap();
    assert!(matches!(store.compact_once(&image), Err(Error::InvalidArgument(_))));
}

/// A DISCARD over more blocks than one batch may hold is split across
/// batches (each covering the records before it), and the blocks it
/// unmaps become holes.
#[test]
fn a_huge_discard_is_split_across_batches() {
    let mem = MemStorage::new();
    // 16 MiB of compaction memory: batches of at most 65536 blocks (256 MiB).
    let o = StoreOptions { compaction_memory_bytes: 16 << 20, ..opts() };
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), o.clone()).unwrap();
    let size = 1u64 << 30;
    store.create_image("i", size).unwrap();
    let image = store.open_image("i").unwrap();
    let spots = [0u64, 300 << 20, (1 << 30) - 4096];
    for (k, &at) in spots.iter().enumerate() {
        image.write(at, &payload(k as u64 + 1, at / 512, 8), false).unwrap();
    }
    image.flush().unwrap();
    store.compact_once(&image).unwrap();
    assert_eq!(store.compaction(&image).unwrap().manifest().stats().mapped_blocks, 3);
    image.discard(0, size).unwrap();
    image.write(4096, &payload(9, 8, 8), false).unwrap();
    image.flush().unwrap();
    let r = store.compact_once(&image).unwrap();
    assert!(r.work.batches >= 4, "1 GiB of blocks in batches of 256 MiB: {r:?}");
    assert_eq!(r.covered_after, image.durable_seq());
    assert_eq!(store.compaction(&image).unwrap().manifest().stats().mapped_blocks, 1);
    let mut buf = vec![0u8; 8192];
    for &at in &spots {
        image.read(at.min(size - 8192), &mut buf).unwrap();
        let nonzero = buf.iter().any(|&b| b != 0);
        assert_eq!(nonzero, at.min(size - 8192) == 0, "at {at}");
    }
    // A crash after the split keeps the same picture.
    drop((image, store));
    mem.crash(CrashMode::LoseUnsynced);
    let store = reopen(&mem, o).unwrap();
    let image = store.open_image("i").unwrap();
    image.read(0, &mut buf).unwrap();
    assert_eq!(decode_sector(&buf[4096..4608], 8).unwrap(), 9);
    assert!(buf[..4096].iter().all(|&b| b == 0));
}

/// The compaction budget cuts batches short (back-pressure) without
/// stopping compaction; a chunk index over its budget still compacts (it
/// finds fewer duplicates instead).
#[test]
fn memory_budgets_give_back_pressure_not_failure() {
    let mem = MemStorage::new();
    let o = StoreOptions { compaction_memory_bytes: 14 << 20, compaction_batch_bytes: 64 << 20, ..opts() };
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), o).unwrap();
    store.create_image("i", 16 << 20).unwrap();
    let image = store.open_image("i").unwrap();
    for m in 0..12u64 {
        image.write(m << 20, &payload(m + 1, m * 2048, 2048), false).unwrap();
    }
    image.flush().unwrap();
    let want = read_tokens(&image).unwrap();
    let r = store.compact_once(&image).unwrap();
    assert!(r.work.budget_waits > 0, "{r:?}");
    assert!(r.work.batches >= 2, "{r:?}");
    assert_eq!(r.covered_after, image.durable_seq());
    same_tokens(&read_tokens(&image).unwrap(), &want, "after budget-cut batches");
    drop((image, store));

    let mem = MemStorage::new();
    let o = StoreOptions { memory_budget_bytes: (128 << 20) + 4096, ..opts() };
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), o).unwrap();
    store.create_image("i", 16 << 20).unwrap();
    let image = store.open_image("i").unwrap();
    image.write(0, &payload(1, 0, 4096), true).unwrap();
    let r = store.compact_once(&image).unwrap();
    assert_eq!(r.covered_after, image.durable_seq());
    assert_eq!(store.image_stats(&image).compaction.errors, 0);
    assert!(store.chunk_stats().index_summary_fraction_ppm < 1_000_000, "{:?}", store.chunk_stats());
    assert!(read_tokens(&image).unwrap()[..4096].iter().all(|&t| t == 1));
    image.write(0, &payload(2, 0, 8), false).unwrap();
}

/// A read in flight pins the segment it reads: reclamation leaves that
/// segment's file (and its quota) alone until the read is done, and the
/// next reclamation deletes it.
#[test]
fn a_read_in_flight_pins_its_segment() {
    let mem = MemStorage::new();
    let slow = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicU64::new(0));
    // 4 KiB reads of log segments (an image read of one block; the
    // compactor reads in larger pieces) take 400 ms while `slow` is set.
    let (s, st) = (slow.clone(), started.clone());
    let hook: ReadHook = Arc::new(move |path, len| {
        if len == 4096 && s.load(Ordering::SeqCst) && path.to_string_lossy().contains("/wal/") {
            st.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(400));
        }
    });
    let storage = SlowSync {
        inner: Arc::new(mem.clone()),
        delay: Duration::ZERO,
        read_hook: Some(hook),
        write_hook: None,
        decline_nowait: None,
    };
    let store = Store::create(Arc::new(storage), &store_dir(), opts()).unwrap();
    store.create_image("i", 4 << 20).unwrap();
    let image = store.open_image("i").unwrap();
    for k in 0..3u64 {
        image.write(k << 20, &payload(k + 1, k * 2048, 1800), false).unwrap();
    }
    image.flush().unwrap();
    let first = segment_path("i", 1);
    slow.store(true, Ordering::SeqCst);
    let img = image.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        img.read(0, &mut buf).unwrap();
        decode_sector(&buf[..512], 0).unwrap()
    });
    while started.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let r = store.compact_once(&image).unwrap();
    slow.store(false, Ordering::SeqCst);
    assert_eq!(r.covered_after, image.durable_seq());
    assert!(image.stats().reclaim_deferred >= 1, "{:?}", image.stats());
    assert!(exists(&mem, &first), "a pinned segment was deleted under a read");
    assert_eq!(reader.join().unwrap(), 1, "the read in flight saw its data");
    // The read is done: the next reclamation deletes the segment.
    let r = store.compact_once(&image).unwrap();
    assert!(r.work.segments_reclaimed >= 1, "{r:?}");
    assert!(!exists(&mem, &first));
    assert_eq!(image.stats().log_segments, 1);
}

/// Regression: a segment's header was never charged to the quota but its
/// whole size was returned on reclamation, so the accounting drifted down
/// by 512 bytes per segment until a release underflowed. After many
/// roll / compact / reclaim cycles the image's count must equal the one
/// recovery computes from the files.
#[test]
fn log_accounting_stays_exact_across_rolls_and_reclaims() {
    let mem = MemStorage::new();
    let o = StoreOptions { log_quota_bytes: 3 << 20, ..opts() };
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), o.clone()).unwrap();
    store.create_image("i", 4 << 20).unwrap();
    let image = store.open_image("i").unwrap();
    for k in 0..40u64 {
        image.write((k % 4) << 20, &payload(k + 1, (k % 4) * 2048, 1500), false).unwrap();
        image.discard(((k + 1) % 4) << 20, 4096).unwrap();
        image.flush().unwrap();
        store.compact_once(&image).unwrap();
    }
    let used = image.log_used_bytes();
    let want = read_tokens(&image).unwrap();
    assert!(store.image_stats(&image).compaction.segments_reclaimed >= 20);
    drop((image, store));
    let store = reopen(&mem, o).unwrap();
    let image = store.open_image("i").unwrap();
    assert_eq!(image.log_used_bytes(), used, "the running count matches the files");
    same_tokens(&read_tokens(&image).unwrap(), &want, "after reopen");
}

#[test]
fn long_unaligned_reads_of_compacted_data_match_sector_reads() {
    let mem = MemStorage::new();
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), opts()).unwrap();
    store.create_image("i", 4 << 20).unwrap();
    let image = store.open_image("i").unwrap();
    // Chunks, holes and partial blocks over more than one lookup window
    // (32 blocks): blocks 0..26 and 40..120 written, 26..40 a hole.
    let t = mixed_writes(&image, 1);
    image.write(40 * 4096, &payload(t, 40 * 8, 80 * 8), false).unwrap();
    image.flush().unwrap();
    store.compact_once(&image).unwrap();
    let sectors = 130 * 8;
    let mut want = vec![0u8; sectors * 512];
    for (s, out) in want.chunks_mut(512).enumerate() {
        image.read(s as u64 * 512, out).unwrap();
    }
    for (first, len) in [(0, 1), (3, 700), (7, 257), (100, 9), (200, 840), (301, 512), (8, 1032), (1000, 40)]
    {
        let mut got = vec![0u8; len * 512];
        image.read(first as u64 * 512, &mut got).unwrap();
        assert!(got == want[first * 512..(first + len) * 512], "sectors {first}+{len}");
    }
    assert!(image.stats().read_chunk_bytes > 0 && image.stats().read_hole_bytes > 0);
}

#[test]
fn every_image_looks_up_through_the_stores_one_page_cache() {
    let mem = MemStorage::new();
    let cache_pages = 4;
    let opts = StoreOptions {
        manifest_cache_bytes: cache_pages * cas::manifest::PAGE_BYTES as u64,
        log_quota_bytes: 32 << 20,
        ..opts()
    };
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), opts).unwrap();
    // Three images of 8 MiB: 2048 blocks, 17 leaves each.
    let images: Vec<_> = (0..3u64)
        .map(|i| {
            store.create_image(&format!("i{i}"), 8 << 20).unwrap();
            let image = store.open_image(&format!("i{i}")).unwrap();
            for mib in 0..8u64 {
                image.write(mib << 20, &payload(i * 100 + mib + 1, mib * 2048, 2048), false).unwrap();
            }
            image.flush().unwrap();
            store.compact_once(&image).unwrap();
            image
        })
        .collect();
    let cache = store.manifest_cache();
    assert_eq!(cache.capacity_pages(), cache_pages as usize);
    for (i, image) in images.iter().enumerate() {
        let mut buf = vec![0u8; 1 << 20];
        for mib in 0..8u64 {
            image.read(mib << 20, &mut buf).unwrap();
            assert_eq!(buf, payload(i as u64 * 100 + mib + 1, mib * 2048, 2048), "image {i} MiB {mib}");
        }
        assert!(image.stats().log_segments <= 2, "image {i} was compacted");
    }
    // Every image's pages went through the one cache, which held no more
    // than its bound.
    assert!(!cache.is_empty(), "the images' lookups did not use the store's cache");
    assert!(cache.len() <= cache_pages as usize, "{} pages in a cache of {cache_pages}", cache.len());
}
