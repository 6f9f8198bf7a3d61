//! Per-image scheduler counters, read by trace and `casblk stats`.
//! These are the seed's scheduler telemetry (independent-read admission,
//! ordinary-head wait, reads that passed a blocked head, refused turns,
//! admitted requests), plus wait totals per gate and the image's IO limits.

use crate::rate::Limits;
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
    /// Requests admitted after their image's IO limit held them.
    pub rate_limited_admissions: u64,
    /// The image's IO limits now.
    pub limits: LimitCounters,
    /// Descriptors waiting now.
    pub pending_requests: u64,
    /// Requests dispatched and not yet completed now.
    pub inflight_requests: u64,
}

/// An image's IO limits as counters: 0 is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LimitCounters {
    pub read_iops: u64,
    pub read_iops_burst: u64,
    pub read_bytes_per_sec: u64,
    pub read_bytes_burst: u64,
    pub write_iops: u64,
    pub write_iops_burst: u64,
    pub write_bytes_per_sec: u64,
    pub write_bytes_burst: u64,
}

impl From<Limits> for LimitCounters {
    fn from(l: Limits) -> Self {
        let rate = |r: Option<crate::RateLimit>| r.map_or((0, 0), |r| (r.per_sec, r.burst));
        let (read_iops, read_iops_burst) = rate(l.read_iops);
        let (read_bytes_per_sec, read_bytes_burst) = rate(l.read_bytes_per_sec);
        let (write_iops, write_iops_burst) = rate(l.write_iops);
        let (write_bytes_per_sec, write_bytes_burst) = rate(l.write_bytes_per_sec);
        LimitCounters {
            read_iops,
            read_iops_burst,
            read_bytes_per_sec,
            read_bytes_burst,
            write_iops,
            write_iops_burst,
            write_bytes_per_sec,
            write_bytes_burst,
        }
    }
}
