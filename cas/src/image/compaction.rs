//! What the compactor needs of an image: its log, its durability (to make
//! the completed log durable under pressure), the pressure signal of its
//! capacity, and reclamation of the log a manifest commit covers (with
//! segment pins, see `Log::reclaim_through`).

use super::{bump, write_lock, CapacityListener, Image, RECLAIM_PIN_WAIT_MS};
use crate::error::{Error, Result};
use crate::wal::Log;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Overlay extents removed per hold of the overlay's write lock.
const RECLAIM_STEP_EXTENTS: usize = 512;

impl Image {
    pub(crate) fn log(&self) -> &Arc<Log> {
        &self.log
    }

    /// See `start_cursor`.
    pub(crate) fn start_cursor(&self) -> (u64, u64, u64) {
        self.start_cursor
    }

    /// Fails if the image failed (a sync or an unvoidable write failed).
    pub(crate) fn check_usable(&self) -> Result<()> {
        self.durability.check()
    }

    /// Makes every record completed so far durable, without waiting for
    /// writes in flight (the compactor calls this when the log is under
    /// pressure and nobody flushes: only durable log can be compacted).
    /// Returns the durable seq.
    pub(crate) fn make_completed_durable(&self) -> Result<u64> {
        let target = self.durability.watermark();
        if target > self.durability.durable_seq() {
            self.make_durable(crate::io::IoCx::default(), target)?;
        }
        Ok(self.durability.durable_seq())
    }

    /// True when records are complete but not yet durable.
    pub(crate) fn has_undurable_records(&self) -> bool {
        self.durability.watermark() > self.durability.durable_seq()
    }

    /// Registers the compactor's pressure listener: called when log use
    /// reaches `threshold_bytes` or a reservation is refused.
    pub(crate) fn set_pressure_listener(&self, threshold_bytes: u64, f: CapacityListener) {
        self.capacity.set_pressure_listener(threshold_bytes, f);
    }

    pub(crate) fn rearm_pressure(&self) {
        self.capacity.rearm_pressure();
    }

    /// True if a reservation was refused since space was last released.
    pub(crate) fn capacity_refused(&self) -> bool {
        self.capacity.refused()
    }

    /// Reclamation (the compactor calls it after committing a manifest
    /// that covers every record through `covered_seq`): drops those records
    /// from the overlay, deletes the segments holding only such records once
    /// no read or scan pins them (see `Log::reclaim_through`), returns their
    /// space to the quota and wakes waiting writers and the capacity
    /// listener. Returns the bytes freed; a pinned segment is left for a
    /// later call (which `covered_seq` no higher than before retries).
    pub fn reclaim_log(&self, covered_seq: u64) -> Result<u64> {
        self.reclaim_counted(covered_seq).map(|(freed, _)| freed)
    }

    /// Fails the image: writes and flushes fail from now on (reads go on),
    /// until it is reopened.
    pub(crate) fn fail(&self, why: String) {
        tracing::error!(image = %self.name(), "{why}; writes and flushes fail from now on");
        self.durability.fail(why);
    }

    /// Limits reclamation to records through `seq` (see `reclaim_gate`);
    /// `u64::MAX` lifts the limit.
    pub(crate) fn gate_reclaim(&self, seq: u64) {
        self.reclaim_gate.store(seq, Ordering::Release);
    }

    /// The limit on reclamation, if one is set.
    pub fn reclaim_gate(&self) -> Option<u64> {
        Some(self.reclaim_gate.load(Ordering::Acquire)).filter(|&g| g != u64::MAX)
    }

    /// `reclaim_log`, returning the bytes freed and the segments deleted.
    /// Reclaims no further than the gate.
    pub(crate) fn reclaim_counted(&self, covered_seq: u64) -> Result<(u64, u64)> {
        let covered_seq = covered_seq.min(self.reclaim_gate.load(Ordering::Acquire));
        let durable = self.durability.durable_seq();
        if covered_seq > durable {
            return Err(Error::InvalidArgument(format!(
                "cannot reclaim log through seq {covered_seq}: only seq {durable} is durable"
            )));
        }
        // In bounded steps, releasing the lock between them: readers and
        // writers of the image wait at most one step. Any subset of covered
        // extents may go first: each holds the same bytes as the manifest.
        loop {
            let (gone, more) = write_lock(&self.overlay).remove_through(covered_seq, RECLAIM_STEP_EXTENTS);
            // Segment handles drop here, outside the lock.
            drop(gone);
            if !more {
                break;
            }
        }
        let wait = std::time::Duration::from_millis(RECLAIM_PIN_WAIT_MS);
        let out = self.log.reclaim_through(covered_seq, wait);
        bump(&self.counters.segments_reclaimed, out.deleted);
        bump(&self.counters.reclaim_deferred, out.deferred);
        self.capacity.release_consumed(out.freed_bytes);
        match out.error {
            Some(e) => Err(e),
            None => Ok((out.freed_bytes, out.deleted)),
        }
    }

    /// When every record is covered through `covered_seq` and writers wait
    /// for capacity, closes the current segment so that `reclaim_log` can
    /// delete it (otherwise a request needing more than the quota minus one
    /// segment could wait forever). Returns true if it rolled.
    pub(crate) fn roll_covered_segment(&self, covered_seq: u64) -> Result<bool> {
        if covered_seq > self.durability.durable_seq() {
            return Ok(false);
        }
        match self.log.roll_if_covered(covered_seq)? {
            Some(consumed) => {
                self.capacity.add_consumed(consumed);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Covered segments still waiting for pins to drop.
    pub(crate) fn retired_segments(&self) -> usize {
        self.log.retired_count()
    }
}
