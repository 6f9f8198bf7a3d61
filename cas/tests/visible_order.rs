//! A write is acknowledged only after every earlier record is complete, so
//! the acknowledged writes are always a prefix of the log. Log recovery
//! keeps the prefix of whole records: after the daemon dies (kill -9, then
//! `casblk recover` with the driver reissuing what was in flight), no
//! acknowledged write may sit behind the hole of one that never finished.

mod common;

use cas::Store;
use common::*;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

#[test]
fn a_later_write_waits_for_an_earlier_one_still_in_flight() {
    let mem = cas::storage::MemStorage::new();
    let (held, entered) = (Arc::new(AtomicBool::new(true)), Arc::new(AtomicBool::new(false)));
    let (h, e) = (held.clone(), entered.clone());
    // The 8 KiB payload write of the first write stalls until released.
    let hook: ReadHook = Arc::new(move |path: &Path, len| {
        if len == 8192 && path.to_string_lossy().contains("/wal/") {
            e.store(true, Ordering::SeqCst);
            while h.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    });
    let storage = SlowSync {
        inner: Arc::new(mem.clone()),
        delay: Duration::ZERO,
        read_hook: None,
        write_hook: Some(hook),
        decline_nowait: None,
    };
    let store = Store::create(Arc::new(storage), &store_dir(), small_opts()).unwrap();
    store.create_image("i", 8 << 20).unwrap();
    let image = store.open_image("i").unwrap();

    let img = image.clone();
    let first = std::thread::spawn(move || img.write(0, &payload(1, 0, 16), false));
    while !entered.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(1));
    }
    // The second write's record is placed after the first's and completes
    // at once; its acknowledgement must wait for the first.
    let (tx, rx) = mpsc::channel();
    let img = image.clone();
    let second = std::thread::spawn(move || {
        let r = img.write(1 << 20, &payload(2, 2048, 8), false);
        tx.send(()).unwrap();
        r
    });
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "a write was acknowledged while an earlier record was still being written"
    );
    held.store(false, Ordering::SeqCst);
    first.join().unwrap().unwrap();
    rx.recv_timeout(Duration::from_secs(10)).expect("the second write completes once the first does");
    second.join().unwrap().unwrap();
    let t = read_tokens(&image).unwrap();
    assert_eq!((t[0], t[2048]), (1, 2));
}
