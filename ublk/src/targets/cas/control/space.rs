//! The store filesystem's fullness, watched: every [`CHECK_INTERVAL`] the
//! daemon reads the filesystem's size and free space (statvfs, through the
//! store's storage) and, when the used share crosses `--space-warn`, logs
//! it once (and once again when it falls a point below). Stats and metrics
//! show the state (`space` source: `warn_pct`, `used_pct`, `warning`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the filesystem is looked at.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// `--space-warn` when not given: the share of the filesystem in use, in
/// percent, at which the daemon warns.
pub const DEFAULT_WARN_PCT: u64 = 90;

/// What the watch last saw.
#[derive(Default)]
pub struct SpaceState {
    pub warn_pct: AtomicU64,
    /// Used share of the filesystem in hundredths of a percent.
    pub used_pct_x100: AtomicU64,
    pub warning: AtomicBool,
}

/// The running watch; stops and joins its thread on drop.
pub struct SpaceWatch {
    pub state: Arc<SpaceState>,
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl SpaceWatch {
    pub fn spawn(store: Arc<cas::Store>, warn_pct: u64) -> std::io::Result<SpaceWatch> {
        let state = Arc::new(SpaceState { warn_pct: warn_pct.into(), ..Default::default() });
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let thread = {
            let (state, stop) = (state.clone(), stop.clone());
            std::thread::Builder::new()
                .name("casblk-space".into())
                .spawn(move || watch(&store, &state, &stop))?
        };
        Ok(SpaceWatch { state, stop, thread: Some(thread) })
    }
}

impl Drop for SpaceWatch {
    fn drop(&mut self) {
        *self.stop.0.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.stop.1.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn watch(store: &cas::Store, state: &SpaceState, stop: &(Mutex<bool>, Condvar)) {
    let mut told_error = false;
    loop {
        match store.storage().space(store.dir()) {
            Ok(Some(space)) => {
                told_error = false;
                let used = space.used_pct();
                state.used_pct_x100.store((used * 100.0).round() as u64, Ordering::Relaxed);
                let warn_pct = state.warn_pct.load(Ordering::Relaxed);
                // One point of hysteresis: a filesystem hovering at the
                // threshold does not log every 5 s.
                let was = state.warning.load(Ordering::Relaxed);
                let over = if was { used >= warn_pct as f64 - 1.0 } else { used >= warn_pct as f64 };
                if over != state.warning.swap(over, Ordering::Relaxed) {
                    let (size, avail) =
                        (trace::human_bytes(space.size_bytes), trace::human_bytes(space.avail_bytes));
                    if over {
                        tracing::warn!(
                            store = %store.dir().display(),
                            "the store's filesystem is {used:.1}% full (--space-warn {warn_pct}): {avail} of {size} \
                             left; delete or trim data and let GC run, or grow the filesystem"
                        );
                    } else {
                        tracing::info!(store = %store.dir().display(), "the store's filesystem is {used:.1}% full again, below --space-warn {warn_pct}");
                    }
                }
            }
            Ok(None) => {}
            Err(e) if !told_error => {
                tracing::warn!("reading the store filesystem's free space failed: {e}");
                told_error = true;
            }
            Err(_) => {}
        }
        let stopped = stop.0.lock().unwrap_or_else(|p| p.into_inner());
        let (stopped, _) =
            stop.1.wait_timeout_while(stopped, CHECK_INTERVAL, |s| !*s).unwrap_or_else(|p| p.into_inner());
        if *stopped {
            return;
        }
    }
}
