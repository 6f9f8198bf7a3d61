//! Reads of compacted data go from the manifest leaf to the chunk's pack
//! and slot, without the chunk index (issue 17, stage 1): counted by
//! `ChunkStats::read_index_lookups`. A chunk GC moved is still read (through
//! the index), and an older store is moved to the current format on open.

mod common;

use cas::gc::GcOptions;
use cas::storage::{MemStorage, Storage};
use cas::store::STORE_VERSION;
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

#[test]
fn a_chunk_gc_moved_is_still_read_and_the_fallback_is_counted() {
    let (_mem, store) = mem_store(opts());
    store.create_image("a", IMAGE_BYTES).unwrap();
    let image = store.open_image("a").unwrap();
    let blocks = IMAGE_BYTES / BLOCK as u64;
    write_version(&image, 1, 0..blocks);
    store.compact_once(&image).unwrap();
    // Overwrite two blocks in three: every pack of version 1 is left mostly dead.
    write_version(&image, 2, (0..blocks).filter(|i| i % 3 != 0));
    store.compact_once(&image).unwrap();
    let expect: Vec<u64> = (0..blocks).map(|i| if i % 3 == 0 { 1 } else { 2 }).collect();
    let gc = store.gc_with(&GcOptions { repack_dead_fraction: 0.3, ..GcOptions::default() }).unwrap();
    assert!(gc.chunks_moved > 0 && gc.packs_deleted > 0, "{gc:?}");
    let before = lookups(&store);
    check(&image, &expect);
    let asked = lookups(&store) - before;
    // Only blocks whose chunk moved ask; blocks in packs GC left alone do not.
    assert!(asked > 0 && asked < blocks, "{asked} index lookups for {blocks} blocks");
    // Compaction writes located refs again for what it rewrites.
    write_version(&image, 3, 0..blocks);
    store.compact_once(&image).unwrap();
    let before = lookups(&store);
    check(&image, &vec![3; blocks as usize]);
    assert_eq!(lookups(&store), before);
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
    assert_eq!(version(&mem), STORE_VERSION);
}

fn version(mem: &MemStorage) -> u32 {
    let bytes = mem.durable_bytes(&store_dir().join("STORE")).unwrap();
    u32::from_le_bytes(bytes[8..12].try_into().unwrap())
}
