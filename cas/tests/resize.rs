//! Growing images (store/resize.rs): open and closed, with faults and
//! crashes at every step of the `IMAGE` rewrite, with snapshots and
//! clones, and what it refuses; shrinking detached ones, with a crash at
//! each step, and what GC frees after.

mod common;

use cas::storage::{CrashMode, Fault, FaultOp, MemStorage};
use cas::store::ShrinkStop;
use cas::{Error, Image, Store};
use common::*;
use std::sync::Arc;

const OLD_BYTES: u64 = 1 << 20;
const NEW_BYTES: u64 = 3 << 20;

fn write(image: &Image, token: u64, first_sector: u64, sectors: u64) {
    image.write(first_sector * SECTOR as u64, &payload(token, first_sector, sectors), false).unwrap();
}

fn sectors(bytes: u64) -> u64 {
    bytes / SECTOR as u64
}

fn setup() -> (MemStorage, Arc<Store>, Arc<Image>) {
    let (mem, store) = mem_store(small_opts());
    store.create_image("vm", OLD_BYTES).unwrap();
    let image = store.open_image("vm").unwrap();
    (mem, store, image)
}

/// The next `op` on image vm's `IMAGE` file fails with EIO.
fn fail_image_file(mem: &MemStorage, op: FaultOp) {
    mem.inject(Fault {
        op,
        path_contains: Some("/images/vm/IMAGE".into()),
        skip: 0,
        errno: libc::EIO,
        sticky: false,
    });
}

fn listed_size(store: &Store, name: &str) -> u64 {
    store.list_images().unwrap().into_iter().find(|i| i.name == name).unwrap().size_bytes
}

#[test]
fn an_open_image_grows_and_keeps_its_data_through_a_crash() {
    let (mem, store, image) = setup();
    let last = sectors(OLD_BYTES) - 8;
    write(&image, 1, last, 8);
    image.flush().unwrap();
    store.compact_once(&image).unwrap();
    let past = image.write(OLD_BYTES, &payload(2, sectors(OLD_BYTES), 8), false).unwrap_err();
    assert!(matches!(past, Error::InvalidArgument(_)), "{past}");

    let r = store.resize_image("vm", NEW_BYTES).unwrap();
    assert_eq!((r.old_bytes, r.new_bytes), (OLD_BYTES, NEW_BYTES));
    assert!(Arc::ptr_eq(&r.image, &image), "the open image itself grows");
    assert_eq!(image.size_bytes(), NEW_BYTES);
    assert_eq!(store.image_stats(&image).size_bytes, NEW_BYTES, "stats follow the new size");
    assert_eq!(listed_size(&store, "vm"), NEW_BYTES);
    // The new end is writable at once, straddling the old end too; past it is not.
    write(&image, 3, last, 16);
    write(&image, 4, sectors(NEW_BYTES) - 8, 8);
    let beyond = image.write(NEW_BYTES, &payload(5, sectors(NEW_BYTES), 8), false).unwrap_err();
    assert!(matches!(beyond, Error::InvalidArgument(_)), "{beyond}");
    image.flush().unwrap();
    let want = read_tokens(&image).unwrap();
    assert_eq!(want.len() as u64, sectors(NEW_BYTES));
    assert!(want[sectors(OLD_BYTES) as usize + 100..sectors(NEW_BYTES) as usize - 8].iter().all(|&t| t == 0));

    // Half of it compacted, half only in the log: both replay past the old end.
    store.compact_once(&image).unwrap();
    write(&image, 6, sectors(OLD_BYTES) + 64, 32);
    image.flush().unwrap();
    let want = read_tokens(&image).unwrap();
    drop((r, image, store));
    mem.crash(CrashMode::LoseUnsynced);
    let store = reopen(&mem, small_opts()).unwrap();
    let image = store.open_image("vm").unwrap();
    assert_eq!(image.size_bytes(), NEW_BYTES);
    same_tokens(&read_tokens(&image).unwrap(), &want, "the grown image after a crash");
}

#[test]
fn a_closed_image_grows_and_a_rerun_changes_nothing() {
    let (mem, store, image) = setup();
    write(&image, 1, 0, 8);
    image.flush().unwrap();
    drop(image);
    let r = store.resize_image("vm", NEW_BYTES).unwrap();
    assert_eq!(r.old_bytes, OLD_BYTES);
    drop(r);
    let again = store.resize_image("vm", NEW_BYTES).unwrap();
    assert_eq!((again.old_bytes, again.new_bytes), (NEW_BYTES, NEW_BYTES));
    drop((again, store));
    mem.crash(CrashMode::LoseUnsynced);
    let store = reopen(&mem, small_opts()).unwrap();
    let image = store.open_image("vm").unwrap();
    assert_eq!(image.size_bytes(), NEW_BYTES);
    let got = read_tokens(&image).unwrap();
    assert!(got[..8].iter().all(|&t| t == 1) && got[8..].iter().all(|&t| t == 0));
}

/// A fault at each step of the rewrite (the temporary file's write and
/// sync, the rename, the directory's sync), then a crash: the image has
/// the old size or the new one, never a size its open image exceeded,
/// and its data either way; the grow then goes through.
#[test]
fn a_fault_or_crash_in_a_grow_leaves_the_old_size_or_the_new() {
    let mut seen = std::collections::BTreeSet::new();
    for op in [FaultOp::Write, FaultOp::Sync, FaultOp::Namespace] {
        for skip in 0..2 {
            for torn in [false, true] {
                let what = format!("{op:?} skip {skip} torn {torn}");
                let (mem, store, image) = setup();
                write(&image, 1, 0, 16);
                image.flush().unwrap();
                mem.inject(Fault {
                    op,
                    path_contains: Some("/images/vm/IMAGE".into()),
                    skip,
                    errno: libc::EIO,
                    sticky: false,
                });
                let grew = store.resize_image("vm", NEW_BYTES);
                mem.clear_faults();
                match &grew {
                    Ok(_) => assert_eq!(image.size_bytes(), NEW_BYTES, "{what}"),
                    Err(e) => {
                        assert_eq!(image.size_bytes(), OLD_BYTES, "{what}: {e}");
                        let past = image.write(OLD_BYTES, &payload(2, sectors(OLD_BYTES), 8), false);
                        assert!(past.is_err(), "{what}: a write past the old end after a failed grow");
                    }
                }
                if grew.is_ok() {
                    write(&image, 3, sectors(OLD_BYTES), 8);
                    image.flush().unwrap();
                }
                let want = read_tokens(&image).unwrap();
                drop((grew, image, store));
                mem.crash(if torn { CrashMode::Torn { seed: skip } } else { CrashMode::LoseUnsynced });
                let store = reopen(&mem, small_opts()).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
                let image = store.open_image("vm").unwrap_or_else(|e| panic!("{what}: open: {e}"));
                let size = image.size_bytes();
                assert!(size == OLD_BYTES || size == NEW_BYTES, "{what}: size {size}");
                seen.insert(size);
                let got = read_tokens(&image).unwrap();
                same_tokens(&got[..want.len().min(got.len())], &want[..want.len().min(got.len())], &what);
                store.resize_image("vm", NEW_BYTES).unwrap_or_else(|e| panic!("{what}: the rerun: {e}"));
                write(&image, 4, sectors(NEW_BYTES) - 8, 8);
                image.flush().unwrap();
            }
        }
    }
    assert_eq!(seen.len(), 2, "crashes left only the sizes {seen:?}");
}

#[test]
fn snapshots_keep_their_size_and_a_clone_grows_on_its_own() {
    let (_mem, store, image) = setup();
    write(&image, 1, 0, 8);
    let small = store.snapshot_image("vm", "small").unwrap();
    store.resize_image("vm", NEW_BYTES).unwrap();
    write(&image, 2, sectors(NEW_BYTES) - 8, 8);
    let big = store.snapshot_image("vm", "big").unwrap();
    assert_eq!(listed_size(&store, &small), OLD_BYTES);
    assert_eq!(listed_size(&store, &big), NEW_BYTES);
    let refused = store.resize_image(&small, NEW_BYTES).err().expect("a snapshot grew");
    assert!(
        matches!(&refused, Error::InvalidArgument(m) if m.contains("snapshots keep their size")),
        "{refused}"
    );
    assert_eq!(store.open_image(&big).unwrap().size_bytes(), NEW_BYTES);

    store.clone_image(&small, "c").unwrap();
    let clone = store.resize_image("c", 2 * OLD_BYTES).unwrap().image;
    write(&clone, 3, sectors(2 * OLD_BYTES) - 8, 8);
    let got = read_tokens(&clone).unwrap();
    assert!(got[..8].iter().all(|&t| t == 1), "the clone has its snapshot's data");
    assert!(got[8..got.len() - 8].iter().all(|&t| t == 0), "and nothing of the image's later writes");
    assert_eq!(listed_size(&store, &small), OLD_BYTES);
    assert_eq!(image.size_bytes(), NEW_BYTES);
}

#[test]
fn a_resize_refuses_what_it_cannot_do_and_changes_nothing() {
    let (_mem, store, image) = setup();
    let cases: [(&str, u64, &str); 5] = [
        ("vm", OLD_BYTES + 512, "multiple of 4096"),
        ("vm", 0, "non-zero"),
        ("vm", (1 << 50) + 4096, "up to"),
        ("vm", OLD_BYTES - 4096, "shrinking"),
        ("none", NEW_BYTES, "not found"),
    ];
    for (name, size, says) in cases {
        let e = store.resize_image(name, size).err().unwrap_or_else(|| panic!("{name} {size} accepted"));
        assert!(e.to_string().contains(says), "{name} {size}: {e}");
        let kind_ok = match says {
            "not found" => matches!(e, Error::NotFound(_)),
            _ => matches!(e, Error::InvalidArgument(_)),
        };
        assert!(kind_ok, "{name} {size}: {e:?}");
    }
    assert_eq!(image.size_bytes(), OLD_BYTES);
    assert_eq!(listed_size(&store, "vm"), OLD_BYTES);
}

/// A rollback returns a grown image to its snapshot's size too, and a
/// later grow shows zeros past that end, never what was written there
/// before the rollback. A fault at the size's rewrite, then a crash,
/// leaves the snapshot's data at either size; the rollback run again
/// finishes it.
#[test]
fn a_rollback_restores_the_snapshots_size_and_a_later_grow_reads_zeros() {
    for fault in [None, Some(FaultOp::Write), Some(FaultOp::Sync), Some(FaultOp::Namespace)] {
        let (mem, store, image) = setup();
        write(&image, 1, 0, 8);
        store.snapshot_image("vm", "small").unwrap();
        store.resize_image("vm", NEW_BYTES).unwrap();
        write(&image, 2, sectors(OLD_BYTES) - 8, 64);
        write(&image, 3, sectors(NEW_BYTES) - 8, 8);
        image.flush().unwrap();
        store.compact_once(&image).unwrap();
        write(&image, 4, sectors(OLD_BYTES) + 100, 8);
        image.flush().unwrap();
        drop(image);
        let store = match fault {
            None => {
                store.rollback_image("vm", "small").unwrap();
                store
            }
            Some(op) => {
                fail_image_file(&mem, op);
                let r = store.rollback_image("vm", "small");
                mem.clear_faults();
                drop(store);
                mem.crash(CrashMode::LoseUnsynced);
                let store = reopen(&mem, small_opts()).unwrap();
                let image = store.open_image("vm").unwrap();
                let got = read_tokens(&image).unwrap();
                let size = image.size_bytes();
                if r.is_ok() {
                    assert_eq!(size, OLD_BYTES, "{op:?}: a rollback that succeeded");
                } else {
                    assert!(size == NEW_BYTES || size == OLD_BYTES, "{op:?}: {size}");
                }
                assert!(got[..8].iter().all(|&t| t == 1), "{op:?}: the snapshot's data");
                assert!(got[8..].iter().all(|&t| t == 0), "{op:?}: nothing written after the snapshot");
                drop(image);
                store.rollback_image("vm", "small").unwrap();
                store
            }
        };
        let image = store.open_image("vm").unwrap();
        assert_eq!(image.size_bytes(), OLD_BYTES, "{fault:?}");
        assert_eq!(listed_size(&store, "vm"), OLD_BYTES, "{fault:?}");
        store.resize_image("vm", NEW_BYTES).unwrap();
        let got = read_tokens(&image).unwrap();
        assert!(got[..8].iter().all(|&t| t == 1), "{fault:?}");
        assert!(got[8..].iter().all(|&t| t == 0), "{fault:?}: a grow after the rollback shows old writes");
    }
}

/// A grow whose directory sync failed after its rename (sticky, so its
/// own retry fails too) leaves the new size visible but not durable; the
/// same grow run again makes it durable before the image takes it.
#[test]
fn a_grow_rerun_after_a_failed_directory_sync_is_durable() {
    let (mem, store, image) = setup();
    write(&image, 1, 0, 8);
    image.flush().unwrap();
    mem.inject(Fault {
        op: FaultOp::Namespace,
        path_contains: Some("/store/images/vm".into()),
        skip: 1,
        errno: libc::EIO,
        sticky: true,
    });
    let failed = store.resize_image("vm", NEW_BYTES).err().expect("the grow failed at its directory sync");
    mem.clear_faults();
    assert_eq!(image.size_bytes(), OLD_BYTES, "{failed}");
    assert_eq!(listed_size(&store, "vm"), NEW_BYTES, "the rename is visible");
    store.resize_image("vm", NEW_BYTES).unwrap();
    write(&image, 2, sectors(NEW_BYTES) - 8, 8);
    image.flush().unwrap();
    drop((image, store));
    mem.crash(CrashMode::LoseUnsynced);
    let store = reopen(&mem, small_opts()).unwrap();
    let image = store.open_image("vm").unwrap_or_else(|e| panic!("a flushed write past the old end: {e}"));
    assert_eq!(image.size_bytes(), NEW_BYTES);
    let got = read_tokens(&image).unwrap();
    assert!(got[..8].iter().all(|&t| t == 1) && got[got.len() - 8..].iter().all(|&t| t == 2));
}

/// A rollback to a larger snapshot writes the size before it switches
/// the tree: a crash at any step leaves the small snapshot's data (at
/// either size, zeros past its end), or the large one's at its size.
#[test]
fn a_rollback_to_a_larger_snapshot_never_leaves_a_tree_past_the_size() {
    for skip in 0..6 {
        let (mem, store, image) = setup();
        write(&image, 1, 0, 8);
        store.snapshot_image("vm", "small").unwrap();
        store.resize_image("vm", NEW_BYTES).unwrap();
        write(&image, 2, sectors(NEW_BYTES) - 8, 8);
        store.snapshot_image("vm", "big").unwrap();
        let big = read_tokens(&image).unwrap();
        drop(image);
        store.rollback_image("vm", "small").unwrap();
        mem.inject(Fault {
            op: FaultOp::Namespace,
            path_contains: Some("/store/images/vm/".into()),
            skip,
            errno: libc::EIO,
            sticky: false,
        });
        let r = store.rollback_image("vm", "big");
        mem.clear_faults();
        drop(store);
        mem.crash(CrashMode::LoseUnsynced);
        let store = reopen(&mem, small_opts()).unwrap();
        let image = store.open_image("vm").unwrap();
        let size = image.size_bytes();
        let got = read_tokens(&image).unwrap();
        if got == big {
            assert_eq!(size, NEW_BYTES, "skip {skip}");
        } else {
            assert!(r.is_err(), "skip {skip}: the rollback succeeded but the data is not the snapshot's");
            assert!(got[..8].iter().all(|&t| t == 1) && got[8..].iter().all(|&t| t == 0), "skip {skip}");
            store.resize_image("vm", NEW_BYTES).unwrap();
            let grown = read_tokens(&image).unwrap();
            assert!(grown[8..].iter().all(|&t| t == 0), "skip {skip}: a grow shows the larger tree's blocks");
        }
    }
}

/// A store whose image `vm` (NEW_BYTES, closed) holds token 1 in its
/// first 64 KiB, token 2 (blocks nothing else holds) from OLD_BYTES on,
/// and token 3 in its last 64 KiB, half compacted and half only in the
/// log; its tokens.
fn shrinkable() -> (MemStorage, Arc<Store>, Vec<u64>) {
    let (mem, store) = mem_store(small_opts());
    store.create_image("vm", NEW_BYTES).unwrap();
    let image = store.open_image("vm").unwrap();
    write(&image, 1, 0, 128);
    write(&image, 2, sectors(OLD_BYTES), 512);
    image.flush().unwrap();
    store.compact_once(&image).unwrap();
    write(&image, 3, sectors(NEW_BYTES) - 128, 128);
    image.flush().unwrap();
    let tokens = read_tokens(&image).unwrap();
    drop(image);
    (mem, store, tokens)
}

fn fsck_clean(mem: &MemStorage, what: &str) {
    let storage: Arc<dyn cas::storage::Storage> = Arc::new(mem.clone());
    let r = cas::fsck::check(storage, &store_dir(), &cas::fsck::FsckOptions::default()).expect("fsck runs");
    assert!(r.is_clean(), "{what}: {:#?}", r.problems);
}

/// A detached image shrinks: its prefix keeps its data, GC frees the
/// chunks only the dropped bytes held (not those a snapshot shares), the
/// log's records past the new end never replay (a crash and reopen), and
/// a later grow reads zeros there.
#[test]
fn a_detached_image_shrinks_and_gc_frees_what_only_its_tail_held() {
    let (mem, store, tokens) = shrinkable();
    store.snapshot_image("vm", "s").unwrap();
    let held = store.gc().unwrap();
    assert_eq!(held.chunks_dead, 0, "nothing is garbage before the shrink");
    let r = store.shrink_image("vm", OLD_BYTES, None).unwrap();
    assert_eq!(r, cas::store::Shrunk { old_bytes: NEW_BYTES, new_bytes: OLD_BYTES });
    assert_eq!(listed_size(&store, "vm"), OLD_BYTES);
    assert_eq!(listed_size(&store, "vm@s"), NEW_BYTES, "the snapshot keeps its size");
    assert_eq!(store.gc().unwrap().chunks_dead, 0, "the snapshot still holds every dropped chunk");
    store.remove_image("vm@s").unwrap();
    let freed = store.gc().unwrap();
    assert!(
        freed.chunks_dead > 0 && freed.bytes_reclaimed > 0,
        "GC freed nothing after the shrink: {freed:?}"
    );

    drop(store);
    mem.crash(CrashMode::LoseUnsynced);
    let store = reopen(&mem, small_opts()).unwrap();
    let image = store.open_image("vm").unwrap();
    assert_eq!(image.size_bytes(), OLD_BYTES);
    same_tokens(&read_tokens(&image).unwrap(), &tokens[..sectors(OLD_BYTES) as usize], "the shrunk prefix");
    store.resize_image("vm", NEW_BYTES).unwrap();
    assert!(
        read_tokens(&image).unwrap()[sectors(OLD_BYTES) as usize..].iter().all(|&t| t == 0),
        "a grow shows old data"
    );
    drop((image, store));
    fsck_clean(&mem, "after the shrink and the grow");
}

#[test]
fn a_shrink_refuses_what_it_cannot_do_and_changes_nothing() {
    let (_mem, store, _) = shrinkable();
    let open = store.open_image("vm").unwrap();
    let e = store.shrink_image("vm", OLD_BYTES, None).unwrap_err();
    assert!(matches!(e, Error::Unavailable(..)) && e.to_string().contains("detached"), "{e}");
    drop(open);
    store.snapshot_image("vm", "s").unwrap();
    for (name, size, what) in [
        ("vm", NEW_BYTES + 4096, "larger"),
        ("vm", OLD_BYTES + 512, "not in 4 KiB"),
        ("vm", 0, "zero"),
        ("vm@s", OLD_BYTES, "a snapshot"),
    ] {
        let e = store.shrink_image(name, size, None).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{what}: {e}");
    }
    assert!(matches!(store.shrink_image("nope", OLD_BYTES, None).unwrap_err(), Error::NotFound(_)));
    let Err(e) = store.resize_image("vm", OLD_BYTES) else { panic!("a grow to a smaller size succeeded") };
    assert!(e.to_string().contains("--shrink"), "the grow's refusal names --shrink: {e}");
    assert_eq!(listed_size(&store, "vm"), NEW_BYTES);
    assert_eq!(store.shrink_image("vm", NEW_BYTES, None).unwrap().new_bytes, NEW_BYTES, "the same size");
}

/// A crash at each step of a shrink (after the discard, after its
/// compaction, a fault on the `IMAGE` rewrite, and after it), in both
/// crash modes, leaves the old size with the prefix intact and the tail
/// either intact (nothing durable yet) or zeros, or the new size with the
/// prefix; the shrink run again finishes, a grow then reads zeros, and
/// fsck finds the store clean.
#[test]
fn a_crash_at_each_step_of_a_shrink_leaves_old_size_or_new_and_a_rerun_finishes() {
    let mut seen = std::collections::BTreeSet::new();
    let steps: Vec<(Option<ShrinkStop>, Option<FaultOp>)> = vec![
        (Some(ShrinkStop::AfterDiscard), None),
        (Some(ShrinkStop::AfterCompaction), None),
        (None, Some(FaultOp::Write)),
        (None, Some(FaultOp::Sync)),
        (None, Some(FaultOp::Namespace)),
        (None, None),
    ];
    for (stop, fault) in steps {
        for torn in [false, true] {
            let what = format!("stop {stop:?} fault {fault:?} torn {torn}");
            let (mem, store, tokens) = shrinkable();
            if let Some(op) = fault {
                fail_image_file(&mem, op);
            }
            let r = store.shrink_image("vm", OLD_BYTES, stop);
            mem.clear_faults();
            assert_eq!(r.is_err(), fault.is_some(), "{what}: {r:?}");
            drop(store);
            mem.crash(if torn { CrashMode::Torn { seed: 7 } } else { CrashMode::LoseUnsynced });
            let store = reopen(&mem, small_opts()).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
            let image = store.open_image("vm").unwrap_or_else(|e| panic!("{what}: open: {e}"));
            let size = image.size_bytes();
            seen.insert(size);
            if stop.is_none() && fault.is_none() {
                assert_eq!(size, OLD_BYTES, "{what}: a shrink that returned is durable");
            }
            let got = read_tokens(&image).unwrap();
            let cut = sectors(OLD_BYTES) as usize;
            same_tokens(&got[..cut], &tokens[..cut], &format!("{what}: the prefix"));
            match size {
                NEW_BYTES => {
                    let tail = &got[cut..];
                    assert!(
                        tail == &tokens[cut..] || tail.iter().all(|&t| t == 0),
                        "{what}: the tail at the old size is neither its data nor zeros"
                    );
                }
                OLD_BYTES => assert!(stop.is_none(), "{what}: shrunk before the IMAGE rewrite"),
                other => panic!("{what}: size {other}"),
            }
            drop(image);
            let again =
                store.shrink_image("vm", OLD_BYTES, None).unwrap_or_else(|e| panic!("{what}: rerun: {e}"));
            assert_eq!(again.new_bytes, OLD_BYTES);
            store.resize_image("vm", NEW_BYTES).unwrap();
            let grown = store.open_image("vm").unwrap();
            assert!(
                read_tokens(&grown).unwrap()[cut..].iter().all(|&t| t == 0),
                "{what}: a grow shows old data"
            );
            drop((grown, store));
            fsck_clean(&mem, &what);
        }
    }
    assert_eq!(seen.len(), 2, "crashes left only the sizes {seen:?}");
}
