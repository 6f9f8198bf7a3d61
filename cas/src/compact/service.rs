//! The background compactor: one thread per store (plus each pass's reader
//! thread) that decides when each open image is compacted. It never runs
//! on a ublk queue thread or a scheduler worker. Which images are open, and
//! the compaction state of each, it asks the store every round
//! ([`Compactable`]).
//!
//! ```text
//!  wake: pressure listener (log use >= trigger, or a refused reservation)
//!        or the tick (TICK_MS)
//!   for each open image:
//!     pressure = refused reservation || log use >= trigger_percent of quota
//!     due      = durable data waiting && interval passed since the last pass
//!     pressure: make the completed log durable (nobody may FLUSH), then pass
//!     due:      pass (durable data only)
//!     still refused with everything covered: roll the covered current
//!       segment and reclaim it (a request needing more than quota minus
//!       one segment would otherwise wait forever)
//!   pressure and progress: go round again at once
//! ```
//!
//! Why a full log cannot deadlock: writers waiting for capacity hold no
//! lock the compactor needs; every record placed in the log completes
//! without waiting for capacity, so making the completed log durable never
//! waits on a blocked writer; a pass reclaims every segment its commit
//! covers and the reclamation wakes the writers (and the scheduler through
//! the capacity listener); pinned segments are retried on the next round.
//! A failing pass (I/O error, memory budget) is retried after a back-off.
//!
//! Why a store that cannot be written does not hang its writers: after
//! [`FAILURES_BEFORE_CLOSING`] passes of an image failed in a row (a
//! poisoned chunk store or manifest fails every one), the service closes the
//! image's log to waiting (`Image::close_log`): writes that no longer fit
//! fail with EIO naming the cause, instead of waiting for space that cannot
//! come back. Writes that fit, flushes and reads go on; the next pass that
//! succeeds reopens the log. Memory-budget refusals only back off: budget
//! comes back as other passes finish.

use super::{lock, Compactor, ImageCompaction, PassControl};
use crate::background::BackgroundCpu;
use crate::error::Error;
use crate::image::{CapacityListener, Image};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The service looks at every image at least this often.
pub const TICK_MS: u64 = 100;
/// Back-off after a failed pass, and after one refused by the memory budget.
const ERROR_BACKOFF: Duration = Duration::from_secs(1);
const BUDGET_BACKOFF: Duration = Duration::from_millis(100);
/// Failed passes in a row after which a full log fails its writers instead
/// of holding them: with [`ERROR_BACKOFF`], about 5 s of retrying.
pub const FAILURES_BEFORE_CLOSING: u32 = 5;

/// The images the service compacts, asked for anew every round: each open
/// image that the store compacts, with the compactor's state for it. Both
/// are weak handles, upgraded only while the image is looked at, so closing
/// and removing it is rarely delayed.
pub type Compactable = Box<dyn Fn() -> Vec<(Weak<Image>, Weak<ImageCompaction>)> + Send>;

struct Shared {
    woken: Mutex<bool>,
    cond: Condvar,
    stop: AtomicBool,
}

impl Shared {
    fn wake(&self) {
        *lock(&self.woken) = true;
        self.cond.notify_one();
    }
}

/// The running service; dropping it stops the thread (after the pass in
/// progress, if any).
pub struct Service {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Service {
    pub fn start(compactor: Arc<Compactor>, images: Compactable, cpu: BackgroundCpu) -> Service {
        let shared =
            Arc::new(Shared { woken: Mutex::new(false), cond: Condvar::new(), stop: AtomicBool::new(false) });
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("cas-compactor".into())
            .spawn(move || {
                cpu.apply_to_current_thread();
                run(&compactor, &images, &sh)
            })
            .expect("spawn the compactor thread");
        Service { shared, thread: Some(thread) }
    }

    /// What an image calls when its log comes under pressure.
    pub fn waker(&self) -> CapacityListener {
        let sh = self.shared.clone();
        Arc::new(move || sh.wake())
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(compactor: &Compactor, images: &Compactable, sh: &Shared) {
    loop {
        {
            let mut woken = lock(&sh.woken);
            if !*woken && !sh.stop.load(Ordering::Acquire) {
                woken = sh
                    .cond
                    .wait_timeout(woken, Duration::from_millis(TICK_MS))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            *woken = false;
        }
        if sh.stop.load(Ordering::Acquire) {
            return;
        }
        let mut again = false;
        for (image, state) in images() {
            if sh.stop.load(Ordering::Acquire) {
                return;
            }
            let (Some(image), Some(state)) = (image.upgrade(), state.upgrade()) else { continue };
            match step(compactor, &image, &state) {
                Ok(Some(more)) => {
                    again |= more;
                    *lock(&state.failures_in_a_row) = 0;
                    image.reopen_log();
                }
                Ok(None) => {}
                Err(e) => failed(&image, &state, &e),
            }
        }
        if again {
            *lock(&sh.woken) = true;
        }
    }
}

/// A pass of `image` failed: back off, and after
/// [`FAILURES_BEFORE_CLOSING`] in a row close its log to waiting.
fn failed(image: &Image, state: &ImageCompaction, e: &Error) {
    let budget = matches!(e, Error::MemoryBudget(_));
    let backoff = if budget { BUDGET_BACKOFF } else { ERROR_BACKOFF };
    *lock(&state.retry_after) = Some(Instant::now() + backoff);
    if budget {
        tracing::warn!(image = image.name(), error = %e, "compaction pass refused by the memory budget; retrying");
        return;
    }
    let n = {
        let mut n = lock(&state.failures_in_a_row);
        *n += 1;
        *n
    };
    tracing::warn!(image = image.name(), error = %e, failures_in_a_row = n, "compaction pass failed; retrying later");
    if n >= FAILURES_BEFORE_CLOSING {
        image
            .close_log(&format!("compaction failed {n} times in a row, so the log cannot be reclaimed: {e}"));
    }
}

/// Looks at one image and compacts it if needed: `None` if no pass ran,
/// else whether it should be looked at again at once.
fn step(compactor: &Compactor, image: &Image, state: &ImageCompaction) -> crate::Result<Option<bool>> {
    if lock(&state.retry_after).is_some_and(|t| Instant::now() < t) {
        return Ok(None);
    }
    // Re-arm before looking, so a signal raised from now on is not lost.
    image.rearm_pressure();
    let cfg = &compactor.cfg;
    let blocked = image.capacity_refused();
    let pressure = blocked
        || u128::from(image.log_used_bytes()) * 100
            >= u128::from(image.log_quota_bytes()) * u128::from(cfg.trigger_percent);
    let covered = state.manifest.covered();
    let waiting = image.durable_seq() > covered;
    let due = waiting && lock(&state.last_pass).is_none_or(|t| t.elapsed() >= cfg.interval);
    if !(pressure || due || image.retired_segments() > 0) {
        return Ok(None);
    }
    let ctl =
        PassControl { force_durable: pressure, max_batches: cfg.service_batches, ..PassControl::default() };
    let report = compactor.run_pass(image, state, &ctl)?;
    let mut rolled = false;
    if blocked && report.covered_after == image.durable_seq() && !image.has_undurable_records() {
        rolled = image.roll_covered_segment(report.covered_after)?;
        if rolled {
            let (freed, deleted) = image.reclaim_counted(report.covered_after)?;
            state.add_stats(&super::CompactStats {
                segment_rolls: 1,
                log_bytes_reclaimed: freed,
                segments_reclaimed: deleted,
                syncs: u64::from(deleted > 0),
                ..Default::default()
            });
        }
    }
    let progress = report.covered_after > report.covered_before || rolled;
    let unfinished = image.durable_seq() > report.covered_after;
    Ok(Some(progress && (pressure || unfinished)))
}
