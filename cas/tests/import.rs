//! Import straight into chunks: every byte reads back, zero blocks are
//! holes, chunks are shared with other images, and a crash or fault at any
//! point leaves the image whole or absent, never partial.

mod common;

use cas::storage::{CrashMode, Fault, FaultOp};
use cas::Error;
use common::*;

/// 3 MiB + 12.5 KiB: distinct blocks, a zero MiB, a MiB repeating image
/// "a"'s first MiB, and a tail of 3.125 blocks (the size rounds up to 4 KiB).
fn source() -> Vec<u8> {
    let mut v = payload(11, 0, 2048); // 1 MiB of distinct blocks
    v.extend(vec![0u8; 1 << 20]);
    v.extend(payload(5, 0, 2048)); // as image "a" holds
    v.extend(payload(12, 8192, 25));
    v
}

#[test]
fn an_import_reads_back_with_holes_and_shared_chunks() {
    let (mem, store) = mem_store(small_opts());
    store.create_image("a", 4 << 20).unwrap();
    let a = store.open_image("a").unwrap();
    a.write(0, &payload(5, 0, 2048), false).unwrap();
    a.flush().unwrap();
    store.compact_once(&a).unwrap();
    let src = source();
    let size = (src.len() as u64).div_ceil(4096) * 4096;
    let mut seen = Vec::new();
    let r = store.import_image("b", size, &mut &src[..], &mut |n| seen.push(n)).unwrap();
    assert_eq!(r.bytes_read, src.len() as u64);
    assert_eq!(r.zero_blocks, 256, "the zero MiB: {r:?}");
    assert_eq!(r.dedup_blocks, 256, "a's MiB is shared: {r:?}");
    assert_eq!(r.new_chunks, 256 + 4, "distinct blocks and the tail's 4: {r:?}");
    assert_eq!(seen.last(), Some(&(src.len() as u64)));
    let check = |store: &cas::Store| {
        let b = store.open_image("b").unwrap();
        assert_eq!(b.size_bytes(), size);
        let mut back = vec![0u8; size as usize];
        b.read(0, &mut back).unwrap();
        assert!(back[..src.len()] == src[..], "imported bytes differ");
        assert!(back[src.len()..].iter().all(|&x| x == 0));
    };
    check(&store);
    assert!(matches!(
        store.import_image("b", 4096, &mut &src[..], &mut |_| {}),
        Err(Error::AlreadyExists(_))
    ));
    // Durable without any flush of the image: the import synced it all.
    drop(store);
    mem.crash(CrashMode::LoseUnsynced);
    let store = reopen(&mem, small_opts()).unwrap();
    check(&store);
    let storage: std::sync::Arc<dyn cas::storage::Storage> = std::sync::Arc::new(mem.clone());
    drop(store);
    let report = cas::fsck::check(storage, &store_dir(), &Default::default()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.problems);
    assert_eq!(report.counts.max_references, 2);
}

#[test]
fn a_fault_or_crash_anywhere_leaves_the_image_whole_or_absent() {
    let src = source();
    let size = (src.len() as u64).div_ceil(4096) * 4096;
    let (mut whole, mut absent) = (0, 0);
    for skip in 0..40u64 {
        for op in [FaultOp::Sync, FaultOp::Write, FaultOp::Namespace] {
            let (mem, store) = mem_store(small_opts());
            mem.inject(Fault { op, path_contains: None, skip, errno: libc::EIO, sticky: true });
            let done = store.import_image("b", size, &mut &src[..], &mut |_| {}).is_ok();
            // A failure in the last step (IMAGE's rename or its directory
            // sync) may leave the image listed: then it is whole (below).
            drop(store);
            mem.crash(CrashMode::Torn { seed: skip });
            let store = reopen(&mem, small_opts()).unwrap();
            match store.list_images().unwrap().as_slice() {
                [] => {
                    assert!(!done, "a completed import was lost (skip {skip}, {op:?})");
                    absent += 1;
                }
                [info] => {
                    assert_eq!(info.size_bytes, size);
                    let b = store.open_image("b").unwrap();
                    let mut back = vec![0u8; src.len()];
                    b.read(0, &mut back).unwrap();
                    assert!(back == src, "an imported image is partial (skip {skip}, {op:?})");
                    whole += 1;
                }
                other => panic!("{other:?}"),
            }
            // Whatever a crash left, a new import of the name works.
            if store.list_images().unwrap().is_empty() {
                store.import_image("b", size, &mut &src[..], &mut |_| {}).unwrap();
            }
        }
    }
    assert!(whole > 0 && absent > 0, "whole {whole}, absent {absent}: the faults missed the import");
}

#[test]
fn an_import_goes_through_the_stores_page_cache() {
    // No image is open, so only the import can put pages in the store's
    // cache: a private cache per import would be memory no budget counts.
    let (_mem, store) = mem_store(small_opts());
    assert!(store.manifest_cache().is_empty());
    let src = source();
    let size = (src.len() as u64).div_ceil(4096) * 4096;
    store.import_image("b", size, &mut &src[..], &mut |_| {}).unwrap();
    assert!(!store.manifest_cache().is_empty(), "the import's manifest used a cache of its own");
}
