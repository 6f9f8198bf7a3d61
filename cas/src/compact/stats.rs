//! What one pass reports ([`CompactReport`]): positions, and the work
//! counters it adds to its image's cumulative ones ([`CompactStats`],
//! defined with the other per-image counters in `image/stats.rs`).

pub use crate::image::stats::CompactStats;

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CompactReport {
    /// The manifest's covered seq before and after the pass.
    pub covered_before: u64,
    pub covered_after: u64,
    /// The durable seq the pass drained towards.
    pub durable_seq: u64,
    pub work: CompactStats,
}
