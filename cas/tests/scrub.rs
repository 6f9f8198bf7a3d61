//! Online scrub: on an open store (images open, compaction done), a
//! flipped byte in a pack is found, named with the blocks of every image
//! that holds the chunk, and reads of those blocks fail (never wrong
//! data); a damaged manifest page is found; the rate bounds the pass; a
//! stop ends it; --image checks only that image's chunks.

mod common;

use cas::storage::{MemStorage, Storage};
use cas::{ScrubOptions, ScrubProgress, Store};
use common::*;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

const BLOCKS: u64 = 300;
const FAST: u64 = 1 << 40;

/// Image "a" with 300 distinct compacted blocks; "b" holds a's first 100.
fn build() -> (MemStorage, Arc<Store>) {
    let (mem, store) = mem_store(small_opts());
    for (name, blocks) in [("a", BLOCKS), ("b", 100)] {
        store.create_image(name, 16 << 20).unwrap();
        let image = store.open_image(name).unwrap();
        image.write(0, &payload(7, 0, blocks * 8), false).unwrap();
        image.flush().unwrap();
        store.compact_once(&image).unwrap();
    }
    (mem, store)
}

fn scrub(store: &Store, image: Option<&str>, rate: u64) -> cas::ScrubReport {
    let opts = ScrubOptions { image: image.map(String::from), rate_bytes_per_sec: rate, bucket: false };
    store.scrub(&opts, &ScrubProgress::default(), &AtomicBool::new(false)).expect("scrub runs")
}

#[test]
fn a_clean_store_scrubs_clean_and_every_chunk_is_read() {
    let (_mem, store) = build();
    let r = scrub(&store, None, FAST);
    assert!(r.is_clean(), "{r:#?}");
    assert_eq!(r.chunks_checked, BLOCKS, "each chunk once: {r:#?}");
    assert_eq!(r.manifest_refs_walked, BLOCKS + 100);
    let r = scrub(&store, Some("b"), FAST);
    assert!(r.is_clean(), "{r:#?}");
    assert_eq!((r.chunks_checked, r.manifest_refs_walked), (100, 100));
}

#[test]
fn a_flipped_byte_under_an_open_store_is_found_named_and_never_read_back() {
    let (mem, store) = build();
    let a = store.open_image("a").unwrap();
    let mut before = vec![0u8; 4096];
    a.read(5 * 4096, &mut before).unwrap(); // one read: not admitted to the cache
                                            // Slot 5 of the first pack: block 5 of both images.
    flip(&mem, &pack(1), 4096 + 5 * 4096 + 77);
    let r = scrub(&store, None, FAST);
    assert_eq!(r.damaged_chunks, 1, "{r:#?}");
    assert_eq!(r.chunks_checked, BLOCKS);
    let f = &r.findings[0];
    assert!(f.detail.contains("pack 1 slot 5") && f.detail.contains("crc32c"), "{}", f.detail);
    let named: Vec<(&str, u64)> = f.blocks.iter().map(|b| (b.image.as_str(), b.block)).collect();
    assert_eq!(named, [("a", 5), ("b", 5)]);
    assert_eq!(f.blocks_total, 2);
    // The read path refuses it as well: an error, not other bytes.
    let mut out = vec![0u8; 4096];
    let e = a.read(5 * 4096, &mut out).unwrap_err();
    assert!(e.to_string().contains("checksum"), "{e}");
    // --image b finds it through b's refs, and a's other chunks are not read.
    let r = scrub(&store, Some("b"), FAST);
    assert_eq!((r.damaged_chunks, r.chunks_checked), (1, 100), "{r:#?}");
    assert_eq!(r.findings[0].blocks, [cas::DamagedBlock { image: "b".into(), block: 5 }]);
}

#[test]
fn a_damaged_manifest_page_is_found() {
    let (mem, store) = build();
    drop(store);
    let path = store_dir().join("images/a/manifest");
    flip(&mem, &path, 2 * 4096 + 300);
    let store = reopen(&mem, small_opts()).unwrap();
    let r = scrub(&store, None, FAST);
    assert!(!r.is_clean());
    assert!(r.damaged_metadata.iter().any(|m| m.contains("image a")), "{r:#?}");
}

#[test]
fn the_rate_bounds_the_pass_and_a_stop_ends_it() {
    let (_mem, store) = build();
    // 300 chunks of 4 KiB at 4 MiB/s: about 0.29 s.
    let t = Instant::now();
    let r = scrub(&store, None, 4 << 20);
    assert!(t.elapsed().as_millis() >= 250, "{:?} for {} chunks", t.elapsed(), r.chunks_checked);
    let stop = AtomicBool::new(true);
    let opts = ScrubOptions { image: None, rate_bytes_per_sec: 4096, bucket: false };
    let r = store.scrub(&opts, &ScrubProgress::default(), &stop).unwrap();
    assert!(r.stopped);
    assert!(r.chunks_checked <= 1, "{r:#?}");
    let zero = ScrubOptions { image: None, rate_bytes_per_sec: 0, bucket: false };
    assert!(store.scrub(&zero, &ScrubProgress::default(), &stop).is_err());
    let missing = ScrubOptions { image: Some("nope".into()), rate_bytes_per_sec: FAST, bucket: false };
    assert!(store
        .scrub(&missing, &ScrubProgress::default(), &stop)
        .unwrap_err()
        .to_string()
        .contains("nope"));
}

#[test]
fn a_damaged_chunk_the_bucket_holds_is_repaired_from_it() {
    let mem = MemStorage::new();
    let objects = cas::objects::MemObjects::new();
    let mut opts = remote_opts(Some(Arc::new(objects.clone())));
    // Keep the uploaded packs' local copies: the damage is in one of them.
    if let Some(r) = opts.remote.0.as_mut() {
        r.local_keep_bytes = 1 << 30;
    }
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), opts).unwrap();
    store.create_image("vm", 8 << 20).unwrap();
    let image = store.open_image("vm").unwrap();
    image.write(0, &payload(3, 0, 512), false).unwrap();
    image.flush().unwrap();
    let want = read_tokens(&image).unwrap();
    store.compact_once(&image).unwrap();
    store.chunks().seal_active().unwrap();
    store.tier().unwrap().upload_sealed().unwrap();
    let st = store.tier().unwrap().stats();
    assert!(st.uploaded_packs >= 1 && st.evicted_packs == 0, "{st:?}");
    let first = mem
        .list_dir(&store_dir().join("chunks"))
        .unwrap()
        .into_iter()
        .filter(|n| n.ends_with(".pack"))
        .min()
        .expect("a local pack");
    flip(&mem, &store_dir().join("chunks").join(&first), 4096 + 7 * 4096 + 9);
    let r = scrub(&store, None, FAST);
    assert_eq!((r.damaged_chunks, r.repaired_chunks), (1, 1), "{r:#?}");
    assert!(r.findings[0].repaired && r.is_clean(), "{r:#?}");
    assert_eq!(r.findings[0].blocks.len(), 1);
    // The slot holds the chunk again: a second pass is clean, reads match.
    let r = scrub(&store, None, FAST);
    assert_eq!(r.damaged_chunks, 0, "{r:#?}");
    same_tokens(&read_tokens(&image).unwrap(), &want, "after the repair");
}

#[test]
fn packs_only_in_the_bucket_are_not_downloaded_to_be_scrubbed() {
    let mem = MemStorage::new();
    let objects = cas::objects::MemObjects::new();
    // local_keep_bytes 0: every uploaded pack leaves the disk.
    let store =
        Store::create(Arc::new(mem.clone()), &store_dir(), remote_opts(Some(Arc::new(objects.clone()))))
            .unwrap();
    store.create_image("vm", 8 << 20).unwrap();
    let image = store.open_image("vm").unwrap();
    image.write(0, &payload(5, 0, 256), false).unwrap();
    image.flush().unwrap();
    store.compact_once(&image).unwrap();
    store.chunks().seal_active().unwrap();
    store.tier().unwrap().upload_sealed().unwrap();
    let gets = store.tier().unwrap().stats().gets;
    let r = scrub(&store, None, FAST);
    assert!(r.is_clean(), "{r:#?}");
    assert_eq!((r.chunks_checked, r.chunks_not_local), (0, 32), "{r:#?}");
    assert_eq!(store.tier().unwrap().stats().gets, gets, "the scrub read the bucket");
}

/// Scrubs run while GC repacks and sweeps the packs they read, and while
/// writes and compaction go on: a slot GC moved or freed under a scrub is
/// never reported as damage, every pass ends, and the images read back
/// as written.
#[test]
fn scrubs_beside_gc_and_writes_report_no_false_damage() {
    let (_mem, store) = build();
    let a = store.open_image("a").unwrap();
    let stop = AtomicBool::new(false);
    let (passes, moved) = std::thread::scope(|s| {
        let scrubber = s.spawn(|| {
            let mut passes = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || passes == 0 {
                let r = scrub(&store, None, FAST);
                assert!(r.is_clean(), "a scrub beside GC reported damage: {r:#?}");
                assert!(r.chunks_checked > 0, "{r:#?}");
                passes += 1;
            }
            passes
        });
        // Overwrite half of a's blocks each round (garbage for GC in the
        // packs being scrubbed), compact, and collect.
        let mut moved = 0;
        for round in 0..12u64 {
            let first = (round % 2) * (BLOCKS / 2);
            a.write(first * 4096, &payload(100 + round, first * 8, BLOCKS / 2 * 8), false).unwrap();
            a.flush().unwrap();
            store.compact_once(&a).unwrap();
            let gc = store.gc().unwrap();
            moved += gc.chunks_moved + gc.packs_deleted;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (scrubber.join().unwrap(), moved)
    });
    assert!(passes >= 2, "only {passes} scrub passes ran beside GC");
    assert!(moved > 0, "GC neither moved a chunk nor deleted a pack: the scrubs raced nothing");
    let tokens = read_tokens(&a).unwrap();
    for (sector, &t) in tokens.iter().enumerate().take((BLOCKS * 8) as usize) {
        let want = if (sector as u64 / 8) < BLOCKS / 2 { 110 } else { 111 };
        assert_eq!(t, want, "sector {sector}");
    }
    assert!(scrub(&store, None, FAST).is_clean());
}

fn scrub_bucket(store: &Store) -> cas::ScrubReport {
    let opts = ScrubOptions { image: None, rate_bytes_per_sec: FAST, bucket: true };
    store.scrub(&opts, &ScrubProgress::default(), &AtomicBool::new(false)).expect("a bucket scrub runs")
}

/// `--bucket` checks the bucket's copies, not the local packs: a clean
/// bucket scrubs clean; a byte flipped in a pack object is found and named
/// with the image block that holds it (the local scrub sees nothing); a
/// pack object deleted behind casblk's back is damage for each of its
/// live slots, and a missing slot index is damaged metadata.
#[test]
fn a_bucket_scrub_finds_damage_in_the_buckets_copies_and_names_the_blocks() {
    use cas::bucket::packs::{pack_key, packidx_key};
    use cas::objects::{MemObjects, Objects};
    let objects = MemObjects::new();
    let (_mem, store) = mem_store(remote_opts(Some(Arc::new(objects.clone()))));
    store.create_image("vm", 4 << 20).unwrap();
    let image = store.open_image("vm").unwrap();
    image.write(0, &payload(7, 0, 64 * 8), false).unwrap();
    store.drain_to_bucket(&image, std::time::Duration::from_secs(10)).unwrap();
    let packs: Vec<u32> = objects
        .keys()
        .iter()
        .filter_map(|k| k.strip_prefix("packidx/").and_then(|id| u32::from_str_radix(id, 16).ok()))
        .collect();
    assert!(!packs.is_empty(), "nothing uploaded: {:?}", objects.keys());
    let r = scrub_bucket(&store);
    assert!(r.is_clean(), "{r:#?}");
    assert_eq!((r.scope.as_str(), r.chunks_checked), ("bucket", 64), "{r:#?}");

    // Slot 5 of the first pack in the bucket: block 5.
    let key = pack_key(packs[0], 0);
    let mut bytes = objects.get(&key).unwrap();
    bytes[(cas::chunk::PACK_HEADER_BYTES + 5 * 4096 + 77) as usize] ^= 0x40;
    objects.put(&key, &bytes).unwrap();
    let r = scrub_bucket(&store);
    assert_eq!(r.damaged_chunks, 1, "{r:#?}");
    let f = &r.findings[0];
    assert!(f.detail.contains("slot 5 in the bucket") && f.detail.contains("crc32c"), "{}", f.detail);
    assert_eq!(f.blocks, [cas::DamagedBlock { image: "vm".into(), block: 5 }]);
    assert!(!f.repaired);
    assert!(scrub(&store, None, FAST).damaged_chunks == 0, "the local scrub does not read the bucket");

    // Deleted behind casblk's back: the pack object, then its slot index.
    objects.delete(&key).unwrap();
    let r = scrub_bucket(&store);
    assert_eq!(r.damaged_chunks, 64, "{r:#?}");
    assert!(r.findings[0].detail.contains("deleted behind"), "{}", r.findings[0].detail);
    objects.delete(&packidx_key(packs[0])).unwrap();
    let r = scrub_bucket(&store);
    assert_eq!(r.damaged_metadata.len(), 1, "{r:#?}");
    assert!(!r.is_clean());

    // A store without a remote has no bucket to scrub.
    let (_mem, local) = mem_store(small_opts());
    let opts = ScrubOptions { image: None, rate_bytes_per_sec: FAST, bucket: true };
    let e = local.scrub(&opts, &ScrubProgress::default(), &AtomicBool::new(false)).unwrap_err();
    assert!(matches!(e, cas::Error::InvalidArgument(_)) && e.to_string().contains("no bucket"), "{e}");
}
