//! Background compaction, reclamation and GC running while several
//! images are written and read from many threads; then a crash. Every read
//! is checked exactly (each image has one writer, which keeps the model;
//! readers only read data written before they start).
//!
//! `CAS_CONCURRENT_ROUNDS` scales the writes per image (default 300).

mod common;

use cas::storage::{CrashMode, MemStorage};
use cas::{Store, StoreOptions};
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const IMAGE_SECTORS: u64 = 8 << 11; // 8 MiB
/// The first MiB is written once, before the readers start.
const STABLE_SECTORS: u64 = 2048;

fn opts() -> StoreOptions {
    StoreOptions {
        log_segment_bytes: 1 << 20,
        log_quota_bytes: 6 << 20,
        compaction_batch_bytes: 1 << 20,
        compaction_interval_ms: 20,
        ..StoreOptions::default()
    }
}

fn check(image: &cas::Image, first: u64, want: &[u64], what: &str) {
    let mut buf = vec![0u8; want.len() * SECTOR];
    image.read(first * 512, &mut buf).unwrap();
    for (i, b) in buf.chunks(SECTOR).enumerate() {
        let got = decode_sector(b, first + i as u64).unwrap();
        assert_eq!(got, want[i], "{what}: image {} sector {}", image.name(), first + i as u64);
    }
}

#[test]
fn compaction_and_gc_run_under_io_and_survive_a_crash() {
    let rounds: u64 = std::env::var("CAS_CONCURRENT_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(300);
    let mem = MemStorage::new();
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), opts()).unwrap();
    let names = ["a", "b", "c"];
    let mut models = Vec::new();
    // Held for the whole run: stats live as long as the open image.
    let mut images = Vec::new();
    for name in names {
        store.create_image(name, IMAGE_SECTORS * 512).unwrap();
        let image = store.open_image(name).unwrap();
        // Stable data; images b and c share it with a (dedup under GC).
        let token = 1;
        image.write(0, &payload(token, 0, STABLE_SECTORS), false).unwrap();
        image.flush().unwrap();
        let mut m = vec![0u64; IMAGE_SECTORS as usize];
        m[..STABLE_SECTORS as usize].fill(token);
        models.push(m);
        images.push(image);
    }
    // A scratch image whose chunks become garbage once it is removed.
    store.create_image("scratch", 1 << 20).unwrap();
    let scratch = store.open_image("scratch").unwrap();
    scratch.write(0, &payload(99_999, 0, 2048), true).unwrap();
    store.compact_once(&scratch).unwrap();
    drop(scratch);

    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for name in names {
        let (image, stop) = (store.open_image(name).unwrap(), stop.clone());
        readers.push(std::thread::spawn(move || {
            let want = vec![1u64; 64];
            let mut rng = StdRng::seed_from_u64(name.as_bytes()[0] as u64);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let first = rng.gen_range(0..STABLE_SECTORS - 64);
                check(&image, first, &want, "stable read");
                n += 1;
            }
            n
        }));
    }
    let gc = {
        let (store, stop) = (store.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut passes, mut dead) = (0u64, 0u64);
            let mut removed = false;
            while !stop.load(Ordering::Relaxed) {
                if !removed {
                    store.remove_image("scratch").unwrap();
                    removed = true;
                }
                let r = store.gc().unwrap();
                assert_eq!(r.missing_references, 0, "{r:?}");
                passes += 1;
                dead += r.chunks_dead;
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            (passes, dead)
        })
    };
    let writers: Vec<_> = names
        .iter()
        .zip(models)
        .enumerate()
        .map(|(k, (name, mut m))| {
            let image = store.open_image(name).unwrap();
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(0xC0FFEE + k as u64);
                for r in 0..rounds {
                    let token = 2 + r + 1_000_000 * k as u64;
                    let n = rng.gen_range(1..=256u64);
                    let first = rng.gen_range(STABLE_SECTORS..IMAGE_SECTORS - n);
                    match rng.gen_range(0..10) {
                        0 => {
                            image.discard(first * 512, n * 512).unwrap();
                            m[first as usize..(first + n) as usize].fill(0);
                        }
                        _ => {
                            image.write(first * 512, &payload(token, first, n), false).unwrap();
                            m[first as usize..(first + n) as usize].fill(token);
                        }
                    }
                    if rng.gen_bool(0.1) {
                        image.flush().unwrap();
                    }
                    let rf = rng.gen_range(STABLE_SECTORS..IMAGE_SECTORS - 128);
                    check(&image, rf, &m[rf as usize..rf as usize + 128], "own read");
                }
                image.flush().unwrap();
                m
            })
        })
        .collect();
    let models: Vec<Vec<u64>> = writers.into_iter().map(|t| t.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    let reads: u64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
    let (gc_passes, gc_dead) = gc.join().unwrap();
    for (image, m) in images.iter().zip(&models) {
        check(image, 0, m, "after the run");
        let st = store.image_stats(image);
        println!("{}: waits {} {:?}", image.name(), st.capacity_waits, st.compaction);
        assert!(st.compaction.batches > 0, "the background compactor never ran on {}", image.name());
        assert_eq!(st.write_errors, 0);
    }
    println!("{reads} stable reads, {gc_passes} GC passes sweeping {gc_dead} chunks");
    assert!(gc_passes > 0 && gc_dead > 0, "GC never swept the removed image's chunks");

    drop((images, store));
    mem.crash(CrashMode::LoseUnsynced);
    let store = reopen(&mem, opts()).unwrap();
    for (name, m) in names.iter().zip(&models) {
        let image = store.open_image(name).unwrap();
        check(&image, 0, m, "after the crash");
    }
    let r = store.gc().unwrap();
    assert_eq!(r.missing_references, 0, "{r:?}");
}
