//! A failed image fails its requests within a bound, and a store that
//! cannot be written fails writes instead of hanging them.
//!
//! - The image failed (a sync failed): writers waiting for log space, new
//!   writes and flushes get EIO within one capacity retry period; reads of
//!   its data go on; another image goes on; `failure()` says why.
//! - Compaction cannot write (every pass fails): after a bounded run of
//!   failed passes, writes that do not fit in the full log get EIO naming
//!   the cause; flushes and reads go on.

mod common;

use cas::image::CAPACITY_RETRY_MS;
use cas::io::IoCx;
use cas::storage::{Fault, FaultOp, MemStorage};
use cas::{Error, RecordKind, Store, StoreOptions};
use common::*;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn store_on(mem: &MemStorage, opts: StoreOptions, images: &[&str]) -> (Arc<Store>, Vec<Arc<cas::Image>>) {
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), opts).unwrap();
    let images = images
        .iter()
        .map(|name| {
            store.create_image(name, 64 << 20).unwrap();
            store.open_image(name).unwrap()
        })
        .collect();
    (store, images)
}

/// Fills `image`'s log through the scheduler's path (reservations that
/// never block) until one is refused; returns the bytes one write needs.
fn fill_log(image: &cas::Image, write_bytes: u64) -> u64 {
    let need = image.log_bytes_needed(RecordKind::Write, write_bytes);
    let mut n = 0u64;
    while let Some(r) = image.try_reserve(need) {
        assert!(r.refusal().is_none());
        image
            .write_reserved(
                IoCx::default(),
                r,
                n * write_bytes,
                &payload(n + 1, n * write_bytes / 512, write_bytes / 512),
                false,
            )
            .unwrap();
        n += 1;
        assert!(n < 10_000, "the log never filled");
    }
    need
}

fn is_eio(e: &Error) -> bool {
    e.errno() == -libc::EIO
}

#[test]
fn a_failed_image_fails_its_waiting_and_new_writes_within_a_bound() {
    let mem = MemStorage::new();
    let opts = StoreOptions { log_quota_bytes: 2 << 20, ..small_opts() };
    let (_store, images) = store_on(&mem, opts, &["bad", "good"]);
    let (bad, good) = (images[0].clone(), images[1].clone());
    let need = fill_log(&bad, 256 << 10);
    let before = read_tokens(&bad).unwrap();

    // A blocking writer waits for space that reclamation would free ...
    let (tx, rx) = mpsc::channel();
    let img = bad.clone();
    let waiter = std::thread::spawn(move || {
        let r = img.write(32 << 20, &payload(999, 65536, 512), false);
        tx.send(Instant::now()).unwrap();
        r
    });
    std::thread::sleep(Duration::from_millis(300));
    assert!(rx.try_recv().is_err(), "the writer must wait while the log is full");
    assert!(bad.try_reserve(need).is_none(), "the scheduler's writes wait too");

    // ... then a FLUSH's sync fails: the image fails.
    mem.inject(Fault {
        op: FaultOp::Sync,
        path_contains: Some("images/bad/wal".into()),
        skip: 0,
        errno: libc::EIO,
        sticky: false,
    });
    let failed_at = Instant::now();
    assert!(bad.flush().is_err());

    // The waiter gets EIO within a retry period or two, not never.
    let woke = rx.recv_timeout(Duration::from_secs(5)).expect("the waiting writer was never failed");
    let e = waiter.join().unwrap().unwrap_err();
    assert!(is_eio(&e), "{e}");
    assert!(
        woke.duration_since(failed_at) <= Duration::from_millis(10 * CAPACITY_RETRY_MS),
        "failed after {:?}",
        woke.duration_since(failed_at)
    );
    // The scheduler's path: a refusal instead of a wait, and the write fails.
    let r = bad.try_reserve(need).expect("a failed image hands out a refusal, not a wait");
    assert!(r.refusal().is_some());
    assert!(is_eio(&bad.write_reserved(IoCx::default(), r, 0, &payload(8, 0, 512), false).unwrap_err()));
    assert!(is_eio(&bad.write(4096, &payload(9, 8, 8), false).unwrap_err()));
    assert!(is_eio(&bad.flush().unwrap_err()));
    let why = bad.failure().expect("the image says it failed");
    assert!(why.starts_with("failed: ") && why.contains("sync"), "{why}");

    // Reads of its data go on; the other image goes on.
    let after = read_tokens(&bad).unwrap();
    assert_eq!(after[..before.len().min(8192)], before[..before.len().min(8192)]);
    good.write(0, &payload(42, 0, 8), true).unwrap();
    good.flush().unwrap();
    assert_eq!(read_tokens(&good).unwrap()[0], 42);
    assert!(good.failure().is_none());
}

#[test]
fn writes_to_a_full_log_fail_once_compaction_keeps_failing() {
    let mem = MemStorage::new();
    let opts = StoreOptions {
        log_quota_bytes: 4 << 20,
        background_compaction: true,
        compaction_interval_ms: 10,
        ..small_opts()
    };
    let (_store, images) = store_on(&mem, opts, &["i"]);
    let image = images[0].clone();
    // Nothing compacted can be written: every pass fails.
    mem.inject(Fault {
        op: FaultOp::Write,
        path_contains: Some("/chunks/".into()),
        skip: 0,
        errno: libc::EIO,
        sticky: true,
    });
    mem.inject(Fault {
        op: FaultOp::Write,
        path_contains: Some("manifest".into()),
        skip: 0,
        errno: libc::EIO,
        sticky: true,
    });
    let started = Instant::now();
    let mut n = 0u64;
    let e = loop {
        let at = n * (256 << 10) % (32 << 20);
        match image.write(at, &payload(n + 1, at / 512, 512), false) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(started.elapsed() < Duration::from_secs(60), "writes hung on a log that cannot be reclaimed");
    };
    let took = started.elapsed();
    assert!(is_eio(&e), "{e}");
    assert!(e.to_string().contains("compaction failed"), "{e}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert!(n > 0, "the writes that fit the log went in first");
    let why = image.failure().expect("the image says its log is closed");
    assert!(why.starts_with("log closed: "), "{why}");
    // The log itself is fine: flushes and reads go on.
    image.flush().unwrap();
    read_tokens(&image).unwrap();
    println!("{n} writes, then EIO after {took:?}: {e}");
}
