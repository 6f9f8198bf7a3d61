//! Where the calling thread's wall time went over a stretch of work: on a
//! CPU, waiting for one (runnable but not running: other threads, or the
//! host, had the CPU), or asleep (I/O, page faults, locks), read from
//! Linux's per-thread accounting (`/proc/thread-self/schedstat` and `stat`).
//!
//! Used where a slow phase needs explaining after the fact (the chunk
//! store's open, whose time sits on a device's recovery path): a phase
//! that ran long while on the CPU did more work than usual; one that
//! waited for a CPU was starved; one asleep waited on the disk or a lock.
//! Without procfs every figure reads zero and `asleep` takes the wall time.

use std::time::Instant;

/// The thread's counters at one moment.
#[derive(Clone, Copy, Debug)]
pub struct ThreadTime {
    at: Instant,
    on_cpu_ns: u64,
    runnable_ns: u64,
    stat: StatFields,
}

/// How the wall time between two [`ThreadTime`] readings divides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct TimeSplit {
    pub wall_ms: u64,
    /// Running on a CPU.
    pub on_cpu_ms: u64,
    /// Runnable, waiting for a CPU.
    pub runnable_ms: u64,
    /// Neither: blocked in the kernel (I/O, faults, locks, sleeps).
    pub asleep_ms: u64,
    /// Of `on_cpu_ms`, in user space and in the kernel (10 ms ticks).
    pub user_ms: u64,
    pub kernel_ms: u64,
    /// Page faults served from memory (first touches, page cache hits).
    pub minor_faults: u64,
    /// Page faults that had to read from the disk.
    pub major_faults: u64,
}

impl ThreadTime {
    /// Reads the calling thread's counters now.
    pub fn now() -> ThreadTime {
        let (on_cpu_ns, runnable_ns) = read_schedstat().unwrap_or((0, 0));
        let stat = read_stat().unwrap_or_default();
        ThreadTime { at: Instant::now(), on_cpu_ns, runnable_ns, stat }
    }

    /// The split of the time since `self`, read on the same thread.
    pub fn split(&self) -> TimeSplit {
        let now = ThreadTime::now();
        let ms = |ns: u64| ns / 1_000_000;
        let wall = now.at.saturating_duration_since(self.at);
        let on_cpu = now.on_cpu_ns.saturating_sub(self.on_cpu_ns);
        let runnable = now.runnable_ns.saturating_sub(self.runnable_ns);
        let wall_ns = u64::try_from(wall.as_nanos()).unwrap_or(u64::MAX);
        TimeSplit {
            wall_ms: ms(wall_ns),
            on_cpu_ms: ms(on_cpu),
            runnable_ms: ms(runnable),
            asleep_ms: ms(wall_ns.saturating_sub(on_cpu).saturating_sub(runnable)),
            user_ms: now.stat.user_ticks.saturating_sub(self.stat.user_ticks) * MS_PER_TICK,
            kernel_ms: now.stat.kernel_ticks.saturating_sub(self.stat.kernel_ticks) * MS_PER_TICK,
            minor_faults: now.stat.minor_faults.saturating_sub(self.stat.minor_faults),
            major_faults: now.stat.major_faults.saturating_sub(self.stat.major_faults),
        }
    }
}

/// Nanoseconds the calling thread has run on a CPU; `None` without procfs.
pub fn on_cpu_ns() -> Option<u64> {
    read_schedstat().map(|(on_cpu, _)| on_cpu)
}

/// `/proc/thread-self/schedstat`: ns on a CPU, ns runnable, timeslices.
fn read_schedstat() -> Option<(u64, u64)> {
    parse_schedstat(&std::fs::read_to_string("/proc/thread-self/schedstat").ok()?)
}

/// Nanoseconds on a CPU and runnable, from a `schedstat` file's text (any
/// thread's: `/proc/<pid>/task/<tid>/schedstat`).
pub fn parse_schedstat(text: &str) -> Option<(u64, u64)> {
    let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
    Some((fields.next()??, fields.next()??))
}

/// procfs reports CPU time in USER_HZ ticks, 100 per second on Linux.
const MS_PER_TICK: u64 = 10;

/// The counters of `/proc/thread-self/stat` this module reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct StatFields {
    minor_faults: u64,
    major_faults: u64,
    user_ticks: u64,
    kernel_ticks: u64,
}

fn read_stat() -> Option<StatFields> {
    parse_stat(&std::fs::read_to_string("/proc/thread-self/stat").ok()?)
}

/// Fields 10 (`minflt`), 12 (`majflt`), 14 (`utime`) and 15 (`stime`).
fn parse_stat(text: &str) -> Option<StatFields> {
    // The command name (field 2) is parenthesised and may hold spaces:
    // count fields from the last ')', which is followed by field 3.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse().ok();
    Some(StatFields {
        minor_faults: field(10)?,
        major_faults: field(12)?,
        user_ticks: field(14)?,
        kernel_ticks: field(15)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_procfs_lines() {
        assert_eq!(parse_schedstat("123456789 2000000 17\n"), Some((123_456_789, 2_000_000)));
        assert_eq!(parse_schedstat("garbage"), None);
        let stat = "4242 (casblk (x) y) S 1 4242 4242 0 -1 4194560 1234 0 56 0 7 3 0 0 20 0 9 0 100";
        let want = StatFields { minor_faults: 1234, major_faults: 56, user_ticks: 7, kernel_ticks: 3 };
        assert_eq!(parse_stat(stat), Some(want));
        assert_eq!(parse_stat("no parenthesis"), None);
    }

    #[test]
    fn busy_time_counts_as_on_cpu() {
        use std::time::Duration;
        let start = ThreadTime::now();
        let mut x = 0u64;
        while start.at.elapsed() < Duration::from_millis(60) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let split = start.split();
        if std::path::Path::new("/proc/thread-self/schedstat").exists() {
            assert!(split.on_cpu_ms + split.runnable_ms >= 50, "{split:?}");
            assert!(split.asleep_ms <= 10, "a busy loop does not sleep: {split:?}");
        }
        assert!(split.wall_ms >= 60);
    }
}
