use super::*;
use crate::format;
use crate::storage::{CrashMode, Fault, FaultOp, MemStorage};

fn block(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..CHUNK_BYTES / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

fn small_opts() -> ChunkStoreOptions {
    ChunkStoreOptions { pack_bytes: PACK_HEADER_BYTES + 8 * CHUNK_BYTES as u64, ..Default::default() }
}

fn open(s: &MemStorage, opts: ChunkStoreOptions) -> ChunkStore {
    ChunkStore::open(Arc::new(s.clone()), Path::new("/chunks"), opts).unwrap()
}

fn insert(c: &ChunkStore, seeds: impl IntoIterator<Item = u64>) -> InsertStats {
    let blocks: Vec<Vec<u8>> = seeds.into_iter().map(block).collect();
    let items: Vec<(ChunkHash, &[u8])> = blocks.iter().map(|b| (ChunkHash::of(b), &b[..])).collect();
    c.insert_missing(&c.pin(), &items).unwrap()
}

fn read(c: &ChunkStore, seed: u64) -> Result<Vec<u8>> {
    let mut out = vec![0u8; CHUNK_BYTES];
    c.read(&ChunkHash::of(&block(seed)), &mut out)?;
    Ok(out)
}

#[test]
fn insert_dedups_and_reads_back() {
    let s = MemStorage::new();
    let c = open(&s, small_opts());
    let st = insert(&c, [1, 2, 3, 2, 1]);
    assert_eq!(
        st,
        InsertStats {
            new_chunks: 3,
            dup_chunks: 2,
            bytes_written: 3 * CHUNK_BYTES as u64 + PACK_HEADER_BYTES
        }
    );
    let st = insert(&c, 1..=20);
    assert_eq!((st.new_chunks, st.dup_chunks), (17, 3));
    assert_eq!(c.len(), 20);
    for seed in 1..=20 {
        assert_eq!(read(&c, seed).unwrap(), block(seed));
    }
    // 8 slots per pack: 20 chunks span 3 packs.
    assert_eq!(c.stats().packs, 3);
    assert_eq!(c.stored_bytes(), 3 * PACK_HEADER_BYTES + 20 * CHUNK_BYTES as u64);
    assert!(matches!(read(&c, 99), Err(Error::NotFound(_))));
}

#[test]
fn zero_blocks_and_bad_sizes_are_refused() {
    let s = MemStorage::new();
    let c = open(&s, small_opts());
    let zero = vec![0u8; CHUNK_BYTES];
    assert!(is_zero_block(&zero));
    let mut almost = zero.clone();
    almost[4095] = 1;
    assert!(!is_zero_block(&almost));
    almost[4095] = 0;
    almost[0] = 1;
    assert!(!is_zero_block(&almost));
    let pin = c.pin();
    assert!(matches!(
        c.insert_missing(&pin, &[(ChunkHash::of(&zero), &zero)]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        c.insert_missing(&pin, &[(ChunkHash::from_bytes([1; 32]), &almost[..100])]),
        Err(Error::InvalidArgument(_))
    ));
    assert!(c.is_empty());
}

#[test]
fn only_synced_chunks_survive_a_crash() {
    let s = MemStorage::new();
    let c = open(&s, small_opts());
    insert(&c, 0..10);
    c.sync().unwrap();
    insert(&c, 10..30);
    s.crash(CrashMode::LoseUnsynced);
    let c = open(&s, small_opts());
    assert_eq!(c.len(), 10);
    for seed in 0..10 {
        assert_eq!(read(&c, seed).unwrap(), block(seed));
    }
    // Appends continue after the survivors; the lost ones can come back.
    insert(&c, 10..30);
    c.sync().unwrap();
    s.crash(CrashMode::LoseUnsynced);
    let c = open(&s, small_opts());
    assert_eq!(c.verify(true).unwrap(), 30);
}

#[test]
fn torn_crashes_never_leave_entries_to_garbage() {
    for seed in 0..60 {
        let s = MemStorage::new();
        let c = open(&s, small_opts());
        insert(&c, 0..5);
        c.sync().unwrap();
        insert(&c, 5..23);
        if seed % 2 == 0 {
            // Crash in the middle of a sync: packs synced, journal not.
            let w = lock(&c.writer);
            for f in w.dirty.values() {
                f.sync_data().unwrap();
            }
        }
        s.crash(CrashMode::Torn { seed });
        let c = open(&s, small_opts());
        assert!(c.len() >= 5, "seed {seed}: synced chunks lost");
        assert_eq!(c.verify(true).unwrap(), c.len(), "seed {seed}");
        insert(&c, 0..30);
        c.sync().unwrap();
        assert_eq!(c.verify(true).unwrap(), 30, "seed {seed}");
    }
}

#[test]
fn damaged_chunk_bytes_are_a_checksum_error() {
    let s = MemStorage::new();
    let c = open(&s, small_opts());
    insert(&c, [7]);
    c.sync().unwrap();
    s.corrupt(&PathBuf::from("/chunks").join(pack::pack_file_name(1)), PACK_HEADER_BYTES + 100, 0x40)
        .unwrap();
    let c = open(&s, small_opts());
    let mut out = vec![1u8; CHUNK_BYTES];
    let e = c.read(&ChunkHash::of(&block(7)), &mut out).unwrap_err();
    assert!(matches!(e, Error::ChecksumMismatch { .. }), "{e}");
    assert!(out.iter().all(|&b| b == 0), "no garbage handed out");
    assert!(c.verify(false).is_err());
}

#[test]
fn damaged_pack_header_refuses_open() {
    let s = MemStorage::new();
    let c = open(&s, small_opts());
    insert(&c, [7]);
    c.sync().unwrap();
    s.corrupt(&PathBuf::from("/chunks").join(pack::pack_file_name(1)), 30, 1).unwrap();
    let e = ChunkStore::open(Arc::new(s.clone()), Path::new("/chunks"), small_opts()).err().unwrap();
    assert!(matches!(e, Error::ChecksumMismatch { .. } | Error::Corruption { .. }), "{e}");
}

/// Past its memory budget the index does not refuse writes: its summary
/// covers less of the hash space, so some duplicates are stored again.
#[test]
fn over_its_memory_budget_the_index_loses_dedup_not_writes() {
    let s = MemStorage::new();
    let opts = ChunkStoreOptions {
        index_memory_budget_bytes: 64 * 1024,
        index_checkpoint_min_bytes: 16 << 10,
        ..small_opts()
    };
    let c = open(&s, opts);
    for round in 0..20u64 {
        insert(&c, round * 100..(round + 1) * 100);
        c.sync().unwrap();
    }
    let st = c.stats();
    assert!(st.index_runs > 0, "{st:?}");
    assert!(st.index_summary_fraction_ppm < 1_000_000, "the summary was not sampled: {st:?}");
    // The same chunks again: most are no longer found, and are stored.
    let again = insert(&c, 0..1000);
    assert!(again.new_chunks > 500, "{again:?}");
    c.sync().unwrap();
    for seed in (0..2000).step_by(7) {
        assert_eq!(read(&c, seed).unwrap(), block(seed));
    }
    assert_eq!(c.len(), 2000 + again.new_chunks);
    // Within budget, every duplicate is found after flushes too.
    let s = MemStorage::new();
    let c = open(&s, ChunkStoreOptions { index_checkpoint_min_bytes: 16 << 10, ..small_opts() });
    for round in 0..20u64 {
        insert(&c, round * 100..(round + 1) * 100);
        c.sync().unwrap();
    }
    assert!(c.stats().index_runs > 0);
    assert_eq!(insert(&c, 0..2000).new_chunks, 0);
}

#[test]
fn cache_is_bounded_and_counts() {
    let s = MemStorage::new();
    let opts = ChunkStoreOptions { cache_bytes: 4 * CHUNK_BYTES as u64, ..small_opts() };
    let c = open(&s, opts);
    insert(&c, 0..16);
    for seed in 0..16 {
        read(&c, seed).unwrap();
    }
    let st = c.stats();
    assert_eq!((st.cache_hits, st.cache_misses), (0, 16));
    // Each chunk missed once: none entered the cache (admission.rs).
    assert_eq!((st.cache_entries, st.cache_admits_deferred), (0, 16));
    // Two misses in a row admit a chunk (one, if its first miss is still
    // in its slot), so a third read in a row hits.
    for seed in 0..16 {
        read(&c, seed).unwrap();
        read(&c, seed).unwrap();
        let hits = c.stats().cache_hits;
        read(&c, seed).unwrap();
        assert_eq!(c.stats().cache_hits, hits + 1, "chunk {seed}: the third read in a row missed");
    }
    assert!(c.stats().cache_entries <= 4);
}

#[test]
fn concurrent_inserts_store_each_chunk_once() {
    let s = MemStorage::new();
    let c = Arc::new(open(&s, ChunkStoreOptions { pack_bytes: 1 << 20, ..Default::default() }));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                let mut new = 0;
                for round in 0..20u64 {
                    // Every thread inserts the same 64 chunks, in another order.
                    let seeds: Vec<u64> = (0..64).map(|i| (i * 7 + t * 13 + round) % 64).collect();
                    new += insert(&c, seeds).new_chunks;
                    if round % 5 == t {
                        c.sync().unwrap();
                    }
                }
                new
            })
        })
        .collect();
    let total: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(total, 64);
    assert_eq!(c.stats().stored_bytes, PACK_HEADER_BYTES + 64 * CHUNK_BYTES as u64);
}

#[test]
fn sync_waits_for_duplicates_found_in_unsynced_chunks() {
    let s = MemStorage::new();
    let c = open(&s, small_opts());
    insert(&c, [1]);
    // A second caller finds chunk 1 as a duplicate and syncs: chunk 1 must
    // then be durable although the first caller never synced.
    assert_eq!(insert(&c, [1]).dup_chunks, 1);
    c.sync().unwrap();
    s.crash(CrashMode::LoseUnsynced);
    let c = open(&s, small_opts());
    assert!(read(&c, 1).is_ok());
}

#[test]
fn a_failed_sync_poisons_until_reopen() {
    let s = MemStorage::new();
    let c = open(&s, small_opts());
    insert(&c, [1]);
    c.sync().unwrap();
    insert(&c, [2]);
    s.inject(Fault {
        op: FaultOp::Sync,
        path_contains: Some("pack".into()),
        skip: 0,
        errno: libc::EIO,
        sticky: false,
    });
    assert!(c.sync().is_err());
    assert!(matches!(c.sync(), Err(Error::Unavailable(..))));
    let blk = block(3);
    assert!(matches!(
        c.insert_missing(&c.pin(), &[(ChunkHash::of(&blk), &blk)]),
        Err(Error::Unavailable(..))
    ));
    assert!(read(&c, 1).is_ok(), "reads continue");
    drop(c);
    let c = open(&s, small_opts());
    insert(&c, [2, 3]);
    c.sync().unwrap();
    assert_eq!(c.verify(true).unwrap(), 3);
}

#[test]
fn journal_flushes_and_reopens_the_same() {
    let s = MemStorage::new();
    let opts = ChunkStoreOptions { index_checkpoint_min_bytes: 64 << 10, ..small_opts() };
    let c = open(&s, opts.clone());
    // One chunk per sync: each batch pads to 512 bytes, so 200 syncs pass
    // the 64 KiB threshold.
    let mut shrank = false;
    let mut prev = 0;
    for seed in 0..200 {
        insert(&c, [seed]);
        c.sync().unwrap();
        let now = lock(&c.sync_state).journal.len_bytes();
        assert!(now <= 64 << 10, "journal of {now} bytes not flushed");
        shrank |= now < prev;
        prev = now;
    }
    assert!(shrank, "the journal never shrank");
    // Freed slots are flushed away too.
    let e = c.gc_advance_epoch(std::time::Duration::from_secs(1)).unwrap();
    let keep: Vec<ChunkRef> = (0..100).map(|i| ChunkRef::unlocated(&ChunkHash::of(&block(i)))).collect();
    assert_eq!(c.gc_mark(e, &keep).unwrap(), 0);
    assert_eq!(c.gc_sweep(e).unwrap().removed, 100);
    c.sync().unwrap();
    c.flush(&mut lock(&c.sync_state)).unwrap();
    s.crash(CrashMode::LoseUnsynced);
    let c = open(&s, opts);
    assert_eq!(c.open_report().journal_puts, 0, "everything was in the runs");
    assert_eq!(c.len(), 100);
    assert_eq!(c.verify(true).unwrap(), 100);
    for seed in 100..200 {
        assert!(!c.contains(&ChunkHash::of(&block(seed))), "swept chunk {seed} is back");
    }
}

#[test]
fn unreferenced_packs_are_deleted_on_open() {
    let s = MemStorage::new();
    let c = open(&s, small_opts());
    insert(&c, 0..8);
    c.sync().unwrap();
    insert(&c, 8..12); // a second pack, never synced into the index
    for f in lock(&c.writer).dirty.values() {
        f.sync_data().unwrap();
    }
    s.sync_dir(Path::new("/chunks")).unwrap();
    s.crash(CrashMode::LoseUnsynced);
    assert_eq!(s.list_dir(Path::new("/chunks")).unwrap().len(), 4);
    let c = open(&s, small_opts());
    assert_eq!(s.list_dir(Path::new("/chunks")).unwrap(), vec!["index", "index-root", "pack-00000001.pack"]);
    assert_eq!(c.len(), 8);
    insert(&c, 8..12);
    c.sync().unwrap();
    assert_eq!(c.verify(true).unwrap(), 12);
}

#[test]
fn syncs_are_counted_like_the_storage_sees_them() {
    let s = MemStorage::new();
    let c = open(&s, small_opts());
    let before = s.sync_count();
    insert(&c, 0..20); // three packs
    c.sync().unwrap();
    insert(&c, [1]);
    c.sync().unwrap(); // nothing new: no sync at all
    assert_eq!(c.stats().syncs, s.sync_count() - before);
    assert_eq!(c.stats().syncs, 3 + 1 + 1, "three packs, the directory, the journal");
}

/// Reads through the index (by hash) while flushes and merges move the
/// entries from the memtable into runs and from runs into merged runs:
/// every synced chunk is found at every moment.
#[test]
fn reads_by_hash_find_every_chunk_across_flushes_and_merges() {
    let s = MemStorage::new();
    let opts = ChunkStoreOptions { index_checkpoint_min_bytes: 8 << 10, ..small_opts() };
    let c = Arc::new(open(&s, opts));
    let synced = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (c, synced, stop) = (c.clone(), synced.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let n = synced.load(Ordering::Acquire);
                for seed in (0..n).rev().step_by(13) {
                    assert_eq!(read(&c, seed).unwrap(), block(seed), "chunk {seed} of {n}");
                    reads += 1;
                }
            }
            reads
        })
    };
    for round in 0..60u64 {
        insert(&c, round * 40..(round + 1) * 40);
        c.sync().unwrap();
        synced.store((round + 1) * 40, Ordering::Release);
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    let st = c.stats();
    assert!(st.index_runs >= 1 && st.index_run_entries > 0, "no flush happened: {st:?}");
    assert_eq!(c.verify(true).unwrap(), 2400);
}

/// The sweep frees exactly the live slots neither marked nor touched by an
/// insert since the epoch began; a duplicate found counts as touched.
#[test]
fn sweep_frees_slots_neither_marked_nor_touched() {
    use std::time::Duration;
    let s = MemStorage::new();
    let c = open(&s, small_opts());
    insert(&c, 0..30);
    let epoch = c.gc_advance_epoch(Duration::from_secs(1)).unwrap();
    // Marked: 0..10 (unlocated refs, through the index) and 10..15 (located).
    let mut refs: Vec<ChunkRef> = (0..10).map(|i| ChunkRef::unlocated(&ChunkHash::of(&block(i)))).collect();
    let blocks: Vec<Vec<u8>> = (10..15).map(block).collect();
    let items: Vec<(ChunkHash, &[u8])> = blocks.iter().map(|b| (ChunkHash::of(b), &b[..])).collect();
    let mut located = Vec::new();
    let pin = c.pin();
    // Found as duplicates under a pin of this epoch: 10..15 are touched.
    c.insert_located(&pin, &items, &mut located).unwrap();
    refs.extend(&located);
    assert_eq!(c.gc_mark(epoch, &refs[..10]).unwrap(), 0);
    // New after the bump: 100..105 are touched.
    insert(&c, 100..105);
    let swept = c.gc_sweep(epoch).unwrap();
    assert_eq!((swept.scanned, swept.removed), (35, 15));
    drop(pin);
    for seed in (0..15).chain(100..105) {
        assert!(c.contains(&ChunkHash::of(&block(seed))), "kept chunk {seed} swept");
    }
    for seed in 15..30 {
        assert!(!c.contains(&ChunkHash::of(&block(seed))), "chunk {seed} not swept");
    }
    c.sync().unwrap();
    drop(c);
    let c = open(&s, small_opts());
    assert_eq!(c.len(), 20);
    assert_eq!(c.open_report().journal_frees, 15);
}

/// An open reads the runs' fences and summary keys, not their entries,
/// and replays only the journal since the last flush.
#[test]
fn reopen_reads_runs_and_replays_only_the_tail() {
    let s = MemStorage::new();
    let opts = ChunkStoreOptions { index_checkpoint_min_bytes: 32 << 10, ..ChunkStoreOptions::default() };
    let c = open(&s, opts.clone());
    for part in (0..6000u64).step_by(500) {
        insert(&c, part..part + 500);
        c.sync().unwrap();
    }
    let tail = lock(&c.writer).packs.values().map(|p| u64::from(p.live)).sum::<u64>();
    drop(c);
    let c = open(&s, opts);
    let r = c.open_report();
    assert_eq!((r.entries, tail), (6000, 6000));
    assert!(r.runs >= 1 && r.run_entries >= 5000, "{r:?}");
    assert!(r.journal_puts < 1000, "{r:?}");
    assert_eq!(r.run_entries + r.journal_puts, 6000, "{r:?}");
    assert_eq!(insert(&c, 0..6000).new_chunks, 0, "every chunk found by dedup after the reopen");
}

fn pack_files(s: &MemStorage) -> Vec<u32> {
    let names = s.list_dir(Path::new("/chunks")).unwrap();
    names.iter().filter_map(|n| pack::parse_pack_file_name(n)).collect()
}

/// Manifest leaves name chunks by pack and slot, so an id whose pack is
/// gone must never name another pack: not even after two reopens that
/// deleted every pack file.
#[test]
fn pack_ids_are_never_given_out_again() {
    let s = MemStorage::new();
    let c = open(&s, small_opts());
    insert(&c, 1..=20); // packs 1, 2 and 3
    c.sync().unwrap();
    let e = c.gc_advance_epoch(std::time::Duration::from_secs(1)).unwrap();
    assert_eq!(c.gc_sweep(e).unwrap().removed, 20);
    c.sync().unwrap();
    drop(c);
    drop(open(&s, small_opts())); // deletes the unreferenced packs
    assert_eq!(pack_files(&s), Vec::<u32>::new());
    let c = open(&s, small_opts());
    let b = block(99);
    let mut refs = Vec::new();
    c.insert_located(&c.pin(), &[(ChunkHash::of(&b), &b[..])], &mut refs).unwrap();
    assert_eq!(refs[0].at.map(|at| at.pack), Some(4), "{refs:?}");
    // A flush carries the floor too (in the root).
    c.sync().unwrap();
    c.flush(&mut lock(&c.sync_state)).unwrap();
    let e = c.gc_advance_epoch(std::time::Duration::from_secs(1)).unwrap();
    c.gc_sweep(e).unwrap();
    c.sync().unwrap();
    drop(c);
    drop(open(&s, small_opts()));
    let c = open(&s, small_opts());
    c.insert_located(&c.pin(), &[(ChunkHash::of(&b), &b[..])], &mut refs).unwrap();
    assert_eq!(refs[0].at.map(|at| at.pack), Some(5), "{refs:?}");
}

/// A journal from before the next-pack record (version 1) and the on-disk
/// index (no root) replays whole, and the open writes it out as the first
/// run, with the floor in the root.
#[test]
fn a_version_1_journal_is_migrated_on_open() {
    let s = MemStorage::new();
    let c = open(&s, small_opts());
    insert(&c, 1..=10);
    c.sync().unwrap();
    drop(c);
    s.remove_file(&Path::new("/chunks").join(dedup::root::ROOT_FILE)).unwrap();
    let path = Path::new("/chunks").join(journal::INDEX_FILE);
    let f = s.open(&path, crate::storage::OpenMode::Existing).unwrap();
    let mut head = vec![0u8; journal::FILE_HEADER_USED];
    f.read_exact_at(&mut head, 0).unwrap();
    head[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = format::crc32c(&head[..head.len() - 4]);
    let at = head.len() - 4;
    head[at..].copy_from_slice(&crc.to_le_bytes());
    f.write_all_at(&head, 0).unwrap();
    f.sync_data().unwrap();
    drop(f);
    // What a migration a crash cut short leaves (its names come back).
    for name in
        ["index-run-0000000000000001", "index-run-0000000000000001.keys", "index-slots-0000000000000002"]
    {
        let f = s.open(&Path::new("/chunks").join(name), crate::storage::OpenMode::CreateNew).unwrap();
        f.write_all_at(b"partial", 0).unwrap();
    }
    let c = open(&s, small_opts());
    assert_eq!(lock(&c.sync_state).journal.version, journal::INDEX_VERSION);
    let r = c.open_report();
    assert!(r.migrated && r.journal_puts == 10, "{r:?}");
    assert_eq!((c.stats().index_runs, c.stats().index_run_entries), (1, 10));
    for seed in 1..=10 {
        assert_eq!(read(&c, seed).unwrap(), block(seed));
    }
    let b = block(99);
    let mut refs = Vec::new();
    c.insert_located(&c.pin(), &[(ChunkHash::of(&b), &b[..])], &mut refs).unwrap();
    assert_eq!(refs[0].at.map(|at| at.pack), Some(2), "the newest pack has room: appends go on there");
}

/// A chunk stored twice (the summary did not cover its hash) whose newer
/// copy GC freed after a merge kept only the newer copy's entry: repack
/// finds no entry for the older copy's slot and moves it by its content.
#[test]
fn repack_moves_a_second_copy_no_entry_names() {
    use std::time::Duration;
    let s = MemStorage::new();
    let opts = ChunkStoreOptions {
        index_memory_budget_bytes: 64 << 10,
        index_checkpoint_min_bytes: 2048,
        index_merge_in_background: false,
        ..small_opts()
    };
    let c = open(&s, opts);
    // A chunk outside partition 0, the only one a 64 KiB budget summarizes.
    let seed = (1000..).find(|&i| ChunkHash::of(&block(i)).as_bytes()[0] != 0).unwrap();
    let b = block(seed);
    let item = [(ChunkHash::of(&b), &b[..])];
    let (mut first, mut second) = (Vec::new(), Vec::new());
    c.insert_located(&c.pin(), &item, &mut first).unwrap();
    c.sync().unwrap();
    c.flush(&mut lock(&c.sync_state)).unwrap();
    c.insert_located(&c.pin(), &item, &mut second).unwrap();
    assert_ne!(first[0].at, second[0].at, "not found by dedup: stored again");
    // Eight flushes in all: the runs merge, keeping the newer copy's entry.
    for filler in 0..7 {
        insert(&c, [filler]);
        c.sync().unwrap();
        c.flush(&mut lock(&c.sync_state)).unwrap();
    }
    assert_eq!(c.stats().index_runs, 1);
    insert(&c, [99]); // the first pack is full: appends move on
                      // Only the first copy is referenced: the second is swept.
    let epoch = c.gc_advance_epoch(Duration::from_secs(1)).unwrap();
    assert_eq!(c.gc_mark(epoch, &first).unwrap(), 0);
    c.gc_sweep(epoch).unwrap();
    c.sync().unwrap();
    let pack = first[0].at.unwrap().pack;
    let moved = c.gc_repack(pack).unwrap();
    assert_eq!((moved.moved, moved.adopted), (1, 1), "{moved:?}");
    c.gc_delete_pack(pack, moved.moves).unwrap();
    let mut out = vec![0u8; CHUNK_BYTES];
    c.read_ref(&first[0], &mut out).unwrap();
    assert_eq!(out, b);
    assert!(c.contains(&ChunkHash::of(&b)), "the moved copy has an entry again");
}
