//! Why a request waited: the gate that held it.

/// The reason a request was not admitted or dispatched at some moment.
/// `sched` reports these; `trace` records them per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub enum Gate {
    /// A write waits for its image's log capacity.
    LogCapacity,
    /// A request waits behind an earlier overlapping write, zero or discard
    /// (or a write behind an earlier overlapping read).
    Overlap,
    /// A request waits behind a FLUSH, or a FLUSH waits for earlier requests.
    FlushBarrier,
    /// A read waits for one of its image's read credits.
    ReadCredits,
    /// Eligible, but another image or request had the scheduler's turn.
    SchedulerTurn,
}

impl Gate {
    pub const ALL: [Gate; 5] =
        [Gate::LogCapacity, Gate::Overlap, Gate::FlushBarrier, Gate::ReadCredits, Gate::SchedulerTurn];

    /// Stable snake_case name used in JSON and tables.
    pub fn name(self) -> &'static str {
        match self {
            Gate::LogCapacity => "log_capacity",
            Gate::Overlap => "overlap",
            Gate::FlushBarrier => "flush_barrier",
            Gate::ReadCredits => "read_credits",
            Gate::SchedulerTurn => "scheduler_turn",
        }
    }
}
