//! GC without an operator: a background task of the store that runs a
//! pass ([`crate::Store::gc`]) when enough has changed since the last one,
//! so that a store under running VMs gives back the space of overwritten
//! and removed data by itself (`casblk gc` still runs one at once).
//!
//! ```text
//!  every check_interval_ms:
//!    a pass ran (by anyone), or the store opened, less than
//!    min_interval_ms ago                                   -> wait
//!    an image was removed since the last pass              -> pass
//!    a compaction pass failed with ENOSPC since            -> pass
//!    chunks stored since the last pass >= max(min_new_chunks,
//!        growth_percent % of the chunks after it)          -> pass
//!    block mappings compaction dropped since the last pass
//!        >= that same threshold                            -> pass
//!    else                                                  -> wait
//! ```
//!
//! Why growth: a chunk is stored only for new content, and overwritten
//! content becomes garbage only once its block is written again, so a
//! store whose chunk count grew by a quarter since the last pass may hold
//! up to that much garbage. A store that only fills (a guest installing)
//! runs a pass at each quarter of growth: geometric, so the mark and
//! sweep cost per stored chunk stays constant.
//!
//! Why dropped mappings: garbage is also made without growth, by
//! overwrites whose new content is already stored, by DISCARD (a guest's
//! fstrim) and by zeroing. Each manifest commit counts the blocks that
//! mapped a chunk and now map none or another
//! (`CommitStats::refs_dropped`), the compactor sums them for the store
//! as each commit lands, and as many as the growth threshold start a pass
//! like growth does. The count is an upper bound on the chunks made dead
//! (a chunk other blocks or snapshots still use stays), so a pass it
//! starts may find less; the threshold keeps such passes geometric too. Removal of
//! an image is nudged directly. The count is in memory: drops before a
//! restart, and garbage left by an offline `casblk image rm` before the
//! store opened, wait for the next pass.
//!
//! A failed pass is logged and counted; the next try waits the minimum
//! interval. The task decides from the history it shares with the store
//! and the chunk count. It runs a pass through a closure the store hands
//! it (GC is below the store: it never names it), which holds the store
//! weakly and upgrades it only to run the pass: a store dropped during a
//! pass closes (and unlocks) when the pass ends, on the task's thread. A process that exits during a pass
//! leaves it cut short, as a crash would (a pass is crash-safe: cas::gc).

use crate::chunk::{lock, ChunkStore};
use crate::error::Result;
use crate::gc::GcReport;
use crate::space::{SpacePhase, SpaceReserve};
use crate::tasks::{Context, Step, Task, Wake};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The least time between automatic passes while the store is below its
/// space reserve.
pub const URGENT_MIN_INTERVAL_MS: u64 = 5_000;

/// When the store runs GC by itself ([`crate::StoreOptions::gc_auto`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct AutoGcOptions {
    pub enabled: bool,
    /// How often the task looks at the store.
    pub check_interval_ms: u64,
    /// At least this long from one pass (automatic or not) to the next
    /// automatic one; also the wait after a failed pass.
    pub min_interval_ms: u64,
    /// A pass needs at least this many chunks stored since the last one
    /// (65,536: 256 MiB of 4 KiB chunks)...
    pub min_new_chunks: u64,
    /// ...and at least this percentage of the chunks the last pass left.
    pub growth_percent: u64,
}

impl Default for AutoGcOptions {
    fn default() -> Self {
        AutoGcOptions {
            enabled: true,
            check_interval_ms: 10_000,
            min_interval_ms: 60_000,
            min_new_chunks: 65_536,
            growth_percent: 25,
        }
    }
}

impl AutoGcOptions {
    /// No automatic GC (one-shot tools, benchmarks timing other work).
    pub fn off() -> AutoGcOptions {
        AutoGcOptions { enabled: false, ..AutoGcOptions::default() }
    }
}

/// What the store remembers of its GC passes, for the task's decision
/// and the `store` counters.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct GcHistory {
    /// Passes that finished, automatic or not, and the automatic ones.
    pub passes: u64,
    pub auto_passes: u64,
    pub auto_failures: u64,
    pub reclaimed_bytes: u64,
    /// Live chunks when the last pass finished (or when the store opened).
    pub chunks_after_last: u64,
    /// The store's dropped block mappings (`GcShared::refs_dropped`) as
    /// the last pass began.
    pub refs_dropped_at_last: u64,
    /// When the last pass (or automatic try) ended, or the store opened,
    /// on the tasks' clock.
    pub last_at: Option<Instant>,
    /// An image was removed since the last pass.
    pub nudged: bool,
    /// A compaction pass failed with ENOSPC since the last pass.
    pub no_space: bool,
}

impl GcHistory {
    /// Why a pass is due now, if it is: `chunks` live chunks and
    /// `refs_dropped` dropped mappings (summed since the open) at `now`,
    /// with the store's space reserve in `space`: below the reserve a pass
    /// is due every [`URGENT_MIN_INTERVAL_MS`] (writes wait for it); once
    /// GC has shown it cannot free space, only when new garbage may have
    /// appeared.
    pub fn due(
        &self,
        opts: &AutoGcOptions,
        chunks: u64,
        refs_dropped: u64,
        space: SpacePhase,
        now: Instant,
    ) -> Option<String> {
        let urgent_gap = Duration::from_millis(URGENT_MIN_INTERVAL_MS.min(opts.min_interval_ms));
        let urgent_ok = self.last_at.is_none_or(|t| now.saturating_duration_since(t) >= urgent_gap);
        let new_garbage = self.nudged || refs_dropped > self.refs_dropped_at_last;
        match space {
            SpacePhase::Low { .. } if urgent_ok => {
                return Some("the store is below its space reserve".into())
            }
            SpacePhase::Exhausted if urgent_ok && new_garbage => {
                return Some("the store is full and new garbage may be freed".into())
            }
            _ => {}
        }
        let min_interval = Duration::from_millis(opts.min_interval_ms);
        if self.last_at.is_some_and(|t| now.saturating_duration_since(t) < min_interval) {
            return None;
        }
        if self.nudged {
            return Some("an image was removed".into());
        }
        if self.no_space {
            return Some("compaction found the filesystem full".into());
        }
        let new = chunks.saturating_sub(self.chunks_after_last);
        let need = opts.min_new_chunks.max(self.chunks_after_last.saturating_mul(opts.growth_percent) / 100);
        if new >= need {
            return Some(format!("{new} chunks stored since the last pass (threshold {need})"));
        }
        let dropped = refs_dropped.saturating_sub(self.refs_dropped_at_last);
        (dropped >= need).then(|| {
            format!("{dropped} block mappings dropped or replaced since the last pass (threshold {need})")
        })
    }

    /// Records a finished pass that left `chunks` live chunks and began
    /// when the store had dropped `refs_dropped` mappings.
    pub fn finished(&mut self, report: &GcReport, chunks: u64, refs_dropped: u64, now: Instant, auto: bool) {
        self.passes += 1;
        self.auto_passes += u64::from(auto);
        self.reclaimed_bytes += report.bytes_reclaimed.max(0) as u64;
        self.chunks_after_last = chunks;
        self.refs_dropped_at_last = refs_dropped;
        self.last_at = Some(now);
        self.nudged = false;
        self.no_space = false;
    }

    /// Records a failed automatic pass: the next try waits the interval.
    pub fn failed(&mut self, now: Instant) {
        self.auto_failures += 1;
        self.last_at = Some(now);
    }
}

/// The GC state the store and its automatic task share: the history,
/// the task's waker once it runs (so a removal can wake it), and the
/// compactor's count of dropped block mappings.
pub(crate) struct GcShared {
    pub history: Mutex<GcHistory>,
    pub wake: OnceLock<Wake>,
    pub refs_dropped: Arc<AtomicU64>,
    /// The store's space reserve: below it passes are urgent.
    pub space: Arc<SpaceReserve>,
}

impl GcShared {
    /// An image was removed: its chunks may be garbage now.
    pub fn nudge(&self) {
        lock(&self.history).nudged = true;
        self.space.garbage_appeared();
        self.wake_task();
    }

    /// The store went below its space reserve: run a pass now.
    pub fn space_low(&self) {
        self.wake_task();
    }

    /// A compaction pass failed with ENOSPC: dead chunks may hold the room
    /// it needs.
    pub fn no_space(&self) {
        lock(&self.history).no_space = true;
        self.wake_task();
    }

    fn wake_task(&self) {
        if let Some(w) = self.wake.get() {
            w.wake();
        }
    }
}

/// Runs one automatic pass, given why it is due; None when there is no
/// store to run it on (being dropped, or not built yet).
pub(crate) type AutoGcPass = Box<dyn FnMut(&str) -> Option<Result<GcReport>> + Send>;

/// The background task; see the module docs. It decides from the shared
/// history and the chunk count without the store, which only `pass`
/// reaches.
pub(crate) struct AutoGcTask {
    pub pass: AutoGcPass,
    pub shared: Arc<GcShared>,
    pub chunks: Arc<ChunkStore>,
    pub opts: AutoGcOptions,
}

impl Task for AutoGcTask {
    fn step(&mut self, cx: &Context<'_>) -> Step {
        let check = Step::Wait(Some(Duration::from_millis(self.opts.check_interval_ms.max(1))));
        let chunks = self.chunks.len();
        let dropped = self.shared.refs_dropped.load(Ordering::Relaxed);
        if self.shared.space.phase() != SpacePhase::Ok {
            // Keep the reported state current while no write asks, and let
            // trims or overwrites since the pass that exhausted the reserve
            // make writes wait for the next pass instead of failing.
            self.shared.space.refresh();
            self.shared.space.garbage_seen(dropped);
        }
        let space = self.shared.space.phase();
        let due = lock(&self.shared.history).due(&self.opts, chunks, dropped, space, cx.now());
        let Some(why) = due else {
            // Below the reserve, look again soon: writes are waiting.
            return if space == SpacePhase::Ok { check } else { Step::Wait(Some(Duration::from_secs(1))) };
        };
        match (self.pass)(&why) {
            None => {}
            Some(Ok(r)) => tracing::info!(
                chunks_dead = r.chunks_dead,
                packs_rewritten = r.packs_rewritten,
                packs_deleted = r.packs_deleted,
                bytes_reclaimed = r.bytes_reclaimed,
                "automatic GC pass done"
            ),
            Some(Err(e)) => tracing::warn!(error = %e, "automatic GC pass failed; trying again later"),
        }
        check
    }
}
