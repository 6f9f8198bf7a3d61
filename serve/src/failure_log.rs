//! The bound on what failing requests write to the daemon's log: a guest
//! retrying against a failed image (or a full store) sends thousands of
//! requests a second, and a warning each would grow the log (on /run, a
//! tmpfs: memory) without bound and bury what came before. Per attached
//! image, the first failure is logged, then at most one line per window,
//! naming how many it held back (`held_back`); the stats' `errors` and
//! the metric `casblk_image_request_errors_total` still count every one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// One line per this long at most, per image.
pub const FAILURE_LOG_WINDOW: Duration = Duration::from_secs(10);

/// When an image's next failure may be logged, and how many were not.
#[derive(Debug, Default)]
pub struct FailureLog {
    /// The trace clock's time before which failures are only counted.
    quiet_until_ns: AtomicU64,
    /// Failures not logged since the last line.
    unlogged: AtomicU64,
}

impl FailureLog {
    /// Whether a failure at `now_ns` is logged: Some(the failures left
    /// unlogged since the previous line, which this line stands for too),
    /// or None (counted, to be named by the next line).
    pub fn admit(&self, now_ns: u64) -> Option<u64> {
        let until = self.quiet_until_ns.load(Ordering::Relaxed);
        let next = now_ns.saturating_add(FAILURE_LOG_WINDOW.as_nanos() as u64);
        if now_ns >= until
            && self.quiet_until_ns.compare_exchange(until, next, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            return Some(self.unlogged.swap(0, Ordering::Relaxed));
        }
        self.unlogged.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_is_logged_then_one_line_per_window_counting_the_rest() {
        let log = FailureLog::default();
        let window = FAILURE_LOG_WINDOW.as_nanos() as u64;
        let t0 = 5_000_000_000;
        assert_eq!(log.admit(t0), Some(0));
        for i in 1..1000 {
            assert_eq!(log.admit(t0 + i * (window / 1000)), None, "failure {i} inside the window");
        }
        assert_eq!(log.admit(t0 + window), Some(999), "the next line names the 999 held back");
        assert_eq!(log.admit(t0 + window + 1), None);
        assert_eq!(log.admit(t0 + 5 * window), Some(1), "a quiet image logs at once again");
    }

    #[test]
    fn racing_threads_log_one_line_per_window_and_lose_no_count() {
        let log = std::sync::Arc::new(FailureLog::default());
        let now = 1_000;
        let lines: Vec<Option<u64>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    let log = log.clone();
                    s.spawn(move || (0..250).map(|_| log.admit(now)).collect::<Vec<_>>())
                })
                .collect();
            handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let logged: Vec<u64> = lines.iter().flatten().copied().collect();
        assert_eq!(logged.len(), 1, "{logged:?}");
        // Failures counted between the winner's claim and its swap go to
        // its line; the rest to the next.
        let later = log.admit(now + FAILURE_LOG_WINDOW.as_nanos() as u64).unwrap();
        assert_eq!(logged[0] + later, 999, "every failure is counted once");
    }
}
