//! The background compactor: one task per store (a thread, plus each
//! pass's reader thread; or stepped by a test, see `crate::tasks`) that
//! decides when each open image is compacted. It never runs on a ublk
//! queue thread or a scheduler worker. Which images are open, and the
//! compaction state of each, it asks the store every round
//! ([`Compactable`]). Its time comes from its task's clock, so under a
//! stepper its back-offs and intervals replay exactly.
//!
//! ```text
//!  wake: pressure listener (log use >= trigger, or a refused reservation)
//!        or the tick (TICK_MS)
//!   for each open image:
//!     pressure = refused reservation || log use >= trigger_percent of quota
//!     due      = durable data waiting && interval passed since the last pass
//!                && (no write for an interval || the data waited 10 intervals)
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
//! comes back as other passes finish. A pass that failed because the
//! filesystem is full also asks the store for a GC pass (cas::gc::auto),
//! which gives back the space of dead chunks.

use super::{lock, Compactor, ImageCompaction, PassControl};
use crate::background::BackgroundCpu;
use crate::error::Error;
use crate::image::{CapacityListener, Image};
use crate::tasks::{Context, Step, Task, TaskHandle, Tasks, Wake};
use std::sync::{Arc, Weak};
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

/// The running service; dropping it stops its task (after the pass in
/// progress, if any).
pub struct Service {
    wake: Wake,
    _task: TaskHandle,
}

impl Service {
    /// `no_space` is called when a pass fails because the filesystem is
    /// full (the store then asks for a GC pass: cas::gc::auto).
    pub fn start(
        compactor: Arc<Compactor>,
        images: Compactable,
        no_space: NoSpace,
        tasks: &Tasks,
        cpu: BackgroundCpu,
    ) -> Service {
        let task = tasks.spawn(
            "cas-compactor",
            cpu,
            Box::new(ServiceTask { compactor, images, no_space, started: false, worked: false }),
        );
        Service { wake: task.waker(), _task: task }
    }

    /// What an image calls when its log comes under pressure.
    pub fn waker(&self) -> CapacityListener {
        let wake = self.wake.clone();
        Arc::new(move || wake.wake())
    }
}

/// What the service calls when a pass failed with ENOSPC.
pub type NoSpace = Box<dyn Fn() + Send>;

struct ServiceTask {
    compactor: Arc<Compactor>,
    images: Compactable,
    no_space: NoSpace,
    /// The first round waits a tick (or a wake-up): the store is still
    /// being opened.
    started: bool,
    /// A pass ran since the service last went idle: when it next does, the
    /// memory the passes freed goes back to the kernel (`crate::heap`).
    worked: bool,
}

impl Task for ServiceTask {
    /// One round over the open images; again at once if a pass under
    /// pressure made progress, else after the tick (or a wake-up).
    fn step(&mut self, cx: &Context<'_>) -> Step {
        if !std::mem::replace(&mut self.started, true) {
            return Step::Wait(Some(Duration::from_millis(TICK_MS)));
        }
        let mut again = false;
        for (image, state) in (self.images)() {
            if cx.stopping() {
                return Step::Done;
            }
            let (Some(image), Some(state)) = (image.upgrade(), state.upgrade()) else { continue };
            match step(&self.compactor, &image, &state, cx.now()) {
                Ok(Some(more)) => {
                    again |= more;
                    self.worked = true;
                    *lock(&state.failures_in_a_row) = 0;
                    image.reopen_log();
                }
                Ok(None) => {}
                Err(e) => {
                    if e.is_no_space() {
                        (self.no_space)();
                    }
                    failed(&image, &state, &e, cx.now())
                }
            }
        }
        if again {
            Step::Again
        } else {
            if std::mem::take(&mut self.worked) {
                crate::heap::PROCESS.release_free(cx.now());
            }
            Step::Wait(Some(Duration::from_millis(TICK_MS)))
        }
    }
}

/// A pass of `image` failed: back off, and after
/// [`FAILURES_BEFORE_CLOSING`] in a row close its log to waiting.
fn failed(image: &Image, state: &ImageCompaction, e: &Error, now: Instant) {
    let budget = matches!(e, Error::MemoryBudget(_));
    let backoff = if budget { BUDGET_BACKOFF } else { ERROR_BACKOFF };
    *lock(&state.retry_after) = Some(now + backoff);
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

/// True once `image` has written nothing for `interval` (as the service's
/// looks see it: the first look after a write starts the count).
fn quiet(image: &Image, state: &ImageCompaction, now: Instant, interval: Duration) -> bool {
    let seq = image.completed_seq();
    let mut last = lock(&state.last_write);
    match *last {
        Some((seen, since)) if seen == seq => now.saturating_duration_since(since) >= interval,
        _ => {
            *last = Some((seq, now));
            false
        }
    }
}

/// True once durable data has waited [`super::QUIET_WAIT_MAX_INTERVALS`]
/// intervals for a pass (counted from the first look that saw it).
fn waited_long(state: &ImageCompaction, now: Instant, interval: Duration) -> bool {
    let since = *lock(&state.waiting_since).get_or_insert(now);
    now.saturating_duration_since(since) >= interval * super::QUIET_WAIT_MAX_INTERVALS
}

/// Looks at one image and compacts it if needed: `None` if no pass ran,
/// else whether it should be looked at again at once.
fn step(
    compactor: &Compactor,
    image: &Image,
    state: &ImageCompaction,
    now: Instant,
) -> crate::Result<Option<bool>> {
    if lock(&state.retry_after).is_some_and(|t| now < t) {
        return Ok(None);
    }
    // Re-arm before looking, so a signal raised from now on is not lost.
    image.rearm_pressure();
    let cfg = &compactor.cfg;
    let blocked = image.capacity_refused();
    let covered = state.manifest.covered();
    // Below the store's space reserve, records not compacted yet (a trim
    // not flushed) may hold the garbage GC needs: make them durable now.
    let space_low = image.store_space_low() && image.completed_seq() > covered;
    let pressure = blocked
        || space_low
        || u128::from(image.log_used_bytes()) * 100
            >= u128::from(image.log_quota_bytes()) * u128::from(cfg.trigger_percent);
    let waiting = image.durable_seq() > covered;
    let due = waiting
        && lock(&state.last_pass).is_none_or(|t| now.saturating_duration_since(t) >= cfg.interval)
        && (quiet(image, state, now, cfg.interval) || waited_long(state, now, cfg.interval));
    if !waiting {
        *lock(&state.waiting_since) = None;
    }
    if !(pressure || due || image.retired_segments() > 0) {
        return Ok(None);
    }
    let ctl =
        PassControl { force_durable: pressure, max_batches: cfg.service_batches, ..PassControl::default() };
    let report = compactor.run_pass(image, state, &ctl)?;
    // The longest wait for a pause counts again from this pass.
    *lock(&state.waiting_since) = None;
    let mut rolled = false;
    // Only when the closed segment can go: not past the reclaim gate (a
    // bucket behind would leave it, and the rest of it, unreclaimable).
    let reclaimable = image.reclaim_gate().map_or(report.covered_after, |g| g.min(report.covered_after));
    if blocked && reclaimable == image.durable_seq() && !image.has_undurable_records() {
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
