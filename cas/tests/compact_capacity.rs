//! Writers blocked on a full log resume once the background compactor
//! reclaims space: with FLUSHes, without any (the compactor makes the log
//! durable itself), and for a request larger than the quota minus one
//! segment (the compactor rolls the covered current segment). No error, no
//! deadlock: a watchdog fails the test if the writers stop.

mod common;

use cas::storage::MemStorage;
use cas::{Store, StoreOptions};
use common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// Generous for a loaded 2-core machine; a deadlock never finishes.
const DEADLINE: Duration = Duration::from_secs(60);

fn opts() -> StoreOptions {
    StoreOptions {
        log_segment_bytes: MIB,
        log_quota_bytes: 4 * MIB,
        compaction_batch_bytes: MIB,
        // Only pressure (not the timer) should drive these passes.
        compaction_interval_ms: 60_000,
        ..StoreOptions::default()
    }
}

/// Runs `work` on a thread and fails if it does not finish in time.
fn with_watchdog(what: &str, work: impl FnOnce() + Send + 'static) {
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let t = std::thread::spawn(move || {
        work();
        d.store(true, Ordering::SeqCst);
    });
    let start = Instant::now();
    while !done.load(Ordering::SeqCst) && !t.is_finished() {
        assert!(start.elapsed() < DEADLINE, "{what}: writers made no progress for {DEADLINE:?} (deadlock?)");
        std::thread::sleep(Duration::from_millis(20));
    }
    t.join().unwrap();
}

fn writes_through_a_full_log(flush_every: Option<u64>) {
    let mem = MemStorage::new();
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), opts()).unwrap();
    store.create_image("i", 8 * MIB).unwrap();
    let image = store.open_image("i").unwrap();
    let wakes = Arc::new(AtomicU64::new(0));
    let w = wakes.clone();
    image.set_capacity_listener(Arc::new(move || {
        w.fetch_add(1, Ordering::SeqCst);
    }));
    // Two writers, 32 MiB each (8 times the quota), 128 KiB at a time.
    let chunk_sectors = 256u64;
    let rounds = 32 * MIB / (chunk_sectors * 512);
    let img = image.clone();
    with_watchdog(&format!("flush_every {flush_every:?}"), move || {
        let threads: Vec<_> = (0..2u64)
            .map(|th| {
                let image = img.clone();
                std::thread::spawn(move || {
                    for r in 0..rounds {
                        let first = th * 8192 + (r % 32) * chunk_sectors;
                        let token = 1 + th * rounds + r;
                        image.write(first * 512, &payload(token, first, chunk_sectors), false).unwrap();
                        if flush_every.is_some_and(|n| r % n == n - 1) {
                            image.flush().unwrap();
                        }
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
    });
    let st = store.image_stats(&image);
    println!("{flush_every:?}: {st:?}");
    assert!(st.capacity_waits > 0, "the writers never waited: the test did not fill the log");
    assert!(st.write_errors == 0);
    assert!(st.compaction.segments_reclaimed > 0);
    assert!(wakes.load(Ordering::SeqCst) > 0, "reclamation never called the capacity listener");
    if flush_every.is_none() {
        assert_eq!(st.flushes, 0);
        assert!(st.compaction.forced_log_syncs > 0, "only durable log can be compacted: someone had to sync");
    }
    // The last round of each writer is what reads back.
    let t = read_tokens(&image).unwrap();
    for th in 0..2u64 {
        for slot in 0..32u64 {
            let r = rounds - 32 + slot;
            let first = (th * 8192 + slot * chunk_sectors) as usize;
            assert_eq!(t[first], 1 + th * rounds + r, "writer {th} slot {slot}");
        }
    }
}

#[test]
fn writers_blocked_on_a_full_log_resume_with_flushes() {
    writes_through_a_full_log(Some(4));
}

#[test]
fn writers_blocked_on_a_full_log_resume_without_any_flush() {
    writes_through_a_full_log(None);
}

/// A request needing more than the quota minus one segment fits only once
/// the current segment is closed and reclaimed too.
#[test]
fn a_request_larger_than_quota_minus_a_segment_completes() {
    let mem = MemStorage::new();
    let o = StoreOptions { log_quota_bytes: 2 * MIB, ..opts() };
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), o).unwrap();
    store.create_image("i", 8 * MIB).unwrap();
    let image = store.open_image("i").unwrap();
    image.write(0, &payload(1, 0, 1800), false).unwrap(); // 900 KiB
    let img = image.clone();
    with_watchdog("big write", move || {
        img.write(MIB, &payload(2, 2048, 3000), false).unwrap(); // 1.5 MiB
    });
    let t = read_tokens(&image).unwrap();
    assert_eq!(t[0], 1);
    assert_eq!(t[2048 + 2999], 2);
}
