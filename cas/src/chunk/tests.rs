use super::*;
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

#[test]
fn memory_budget_refuses_growth_before_writing() {
    let s = MemStorage::new();
    let opts = ChunkStoreOptions { index_memory_budget_bytes: 64 * 1024, ..small_opts() };
    let c = open(&s, opts);
    let mut stored = 0;
    let mut refused = false;
    for round in 0..100u64 {
        let before = c.stored_bytes();
        match c.insert_missing(&c.pin(), &[]).and_then(|_| {
            let blocks: Vec<Vec<u8>> = (round * 50..round * 50 + 50).map(block).collect();
            let items: Vec<(ChunkHash, &[u8])> = blocks.iter().map(|b| (ChunkHash::of(b), &b[..])).collect();
            c.insert_missing(&c.pin(), &items)
        }) {
            Ok(st) => stored += st.new_chunks,
            Err(Error::MemoryBudget(_)) => {
                assert_eq!(c.stored_bytes(), before, "nothing written when refused");
                refused = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
        assert!(c.index_memory_bytes() <= 64 * 1024);
    }
    assert!(refused && stored > 0, "stored {stored} then refused: {refused}");
    // Syncing drains the queued journal ops; lookups keep working.
    c.sync().unwrap();
    assert!(read(&c, 0).is_ok());
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
    assert!(st.cache_entries <= 4);
    read(&c, 15).unwrap();
    read(&c, 15).unwrap();
    assert!(c.stats().cache_hits >= 1);
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
fn journal_checkpoints_and_reopens_the_same() {
    let s = MemStorage::new();
    let opts = ChunkStoreOptions { index_checkpoint_min_bytes: 64 << 10, ..small_opts() };
    let c = open(&s, opts.clone());
    // One chunk per sync: each batch pads to 512 bytes, so 200 syncs pass
    // the 64 KiB floor and twice the live entries' 45 bytes each.
    let mut shrank = false;
    let mut prev = 0;
    for seed in 0..200 {
        insert(&c, [seed]);
        c.sync().unwrap();
        let now = lock(&c.sync_state).journal.len_bytes();
        assert!(now <= 64 << 10, "journal of {now} bytes not checkpointed");
        shrank |= now < prev;
        prev = now;
    }
    assert!(shrank, "the journal never shrank");
    // Removes are checkpointed away too.
    let e = c.gc_advance_epoch(std::time::Duration::from_secs(1)).unwrap();
    let keep: Vec<ChunkTag> = (0..100).map(|i| ChunkHash::of(&block(i)).tag()).collect();
    c.gc_mark(e, &keep);
    assert_eq!(c.gc_sweep(e).unwrap().removed, 100);
    c.sync().unwrap();
    s.crash(CrashMode::LoseUnsynced);
    let c = open(&s, opts);
    assert_eq!(c.len(), 100);
    assert_eq!(c.verify(true).unwrap(), 100);
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
    assert_eq!(s.list_dir(Path::new("/chunks")).unwrap().len(), 3);
    let c = open(&s, small_opts());
    assert_eq!(s.list_dir(Path::new("/chunks")).unwrap(), vec!["index", "pack-00000001.pack"]);
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

/// Regression (bench_sched read maxima of 36-56 ms): growing the index held
/// every reader out for the whole rehash. Now a growth builds the bigger
/// table while readers keep reading; the hook runs while each growth copies
/// its shard and has another thread read every stored chunk meanwhile.
#[test]
fn readers_are_not_held_out_by_index_growth() {
    use std::sync::mpsc;
    use std::time::Duration;
    let s = MemStorage::new();
    let c = Arc::new(open(&s, ChunkStoreOptions { pack_bytes: 4 << 20, ..Default::default() }));
    let stored = Arc::new(Mutex::new(Vec::<u64>::new()));
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel::<usize>();
    let reader = {
        let (c, stored) = (c.clone(), stored.clone());
        std::thread::spawn(move || {
            for () in go_rx {
                let seeds = stored.lock().unwrap().clone();
                for &seed in &seeds {
                    assert_eq!(read(&c, seed).unwrap(), block(seed), "chunk {seed} during a growth");
                }
                done_tx.send(seeds.len()).unwrap();
            }
        })
    };
    let checked = Arc::new(AtomicU64::new(0));
    {
        let checked = checked.clone();
        let go_tx = Mutex::new(go_tx);
        let done_rx = Mutex::new(done_rx);
        c.set_growth_hook(Some(Arc::new(move |_shard, phase| {
            if phase != GrowthPhase::Copying {
                return;
            }
            go_tx.lock().unwrap().send(()).unwrap();
            let n = done_rx
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(10))
                .expect("a reader was held out while the index grew");
            checked.fetch_add(n as u64, Ordering::Relaxed);
        })));
    }
    for round in 0..16u64 {
        let seeds: Vec<u64> = (round * 256..(round + 1) * 256).collect();
        insert(&c, seeds.iter().copied());
        stored.lock().unwrap().extend(seeds);
    }
    c.set_growth_hook(None);
    assert!(checked.load(Ordering::Relaxed) > 0, "no growth found chunks to read");
    drop(c);
    reader.join().unwrap();
}

/// Every index change needs the writer lock, GC marking included: a growth
/// copies its shard under the read lock and swaps the copy in, so a stamp
/// made in between would land in the discarded table and the sweep would
/// then remove a live chunk. Here a mark starts in the middle of a growth
/// of a shard holding marked chunks; none of them may be swept.
#[test]
fn a_mark_during_a_growth_lands_in_the_grown_table() {
    use std::sync::mpsc;
    use std::time::Duration;
    let s = MemStorage::new();
    let c = Arc::new(open(&s, ChunkStoreOptions { pack_bytes: 4 << 20, ..Default::default() }));
    insert(&c, 0..64);
    let epoch = c.gc_advance_epoch(Duration::from_secs(1)).unwrap();
    let marked: Vec<ChunkHash> = (0..64).map(|seed| ChunkHash::of(&block(seed))).collect();
    let shards: Vec<usize> = marked.iter().map(|h| index::shard_of(&Key(*h))).collect();
    let marker = Arc::new(Mutex::new(None));
    {
        let (weak, marker) = (Arc::downgrade(&c), marker.clone());
        c.set_growth_hook(Some(Arc::new(move |shard, phase| {
            let mut slot = marker.lock().unwrap();
            if slot.is_some() || phase != GrowthPhase::Copied || !shards.contains(&shard) {
                return;
            }
            let (c, hashes) = (weak.upgrade().expect("store alive"), marked.clone());
            let (tx, rx) = mpsc::channel();
            *slot = Some(std::thread::spawn(move || {
                let tags: Vec<ChunkTag> = hashes.iter().map(|h| h.tag()).collect();
                let missing = c.gc_mark(epoch, &tags);
                // Nobody listens once the growth went on without it.
                let _ = tx.send(());
                missing
            }));
            // Give an unserialised mark time to land in the old table.
            let _ = rx.recv_timeout(Duration::from_millis(200));
        })));
    }
    let mut seed = 64;
    while marker.lock().unwrap().is_none() {
        assert!(seed < 64 + 100_000, "no growth of a shard holding a marked chunk");
        insert(&c, seed..seed + 256);
        seed += 256;
    }
    c.set_growth_hook(None);
    let handle = marker.lock().unwrap().take().unwrap();
    assert_eq!(handle.join().unwrap(), 0, "every marked chunk was stored");
    // Entries inserted since were stamped by their pins; the 64 by the mark.
    let swept = c.gc_sweep(epoch).unwrap();
    assert_eq!(swept.removed, 0, "a mark made during a growth was lost");
    for seed in 0..64 {
        assert!(c.contains(&ChunkHash::of(&block(seed))), "chunk {seed} swept");
    }
}

/// Reopening sizes each shard from the journal before the replay, then
/// keeps a shard's table only if it is the size a fresh table for its
/// entries would be: the index's accounted bytes match its entries.
#[test]
fn reopen_tables_are_sized_for_their_entries() {
    // 3,000 chunks: the up-front size is a class too big for each shard's
    // ~12 entries, so every table is rebuilt. 61,440 (240 per shard): the
    // up-front size and the final one share a class, so most are kept.
    for (chunks, rebuilt_max) in [(3000u64, index::SHARDS as u64), (61_440, index::SHARDS as u64 / 4)] {
        let s = MemStorage::new();
        let c = open(&s, ChunkStoreOptions::default());
        for part in (0..chunks).step_by(4096) {
            insert(&c, part..(part + 4096).min(chunks));
        }
        c.sync().unwrap();
        drop(c);
        let c = open(&s, ChunkStoreOptions::default());
        let report = c.open_report();
        assert_eq!(report.entries, chunks);
        assert!(report.tables_rebuilt <= rebuilt_max, "{report:?}");
        check_tables_sized(&c);
    }
}

fn check_tables_sized(c: &ChunkStore) {
    let w = lock(&c.writer);
    for shard in 0..index::SHARDS {
        let len = c.index.read(shard).len();
        assert_eq!(w.table_bytes[shard], index::table_bytes(len), "shard {shard} of {len} entries");
    }
    assert_eq!(w.table_bytes_total, w.table_bytes.iter().sum::<u64>());
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
    // A checkpoint carries the floor too.
    c.sync().unwrap();
    c.checkpoint(&mut lock(&c.sync_state)).unwrap();
    let e = c.gc_advance_epoch(std::time::Duration::from_secs(1)).unwrap();
    c.gc_sweep(e).unwrap();
    c.sync().unwrap();
    drop(c);
    drop(open(&s, small_opts()));
    let c = open(&s, small_opts());
    c.insert_located(&c.pin(), &[(ChunkHash::of(&b), &b[..])], &mut refs).unwrap();
    assert_eq!(refs[0].at.map(|at| at.pack), Some(5), "{refs:?}");
}

/// A journal from before the next-pack record (version 1) replays, and the
/// open rewrites it as the current version with the floor in it.
#[test]
fn a_version_1_journal_is_rewritten_on_open() {
    let s = MemStorage::new();
    let c = open(&s, small_opts());
    insert(&c, 1..=10);
    c.sync().unwrap();
    drop(c);
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
    let c = open(&s, small_opts());
    assert_eq!(lock(&c.sync_state).journal.version, journal::INDEX_VERSION);
    for seed in 1..=10 {
        assert_eq!(read(&c, seed).unwrap(), block(seed));
    }
    let b = block(99);
    let mut refs = Vec::new();
    c.insert_located(&c.pin(), &[(ChunkHash::of(&b), &b[..])], &mut refs).unwrap();
    assert_eq!(refs[0].at.map(|at| at.pack), Some(2), "the newest pack has room: appends go on there");
}
