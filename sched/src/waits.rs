//! Where a request's admission wait went, per gate ([`trace::Gate`]).
//!
//! A waiting request is looked at ("observed") whenever the scheduler scans
//! its image. The time since the previous observation is charged to the gate
//! seen then; time before the first observation to the first gate seen;
//! time after the last observation to that gate, or to
//! [`Gate::SchedulerTurn`] if the request was never held by a gate (it was
//! eligible and only waited for a worker or its image's turn). So the waits
//! of a dispatched request add up exactly to `admitted_ns - arrival_ns`.

use trace::Gate;

/// Nanoseconds spent behind each gate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GateWaits {
    pub log_capacity_ns: u64,
    pub overlap_ns: u64,
    pub flush_barrier_ns: u64,
    pub read_credits_ns: u64,
    pub scheduler_turn_ns: u64,
    pub rate_limit_ns: u64,
    pub store_space_ns: u64,
}

impl GateWaits {
    /// Time behind `gate`; 0 for a gate sched does not know.
    pub fn get(&self, gate: Gate) -> u64 {
        match gate {
            Gate::LogCapacity => self.log_capacity_ns,
            Gate::Overlap => self.overlap_ns,
            Gate::FlushBarrier => self.flush_barrier_ns,
            Gate::ReadCredits => self.read_credits_ns,
            Gate::SchedulerTurn => self.scheduler_turn_ns,
            Gate::RateLimit => self.rate_limit_ns,
            Gate::StoreSpace => self.store_space_ns,
            _ => 0,
        }
    }

    fn slot(&mut self, gate: Gate) -> &mut u64 {
        match gate {
            Gate::LogCapacity => &mut self.log_capacity_ns,
            Gate::Overlap => &mut self.overlap_ns,
            Gate::FlushBarrier => &mut self.flush_barrier_ns,
            Gate::ReadCredits => &mut self.read_credits_ns,
            Gate::SchedulerTurn => &mut self.scheduler_turn_ns,
            Gate::RateLimit => &mut self.rate_limit_ns,
            Gate::StoreSpace => &mut self.store_space_ns,
            other => panic!("sched never holds a request behind gate {other:?}"),
        }
    }

    pub fn add(&mut self, gate: Gate, ns: u64) {
        let slot = self.slot(gate);
        *slot = slot.saturating_add(ns);
    }

    /// Adds every gate of `other` into `self`.
    pub fn accumulate(&mut self, other: &GateWaits) {
        for (gate, ns) in other.iter() {
            self.add(gate, ns);
        }
    }

    pub fn total_ns(&self) -> u64 {
        Gate::ALL.iter().map(|&g| self.get(g)).sum()
    }

    /// The gates with a non-zero wait, in [`Gate::ALL`] order.
    pub fn iter(&self) -> impl Iterator<Item = (Gate, u64)> + '_ {
        Gate::ALL.iter().map(|&g| (g, self.get(g))).filter(|&(_, ns)| ns > 0)
    }
}

/// Per-request gate bookkeeping while the request waits.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GateTrack {
    current: Option<Gate>,
    since_ns: u64,
    waits: GateWaits,
}

impl GateTrack {
    /// Starts at arrival, optionally already behind `gate` (known without a
    /// scan, e.g. an uncompleted FLUSH ahead).
    pub(crate) fn new(arrival_ns: u64, gate: Option<Gate>) -> Self {
        GateTrack { current: gate, since_ns: arrival_ns, waits: GateWaits::default() }
    }

    pub(crate) fn observe(&mut self, now_ns: u64, gate: Gate) {
        let held_by = self.current.unwrap_or(gate);
        self.waits.add(held_by, now_ns.saturating_sub(self.since_ns));
        self.current = Some(gate);
        self.since_ns = now_ns;
    }

    /// Closes the last interval at dispatch time.
    pub(crate) fn finish(mut self, now_ns: u64) -> GateWaits {
        let held_by = self.current.unwrap_or(Gate::SchedulerTurn);
        self.waits.add(held_by, now_ns.saturating_sub(self.since_ns));
        self.waits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_add_up_to_the_admission_wait() {
        let mut t = GateTrack::new(100, None);
        t.observe(150, Gate::LogCapacity); // 50 charged to the first gate seen
        t.observe(400, Gate::SchedulerTurn); // 250 still behind log capacity
        let w = t.finish(1000); // 600 waiting for a turn
        assert_eq!(w.log_capacity_ns, 300);
        assert_eq!(w.scheduler_turn_ns, 600);
        assert_eq!(w.total_ns(), 900);
    }

    #[test]
    fn an_unobserved_request_waited_for_its_turn() {
        let w = GateTrack::new(10, None).finish(30);
        assert_eq!(w.scheduler_turn_ns, 20);
        let w = GateTrack::new(10, Some(Gate::FlushBarrier)).finish(30);
        assert_eq!(w.flush_barrier_ns, 20);
        assert_eq!(w.iter().collect::<Vec<_>>(), vec![(Gate::FlushBarrier, 20)]);
    }
}
