//! Image behaviour: sub-4K merging, the manifest seam, faults, group
//! commit, log capacity and reclamation, concurrency, bad arguments.

mod common;

use cas::image::{ManifestView, BLOCK_BYTES};
use cas::io::IoCx;
use cas::storage::{CrashMode, Fault, FaultOp, MemStorage};
use cas::{Error, RecordKind, Store, StoreOptions};
use common::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn image_on(mem: &MemStorage, opts: StoreOptions, size: u64) -> (Arc<Store>, Arc<cas::Image>) {
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), opts).unwrap();
    store.create_image("i", size).unwrap();
    let image = store.open_image("i").unwrap();
    (store, image)
}

#[test]
fn sub_4k_writes_merge_with_older_data_and_survive_reopen() {
    let mem = MemStorage::new();
    let (store, image) = image_on(&mem, small_opts(), 1 << 20);
    image.write(0, &payload(1, 0, 16), false).unwrap(); // 8 KiB
    image.write(1024, &payload(2, 2, 1), false).unwrap(); // one sector inside block 0
    image.write(3584, &payload(3, 7, 3), false).unwrap(); // straddles blocks 0 and 1
    image.write_zeroes(6144, 512, false).unwrap();
    let want = [1, 1, 2, 1, 1, 1, 1, 3, 3, 3, 1, 1, 0, 1, 1, 1];
    assert_eq!(read_tokens(&image).unwrap()[..16], want);
    // A read starting and ending mid-block.
    let mut buf = vec![0u8; 1536];
    image.read(3072, &mut buf).unwrap();
    let got: Vec<u64> =
        buf.chunks(512).enumerate().map(|(i, b)| decode_sector(b, 6 + i as u64).unwrap()).collect();
    assert_eq!(got, [1, 3, 3]);
    image.flush().unwrap();
    drop((image, store));
    mem.crash(CrashMode::LoseUnsynced);
    let image = reopen(&mem, small_opts()).unwrap().open_image("i").unwrap();
    assert_eq!(read_tokens(&image).unwrap()[..16], want);
}

#[test]
fn reads_fall_through_the_overlay_to_the_manifest_then_to_zeros() {
    let mem = MemStorage::new();
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), small_opts()).unwrap();
    store.create_image("i", 1 << 20).unwrap();
    let manifest = Arc::new(MapManifest::default());
    manifest.blocks.lock().unwrap().insert(1, payload(7, 8, 8));
    let image = store.open_image_with("i", manifest.clone()).unwrap();
    // Sector 9 (inside block 1) is overwritten in the log; block 2 zeroed.
    image.write(9 * 512, &payload(8, 9, 1), false).unwrap();
    image.discard(2 * BLOCK_BYTES, BLOCK_BYTES).unwrap();
    manifest.blocks.lock().unwrap().insert(2, payload(5, 16, 8));
    let t = read_tokens(&image).unwrap();
    assert_eq!(t[..8], [0; 8], "hole");
    assert_eq!(t[8..16], [7, 8, 7, 7, 7, 7, 7, 7], "chunk merged with a newer log sector");
    assert_eq!(t[16..24], [0; 8], "a discard in the overlay hides the manifest");
    let st = image.stats();
    assert!(st.read_chunk_bytes > 0 && st.read_log_bytes > 0 && st.read_hole_bytes > 0, "{st:?}");
}

fn inject(mem: &MemStorage, op: FaultOp, errno: i32, skip: u64, sticky: bool) {
    mem.inject(Fault { op, path_contains: Some("/wal/".into()), skip, errno, sticky });
}

#[test]
fn a_failed_write_fails_cleanly_and_the_image_goes_on() {
    for (errno, skip) in [(libc::EIO, 0), (libc::ENOSPC, 0), (libc::EIO, 1)] {
        let mem = MemStorage::new();
        let (store, image) = image_on(&mem, small_opts(), 1 << 20);
        image.write(0, &payload(1, 0, 8), false).unwrap();
        image.flush().unwrap();
        // skip 0: the payload write fails; skip 1: the header write fails.
        inject(&mem, FaultOp::Write, errno, skip, false);
        let e = image.write(0, &payload(2, 0, 8), false).unwrap_err();
        assert_eq!(e.errno(), -errno, "{e}");
        assert_eq!(read_tokens(&image).unwrap()[..8], [1; 8], "a failed write is not visible");
        assert_eq!(image.stats().pad_records, 1);
        // The image keeps working.
        image.write(4096, &payload(3, 8, 8), false).unwrap();
        image.flush().unwrap();
        drop((image, store));
        mem.crash(CrashMode::Torn { seed: errno as u64 });
        let image = reopen(&mem, small_opts()).unwrap().open_image("i").unwrap();
        let t = read_tokens(&image).unwrap();
        assert_eq!(t[..16], [1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3], "errno {errno}");
    }
}

#[test]
fn a_write_that_cannot_be_voided_fails_the_image_with_a_clear_error() {
    let mem = MemStorage::new();
    let (store, image) = image_on(&mem, small_opts(), 1 << 20);
    image.write(0, &payload(1, 0, 8), false).unwrap();
    image.flush().unwrap();
    inject(&mem, FaultOp::Write, libc::ENOSPC, 0, true);
    assert!(image.write(4096, &payload(2, 8, 8), false).unwrap_err().is_no_space());
    let e = image.write(8192, &payload(3, 16, 8), false).unwrap_err();
    assert!(matches!(e, Error::Unavailable(..)) && e.to_string().contains("voiding"), "{e}");
    assert!(image.flush().is_err());
    assert_eq!(read_tokens(&image).unwrap()[..8], [1; 8], "reads still work");
    mem.clear_faults();
    drop((image, store));
    mem.crash(CrashMode::LoseUnsynced);
    let image = reopen(&mem, small_opts()).unwrap().open_image("i").unwrap();
    assert_eq!(read_tokens(&image).unwrap()[..24], [[1; 8], [0; 8], [0; 8]].concat());
}

#[test]
fn a_failed_sync_fails_the_flush_and_the_image() {
    let mem = MemStorage::new();
    let (store, image) = image_on(&mem, small_opts(), 1 << 20);
    image.write(0, &payload(1, 0, 8), true).unwrap();
    image.write(4096, &payload(2, 8, 8), false).unwrap();
    inject(&mem, FaultOp::Sync, libc::EIO, 0, false);
    assert_eq!(image.flush().unwrap_err().errno(), -libc::EIO);
    let e = image.write(0, &payload(3, 0, 8), false).unwrap_err();
    assert!(e.to_string().contains("sync failed"), "{e}");
    drop((image, store));
    mem.crash(CrashMode::LoseUnsynced);
    let image = reopen(&mem, small_opts()).unwrap().open_image("i").unwrap();
    assert_eq!(read_tokens(&image).unwrap()[..8], [1; 8], "the FUA write survives");
}

#[test]
fn concurrent_flushes_share_syncs() {
    let mem = MemStorage::new();
    let slow = SlowSync {
        inner: Arc::new(mem.clone()),
        delay: Duration::from_millis(2),
        read_hook: None,
        write_hook: None,
        decline_nowait: None,
    };
    let store = Store::create(Arc::new(slow), &store_dir(), small_opts()).unwrap();
    store.create_image("i", 8 << 20).unwrap();
    let image = store.open_image("i").unwrap();
    let threads: Vec<_> = (0..32u64)
        .map(|t| {
            let image = image.clone();
            std::thread::spawn(move || {
                for i in 0..10u64 {
                    let sector = t * 64 + i;
                    image.write(sector * 512, &payload(1 + t * 100 + i, sector, 1), false).unwrap();
                    image.flush().unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let st = image.stats();
    assert_eq!(st.flushes, 320);
    eprintln!("group commit: {} flushes, {} sync rounds, {} syncs", st.flushes, st.sync_rounds, st.syncs);
    assert!(st.sync_rounds * 4 <= st.flushes, "{} sync rounds for {} flushes", st.sync_rounds, st.flushes);
    assert!(st.syncs >= st.sync_rounds && st.sync_rounds > 0);
    // Every flushed write survives a crash.
    drop((image, store));
    mem.crash(CrashMode::LoseUnsynced);
    let image = reopen(&mem, small_opts()).unwrap().open_image("i").unwrap();
    let t = read_tokens(&image).unwrap();
    for th in 0..32u64 {
        for i in 0..10u64 {
            assert_eq!(t[(th * 64 + i) as usize], 1 + th * 100 + i);
        }
    }
}

/// Copies what the overlay holds into the manifest (a stand-in for the
/// compactor), then reclaims the log through the durable seq.
fn fake_compact(image: &cas::Image, manifest: &MapManifest) -> u64 {
    image.flush().unwrap();
    let covered = image.durable_seq();
    let mut buf = vec![0u8; BLOCK_BYTES as usize];
    for block in 0..image.size_bytes() / BLOCK_BYTES {
        image.read(block * BLOCK_BYTES, &mut buf).unwrap();
        if buf.iter().any(|&b| b != 0) {
            manifest.blocks.lock().unwrap().insert(block, buf.clone());
        } else {
            manifest.blocks.lock().unwrap().remove(&block);
        }
    }
    image.reclaim_log(covered).unwrap()
}

#[test]
fn full_log_blocks_writers_until_reclamation_wakes_them() {
    let mem = MemStorage::new();
    let opts = StoreOptions {
        log_segment_bytes: 1 << 20,
        log_quota_bytes: 2 << 20,
        background_compaction: false,
        ..StoreOptions::default()
    };
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), opts.clone()).unwrap();
    store.create_image("i", 8 << 20).unwrap();
    let manifest = Arc::new(MapManifest::default());
    let image = store.open_image_with("i", manifest.clone()).unwrap();
    let wakes = Arc::new(AtomicU64::new(0));
    let w = wakes.clone();
    image.set_capacity_listener(Arc::new(move || {
        w.fetch_add(1, Ordering::SeqCst);
    }));
    // Fill the quota with 256 KiB writes until a reservation is refused.
    let need = image.log_bytes_needed(RecordKind::Write, 256 << 10);
    let mut n = 0u64;
    while let Some(r) = image.try_reserve(need) {
        image
            .write_reserved(IoCx::default(), r, n * (256 << 10), &payload(n + 1, n * 512, 512), false)
            .unwrap();
        n += 1;
    }
    assert!(n >= 6, "only {n} writes fit in 2 MiB");
    assert!(image.log_used_bytes() <= image.log_quota_bytes());
    assert!(image.stats().log_segments <= 3, "segments stay within quota / segment + 1");
    // A blocking write now waits (it does not fail).
    let (img, done) = (image.clone(), Arc::new(AtomicU64::new(0)));
    let d = done.clone();
    let waiter = std::thread::spawn(move || {
        img.write(7 << 20, &payload(99, 14336, 512), false).unwrap();
        d.store(1, Ordering::SeqCst);
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(done.load(Ordering::SeqCst), 0, "the write must wait for capacity");
    assert_eq!(image.stats().capacity_waits, 1);
    let freed = fake_compact(&image, &manifest);
    assert!(freed >= 1 << 20, "freed {freed}");
    waiter.join().unwrap();
    assert!(wakes.load(Ordering::SeqCst) >= 1, "the capacity listener was not called");
    // Reclaimed data reads back through the manifest, new data from the log.
    let t = read_tokens(&image).unwrap();
    for i in 0..n {
        assert_eq!(t[(i * 512) as usize], i + 1);
    }
    assert_eq!(t[14336], 99);
    assert!(image.stats().segments_reclaimed >= 1);
    // Reclaiming beyond the durable log is refused.
    let beyond = image.durable_seq() + 1;
    assert!(matches!(image.reclaim_log(beyond), Err(Error::InvalidArgument(_))));
}

#[test]
fn many_threads_read_and_write_one_image() {
    let mem = MemStorage::new();
    let (store, image) = image_on(&mem, small_opts(), 8 << 20);
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let image = image.clone();
            std::thread::spawn(move || {
                // Each thread owns 1 MiB and checks its own last writes.
                let base = t * 2048;
                let mut mine = vec![0u64; 2048];
                let mut x = t + 1;
                for i in 0..200u64 {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let first = (x >> 33) % 2000;
                    let n = 1 + (x >> 50) % 48;
                    let token = (t << 32) | (i + 1);
                    image.write((base + first) * 512, &payload(token, base + first, n), i % 17 == 0).unwrap();
                    mine[first as usize..(first + n) as usize].fill(token);
                    if i % 5 == 0 {
                        let mut buf = vec![0u8; 2048 * 512];
                        image.read(base * 512, &mut buf).unwrap();
                        for (s, b) in buf.chunks(512).enumerate() {
                            assert_eq!(decode_sector(b, base + s as u64).unwrap(), mine[s], "thread {t}");
                        }
                    }
                    if i % 23 == 0 {
                        image.flush().unwrap();
                    }
                }
                image.flush().unwrap();
                mine
            })
        })
        .collect();
    let expect: Vec<u64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    drop((image, store));
    mem.crash(CrashMode::Torn { seed: 7 });
    let image = reopen(&mem, small_opts()).unwrap().open_image("i").unwrap();
    assert_eq!(read_tokens(&image).unwrap()[..expect.len()], expect[..]);
}

#[test]
fn bad_arguments_get_clear_errors() {
    let mem = MemStorage::new();
    let opts = StoreOptions {
        log_segment_bytes: 1 << 20,
        log_quota_bytes: 2 << 20,
        background_compaction: false,
        ..StoreOptions::default()
    };
    let (_store, image) = image_on(&mem, opts, 1 << 20);
    let inval = |r: cas::Result<()>| matches!(r, Err(Error::InvalidArgument(_)));
    assert!(inval(image.write(100, &[0u8; 512], false)), "unaligned offset");
    assert!(inval(image.write(0, &[0u8; 100], false)), "unaligned length");
    assert!(inval(image.write(0, &[], false)), "empty");
    assert!(inval(image.write((1 << 20) - 512, &[0u8; 1024], false)), "past the end");
    assert!(inval(image.discard(u64::MAX - 511, 512)), "overflow");
    assert!(inval(image.read(0, &mut [0u8; 3])), "unaligned read");
    // Larger than the whole quota: an error, not an endless wait.
    let big = vec![0u8; 3 << 20];
    let (_s2, image2) = {
        let mem = MemStorage::new();
        let opts = StoreOptions {
            log_segment_bytes: 1 << 20,
            log_quota_bytes: 2 << 20,
            background_compaction: false,
            ..StoreOptions::default()
        };
        image_on(&mem, opts, 4 << 20)
    };
    assert!(inval(image2.write(0, &big, false)));
    // A reservation too small for the request.
    let r = image.try_reserve(100).unwrap();
    assert!(inval(image.write_reserved(IoCx::default(), r, 0, &[0u8; 512], false)));
    assert_eq!(image.stats().log_reserved_bytes, 0, "a refused reservation still returns its bytes");
}

#[test]
fn stats_serialize_to_json() {
    let mem = MemStorage::new();
    let (_store, image) = image_on(&mem, small_opts(), 1 << 20);
    image.write(0, &payload(1, 0, 8), true).unwrap();
    let json = serde_json::to_value(image.stats()).unwrap();
    assert_eq!(json["write_records"], 1);
    assert_eq!(json["fua_writes"], 1);
    assert!(json["recovery"]["segments"].is_u64());
    let _: &dyn ManifestView = &cas::image::EmptyManifest;
}
