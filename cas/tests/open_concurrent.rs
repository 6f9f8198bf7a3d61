//! Opening an image replays its log without holding the store's map of
//! open images: while one image's replay is held up, other images open and
//! the store answers; a second opener of the same image waits for the
//! first and gets the same image; removal sees the image as open.

mod common;

use cas::storage::{MemStorage, Storage};
use cas::{Error, Store};
use common::*;
use std::path::Path;
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;

/// Long enough for anything that does not wait on the gate.
const PROMPT: Duration = Duration::from_secs(20);

/// Reads of files whose path contains `held` wait while the gate is shut.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    held: Option<String>,
    waiting: usize,
}

impl Gate {
    fn shut(&self, held: &str) {
        self.state.lock().unwrap().held = Some(held.to_string());
    }

    fn open(&self) {
        self.state.lock().unwrap().held = None;
        self.changed.notify_all();
    }

    fn pass(&self, path: &Path) {
        let mut s = self.state.lock().unwrap();
        if !s.held.as_ref().is_some_and(|h| path.to_string_lossy().contains(h.as_str())) {
            return;
        }
        s.waiting += 1;
        self.changed.notify_all();
        while s.held.is_some() {
            s = self.changed.wait(s).unwrap();
        }
        s.waiting -= 1;
    }

    fn wait_for_a_waiter(&self) {
        let s = self.state.lock().unwrap();
        let (s, timeout) = self.changed.wait_timeout_while(s, PROMPT, |s| s.waiting == 0).unwrap();
        assert!(!timeout.timed_out() && s.waiting > 0, "no read reached the gate");
    }
}

/// Runs `f` on a thread; its result, or a failure if it takes longer than
/// [`PROMPT`].
fn promptly<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(PROMPT).unwrap_or_else(|_| panic!("{what} waited on another image's log replay"))
}

#[test]
fn a_slow_log_replay_holds_up_only_its_own_image() {
    let gate = Arc::new(Gate::default());
    let hook: ReadHook = {
        let gate = gate.clone();
        Arc::new(move |path, _| gate.pass(path))
    };
    let storage: Arc<dyn Storage> = Arc::new(SlowSync {
        inner: Arc::new(MemStorage::new()),
        delay: Duration::ZERO,
        read_hook: Some(hook),
        write_hook: None,
        decline_nowait: None,
    });
    let store = Store::create(storage, &store_dir(), small_opts()).unwrap();
    for (name, byte) in [("a", 1u8), ("b", 2)] {
        store.create_image(name, 8 << 20).unwrap();
        let image = store.open_image(name).unwrap();
        image.write(0, &[byte; 4096], false).unwrap();
        image.flush().unwrap();
    }
    // Both closed (their last Arc dropped); b's log replay will be held.
    gate.shut("/images/b/wal/");
    let first_b = {
        let store = store.clone();
        std::thread::spawn(move || store.open_image("b"))
    };
    gate.wait_for_a_waiter();

    let a = {
        let store = store.clone();
        promptly("opening image a", move || store.open_image("a").unwrap())
    };
    let mut block = vec![0u8; 4096];
    a.read(0, &mut block).unwrap();
    assert_eq!(block, [1u8; 4096]);
    let listed = {
        let store = store.clone();
        promptly("listing the images", move || store.list_images().unwrap())
    };
    assert!(listed.iter().all(|i| i.open), "a is open and b is being opened: {listed:?}");
    let removed = {
        let store = store.clone();
        promptly("removing image b", move || store.remove_image("b"))
    };
    assert!(matches!(removed, Err(Error::Unavailable(..))), "{removed:?}");

    // A second opener of b waits for the first.
    let (tx, rx) = mpsc::channel();
    {
        let store = store.clone();
        std::thread::spawn(move || {
            let _ = tx.send(store.open_image("b"));
        });
    }
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "b opened twice at once");
    gate.open();
    let first = first_b.join().unwrap().unwrap();
    let second = rx.recv_timeout(PROMPT).unwrap().unwrap();
    assert!(Arc::ptr_eq(&first, &second), "one Image per name");
    first.read(0, &mut block).unwrap();
    assert_eq!(block, [2u8; 4096]);

    // A failed open takes its mark back out: the name can be opened later.
    assert!(matches!(store.open_image("c"), Err(Error::NotFound(_))));
    store.create_image("c", 8 << 20).unwrap();
    store.open_image("c").unwrap();
}
