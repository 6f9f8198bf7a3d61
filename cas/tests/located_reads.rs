//! Reads of compacted data go from the manifest leaf to the chunk's pack
//! and slot, without the chunk index (issue 17, stage 1): counted by
//! `ChunkStats::read_index_lookups`. A chunk GC moved is read through its old
//! pack's forward table (or the index without one), and an older store is
//! moved to the current format on open.

mod common;

use cas::chunk::{ChunkLoc, ChunkRef};
use cas::fsck::{self, FsckOptions};
use cas::gc::GcOptions;
use cas::manifest::{Manifest, ManifestOptions};
use cas::storage::{MemStorage, OpenMode, Storage};
use cas::store::STORE_VERSION_LOCAL;
use cas::{Image, Store, StoreOptions};
use common::*;
use std::sync::Arc;

const BLOCK: usize = 4096;
const IMAGE_BYTES: u64 = 2 << 20;

/// Small packs (15 slots) so data spans many, and no cache, so every read
/// goes to a pack.
fn opts() -> StoreOptions {
    StoreOptions { pack_bytes: 16 * BLOCK as u64, chunk_cache_bytes: 0, ..small_opts() }
}

/// Block `i` of version `v`: distinct per (v, i) unless `i` is a multiple of
/// 4, which repeats one block per version (duplicates that share a chunk).
fn block(v: u64, i: u64) -> Vec<u8> {
    let id = if i.is_multiple_of(4) { 1_000_000 + v } else { v * 1000 + i };
    let mut b = vec![0u8; BLOCK];
    for (k, w) in b.chunks_mut(8).enumerate() {
        w.copy_from_slice(&(id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ k as u64).to_le_bytes());
    }
    b
}

fn write_version(image: &Image, v: u64, blocks: impl Iterator<Item = u64>) {
    for i in blocks {
        image.write(i * BLOCK as u64, &block(v, i), false).unwrap();
    }
    image.flush().unwrap();
}

fn check(image: &Image, expect: &[u64]) {
    let mut buf = vec![0u8; BLOCK];
    for (i, &v) in expect.iter().enumerate() {
        image.read(i as u64 * BLOCK as u64, &mut buf).unwrap();
        assert!(buf == block(v, i as u64), "block {i} is not version {v}");
    }
}

fn lookups(store: &Store) -> u64 {
    store.chunk_stats().read_index_lookups
}

#[test]
fn compacted_reads_never_consult_the_index() {
    let (mem, store) = mem_store(opts());
    store.create_image("a", IMAGE_BYTES).unwrap();
    let image = store.open_image("a").unwrap();
    let blocks = IMAGE_BYTES / BLOCK as u64;
    write_version(&image, 1, 0..blocks);
    store.compact_once(&image).unwrap();
    let before = lookups(&store);
    check(&image, &vec![1; blocks as usize]);
    assert_eq!(lookups(&store), before, "reads of compacted data asked the index");
    // After a reopen too: the locations are in the leaves, not in memory.
    drop(image);
    drop(store);
    let store = reopen(&mem, opts()).unwrap();
    let image = store.open_image("a").unwrap();
    check(&image, &vec![1; blocks as usize]);
    assert_eq!(lookups(&store), 0);
}

/// GC's repack threshold in these tests.
fn repack() -> GcOptions {
    GcOptions { repack_dead_fraction: 0.3, ..GcOptions::default() }
}

/// Image "a" written twice (two blocks in three the second time, so every
/// pack of the first version is left mostly dead), compacted, and one GC
/// pass that repacked and deleted packs. Returns each block's version.
fn moved(store: &Store) -> (Arc<Image>, Vec<u64>, cas::GcReport) {
    store.create_image("a", IMAGE_BYTES).unwrap();
    let image = store.open_image("a").unwrap();
    let blocks = IMAGE_BYTES / BLOCK as u64;
    write_version(&image, 1, 0..blocks);
    store.compact_once(&image).unwrap();
    write_version(&image, 2, (0..blocks).filter(|i| i % 3 != 0));
    store.compact_once(&image).unwrap();
    let expect: Vec<u64> = (0..blocks).map(|i| if i % 3 == 0 { 1 } else { 2 }).collect();
    let gc = store.gc_with(&repack()).unwrap();
    assert!(gc.chunks_moved > 0 && gc.packs_deleted > 0, "{gc:?}");
    (image, expect, gc)
}

/// `moved`, then the store closed: its storage, and each block's version.
fn moved_and_closed() -> (MemStorage, Arc<dyn Storage>, Vec<u64>) {
    let (mem, store) = mem_store(opts());
    let (image, expect, _) = moved(&store);
    drop(image);
    drop(store);
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    (mem, storage, expect)
}

#[test]
fn a_chunk_gc_moved_is_read_through_its_old_packs_forward_table() {
    let (mem, store) = mem_store(opts());
    let (image, expect, gc) = moved(&store);
    let blocks = expect.len() as u64;
    let repack = repack();
    let tables = store.chunk_stats().forward_tables;
    assert!(tables > 0, "no forward table for {} repacked packs", gc.packs_rewritten);
    let (before, forwarded) = (lookups(&store), store.chunk_stats().reads_forwarded);
    check(&image, &expect);
    assert_eq!(lookups(&store), before, "reads of moved chunks asked the index");
    assert!(store.chunk_stats().reads_forwarded > forwarded);
    // The tables are durable: after a reopen too.
    drop(image);
    drop(store);
    let store = reopen(&mem, opts()).unwrap();
    let image = store.open_image("a").unwrap();
    check(&image, &expect);
    assert_eq!(lookups(&store), 0);
    assert_eq!(store.chunk_stats().forward_tables, tables);
    // A pass that still sees leaves naming the deleted packs keeps them.
    assert_eq!(store.gc_with(&repack).unwrap().forward_tables_retired, 0);
    // Once compaction rewrote every block, no leaf names them: retired.
    write_version(&image, 3, 0..blocks);
    store.compact_once(&image).unwrap();
    let gc = store.gc_with(&repack).unwrap();
    assert!(gc.forward_tables_retired >= tables, "{gc:?}");
    check(&image, &vec![3; blocks as usize]);
    assert_eq!(lookups(&store), 0);
}

/// Without its forward table (lost in a crash before it was written, or
/// damaged, which fsck reports), a moved chunk is still read, through the
/// index.
#[test]
fn without_the_forward_table_a_moved_chunk_is_found_through_the_index() {
    let (mem, storage, expect) = moved_and_closed();
    let fsck = |what: &str| {
        let r = fsck::check(storage.clone(), &store_dir(), &FsckOptions::default()).unwrap();
        (r.problems.iter().map(|f| f.kind).collect::<Vec<_>>(), what.to_string())
    };
    assert_eq!(fsck("with tables"), (vec![], "with tables".into()));
    let chunks = store_dir().join("chunks");
    let tables: Vec<String> =
        storage.list_dir(&chunks).unwrap().into_iter().filter(|n| n.ends_with(".fwd")).collect();
    assert!(!tables.is_empty());
    // A damaged table: fsck names it; the store opens and reads without it.
    let f = storage.open(&chunks.join(&tables[0]), OpenMode::Existing).unwrap();
    f.write_all_at(&[0xff], 40).unwrap();
    drop(f);
    assert_eq!(fsck("damaged").0, vec!["forward-table"]);
    let repair = FsckOptions { repair: true, ..FsckOptions::default() };
    let repaired = fsck::check(storage.clone(), &store_dir(), &repair).unwrap();
    assert!(repaired.is_clean(), "{:#?}", repaired.problems);
    assert!(!storage.exists(&chunks.join(&tables[0])), "--repair removes a damaged table");
    // A table write a crash cut short is a leftover, as open deletes it.
    let tmp = chunks.join("pack-0000ffff.fwd.tmp");
    storage.open(&tmp, OpenMode::CreateNew).unwrap().write_all_at(b"torn", 0).unwrap();
    assert_eq!(fsck("leftover").0, vec!["orphan-file"]);
    for name in &tables[1..] {
        storage.remove_file(&chunks.join(name)).unwrap();
    }
    let store = reopen(&mem, opts()).unwrap();
    let image = store.open_image("a").unwrap();
    check(&image, &expect);
    assert!(lookups(&store) > 0);
}

/// The `STORE` file of a store from the first release (version 1).
fn store_v1() -> Vec<u8> {
    let mut b = b"CASSTORE".to_vec();
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    let crc = cas::format::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

#[test]
fn opening_an_older_store_moves_it_to_the_current_version_first() {
    let (mem, store) = mem_store(opts());
    drop(store);
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    let path = store_dir().join("STORE");
    let f = storage.open(&path, cas::storage::OpenMode::Existing).unwrap();
    f.set_len(0).unwrap();
    f.write_all_at(&store_v1(), 0).unwrap();
    f.sync_data().unwrap();
    drop(f);
    assert_eq!(version(&mem), 1);
    let _store = reopen(&mem, opts()).unwrap();
    assert_eq!(version(&mem), STORE_VERSION_LOCAL);
}

fn version(mem: &MemStorage) -> u32 {
    let bytes = mem.durable_bytes(&store_dir().join("STORE")).unwrap();
    u32::from_le_bytes(bytes[8..12].try_into().unwrap())
}

/// fsck holds each located ref against the index: a leaf naming a slot
/// that does not hold its chunk is found (reads would fail there).
#[test]
fn fsck_finds_a_leaf_that_names_the_wrong_slot() {
    let (mem, store) = mem_store(opts());
    store.create_image("a", IMAGE_BYTES).unwrap();
    let image = store.open_image("a").unwrap();
    write_version(&image, 1, 1..3);
    store.compact_once(&image).unwrap();
    drop(image);
    drop(store);
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    let path = store_dir().join("images/a/manifest");
    let m = Manifest::open(storage.clone(), &path, ManifestOptions::default()).unwrap();
    let r = m.lookup(1).unwrap().unwrap();
    let at = r.at.expect("compaction writes located refs");
    let mut e = m.begin();
    e.set(1, Some(ChunkRef { at: Some(ChunkLoc { slot: at.slot + 1, ..at }), ..r }));
    e.commit(m.covered()).unwrap();
    drop(m);
    let r = fsck::check(storage, &store_dir(), &FsckOptions::default()).unwrap();
    let kinds: Vec<_> = r.problems.iter().map(|f| f.kind).collect();
    assert_eq!(kinds, vec!["ref-location"], "{:#?}", r.problems);
}

/// A table whose checksums are right but that sends a slot to the wrong
/// place (damage the crcs cannot see): the read's crc32c catches it and
/// the index finds the chunk.
#[test]
fn a_forward_table_that_leads_astray_falls_back_to_the_index() {
    let (mem, storage, expect) = moved_and_closed();
    let chunks = store_dir().join("chunks");
    for name in storage.list_dir(&chunks).unwrap().iter().filter(|n| n.ends_with(".fwd")) {
        let f = storage.open(&chunks.join(name), OpenMode::Existing).unwrap();
        let mut bytes = vec![0u8; f.len().unwrap() as usize];
        f.read_exact_at(&mut bytes, 0).unwrap();
        let mut table = cas::chunk::fuzz_decode_forward(&bytes).unwrap();
        let mut moves = table.moves.to_vec();
        for m in &mut moves {
            m.to_slot ^= 1;
        }
        table.moves = moves.into();
        let astray = table.encode();
        f.set_len(0).unwrap();
        f.write_all_at(&astray, 0).unwrap();
    }
    let store = reopen(&mem, opts()).unwrap();
    let image = store.open_image("a").unwrap();
    check(&image, &expect);
    assert!(lookups(&store) > 0, "the astray reads asked the index");
}
