//! Cross-host dedup (issue 18): a store that imports the slot indexes of
//! the packs another store uploaded stores none of those chunks again; its
//! images name the other store's packs and read them from the bucket,
//! after a reopen too; GC keeps those packs and fsck finds the store clean.
//! A crash anywhere in an import loses nothing and the next import
//! finishes it.

mod chunk_support;
mod common;

use cas::objects::{MemObjects, Objects};
use cas::storage::MemStorage;
use cas::{Store, StoreOptions};
use chunk_support::{crash_at_every_op, crashing, Cuts};
use common::*;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(5);

fn opts(objects: &MemObjects) -> StoreOptions {
    remote_opts(Some(Arc::new(objects.clone())))
}

/// 2 MiB of distinct blocks: tokens 1..=16 in 128 KiB writes; the image
/// stays open.
fn write_data(store: &Store, name: &str) -> (Vec<u64>, Arc<cas::Image>) {
    store.create_image(name, 4 << 20).unwrap();
    let image = store.open_image(name).unwrap();
    for i in 0..16u64 {
        image.write(i * (128 << 10), &payload(i + 1, i * 256, 256), false).unwrap();
    }
    image.flush().unwrap();
    let report = store.compact_once(&image).unwrap();
    assert!(report.covered_after > 0);
    (read_tokens(&image).unwrap(), image)
}

/// Bytes of pack objects in the bucket.
fn pack_bytes(objects: &MemObjects) -> u64 {
    objects.list("packs/", None, 100_000).unwrap().iter().map(|o| o.size).sum()
}

#[test]
fn a_store_stores_none_of_the_chunks_another_uploaded() {
    let objects = MemObjects::new();
    let (_mem_a, a) = mem_store(opts(&objects));
    let (want, _vm) = write_data(&a, "vm");
    a.publish_wait("vm", WAIT).unwrap(); // seals and uploads what it names
    let unique = pack_bytes(&objects);
    assert!(unique >= 16 * 32 * 4096, "{unique}");

    let (mem_b, b) = {
        let mem = MemStorage::new();
        let s = Store::create(Arc::new(mem.clone()), &store_dir(), opts(&objects)).unwrap();
        (mem, s)
    };
    let imported = b.tier().unwrap().import_foreign(b.chunks()).unwrap();
    assert_eq!(imported.entries, 16 * 32, "{imported:?}");
    let (got, copy) = write_data(&b, "copy");
    same_tokens(&got, &want, "host B's copy");
    let chunks_new = b.image_stats(&b.opened("copy").unwrap()).compaction.chunks_new;
    assert_eq!(chunks_new, 0, "host B stored chunks host A had uploaded");
    b.publish_wait("copy", WAIT).unwrap();
    assert_eq!(pack_bytes(&objects), unique, "the bucket holds each chunk once");
    assert_eq!(b.tier().unwrap().import_foreign(b.chunks()).unwrap().packs, 0, "nothing new to import");

    // After a reopen: still deduplicated, and read from the bucket.
    drop((copy, b));
    let b = reopen(&mem_b, opts(&objects)).unwrap();
    let (got, _copy2) = write_data(&b, "copy2");
    same_tokens(&got, &want, "host B reopened");
    assert_eq!(b.image_stats(&b.opened("copy2").unwrap()).compaction.chunks_new, 0);
    let image = b.open_image("copy").unwrap();
    b.publish_wait("copy", WAIT).unwrap();
    same_tokens(&read_tokens(&image).unwrap(), &want, "read from A's packs");
    let gc = b.gc().unwrap();
    assert_eq!(gc.missing_references, 0, "{gc:?}");
    same_tokens(&read_tokens(&image).unwrap(), &want, "after GC");
    drop((image, b));
    let fsck = cas::fsck::check(Arc::new(mem_b.clone()), &store_dir(), &Default::default()).unwrap();
    assert!(fsck.problems.is_empty(), "{:?}", fsck.problems);
    assert!(fsck.counts.foreign_references >= 2 * 16 * 32, "{:?}", fsck.counts);
}

/// 1 MiB of blocks no other call writes (tokens from `seed`) in a new
/// image `name`, compacted and published (its packs and their slot
/// indexes uploaded).
fn upload_image(store: &Store, name: &str, seed: u64) {
    store.create_image(name, 4 << 20).unwrap();
    let image = store.open_image(name).unwrap();
    for i in 0..8u64 {
        image.write(i * (128 << 10), &payload(seed * 100 + i + 1, i * 256, 256), false).unwrap();
    }
    image.flush().unwrap();
    store.compact_once(&image).unwrap();
    store.publish_wait(name, WAIT).unwrap();
}

#[test]
fn imports_list_only_what_is_new_and_a_full_scan_finds_what_landed_below() {
    let objects = MemObjects::new();
    let new_store = || mem_store(opts(&objects)).1;
    // Host slots are claimed in this order, so C's slot indexes sort
    // before A's.
    let c = new_store();
    let a = new_store();
    let b = new_store();
    let slot = |s: &Store| s.tier().unwrap().stats().host_slot;
    assert!(slot(&c) < slot(&a), "slots {} {}", slot(&c), slot(&a));
    upload_image(&a, "a1", 1);
    let first = b.tier().unwrap().import_foreign(b.chunks()).unwrap();
    assert!(first.packs > 0, "the first import lists everything: {first:?}");
    upload_image(&a, "a2", 2);
    let second = b.tier().unwrap().import_foreign(b.chunks()).unwrap();
    assert!(second.packs > 0, "A's new packs sort after what the last import saw: {second:?}");
    // C's packs land below the listing's start: only a full scan sees them.
    upload_image(&c, "c1", 3);
    for i in 2..cas::bucket::packs::FULL_SCAN_EVERY {
        assert_eq!(
            b.tier().unwrap().import_foreign(b.chunks()).unwrap().packs,
            0,
            "import {i} lists after A's last key"
        );
    }
    let full = b.tier().unwrap().import_foreign(b.chunks()).unwrap();
    assert!(full.packs > 0, "the full scan adopts C's packs: {full:?}");
}

#[test]
fn a_crash_at_every_storage_operation_of_an_import_loses_nothing() {
    let objects = MemObjects::new();
    let (_mem_a, a) = mem_store(opts(&objects));
    let (want, vm) = write_data(&a, "vm");
    a.publish_wait("vm", WAIT).unwrap();
    drop((vm, a));
    let entries = 16 * 32;
    let cuts = Cuts { torn: false, ..Cuts::every(500) };
    let budget = crash_at_every_op(cuts, |budget, mode| {
        let mem = MemStorage::new();
        // The store exists first; only the import runs on the crashing storage.
        drop(Store::create(Arc::new(mem.clone()), &store_dir(), opts(&objects)).unwrap());
        let (storage, ctl) = crashing(&mem, budget);
        let result = Store::open(storage, &store_dir(), opts(&objects))
            .and_then(|b| b.tier().unwrap().import_foreign(b.chunks()));
        if !ctl.died() {
            assert_eq!(result.unwrap().entries, entries);
            return true;
        }
        mem.crash(mode);
        let what = format!("crash after {budget} ops");
        let b = reopen(&mem, opts(&objects)).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
        let r =
            b.tier().unwrap().import_foreign(b.chunks()).unwrap_or_else(|e| panic!("{what}: import: {e}"));
        assert!(r.entries <= entries, "{what}: {r:?}");
        let (got, _copy) = write_data(&b, "copy");
        same_tokens(&got, &want, &what);
        let stats = b.image_stats(&b.opened("copy").unwrap()).compaction;
        assert_eq!(stats.chunks_new, 0, "{what}: stored again after the import finished");
        false
    });
    assert!(budget > 3, "the import took only {budget} operations");
}
