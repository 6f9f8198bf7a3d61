//! Snapshots, clones and rollback (store/snapshot.rs, manifest/base.rs):
//! what each reads back, what each refuses, what GC keeps, and the
//! on-disk entries they leave.

mod common;

use cas::storage::{CrashMode, MemStorage, Storage};
use cas::store::{ImageKind, STORE_VERSION_LOCAL};
use cas::{Error, Image, Store};
use common::*;
use std::sync::Arc;

const IMAGE_BYTES: u64 = 4 << 20;

fn write(image: &Image, token: u64, first_sector: u64, sectors: u64) {
    image.write(first_sector * SECTOR as u64, &payload(token, first_sector, sectors), false).unwrap();
}

fn image_dir(name: &str) -> std::path::PathBuf {
    store_dir().join("images").join(name)
}

fn store_version(mem: &MemStorage) -> u32 {
    let bytes = mem.durable_bytes(&store_dir().join("STORE")).unwrap();
    u32::from_le_bytes(bytes[8..12].try_into().unwrap())
}

fn setup() -> (MemStorage, Arc<Store>, Arc<Image>) {
    let (mem, store) = mem_store(small_opts());
    store.create_image("vm", IMAGE_BYTES).unwrap();
    let image = store.open_image("vm").unwrap();
    (mem, store, image)
}

#[test]
fn a_snapshot_holds_the_completed_writes_compacted_or_not_and_none_after() {
    let (mem, store, image) = setup();
    write(&image, 1, 0, 64);
    image.flush().unwrap();
    store.compact_once(&image).unwrap();
    // Completed but neither flushed nor compacted: still in the snapshot.
    write(&image, 2, 32, 64);
    assert_eq!(
        store_version(&mem),
        STORE_VERSION_LOCAL,
        "older casblk refuse the store before it holds anything new"
    );
    let name = store.snapshot_image("vm", "s1").unwrap();
    assert_eq!(name, "vm@s1");
    let at_snapshot = read_tokens(&image).unwrap();
    write(&image, 3, 0, 8);
    write(&image, 4, 1000, 16);

    let snap = store.open_image("vm@s1").unwrap();
    same_tokens(&read_tokens(&snap).unwrap(), &at_snapshot, "the snapshot");
    assert!(snap.is_read_only());
    let refused = snap.write(0, &payload(9, 0, 8), false).unwrap_err();
    assert!(matches!(refused, Error::ReadOnly(_)), "{refused}");
    assert_eq!(refused.errno(), -libc::EROFS);
    assert!(matches!(snap.discard(0, 4096), Err(Error::ReadOnly(_))));
    assert!(matches!(snap.write_zeroes(0, 4096, false), Err(Error::ReadOnly(_))));

    let infos = store.list_images().unwrap();
    let s = infos.iter().find(|i| i.name == "vm@s1").unwrap();
    assert_eq!((s.kind, s.origin.as_deref()), (ImageKind::Snapshot, Some("vm")));
    // The snapshot shares the image's manifest file: a link, not a copy.
    assert!(!mem.exists(&image_dir("vm@s1").join("manifest")));
    assert!(mem.exists(&image_dir("vm@s1").join("base.root")));

    // After a crash both read back: the snapshot whole, the image its flushed state.
    image.flush().unwrap();
    let image_now = read_tokens(&image).unwrap();
    drop((snap, image, store));
    mem.crash(CrashMode::LoseUnsynced);
    let store = reopen(&mem, small_opts()).unwrap();
    let snap = store.open_image("vm@s1").unwrap();
    same_tokens(&read_tokens(&snap).unwrap(), &at_snapshot, "the snapshot after a crash");
    let image = store.open_image("vm").unwrap();
    same_tokens(&read_tokens(&image).unwrap(), &image_now, "the image after a crash");
}

#[test]
fn the_image_goes_on_committing_and_rewriting_without_touching_its_snapshot() {
    let (_mem, store, image) = setup();
    for t in 1..=20u64 {
        write(&image, t, (t * 37) % 8000, 8);
    }
    image.flush().unwrap();
    store.compact_once(&image).unwrap();
    store.snapshot_image("vm", "s").unwrap();
    let at_snapshot = read_tokens(&image).unwrap();
    for t in 21..=60u64 {
        write(&image, t, (t * 53) % 8000, 8);
        image.flush().unwrap();
        store.compact_once(&image).unwrap();
    }
    // A garbage rewrite of the image's manifest renames a new file into place.
    let manifest = store.compaction(&image).unwrap().manifest().clone();
    manifest.compact().unwrap();
    let snap = store.open_image("vm@s").unwrap();
    same_tokens(&read_tokens(&snap).unwrap(), &at_snapshot, "the snapshot after the image moved on");
    let report = store.gc().unwrap();
    assert_eq!(report.missing_references, 0);
    same_tokens(&read_tokens(&snap).unwrap(), &at_snapshot, "the snapshot after GC");
}

#[test]
fn a_clone_shares_the_snapshot_and_diverges_on_its_own() {
    let (mem, store, image) = setup();
    write(&image, 1, 0, 256);
    store.snapshot_image("vm", "gold").unwrap();
    let gold = read_tokens(&image).unwrap();
    store.clone_image("vm@gold", "web").unwrap();
    let refused = store.clone_image("vm", "db").unwrap_err();
    assert!(refused.to_string().contains("not a snapshot"), "{refused}");
    let web = store.open_image("web").unwrap();
    assert!(!web.is_read_only());
    same_tokens(&read_tokens(&web).unwrap(), &gold, "a new clone");
    write(&web, 7, 8, 16);
    write(&image, 8, 100, 16);
    let mut want = gold.clone();
    want[8..24].fill(7);
    same_tokens(&read_tokens(&web).unwrap(), &want, "the clone after its write");
    // Its first compaction moves its tree to an own manifest file.
    web.flush().unwrap();
    store.compact_once(&web).unwrap();
    assert!(mem.exists(&image_dir("web").join("manifest")));
    assert!(!mem.exists(&image_dir("web").join("base.root")));
    same_tokens(&read_tokens(&web).unwrap(), &want, "the clone after compaction");
    let snap = store.open_image("vm@gold").unwrap();
    same_tokens(&read_tokens(&snap).unwrap(), &gold, "the snapshot under its clone");
    let info = store.list_images().unwrap();
    let w = info.iter().find(|i| i.name == "web").unwrap();
    assert_eq!((w.kind, w.origin.as_deref()), (ImageKind::Image, Some("vm@gold")));
    drop((web, snap, image, store));
    mem.crash(CrashMode::LoseUnsynced);
    let store = reopen(&mem, small_opts()).unwrap();
    same_tokens(&read_tokens(&store.open_image("web").unwrap()).unwrap(), &want, "the clone after a crash");
}

#[test]
fn removal_refuses_an_image_with_snapshots_and_a_snapshot_with_clones_naming_them() {
    let (_mem, store, image) = setup();
    write(&image, 1, 0, 8);
    store.snapshot_image("vm", "a").unwrap();
    store.snapshot_image("vm", "b").unwrap();
    store.clone_image("vm@a", "c1").unwrap();
    drop(image);
    let e = store.remove_image("vm").unwrap_err().to_string();
    assert!(e.contains("vm@a") && e.contains("vm@b"), "{e}");
    let e = store.remove_image("vm@a").unwrap_err().to_string();
    assert!(e.contains("c1"), "{e}");
    store.remove_image("vm@b").unwrap();
    store.remove_image("c1").unwrap();
    store.remove_image("vm@a").unwrap();
    store.remove_image("vm").unwrap();
    assert!(store.list_images().unwrap().is_empty());
    let e = store.snapshot_image("vm", "x").unwrap_err();
    assert!(matches!(e, Error::NotFound(_)), "{e}");
}

#[test]
fn rollback_returns_a_closed_image_to_its_snapshot_and_forgets_the_log_since() {
    let (mem, store, image) = setup();
    write(&image, 1, 0, 64);
    image.flush().unwrap();
    store.compact_once(&image).unwrap();
    store.snapshot_image("vm", "before").unwrap();
    let before = read_tokens(&image).unwrap();
    write(&image, 2, 0, 32);
    image.flush().unwrap();
    store.compact_once(&image).unwrap();
    write(&image, 3, 500, 32); // only in the log
    image.flush().unwrap();
    let e = store.rollback_image("vm", "before").unwrap_err();
    assert!(e.to_string().contains("open"), "{e}");
    drop(image);
    store.rollback_image("vm", "before").unwrap();
    let image = store.open_image("vm").unwrap();
    same_tokens(&read_tokens(&image).unwrap(), &before, "after rollback");
    // The image goes on: new writes land above the covered log.
    write(&image, 4, 40, 8);
    image.flush().unwrap();
    let mut want = before.clone();
    want[40..48].fill(4);
    same_tokens(&read_tokens(&image).unwrap(), &want, "written after rollback");
    drop((image, store));
    mem.crash(CrashMode::LoseUnsynced);
    let store = reopen(&mem, small_opts()).unwrap();
    let image = store.open_image("vm").unwrap();
    same_tokens(&read_tokens(&image).unwrap(), &want, "after rollback and a crash");
    store.compact_once(&image).unwrap();
    same_tokens(&read_tokens(&image).unwrap(), &want, "after rollback and compaction");
}

#[test]
fn gc_keeps_what_only_a_snapshot_references_until_its_last_holder_goes() {
    let (_mem, store, image) = setup();
    write(&image, 1, 0, 256);
    store.snapshot_image("vm", "s").unwrap();
    let held = store.chunk_stats().chunks;
    assert!(held > 0);
    // Overwrite everything: only the snapshot still names the old chunks.
    write(&image, 2, 0, 256);
    image.flush().unwrap();
    store.compact_once(&image).unwrap();
    store.gc().unwrap();
    let snap = store.open_image("vm@s").unwrap();
    let tokens = read_tokens(&snap).unwrap();
    assert!(tokens[..256].iter().all(|&t| t == 1), "the snapshot lost data to GC");
    drop(snap);
    store.clone_image("vm@s", "c").unwrap();
    store.remove_image("c").unwrap();
    let before = store.chunk_stats().chunks;
    store.remove_image("vm@s").unwrap();
    let report = store.gc().unwrap();
    assert_eq!(report.chunks_dead, held, "the snapshot's own chunks are freed with it");
    assert_eq!(store.chunk_stats().chunks, before - held);
}

#[test]
fn an_empty_image_snapshots_and_clones_to_empty_images() {
    let (_mem, store, _image) = setup();
    store.snapshot_image("vm", "empty").unwrap();
    store.clone_image("vm@empty", "new").unwrap();
    let new = store.open_image("new").unwrap();
    assert!(read_tokens(&new).unwrap().iter().all(|&t| t == 0));
    write(&new, 5, 0, 8);
    new.flush().unwrap();
    store.compact_once(&new).unwrap();
    assert_eq!(read_tokens(&new).unwrap()[..8], [5; 8]);
    let e = store.snapshot_image("vm", "bad@name").unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let e = store.snapshot_image("vm@empty", "again").unwrap_err();
    assert!(e.to_string().contains("is a snapshot"), "{e}");
    let e = store.snapshot_image("vm", "empty").unwrap_err();
    assert!(matches!(e, Error::AlreadyExists(_)), "{e}");
}

#[test]
fn a_rollback_racing_the_removal_of_its_snapshot_never_leaves_an_empty_image() {
    for round in 0..40u64 {
        let (_mem, store, image) = setup();
        write(&image, 1, 0, 64);
        store.snapshot_image("vm", "s").unwrap();
        let at_snapshot = read_tokens(&image).unwrap();
        write(&image, 2, 0, 32);
        image.flush().unwrap();
        let after = read_tokens(&image).unwrap();
        drop(image);
        let remover = {
            let store = store.clone();
            std::thread::spawn(move || store.remove_image("vm@s"))
        };
        if round % 2 == 0 {
            std::thread::yield_now();
        }
        let rolled = store.rollback_image("vm", "s");
        remover.join().unwrap().unwrap();
        let got = read_tokens(&store.open_image("vm").unwrap()).unwrap();
        match rolled {
            Ok(()) => same_tokens(&got, &at_snapshot, "rolled back before the removal"),
            Err(Error::NotFound(_)) => same_tokens(&got, &after, "the snapshot went first"),
            Err(e) => panic!("round {round}: {e}"),
        }
    }
}

#[test]
fn a_damaged_own_manifest_does_not_take_the_base_beside_it_down_with_it() {
    let (mem, store, image) = setup();
    write(&image, 1, 0, 64);
    image.flush().unwrap();
    store.compact_once(&image).unwrap();
    store.snapshot_image("vm", "s").unwrap();
    drop((image, store));
    // A rollback's crash window: the new base is in place, the own
    // manifest not yet removed; then the own manifest is damaged.
    let (snap_dir, vm_dir) = (image_dir("vm@s"), image_dir("vm"));
    let link = mem.list_dir(&snap_dir).unwrap().into_iter().find(|n| n.starts_with("base-")).unwrap();
    mem.hard_link(&snap_dir.join(&link), &vm_dir.join(&link)).unwrap();
    let root = mem.durable_bytes(&snap_dir.join("base.root")).unwrap();
    let f = mem.open(&vm_dir.join("base.root"), cas::storage::OpenMode::CreateNew).unwrap();
    f.write_all_at(&root, 0).unwrap();
    f.sync_data().unwrap();
    mem.sync_dir(&vm_dir).unwrap();
    for slot in [0u64, 4096] {
        mem.corrupt(&vm_dir.join("manifest"), slot + 20, 0xff).unwrap();
    }
    let store = reopen(&mem, small_opts()).unwrap();
    assert!(store.open_image("vm").is_err(), "a manifest with both roots damaged opened");
    assert!(mem.exists(&vm_dir.join("base.root")) && mem.exists(&vm_dir.join(&link)), "the base was removed");
}
