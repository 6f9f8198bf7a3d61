//! The store's space reserve: how much of the store filesystem's free
//! space guest writes may not take, so that compaction, GC and manifest
//! commits can always make progress towards freeing space.
//!
//! ```text
//!   avail = statvfs f_bavail - one log segment (what a granted roll takes)
//!   avail >= reserve                           ok: every write goes on
//!   avail <  reserve, first seen               -> low: wake GC at once
//!     a write that needs a new log segment     waits (gate store_space)
//!     a trim or zeroing (range record)         goes on while avail >= reserve/2
//!     low for wait_ms, or a GC pass that began
//!     after low and freed nothing              -> exhausted
//!   exhausted                                  such writes fail with ENOSPC
//!     more garbage appears, or GC frees some   -> low again (a new bounded wait)
//!   avail >= reserve                           -> ok
//! ```
//!
//! - Only a reservation that needs a *new* log segment asks: a log
//!   segment is allocated whole when it is created
//!   ([`crate::storage::StorageFile::allocate`]), so a write into the
//!   current segment takes no new space, and a record write never meets
//!   ENOSPC (which would fail the image: `cas::image::durability`).
//! - Compaction, GC and manifest writes never ask: the reserve is theirs.
//!   Deletions never ask.
//! - Range records (DISCARD, WRITE_ZEROES) may roll into half the
//!   reserve: a trim is how a guest gives space back. So may one WRITE per
//!   image per low episode (its grace roll): the filesystem commit before
//!   a trim is small, and an idle image's current segment may be full.
//! - The free space is probed at most every [`PROBE_MAX_AGE_MS`] while it
//!   is well above the reserve, and at every ask near it (inside the
//!   scheduler's lock: one statvfs); GC's task refreshes it every second
//!   while the store is not ok, so the state reported stays current.
//! - "More garbage" is GC's count of dropped block mappings growing past
//!   what the pass that exhausted the reserve had seen, or an image
//!   removed. A pass that fails counts as one that freed nothing.
//! - Where the filesystem cannot allocate ahead (no fallocate; a
//!   copy-on-write filesystem, which may still fail a write), a record
//!   write can still meet ENOSPC; the reserve then only makes it rarer.
//!
//! This module owns the state machine and its counters; the image asks it
//! ([`SpaceReserve::check`]), GC reports its passes to it, and the store
//! builds it from its options and storage.

use crate::sync::lock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How old a probe of the free space may be while it is at least twice the
/// reserve.
pub const PROBE_MAX_AGE_MS: u64 = 100;

/// How long writes wait below the reserve, at most, before they fail with
/// ENOSPC (unless GC has shown it cannot free space sooner).
pub const DEFAULT_SPACE_WAIT_MS: u64 = 60_000;

/// The default reserve on a filesystem of `fs_bytes`: 1% of it, at least
/// 256 MiB and at most 4 GiB, but never more than a tenth of it.
pub fn default_reserve_bytes(fs_bytes: u64) -> u64 {
    (fs_bytes / 100).clamp(256 << 20, 4 << 30).min(fs_bytes / 10)
}

/// What asks for new space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpaceClass {
    /// A WRITE: needs the whole reserve left.
    Write,
    /// A DISCARD or WRITE_ZEROES: needs half of it left.
    Range,
}

/// The answer to [`SpaceReserve::check`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpaceVerdict {
    Grant,
    /// Below the reserve while GC may still free space: try again later.
    Wait,
    /// GC cannot free space (or the wait ran out): fail with ENOSPC.
    Refuse(String),
}

/// The reserve's state, as `space_state` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpacePhase {
    Ok,
    Low { since: Instant },
    Exhausted,
}

impl SpacePhase {
    /// 0 ok, 1 low, 2 exhausted (stats and metrics).
    pub fn code(self) -> u8 {
        match self {
            SpacePhase::Ok => 0,
            SpacePhase::Low { .. } => 1,
            SpacePhase::Exhausted => 2,
        }
    }
}

/// Free bytes of the store filesystem now, or `None` where unknown.
pub type SpaceProbe = Box<dyn Fn() -> Option<u64> + Send + Sync>;

/// Called (outside the reserve's lock) when the store goes below its
/// reserve: GC should run now.
pub type LowListener = Arc<dyn Fn() + Send + Sync>;

struct State {
    phase: SpacePhase,
    /// Why the phase is exhausted, for the refusal's message.
    exhausted_because: &'static str,
    /// While exhausted: the dropped-mappings count (cas::gc::auto) up to
    /// which GC has already looked; more than this is new garbage.
    garbage_mark: Option<u64>,
    avail_bytes: Option<u64>,
    probed_at: Option<Instant>,
}

/// Counters of the reserve, summed since the store opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SpaceCounters {
    /// Asks told to wait (a held write asks again every 100 ms).
    pub waits: u64,
    /// Asks refused with ENOSPC.
    pub refusals: u64,
    /// Times the store went below its reserve.
    pub low_episodes: u64,
    /// Grace rolls granted (one per image per episode).
    pub graces: u64,
}

/// One store's reserve; see the module docs.
pub struct SpaceReserve {
    reserve_bytes: u64,
    /// What one roll allocates (a log segment): the free space is counted
    /// without it, so a granted roll never takes the reserve.
    roll_bytes: u64,
    wait: Duration,
    probe: SpaceProbe,
    state: Mutex<State>,
    on_low: Mutex<Option<LowListener>>,
    waits: AtomicU64,
    refusals: AtomicU64,
    low_episodes: AtomicU64,
    graces: AtomicU64,
}

/// One writer's (an image's) claim on its grace roll: the low episode it
/// last used it in (0: never).
#[derive(Debug, Default)]
pub struct GraceToken(AtomicU64);

impl SpaceReserve {
    /// A reserve of `reserve_bytes` (0: none, every ask is granted) over
    /// the free space `probe` reports, less `roll_bytes` (what a granted
    /// roll allocates); writes wait at most `wait_ms`.
    pub fn new(reserve_bytes: u64, roll_bytes: u64, wait_ms: u64, probe: SpaceProbe) -> SpaceReserve {
        SpaceReserve {
            reserve_bytes,
            roll_bytes,
            wait: Duration::from_millis(wait_ms),
            probe,
            state: Mutex::new(State {
                phase: SpacePhase::Ok,
                exhausted_because: "",
                garbage_mark: None,
                avail_bytes: None,
                probed_at: None,
            }),
            on_low: Mutex::new(None),
            waits: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            low_episodes: AtomicU64::new(0),
            graces: AtomicU64::new(0),
        }
    }

    /// No reserve (tools, stores whose space cannot be probed).
    pub fn none() -> Arc<SpaceReserve> {
        Arc::new(SpaceReserve::new(0, 0, DEFAULT_SPACE_WAIT_MS, Box::new(|| None)))
    }

    pub fn reserve_bytes(&self) -> u64 {
        self.reserve_bytes
    }

    pub fn set_low_listener(&self, f: LowListener) {
        *lock(&self.on_low) = Some(f);
    }

    pub fn phase(&self) -> SpacePhase {
        lock(&self.state).phase
    }

    pub fn counters(&self) -> SpaceCounters {
        SpaceCounters {
            waits: self.waits.load(Ordering::Relaxed),
            refusals: self.refusals.load(Ordering::Relaxed),
            low_episodes: self.low_episodes.load(Ordering::Relaxed),
            graces: self.graces.load(Ordering::Relaxed),
        }
    }

    /// May a request of `class` take a new log segment now?
    pub fn check(&self, class: SpaceClass) -> SpaceVerdict {
        self.check_at(class, Instant::now())
    }

    /// [`SpaceReserve::check`] at `now`.
    pub fn check_at(&self, class: SpaceClass, now: Instant) -> SpaceVerdict {
        self.decide(class, None, now)
    }

    /// [`SpaceReserve::check`] for a writer holding `grace`: once per time
    /// the store goes below the reserve, a WRITE of that writer may roll
    /// while half the reserve is left, as a trim may. An idle image whose
    /// current segment is full can then still commit the filesystem
    /// metadata that comes before the guest's trim.
    pub fn check_with_grace(&self, class: SpaceClass, grace: &GraceToken) -> SpaceVerdict {
        self.decide(class, Some(grace), Instant::now())
    }

    fn decide(&self, class: SpaceClass, grace: Option<&GraceToken>, now: Instant) -> SpaceVerdict {
        if self.reserve_bytes == 0 {
            return SpaceVerdict::Grant;
        }
        let (verdict, went_low) = {
            let mut st = lock(&self.state);
            let Some(avail) = self.probe_locked(&mut st, now, false) else {
                return SpaceVerdict::Grant;
            };
            let went_low = self.update_locked(&mut st, avail, now);
            let floor = match class {
                SpaceClass::Write => self.reserve_bytes,
                SpaceClass::Range => self.reserve_bytes / 2,
            };
            let episode = self.low_episodes.load(Ordering::Relaxed);
            let graced = |g: &GraceToken| g.0.swap(episode, Ordering::Relaxed) != episode;
            let verdict = if avail >= floor {
                SpaceVerdict::Grant
            } else if avail >= self.reserve_bytes / 2 && grace.is_some_and(graced) {
                bump(&self.graces);
                SpaceVerdict::Grant
            } else if st.phase == SpacePhase::Exhausted {
                SpaceVerdict::Refuse(format!(
                    "the store's filesystem is full: {} MiB free after a log segment, below the space reserve of {} MiB, and {}",
                    avail >> 20,
                    self.reserve_bytes >> 20,
                    st.exhausted_because
                ))
            } else {
                SpaceVerdict::Wait
            };
            (verdict, went_low)
        };
        match &verdict {
            SpaceVerdict::Wait => bump(&self.waits),
            SpaceVerdict::Refuse(_) => bump(&self.refusals),
            SpaceVerdict::Grant => {}
        }
        if went_low {
            self.call_low();
        }
        verdict
    }

    /// A GC pass that began at `started`, when the store had dropped
    /// `dropped` block mappings (cas::gc::auto), ended, freeing
    /// `freed_bytes` (0 for a pass that failed): below the reserve, a
    /// pass that began after the store went low and freed nothing shows
    /// that waiting is useless (exhausted); a pass that freed something
    /// starts a new bounded wait.
    pub fn gc_finished(&self, started: Instant, dropped: u64, freed_bytes: u64) {
        self.gc_finished_at(started, dropped, freed_bytes, Instant::now())
    }

    /// [`SpaceReserve::gc_finished`] at `now`.
    pub fn gc_finished_at(&self, started: Instant, dropped: u64, freed_bytes: u64, now: Instant) {
        if self.reserve_bytes == 0 {
            return;
        }
        let mut st = lock(&self.state);
        let Some(avail) = self.probe_locked(&mut st, now, true) else {
            return;
        };
        self.update_locked(&mut st, avail, now);
        match st.phase {
            SpacePhase::Low { since } if freed_bytes == 0 && started >= since => {
                tracing::error!(
                    avail_mib = avail >> 20,
                    reserve_mib = self.reserve_bytes >> 20,
                    "GC freed nothing below the space reserve; writes that need new space now fail with ENOSPC"
                );
                st.phase = SpacePhase::Exhausted;
                st.exhausted_because = "GC could not free more";
                // Mappings dropped since this pass began may be garbage
                // it did not sweep.
                st.garbage_mark = Some(dropped);
            }
            SpacePhase::Exhausted if freed_bytes > 0 => st.phase = SpacePhase::Low { since: now },
            _ => {}
        }
    }

    /// Garbage may have appeared (an image removed): an exhausted store
    /// waits again, for the GC pass that may free it.
    pub fn garbage_appeared(&self) {
        let mut st = lock(&self.state);
        if st.phase == SpacePhase::Exhausted {
            tracing::info!("new garbage below the space reserve; writes wait for GC again");
            st.phase = SpacePhase::Low { since: Instant::now() };
        }
    }

    /// The store has dropped `dropped` block mappings so far: while
    /// exhausted, more than GC has looked at since is new garbage (trims,
    /// overwrites), and writes wait again for the pass that may free it.
    pub fn garbage_seen(&self, dropped: u64) {
        let mut st = lock(&self.state);
        if st.phase != SpacePhase::Exhausted {
            return;
        }
        match st.garbage_mark {
            None => st.garbage_mark = Some(dropped),
            Some(mark) if dropped > mark => {
                tracing::info!("new garbage below the space reserve; writes wait for GC again");
                st.phase = SpacePhase::Low { since: Instant::now() };
            }
            Some(_) => {}
        }
    }

    /// Probes the free space now and moves the phase, so that the state
    /// reported is current while no write asks (a paused guest).
    pub fn refresh(&self) {
        if self.reserve_bytes == 0 {
            return;
        }
        let now = Instant::now();
        let went_low = {
            let mut st = lock(&self.state);
            match self.probe_locked(&mut st, now, true) {
                Some(avail) => self.update_locked(&mut st, avail, now),
                None => false,
            }
        };
        if went_low {
            self.call_low();
        }
    }

    /// The free space: probed again when `force`, when the last probe is
    /// older than [`PROBE_MAX_AGE_MS`], or when it was below twice the
    /// reserve.
    fn probe_locked(&self, st: &mut State, now: Instant, force: bool) -> Option<u64> {
        let fresh = st
            .probed_at
            .is_some_and(|t| now.saturating_duration_since(t).as_millis() < PROBE_MAX_AGE_MS as u128);
        let roomy = st.avail_bytes.is_some_and(|a| a >= self.reserve_bytes.saturating_mul(2));
        if force || !fresh || !roomy {
            st.avail_bytes = (self.probe)().map(|a| a.saturating_sub(self.roll_bytes));
            st.probed_at = Some(now);
        }
        st.avail_bytes
    }

    /// Moves the phase for `avail`; true when the store just went low.
    fn update_locked(&self, st: &mut State, avail: u64, now: Instant) -> bool {
        if avail >= self.reserve_bytes {
            if st.phase != SpacePhase::Ok {
                tracing::info!(avail_mib = avail >> 20, "the store is above its space reserve again");
            }
            st.phase = SpacePhase::Ok;
            return false;
        }
        match st.phase {
            SpacePhase::Ok => {
                tracing::warn!(
                    avail_mib = avail >> 20,
                    reserve_mib = self.reserve_bytes >> 20,
                    "the store is below its space reserve; writes that need new space wait while GC runs"
                );
                st.phase = SpacePhase::Low { since: now };
                bump(&self.low_episodes);
                true
            }
            SpacePhase::Low { since } if now.saturating_duration_since(since) >= self.wait => {
                tracing::error!(
                    waited_ms = self.wait.as_millis() as u64,
                    "no space came back below the space reserve; writes that need new space now fail with ENOSPC"
                );
                st.phase = SpacePhase::Exhausted;
                st.exhausted_because = "no space came back while writes waited";
                st.garbage_mark = None;
                false
            }
            _ => false,
        }
    }

    fn call_low(&self) {
        let f = lock(&self.on_low).clone();
        if let Some(f) = f {
            f();
        }
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests;
