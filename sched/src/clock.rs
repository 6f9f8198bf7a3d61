//! Time as the scheduler sees it: monotonic nanoseconds from a [`Clock`].
//! The daemon uses [`MonotonicClock`]; tests drive a [`FakeClock`] by hand,
//! so every wait the scheduler measures is deterministic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A monotonic source of nanoseconds. Only differences are meaningful.
pub trait Clock: Send {
    fn now_ns(&self) -> u64;
}

/// Real time: nanoseconds since the process-wide trace epoch.
#[derive(Clone, Debug, Default)]
pub struct MonotonicClock;

impl MonotonicClock {
    pub fn new() -> Self {
        MonotonicClock
    }
}

impl Clock for MonotonicClock {
    /// The trace clock ([`trace::now_ns`], the TSC: ~9 ns a read against
    /// ~25 ns for `Instant::now`), so a dispatch's `admitted_ns` is on the
    /// same time line as the request's trace and can stand for it.
    #[inline]
    fn now_ns(&self) -> u64 {
        trace::now_ns()
    }
}

/// A hand-driven clock for tests. Clones share the same time.
#[derive(Clone, Debug, Default)]
pub struct FakeClock {
    now_ns: Arc<AtomicU64>,
}

impl FakeClock {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn advance(&self, by: Duration) {
        let by_ns = u64::try_from(by.as_nanos()).expect("FakeClock advanced by more than 584 years");
        self.now_ns.fetch_add(by_ns, Ordering::SeqCst);
    }

    pub fn advance_ns(&self, by_ns: u64) {
        self.now_ns.fetch_add(by_ns, Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now_ns(&self) -> u64 {
        self.now_ns.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_clock_clones_share_time() {
        let a = FakeClock::new();
        let b = a.clone();
        a.advance(Duration::from_millis(3));
        b.advance_ns(5);
        assert_eq!(a.now_ns(), 3_000_005);
        assert_eq!(b.now_ns(), 3_000_005);
    }

    #[test]
    fn monotonic_clock_does_not_go_back() {
        let c = MonotonicClock::new();
        let t0 = c.now_ns();
        let t1 = c.now_ns();
        assert!(t1 >= t0);
    }
}
