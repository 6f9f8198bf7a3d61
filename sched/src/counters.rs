//! Per-image scheduler counters, read by trace and `casblk stats`.
//! These are the seed's scheduler telemetry (independent-read admission,
//! ordinary-head wait, reads that passed a blocked head, refused turns,
//! admitted requests), plus wait totals per gate.

use crate::waits::GateWaits;

/// Counters of one image since it was added. Waits are admission waits
/// (`admitted - arrival`) in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ImageCounters {
    /// Descriptors accepted by `submit`.
    pub submitted_requests: u64,
    /// `submit` calls refused because the frontier was full.
    pub refused_submits: u64,
    /// Requests dispatched (admitted) to a worker.
    pub admitted_requests: u64,
    pub completed_requests: u64,
    /// Write reservations the log refused (each one a refused turn).
    pub refused_turns: u64,
    /// Reads admitted while an older request of the image still waited.
    pub reads_passed_blocked_head: u64,
    /// Longest admission wait of a read that passed a blocked head.
    pub independent_read_wait_ns_max: u64,
    /// Longest admission wait of every other request (reads at the head of
    /// their image count here, as in the seed).
    pub ordinary_head_wait_ns_max: u64,
    /// Reads admitted to be served in place on their queue thread (see
    /// `Scheduler::submit_read_in_place`), net of those handed back.
    pub reads_in_place: u64,
    /// In-place reads handed back to the workers (`Scheduler::requeue`):
    /// their data was not in memory.
    pub reads_requeued: u64,
    /// Write-kind requests admitted to be executed on their queue thread
    /// (see `Scheduler::submit_write_in_place`).
    pub writes_in_place: u64,
    /// Admission wait of all admitted requests, per gate.
    pub gate_wait_ns_total: GateWaits,
    /// Descriptors waiting now.
    pub pending_requests: u64,
    /// Requests dispatched and not yet completed now.
    pub inflight_requests: u64,
}
