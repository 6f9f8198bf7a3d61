//! Why a request waited: the gate that held it.

/// The reason a request was not admitted or dispatched at some moment.
/// `sched` reports these; `trace` records them per request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
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
    /// The image's IO limit (IOPS or bytes per second) for the request's
    /// class had no tokens yet.
    RateLimit,
    /// A write waits because the store's filesystem is below its space
    /// reserve, while GC may free room.
    StoreSpace,
}

impl Gate {
    /// Number of gates; the length of per-gate arrays.
    pub const COUNT: usize = 7;

    pub const ALL: [Gate; Gate::COUNT] = [
        Gate::LogCapacity,
        Gate::Overlap,
        Gate::FlushBarrier,
        Gate::ReadCredits,
        Gate::SchedulerTurn,
        Gate::RateLimit,
        Gate::StoreSpace,
    ];

    /// Position in [`Gate::ALL`], for per-gate arrays.
    pub fn index(self) -> usize {
        match self {
            Gate::LogCapacity => 0,
            Gate::Overlap => 1,
            Gate::FlushBarrier => 2,
            Gate::ReadCredits => 3,
            Gate::SchedulerTurn => 4,
            Gate::RateLimit => 5,
            Gate::StoreSpace => 6,
        }
    }

    /// Stable snake_case name used in JSON and tables.
    pub fn name(self) -> &'static str {
        match self {
            Gate::LogCapacity => "log_capacity",
            Gate::Overlap => "overlap",
            Gate::FlushBarrier => "flush_barrier",
            Gate::ReadCredits => "read_credits",
            Gate::SchedulerTurn => "scheduler_turn",
            Gate::RateLimit => "rate_limit",
            Gate::StoreSpace => "store_space",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_matches_all_and_names_are_distinct() {
        for (i, gate) in Gate::ALL.iter().enumerate() {
            assert_eq!(gate.index(), i);
        }
        let mut names: Vec<_> = Gate::ALL.iter().map(|g| g.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Gate::COUNT);
    }

    #[test]
    fn serde_name_is_the_stable_name() {
        for gate in Gate::ALL {
            assert_eq!(serde_json::to_value(gate).unwrap(), serde_json::Value::from(gate.name()));
        }
    }
}
