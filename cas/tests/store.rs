//! The store directory: version file, lock, image create/open/list/remove.

mod common;

use cas::format::crc32c;
use cas::storage::{CrashMode, Fault, FaultOp, FsStorage, MemStorage, OpenMode, Storage};
use cas::store::ImageKind;
use cas::{Error, ImageInfo, Store, StoreOptions};
use common::*;
use std::sync::Arc;

#[test]
fn images_are_created_listed_opened_and_removed() {
    let (mem, store) = mem_store(small_opts());
    store.create_image("b", 8 << 20).unwrap();
    store.create_image("a", 1 << 30).unwrap();
    assert!(matches!(store.create_image("a", 4096), Err(Error::AlreadyExists(_))));
    let a = store.open_image("a").unwrap();
    assert!(Arc::ptr_eq(&a, &store.open_image("a").unwrap()), "one Image per name");
    assert_eq!(a.size_bytes(), 1 << 30);
    let list = store.list_images().unwrap();
    assert_eq!(
        list,
        vec![
            ImageInfo {
                name: "a".into(),
                size_bytes: 1 << 30,
                open: true,
                kind: ImageKind::Image,
                origin: None
            },
            ImageInfo {
                name: "b".into(),
                size_bytes: 8 << 20,
                open: false,
                kind: ImageKind::Image,
                origin: None
            },
        ]
    );
    assert!(matches!(store.remove_image("a"), Err(Error::Unavailable(..))), "open images stay");
    drop(a);
    store.remove_image("a").unwrap();
    assert!(matches!(store.open_image("a"), Err(Error::NotFound(_))));
    assert!(matches!(store.remove_image("a"), Err(Error::NotFound(_))));
    // Durable: after a crash the store still lists exactly "b".
    drop(store);
    mem.crash(CrashMode::LoseUnsynced);
    let store = reopen(&mem, small_opts()).unwrap();
    let names: Vec<String> = store.list_images().unwrap().into_iter().map(|i| i.name).collect();
    assert_eq!(names, ["b"]);
}

#[test]
fn bad_names_and_sizes_are_refused() {
    let (_mem, store) = mem_store(small_opts());
    for name in ["", ".", "..", "a/b", "../etc", "x\0y", ".tmp", &"n".repeat(129)] {
        assert!(matches!(store.create_image(name, 4096), Err(Error::InvalidArgument(_))), "{name:?}");
        assert!(matches!(store.open_image(name), Err(Error::InvalidArgument(_))), "{name:?}");
    }
    for size in [0, 512, 4097, 1 << 51] {
        assert!(matches!(store.create_image("s", size), Err(Error::InvalidArgument(_))), "{size}");
    }
}

#[test]
fn a_crash_during_create_leaves_nothing_visible() {
    // Stop a create at each of its namespace operations and syncs (every
    // later one fails), crash, and reopen: the image exists whole or not
    // at all, and a new create of the name works.
    let mut partial = 0;
    for stop_after in 0..16u64 {
        for op in [FaultOp::Namespace, FaultOp::Sync] {
            let (mem, store) = mem_store(small_opts());
            mem.inject(Fault { op, path_contains: None, skip: stop_after, errno: libc::EIO, sticky: true });
            let created = store.create_image("c", 1 << 20).is_ok();
            drop(store);
            mem.crash(CrashMode::Torn { seed: stop_after });
            let store = reopen(&mem, small_opts()).unwrap();
            match store.list_images().unwrap().as_slice() {
                [] => {
                    assert!(!created, "a completed create was lost");
                    partial += u64::from(mem.exists(&store_dir().join("images/c")));
                    store.create_image("c", 1 << 20).unwrap();
                }
                [info] => assert_eq!(info.size_bytes, 1 << 20),
                other => panic!("{other:?}"),
            }
            let image = store.open_image("c").unwrap();
            image.write(0, &payload(1, 0, 8), true).unwrap();
        }
    }
    assert!(partial > 0, "no stop left a half-made image directory: the test proves nothing");
}

#[test]
fn one_opener_at_a_time() {
    let (mem, store) = mem_store(small_opts());
    let e = reopen(&mem, small_opts()).unwrap_err();
    assert!(matches!(e, Error::Unavailable(..)), "{e}");
    drop(store);
    let _again = reopen(&mem, small_opts()).unwrap();
}

/// A store path on a real filesystem: under target/ rather than /tmp (often
/// tmpfs), like the benchmarks. The directory lives as long as the guard.
fn fs_store_dir() -> (tempfile::TempDir, std::path::PathBuf) {
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-tmp");
    std::fs::create_dir_all(&base).unwrap();
    let tmp = tempfile::tempdir_in(&base).unwrap();
    let dir = tmp.path().join("store");
    (tmp, dir)
}

#[test]
fn fs_store_locks_and_round_trips() {
    let (_tmp, dir) = fs_store_dir();
    let fs: Arc<dyn Storage> = Arc::new(FsStorage::new());
    let store = Store::open_or_create(fs.clone(), &dir, small_opts()).unwrap();
    assert!(Store::open(fs.clone(), &dir, small_opts()).is_err(), "flock held");
    store.create_image("f", 4 << 20).unwrap();
    let image = store.open_image("f").unwrap();
    image.write(4096, &payload(5, 8, 2048), true).unwrap();
    drop((image, store));
    let store = Store::open_or_create(fs, &dir, small_opts()).unwrap();
    let t = read_tokens(&store.open_image("f").unwrap()).unwrap();
    assert_eq!(t[8..2056], [5; 2048]);
}

#[test]
fn store_version_is_checked() {
    let (mem, store) = mem_store(small_opts());
    drop(store);
    let path = store_dir().join("STORE");
    let f = mem.open(&path, OpenMode::Existing).unwrap();
    let mut bytes = vec![0u8; f.len().unwrap() as usize];
    f.read_exact_at(&mut bytes, 0).unwrap();
    let newer = cas::store::STORE_VERSION + 1;
    bytes[8..12].copy_from_slice(&newer.to_le_bytes());
    let n = bytes.len() - 4;
    let crc = crc32c(&bytes[..n]);
    bytes[n..].copy_from_slice(&crc.to_le_bytes());
    f.write_all_at(&bytes, 0).unwrap();
    let e = reopen(&mem, small_opts()).unwrap_err();
    assert!(
        matches!(e, Error::UnsupportedVersion { found, .. } if found == newer)
            && e.to_string().contains("upgrade"),
        "{e}"
    );
    assert!(matches!(
        Store::create(Arc::new(mem.clone()), &store_dir(), small_opts()),
        Err(Error::AlreadyExists(_))
    ));
    let missing = Store::open(Arc::new(MemStorage::new()), &store_dir(), small_opts()).unwrap_err();
    assert!(matches!(missing, Error::NotFound(_)), "{missing}");
}

#[test]
fn options_are_validated() {
    let bad = [
        StoreOptions { log_segment_bytes: 1000, ..StoreOptions::default() },
        StoreOptions { log_segment_bytes: 2 << 30, ..StoreOptions::default() },
        StoreOptions { log_quota_bytes: 8 << 20, ..StoreOptions::default() },
    ];
    for opts in bad {
        let e = Store::create(Arc::new(MemStorage::new()), &store_dir(), opts.clone()).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{opts:?}: {e}");
    }
}

/// Drops every file of `dir` (recursively) from the page cache; the files
/// must be clean (synced) for their pages to go.
fn evict_page_cache(dir: &std::path::Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            evict_page_cache(&path);
        } else if let Ok(f) = std::fs::File::open(&path) {
            // Dirty pages are not dropped: write them back first.
            f.sync_all().unwrap();
            rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
        }
    }
}

/// Evicts `dir`'s pages and runs `declined` until it returns true: up to
/// 100 times, 10 ms apart. Returns whether it did.
fn evicted_then(dir: &std::path::Path, mut declined: impl FnMut() -> bool) -> bool {
    (0..100).any(|_| {
        evict_page_cache(dir);
        declined() || {
            std::thread::sleep(std::time::Duration::from_millis(10));
            false
        }
    })
}

/// Whether a read may wait is a property of each call: a read that must
/// not wait, of data whose file would wait (here: the files of one kind
/// decline, in turn: packs, log segments, the manifest), fails and counts
/// nothing, while a blocking read right after on the same thread reads it.
/// Deterministic on any filesystem, unlike the page cache test below.
#[test]
fn nowait_is_honoured_per_call() {
    let mem = MemStorage::new();
    // The file name ending that declines ("" declines nothing).
    let declined = Arc::new(std::sync::Mutex::new(""));
    let which = declined.clone();
    let decline: DeclineNowait = Arc::new(move |p: &std::path::Path| {
        let end = *which.lock().unwrap();
        !end.is_empty() && p.to_string_lossy().ends_with(end)
    });
    let storage: Arc<dyn Storage> = Arc::new(SlowSync {
        inner: Arc::new(mem),
        delay: std::time::Duration::ZERO,
        read_hook: None,
        write_hook: None,
        decline_nowait: Some(decline),
    });
    // No chunk cache: every chunk read goes to a pack file.
    let opts = StoreOptions { chunk_cache_bytes: 0, ..small_opts() };
    let store = Store::create(storage.clone(), &store_dir(), opts.clone()).unwrap();
    store.create_image("f", 4 << 20).unwrap();
    let image = store.open_image("f").unwrap();
    let chunked: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8 + 1).collect();
    image.write(0, &chunked, false).unwrap();
    // A block in another leaf (126 blocks each): the tree's root is then
    // an interior page, and a store opened again has no leaf cached.
    image.write(2 << 20, &chunked[..4096], false).unwrap();
    image.flush().unwrap();
    store.compact_once(&image).unwrap();
    let logged = vec![9u8; 4096];
    image.write(1 << 20, &logged, true).unwrap();

    // declined_then_read(OFFSET, WANT, WHAT): a read that must not wait is
    // refused and not counted, a blocking one right after reads WANT.
    let declined_then_read = |image: &cas::Image, offset: u64, want: &[u8], what: &str| {
        let mut buf = vec![0u8; want.len()];
        let reads = image.stats().reads;
        assert!(!image.read_nowait(offset, &mut buf).unwrap(), "a {what} read that must not wait was served");
        assert_eq!(image.stats().reads, reads, "a declined read is not counted");
        image.read(offset, &mut buf).unwrap();
        assert_eq!(buf, want, "a blocking read on the same thread is not affected");
    };
    *declined.lock().unwrap() = ".pack";
    declined_then_read(&image, 0, &chunked, "pack");
    let mut small = vec![0u8; 4096];
    assert!(image.read_nowait(1 << 20, &mut small).unwrap(), "log data is served while packs decline");
    assert_eq!(small, logged);
    *declined.lock().unwrap() = ".wal";
    declined_then_read(&image, 1 << 20, &logged, "log segment");
    assert!(image.read_nowait(0, &mut small).unwrap(), "chunks are served while log segments decline");

    // The manifest, as a store opened again reads it: no page cached.
    drop(image);
    drop(store);
    *declined.lock().unwrap() = "";
    let store = Store::open_or_create(storage, &store_dir(), opts).unwrap();
    let image = store.open_image("f").unwrap();
    *declined.lock().unwrap() = "/manifest";
    declined_then_read(&image, 0, &chunked, "manifest page");
}

#[test]
fn nowait_reads_come_from_memory_or_say_they_would_block() {
    let (_tmp, dir) = fs_store_dir();
    let fs: Arc<dyn Storage> = Arc::new(FsStorage::new());
    // No chunk cache: every chunk read goes to a pack file.
    let opts = StoreOptions { chunk_cache_bytes: 0, ..small_opts() };
    let store = Store::open_or_create(fs, &dir, opts).unwrap();
    store.create_image("f", 4 << 20).unwrap();
    let image = store.open_image("f").unwrap();
    let chunked: Vec<u8> = (0..64 * 1024).map(|i| (i % 251) as u8 + 1).collect();
    image.write(0, &chunked, false).unwrap();
    image.flush().unwrap();
    store.compact_once(&image).unwrap();
    let logged = vec![9u8; 4096];
    image.write(1 << 20, &logged, true).unwrap();
    // Hot in the page cache: served in place.
    let mut buf = vec![0u8; chunked.len()];
    assert!(image.read_nowait(0, &mut buf).unwrap());
    assert_eq!(buf, chunked);
    let mut small = vec![0u8; 4096];
    assert!(image.read_nowait(1 << 20, &mut small).unwrap());
    assert_eq!(small, logged);
    // Holes never touch storage.
    assert!(image.read_nowait(2 << 20, &mut small).unwrap());
    assert_eq!(small, vec![0u8; 4096]);

    let probe = std::fs::File::open(dir.join("STORE")).unwrap();
    if cas::storage::is_memory_fs(&probe) {
        return; // tmpfs: nothing waits for a device, every read is served in place
    }
    // Evicted: the nowait read declines, counts nothing; a blocking read
    // brings the data back and the next nowait read is served in place.
    // Eviction is best effort (other load may hold pages a moment), so it
    // is retried, bounded, until a read declines; a read served meanwhile
    // counts, the declined one must not.
    let mut counted_when_declined = None;
    let declined = evicted_then(&dir, || {
        let reads = image.stats().reads;
        let served = image.read_nowait(0, &mut buf).unwrap();
        if !served {
            counted_when_declined = Some(image.stats().reads - reads);
        }
        !served
    });
    assert!(declined, "a read of evicted pack data was served without waiting");
    assert_eq!(counted_when_declined, Some(0), "a declined read is not counted");
    image.read(0, &mut buf).unwrap();
    assert_eq!(buf, chunked);
    assert!(image.read_nowait(0, &mut buf).unwrap());
    assert_eq!(buf, chunked);
    let declined = evicted_then(&dir, || !image.read_nowait(1 << 20, &mut small).unwrap());
    assert!(declined, "a read of evicted log data was served without waiting");
    image.read(1 << 20, &mut small).unwrap();
    assert_eq!(small, logged);
}

#[test]
fn space_stats_give_the_filesystem_and_what_images_were_promised() {
    let (mem, store) = mem_store(small_opts());
    store.create_image("a", 8 << 20).unwrap();
    store.create_image("b", 24 << 20).unwrap();
    store.snapshot_image("a", "s1").unwrap();
    let s = store.space_stats().unwrap();
    assert_eq!(s.provisioned_bytes, 32 << 20, "snapshots promise nothing writable");
    assert_eq!((s.fs_size_bytes, s.fs_avail_bytes, s.overcommit_ratio), (0, 0, 0.0), "unknown space");
    mem.set_space(Some(cas::storage::FsSpace { size_bytes: 16 << 20, avail_bytes: 5 << 20 }));
    let s = store.space_stats().unwrap();
    assert_eq!((s.fs_size_bytes, s.fs_avail_bytes), (16 << 20, 5 << 20));
    assert_eq!(s.overcommit_ratio, 2.0);
    let dir = tempfile::tempdir().unwrap();
    let fs = FsStorage::new().space(dir.path()).unwrap().expect("statvfs answers");
    assert!(fs.size_bytes > 0 && fs.avail_bytes <= fs.size_bytes, "{fs:?}");
}
