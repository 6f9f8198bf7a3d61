//! fsck: a clean store is clean, and each way of damaging one is found
//! and named (image, file, offset); `--repair` removes only leftovers.

mod common;

use cas::fsck::{self, FsckOptions, FsckReport};
use cas::storage::{MemStorage, OpenMode, Storage};
use cas::Store;
use common::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Blocks written to image "a" and compacted (distinct, non-zero).
const BLOCKS: u64 = 300;

/// A store with image "a" (300 compacted blocks, the first 100 repeated in
/// image "b", so chunks are shared) and image "log", never compacted: three
/// flushed writes (so the middle one is proven durable by the next) and an
/// unflushed one.
fn build() -> MemStorage {
    let (mem, store) = mem_store(small_opts());
    for (name, blocks) in [("a", BLOCKS), ("b", 100)] {
        store.create_image(name, 16 << 20).unwrap();
        let image = store.open_image(name).unwrap();
        image.write(0, &payload(7, 0, blocks * 8), false).unwrap();
        image.flush().unwrap();
        store.compact_once(&image).unwrap();
    }
    store.create_image("log", 16 << 20).unwrap();
    let log = store.open_image("log").unwrap();
    for i in 0..3u64 {
        log.write(i * 8192, &payload(100 + i, i * 16, 16), false).unwrap();
        log.flush().unwrap();
    }
    log.write(1 << 20, &payload(200, 2048, 8), false).unwrap();
    drop(log);
    drop(store);
    mem
}

fn run(mem: &MemStorage, opts: &FsckOptions) -> FsckReport {
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    fsck::check(storage, &store_dir(), opts).expect("fsck runs")
}

fn check(mem: &MemStorage) -> FsckReport {
    run(mem, &FsckOptions::default())
}

fn kinds(r: &FsckReport) -> Vec<&'static str> {
    r.problems.iter().map(|f| f.kind).collect()
}

#[test]
fn a_clean_store_is_clean_and_everything_is_counted() {
    let mem = build();
    let r = check(&mem);
    assert!(r.is_clean(), "{:#?}", r.problems);
    let c = &r.counts;
    assert_eq!(c.images, 3);
    assert_eq!(c.chunks, BLOCKS, "every distinct block is one chunk");
    assert_eq!(c.chunks_verified, BLOCKS);
    assert_eq!(c.references, BLOCKS + 100);
    assert_eq!(c.referenced_chunks, BLOCKS);
    assert_eq!(c.max_references, 2, "image b shares a's first 100 chunks");
    assert_eq!(c.unreferenced_chunks, 0);
    assert!(c.manifest_pages >= 2);
    assert_eq!(c.log_records, 6, "image log's 4 records, and a's and b's covered ones");
    // One image only: its log and the chunks it references.
    let r = run(&mem, &FsckOptions { image: Some("b".into()), repair: false });
    assert!(r.is_clean(), "{:#?}", r.problems);
    assert_eq!((r.counts.images, r.counts.references, r.counts.chunks_verified), (1, 100, 100));
}

#[test]
fn a_bit_flip_in_a_pack_names_the_chunk_and_the_blocks() {
    let mem = build();
    // Slot 5 of the first pack: a chunk both images reference.
    let at = 4096 + 5 * 4096 + 77;
    flip(&mem, &pack(1), at);
    let r = check(&mem);
    let bad = r.of_kind("chunk-checksum");
    assert_eq!(bad.len(), 1, "{:#?}", r.problems);
    assert_eq!(bad[0].path, pack(1));
    assert_eq!(bad[0].offset, Some(4096 + 5 * 4096));
    let blocks = r.of_kind("damaged-block");
    let images: Vec<_> = blocks.iter().map(|f| f.image.as_deref().unwrap()).collect();
    assert_eq!(images, ["a", "b"], "{blocks:#?}");
    assert!(blocks[0].detail.contains("block 5 "), "{}", blocks[0].detail);
    assert_eq!(r.counts.chunks_verified, BLOCKS - 1);
    // Repair does not touch damaged data: it is still reported.
    let r = run(&mem, &FsckOptions { image: None, repair: true });
    assert!(r.repaired.is_empty());
    assert_eq!(r.of_kind("chunk-checksum").len(), 1);
}

#[test]
fn a_bit_flip_in_a_manifest_page_is_found_at_its_offset() {
    let mem = build();
    let path = store_dir().join("images/a/manifest");
    // Page 2 is the first tree page written: a leaf (pages go children first).
    flip(&mem, &path, 2 * 4096 + 300);
    let r = check(&mem);
    let bad = r.of_kind("manifest-page");
    assert_eq!(bad.len(), 1, "{:#?}", r.problems);
    assert_eq!((bad[0].image.as_deref(), bad[0].offset), (Some("a"), Some(2 * 4096)));
    assert!(bad[0].path.ends_with("images/a/manifest"));
    assert!(!r.is_clean());
    assert!(r.of_kind("manifest-counts").is_empty(), "counts are not compared past a damaged page");
}

#[test]
fn a_bit_flip_mid_log_is_corruption_but_a_torn_tail_is_a_note() {
    let mem = build();
    let seg = segment_path("log", 1);
    // The first record's payload: later records prove it durable.
    flip(&mem, &seg, 512 + 64 + 100);
    let r = check(&mem);
    let bad = r.of_kind("log");
    assert_eq!(bad.len(), 1, "{:#?}", r.problems);
    assert_eq!((bad[0].image.as_deref(), bad[0].offset), (Some("log"), Some(512)));
    assert_eq!(bad[0].path, seg);
    assert!(bad[0].detail.contains("middle of the log"), "{}", bad[0].detail);

    // Damage to the unflushed last record only: a torn tail, a note, clean.
    let mem = build();
    let len = mem.open(&seg, OpenMode::Existing).unwrap().len().unwrap();
    flip(&mem, &seg, len - 100);
    let r = check(&mem);
    assert!(r.is_clean(), "{:#?}", r.problems);
    let torn = r.of_kind("torn-tail");
    assert_eq!(torn.len(), 1, "{:#?}", r.notes);
    assert!(r.counts.torn_tail_bytes > 0);
    assert_eq!(r.counts.log_records, 5, "the torn record is not counted");
    // Repair cuts it, and the store opens with the flushed writes.
    let r = run(&mem, &FsckOptions { image: None, repair: true });
    assert_eq!(r.repaired.len(), 1, "{:?}", r.repaired);
    assert!(r.of_kind("torn-tail").is_empty() && r.is_clean());
    assert_eq!(mem.open(&seg, OpenMode::Existing).unwrap().len().unwrap(), torn[0].offset.unwrap());
    let store = reopen(&mem, small_opts()).unwrap();
    let log = store.open_image("log").unwrap();
    let mut buf = vec![0u8; 8192];
    log.read(2 * 8192, &mut buf).unwrap();
    assert_eq!(buf, payload(102, 32, 16));
}

#[test]
fn a_missing_pack_loses_its_chunks_and_names_every_block() {
    let mem = build();
    mem.remove_file(&pack(1)).unwrap();
    let r = check(&mem);
    let missing = r.of_kind("pack-missing");
    assert_eq!(missing.len(), 1, "{:#?}", r.problems);
    assert_eq!(missing[0].path, pack(1));
    assert_eq!(r.of_kind("damaged-block").len() as u64, BLOCKS + 100);
    assert_eq!(r.counts.chunks_verified, 0);
}

#[test]
fn an_orphan_pack_and_leftovers_are_repaired_and_nothing_else_is_touched() {
    let mem = build();
    let orphan = pack(0xff);
    let f = mem.open(&orphan, OpenMode::CreateNew).unwrap();
    f.write_all_at(&[1u8; 8192], 0).unwrap();
    let leftover = store_dir().join("chunks/index.tmp");
    mem.open(&leftover, OpenMode::CreateNew).unwrap().write_all_at(b"x", 0).unwrap();
    mem.create_dir_all(&store_dir().join("images/half")).unwrap();
    let r = check(&mem);
    let mut k = kinds(&r);
    k.sort();
    assert_eq!(k, ["orphan-file", "orphan-image-dir", "orphan-pack"], "{:#?}", r.problems);
    assert_eq!(r.of_kind("orphan-pack")[0].path, orphan);
    assert!(r.problems.iter().all(|f| f.repair.is_some()));

    let r = run(&mem, &FsckOptions { image: None, repair: true });
    assert_eq!(r.repaired.len(), 3, "{:?}", r.repaired);
    assert!(r.is_clean(), "{:#?}", r.problems);
    assert!(!mem.exists(&orphan) && !mem.exists(&leftover));
    assert!(mem.exists(&pack(1)), "a referenced pack stays");
    assert_eq!(r.counts.chunks_verified, BLOCKS);
    let store = reopen(&mem, small_opts()).unwrap();
    let a = store.open_image("a").unwrap();
    let mut buf = vec![0u8; 4096];
    a.read(299 * 4096, &mut buf).unwrap();
    assert_eq!(buf, payload(7, 299 * 8, 8));
}

/// `ChunkStore::close`, the store daemon's clean stop, leaves nothing fsck
/// reports even mid-compaction (a `del` while the daemon compacts): the
/// chunks placed but not yet synced are synced, so their pack is not an
/// orphan. A drop, which is how the model tests crash, leaves the orphan
/// pack that t-cas-crash's fsck found after a `del` once its steps ran
/// fast.
#[test]
fn a_clean_close_mid_compaction_leaves_no_orphan_pack() {
    for close in [false, true] {
        let (mem, store) = mem_store(small_opts());
        let data = payload(9, 0, 8);
        let chunks = store.chunks();
        chunks.insert_missing(&chunks.pin(), &[(cas::units::ChunkHash::of(&data), &data[..])]).unwrap();
        if close {
            chunks.close().unwrap();
        }
        drop(store);
        let r = check(&mem);
        if close {
            assert!(r.is_clean(), "{:#?}", r.problems);
            assert_eq!(r.counts.chunks_verified, 1, "the placed chunk is in the index");
        } else {
            assert_eq!(kinds(&r), ["orphan-pack"], "{:#?}", r.problems);
        }
    }
}

#[test]
fn fsck_refuses_a_store_in_use_and_a_missing_one() {
    let mem = build();
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    let store = Store::open(storage.clone(), &store_dir(), small_opts()).unwrap();
    let e = fsck::check(storage.clone(), &store_dir(), &FsckOptions::default()).unwrap_err();
    assert!(e.to_string().contains("daemon has it open"), "{e}");
    drop(store);
    let e = fsck::check(storage.clone(), Path::new("/nowhere"), &FsckOptions::default()).unwrap_err();
    assert!(e.to_string().contains("no STORE file"), "{e}");
    let opts = FsckOptions { image: Some("nope".into()), repair: false };
    assert!(fsck::check(storage, &store_dir(), &opts).is_err());
}

/// A store whose chunk index has flushed runs (a small flush threshold):
/// image "a" written in 30 compactions of 10 blocks, image "b" repeating
/// its first 100.
fn build_with_runs() -> MemStorage {
    let opts = cas::StoreOptions { index_flush_bytes: 2048, ..small_opts() };
    let (mem, store) = mem_store(opts);
    for (name, blocks) in [("a", BLOCKS), ("b", 100)] {
        store.create_image(name, 16 << 20).unwrap();
        let image = store.open_image(name).unwrap();
        for part in (0..blocks).step_by(10) {
            image.write(part * 4096, &payload(7, part * 8, 80), false).unwrap();
            image.flush().unwrap();
            store.compact_once(&image).unwrap();
        }
    }
    assert!(store.chunk_stats().index_runs > 0, "{:?}", store.chunk_stats());
    drop(store);
    mem
}

fn index_files(mem: &MemStorage, prefix: &str) -> Vec<PathBuf> {
    let dir = store_dir().join("chunks");
    let mut v: Vec<PathBuf> = mem
        .list_dir(&dir)
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(prefix) && !n.ends_with(".keys"))
        .map(|n| dir.join(n))
        .collect();
    v.sort();
    v
}

#[test]
fn the_on_disk_index_is_checked_whole_and_damage_to_it_is_named() {
    let mem = build_with_runs();
    let r = check(&mem);
    assert!(r.is_clean(), "{:#?}", r.problems);
    assert_eq!(r.counts.chunks, BLOCKS);
    assert_eq!(r.counts.chunks_verified, BLOCKS);

    // A flipped byte in a run's page, in its keys, in the slots file, in
    // the root: each named. An open refuses all but the page (an open
    // reads no pages; a lookup or merge that reads it fails instead).
    // Each case builds the store again: a background merge may or may not
    // have finished before the close, so the run files are listed anew.
    for (which, at_end, kind) in [
        ("index-run-", Some(false), "index-run"),
        ("index-run-", Some(true), "index-run"),
        ("index-slots-", None, "index-slots"),
        ("index-root", None, "index-root"),
    ] {
        let mem = build_with_runs();
        let path = match which {
            "index-root" => store_dir().join("chunks/index-root"),
            prefix => index_files(&mem, prefix)[0].clone(),
        };
        let len = mem.open(&path, OpenMode::Existing).unwrap().len().unwrap();
        let offset = match (which, at_end) {
            (_, Some(false)) => 4096 + 100,
            (_, Some(true)) => len - 6,
            ("index-slots-", None) => 30,
            _ => 20,
        };
        flip(&mem, &path, offset);
        let r = check(&mem);
        assert!(kinds(&r).contains(&kind), "{path:?} at {offset}: {:#?}", r.problems);
        assert!(r.problems.iter().any(|f| f.path == path), "{:#?}", r.problems);
        assert_eq!(reopen(&mem, small_opts()).is_err(), offset != 4096 + 100, "{path:?} at {offset}");
    }

    // What a crashed flush leaves (a spill file, a run the root does not
    // name) is removed by repair, as an open would.
    let mem = build_with_runs();
    let chunks = store_dir().join("chunks");
    for name in ["index-run-00000000000fffff", "index-run-00000000000fffff.keys"] {
        mem.open(&chunks.join(name), OpenMode::CreateNew).unwrap().write_all_at(b"partial", 0).unwrap();
    }
    let r = check(&mem);
    assert_eq!(kinds(&r), ["orphan-file", "orphan-file"], "{:#?}", r.problems);
    let r = run(&mem, &FsckOptions { image: None, repair: true });
    assert!(r.is_clean(), "{:#?}", r.problems);
    assert!(!mem.exists(&chunks.join("index-run-00000000000fffff")));
    let store = reopen(&mem, small_opts()).unwrap();
    let a = store.open_image("a").unwrap();
    let mut buf = vec![0u8; 4096];
    a.read(299 * 4096, &mut buf).unwrap();
    assert_eq!(buf, payload(7, 299 * 8, 8));
}
