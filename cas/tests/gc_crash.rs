//! GC crash safety: a GC pass over a store with dead chunks, sweeps and
//! repacks is interrupted after every possible number of storage
//! operations, with both crash modes. After each crash: the store opens
//! (no index entry to a deleted pack), every stored chunk checks out,
//! every block of every kept image reads its content, and a clean GC pass
//! then leaves exactly the referenced chunks. The same for a store smaller
//! than one pack, whose dead chunks all sit in the active pack.

mod chunk_support;

use cas::chunk::{ChunkHash, ChunkStore, ChunkStoreOptions, CHUNK_BYTES, PACK_HEADER_BYTES};
use cas::gc::{self, GcOptions};
use cas::manifest::{Manifest, ManifestOptions};
use cas::storage::{MemStorage, Storage};
use chunk_support::{block, block_hash, crash_at_every_op, crashing, Cuts};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const IMAGES: usize = 3;

fn chunk_opts() -> ChunkStoreOptions {
    // Index flushes (a small journal threshold) fall inside the crash loop.
    ChunkStoreOptions {
        pack_bytes: PACK_HEADER_BYTES + 16 * CHUNK_BYTES as u64,
        index_checkpoint_min_bytes: 2048,
        ..Default::default()
    }
}

fn manifest_path(i: usize) -> PathBuf {
    PathBuf::from(format!("/store/img{i}/manifest"))
}

/// One pack holds everything `build` writes (it stays the active pack).
fn one_pack_opts() -> ChunkStoreOptions {
    ChunkStoreOptions { pack_bytes: PACK_HEADER_BYTES + 1024 * CHUNK_BYTES as u64, ..chunk_opts() }
}

fn open_all(storage: Arc<dyn Storage>) -> cas::Result<(ChunkStore, Vec<Manifest>)> {
    open_all_with(storage, chunk_opts())
}

fn open_all_with(
    storage: Arc<dyn Storage>,
    opts: ChunkStoreOptions,
) -> cas::Result<(ChunkStore, Vec<Manifest>)> {
    let c = ChunkStore::open(storage.clone(), Path::new("/store/chunks"), opts)?;
    let ms = (0..IMAGES)
        .map(|i| Manifest::open(storage.clone(), &manifest_path(i), ManifestOptions::default()))
        .collect::<cas::Result<_>>()?;
    Ok((c, ms))
}

/// Writes `content` (block -> content id) into image `i` the way the
/// compactor does: pin, insert, sync chunks, commit, unpin.
fn write(c: &ChunkStore, m: &Manifest, content: &BTreeMap<u64, u64>, covered: u64) {
    let pin = c.pin();
    let blocks: Vec<Vec<u8>> = content.values().map(|&id| block(id)).collect();
    let items: Vec<(ChunkHash, &[u8])> =
        content.values().zip(&blocks).map(|(&id, b)| (block_hash(id), &b[..])).collect();
    let mut refs = Vec::new();
    c.insert_located(&pin, &items, &mut refs).unwrap();
    c.sync().unwrap();
    let mut e = m.begin();
    for (&b, r) in content.keys().zip(&refs) {
        e.set(b, Some(*r));
    }
    e.commit(covered).unwrap();
}

/// The store before GC: images 0 and 1 rewritten so that many chunks are
/// dead and packs are partly dead; image 2 deleted (not passed to GC).
/// Returns the expected content of images 0 and 1.
fn build(storage: Arc<dyn Storage>) -> Vec<BTreeMap<u64, u64>> {
    build_with(storage, chunk_opts())
}

fn build_with(storage: Arc<dyn Storage>, opts: ChunkStoreOptions) -> Vec<BTreeMap<u64, u64>> {
    storage.create_dir_all(Path::new("/store/chunks")).unwrap();
    for i in 0..IMAGES {
        storage.create_dir_all(manifest_path(i).parent().unwrap()).unwrap();
    }
    storage.sync_dir(Path::new("/")).unwrap();
    storage.sync_dir(Path::new("/store")).unwrap();
    let (c, ms) = open_all_with(storage, opts).unwrap();
    let mut expect = vec![BTreeMap::new(); IMAGES];
    // Round 1: 40 blocks each, a third shared between images.
    for (i, m) in ms.iter().enumerate() {
        let content: BTreeMap<u64, u64> =
            (0..40u64).map(|b| (b, if b % 3 == 0 { b } else { 1000 * (i as u64 + 1) + b })).collect();
        write(&c, m, &content, 1);
        expect[i] = content;
    }
    // Round 2: images 0 and 1 overwrite half their blocks.
    for (i, m) in ms.iter().enumerate().take(2) {
        let content: BTreeMap<u64, u64> =
            (0..40u64).step_by(2).map(|b| (b, 50_000 + 100 * i as u64 + b)).collect();
        write(&c, m, &content, 2);
        expect[i].extend(content);
    }
    expect.truncate(2);
    expect
}

fn referenced(expect: &[BTreeMap<u64, u64>]) -> HashSet<ChunkHash> {
    expect.iter().flat_map(|e| e.values().map(|&id| block_hash(id))).collect()
}

fn check(c: &ChunkStore, ms: &[Manifest], expect: &[BTreeMap<u64, u64>], what: &str) {
    c.verify(true).unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut out = vec![0u8; CHUNK_BYTES];
    for (m, content) in ms.iter().zip(expect) {
        for (&b, &id) in content {
            let h = m.lookup(b).unwrap().unwrap_or_else(|| panic!("{what}: block {b} unmapped"));
            assert_eq!(h.tag, block_hash(id).tag(), "{what}: block {b}");
            c.read_ref(&h, &mut out).unwrap_or_else(|e| panic!("{what}: block {b}: {e}"));
            assert_eq!(out, block(id), "{what}: block {b} content");
        }
    }
}

#[test]
fn gc_reclaims_dead_chunks_and_packs() {
    let mem = MemStorage::new();
    let expect = build(Arc::new(mem.clone()));
    let (c, ms) = open_all(Arc::new(mem.clone())).unwrap();
    let before = c.stats();
    let kept: Vec<&Manifest> = ms.iter().take(2).collect();
    let report = gc::run(&c, &kept, &GcOptions::default()).unwrap();
    let live = referenced(&expect).len() as u64;
    assert_eq!(report.chunks_dead, before.chunks - live);
    assert_eq!(c.len(), live);
    assert!(report.packs_rewritten > 0 && report.bytes_reclaimed > 0, "{report:?}");
    assert_eq!(report.missing_references, 0);
    assert!(c.stored_bytes() < before.stored_bytes);
    check(&c, &ms[..2], &expect, "after gc");
    // A second pass finds nothing more to do.
    let again = gc::run(&c, &kept, &GcOptions::default()).unwrap();
    assert_eq!((again.chunks_dead, again.packs_rewritten), (0, 0));
}

#[test]
fn gc_survives_a_crash_at_every_step() {
    let budget = crash_at_every_op(Cuts::every(500), |budget, mode| {
        let mem = MemStorage::new();
        let expect = build(Arc::new(mem.clone()));
        let (storage, ctl) = crashing(&mem, u64::MAX);
        let (c, ms) = open_all(storage).unwrap();
        ctl.arm(budget);
        let kept: Vec<&Manifest> = ms.iter().take(2).collect();
        let result = gc::run(&c, &kept, &GcOptions::default());
        if !ctl.died() {
            result.unwrap();
            return true;
        }
        drop((c, ms));
        mem.crash(mode);
        let what = format!("crash after {budget} ops ({mode:?})");
        let (c, ms) = open_all(Arc::new(mem.clone())).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
        check(&c, &ms[..2], &expect, &what);
        let kept: Vec<&Manifest> = ms.iter().take(2).collect();
        gc::run(&c, &kept, &GcOptions::default()).unwrap_or_else(|e| panic!("{what}: gc after: {e}"));
        assert_eq!(c.len(), referenced(&expect).len() as u64, "{what}");
        check(&c, &ms[..2], &expect, &what);
        false
    });
    eprintln!("gc pass completed with a budget of {budget} storage operations");
    assert!(budget > 10, "the pass should take many storage operations, took {budget}");
}

#[test]
fn a_store_smaller_than_a_pack_gets_its_dead_chunks_back() {
    let mem = MemStorage::new();
    let expect = build_with(Arc::new(mem.clone()), one_pack_opts());
    let (c, ms) = open_all_with(Arc::new(mem.clone()), one_pack_opts()).unwrap();
    let before = c.stats();
    assert_eq!(before.packs, 1, "everything in the one (active) pack");
    let kept: Vec<&Manifest> = ms.iter().take(2).collect();
    let report = gc::run(&c, &kept, &GcOptions::default()).unwrap();
    assert!(report.active_pack_retired && report.packs_rewritten == 1, "{report:?}");
    assert_eq!(c.len(), referenced(&expect).len() as u64);
    let dead = before.chunks - c.len();
    assert!(
        c.stored_bytes() + dead * CHUNK_BYTES as u64 <= before.stored_bytes + PACK_HEADER_BYTES,
        "every dead chunk's bytes came back: {} -> {} bytes, {dead} dead",
        before.stored_bytes,
        c.stored_bytes()
    );
    check(&c, &ms[..2], &expect, "after gc");
    // The new active pack holds only live chunks: nothing more to do.
    let again = gc::run(&c, &kept, &GcOptions::default()).unwrap();
    assert!(!again.active_pack_retired && again.packs_rewritten == 0, "{again:?}");
    // Writes go on into the new pack, and read back after a reopen.
    let more: BTreeMap<u64, u64> = (100..110u64).map(|b| (b, 90_000 + b)).collect();
    write(&c, &ms[0], &more, 3);
    drop((c, ms));
    let (c, ms) = open_all_with(Arc::new(mem.clone()), one_pack_opts()).unwrap();
    let mut expect = expect;
    expect[0].extend(more);
    check(&c, &ms[..2], &expect, "after more writes and a reopen");
}

#[test]
fn retiring_the_active_pack_survives_a_crash_at_every_step() {
    let budget = crash_at_every_op(Cuts::every(500), |budget, mode| {
        let mem = MemStorage::new();
        let expect = build_with(Arc::new(mem.clone()), one_pack_opts());
        let (storage, ctl) = crashing(&mem, u64::MAX);
        let (c, ms) = open_all_with(storage, one_pack_opts()).unwrap();
        ctl.arm(budget);
        let kept: Vec<&Manifest> = ms.iter().take(2).collect();
        let result = gc::run(&c, &kept, &GcOptions::default());
        if !ctl.died() {
            assert!(result.unwrap().active_pack_retired);
            return true;
        }
        drop((c, ms));
        mem.crash(mode);
        let what = format!("crash after {budget} ops ({mode:?})");
        let (c, ms) = open_all_with(Arc::new(mem.clone()), one_pack_opts())
            .unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
        check(&c, &ms[..2], &expect, &what);
        let kept: Vec<&Manifest> = ms.iter().take(2).collect();
        gc::run(&c, &kept, &GcOptions::default()).unwrap_or_else(|e| panic!("{what}: gc after: {e}"));
        assert_eq!(c.len(), referenced(&expect).len() as u64, "{what}");
        check(&c, &ms[..2], &expect, &what);
        let more: BTreeMap<u64, u64> = (100..104u64).map(|b| (b, 90_000 + b)).collect();
        write(&c, &ms[0], &more, 3);
        let mut expect = expect;
        expect[0].extend(more);
        check(&c, &ms[..2], &expect, &format!("{what}, then more writes"));
        false
    });
    assert!(budget > 10, "the pass should take many storage operations, took {budget}");
}
