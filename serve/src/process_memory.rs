//! How a daemon process holds its memory, set once when it starts (the
//! casblk daemons, and the benchmarks that measure their structures).
//!
//! A daemon's large buffers are touched sparsely: each tag's io buffer
//! (depth x `--io-buf-bytes`, 64 MiB per device at the defaults) is
//! touched only as far as its requests reach, and the allocator's
//! per-thread arenas keep freed memory mapped. Where transparent huge
//! pages are `always` (Debian's default kernel), every first touch in a
//! 2 MiB-aligned range makes the whole 2 MiB resident: measured in the VM
//! (ci/bench device, cas arm), 190 of a daemon's 235 MiB of anonymous
//! memory were huge pages, 59 of each device's 66 MiB of tag buffers
//! resident. The daemon opts out of THP for itself
//! (`PR_SET_THP_DISABLE`, which the kernel keeps across fork and exec), so
//! resident memory follows what requests touch; and it fixes glibc's
//! thresholds so large transient buffers are unmapped when freed instead
//! of staying in an arena (the arenas held about 180 MiB at the end of
//! the same run with THP off). Its hot structures are
//! small (the chunk cache is 16 MiB by default), so the TLB reach lost is
//! minor; storage daemons commonly run with THP off for this reason.
//!
//! Reclaim must never wait on the daemon's own devices. A daemon thread
//! that allocates under memory pressure enters direct reclaim, which may
//! write back dirty pages of a filesystem mounted on one of its own
//! `/dev/ublkbN`: that writeback waits for the daemon, which waits for
//! memory, a deadlock. The daemon therefore runs as an IO flusher
//! (`PR_SET_IO_FLUSHER`: reclaim by its threads does no IO, and they are
//! throttled only by their own writes, not by others' dirty pages). The
//! flags are per thread and every thread inherits them from the one that
//! creates it, so setting them here, before the daemon starts its first
//! thread, covers every thread it will ever have: the queue threads,
//! workers, sync threads, log writeback, compaction and its pipeline, GC,
//! the index merge, the bucket tier's uploaders, publisher and lease
//! renewal, the object store client's runtime, and the kernel's io_uring
//! workers created for them. No thread needs to be without them.
//! `ci/e2e/t-cas-io-flusher.sh` reads every daemon thread's flags.

/// Allocations at least this large get their own mapping, returned to the
/// kernel when freed. Set explicitly, it stops glibc from raising the
/// threshold (up to 32 MiB) after the first large free, past which big
/// transient buffers land in the arenas and stay resident.
const MMAP_THRESHOLD_BYTES: i32 = 256 << 10;

/// Free memory at the top of an arena beyond this is returned at once.
const TRIM_THRESHOLD_BYTES: i32 = 1 << 20;

/// At most this many malloc arenas (glibc's default is 8 per CPU), each
/// holding on to its own free memory.
const ARENAS_MAX: i32 = 4;

/// `prctl(PR_SET_IO_FLUSHER)` (Linux 5.6+).
const PR_SET_IO_FLUSHER: libc::c_int = 57;
const PR_GET_IO_FLUSHER: libc::c_int = 58;

/// Set to 1, the daemon does not make itself an IO flusher: only for
/// showing what `t-cas-memory-pressure` guards against.
const NO_IO_FLUSHER_ENV: &str = "CASBLK_TEST_NO_IO_FLUSHER";

/// Makes the calling thread, and every thread it creates from now on, an
/// IO flusher. Needs CAP_SYS_RESOURCE (the daemon runs as root); without
/// it the daemon still runs, and says so once.
pub fn io_flusher() {
    if std::env::var(NO_IO_FLUSHER_ENV).as_deref() == Ok("1") {
        tracing::warn!("{NO_IO_FLUSHER_ENV}=1: not an IO flusher (a test of what the flag prevents)");
        return;
    }
    // SAFETY: PR_SET_IO_FLUSHER takes only integer arguments.
    let rc = unsafe { libc::prctl(PR_SET_IO_FLUSHER, 1, 0, 0, 0) };
    if rc != 0 {
        tracing::warn!(
            error = %std::io::Error::last_os_error(),
            "cannot run as an IO flusher (needs CAP_SYS_RESOURCE): memory reclaim may wait on this daemon's own devices"
        );
    }
}

/// Whether the calling thread is an IO flusher.
pub fn is_io_flusher() -> bool {
    // SAFETY: PR_GET_IO_FLUSHER takes only integer arguments.
    unsafe { libc::prctl(PR_GET_IO_FLUSHER, 0, 0, 0, 0) == 1 }
}

/// Applies the daemon's memory settings to this process, before it starts
/// threads. A setting the system lacks (a kernel without THP, a libc other
/// than glibc) is skipped and logged at debug level.
pub fn daemon_mode() {
    io_flusher();
    // SAFETY: PR_SET_THP_DISABLE takes only integer arguments and touches
    // no memory of this process.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "cannot opt out of transparent huge pages");
    }
    #[cfg(target_env = "gnu")]
    for (param, value, name) in [
        (libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES, "M_MMAP_THRESHOLD"),
        (libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES, "M_TRIM_THRESHOLD"),
        (libc::M_ARENA_MAX, ARENAS_MAX, "M_ARENA_MAX"),
    ] {
        // SAFETY: mallopt takes two integers; called before the daemon's
        // threads exist, so no allocation races the change.
        if unsafe { libc::mallopt(param, value) } != 1 {
            tracing::debug!(name, value, "mallopt refused");
        }
    }
}

/// This process's resident memory and threads (`/proc/self/status`), as
/// the daemon's stats and metrics report them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub resident_bytes: u64,
    pub threads: u64,
}

/// Reads [`Usage`] from `/proc/self/status`.
pub fn usage() -> std::io::Result<Usage> {
    parse_status(&std::fs::read_to_string("/proc/self/status")?).ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "/proc/self/status has no VmRSS or Threads line")
    })
}

/// `VmRSS:` (in kB) and `Threads:` of a `/proc/PID/status` text.
fn parse_status(status: &str) -> Option<Usage> {
    let field = |name: &str| {
        status.lines().find_map(|l| l.strip_prefix(name)).and_then(|rest| rest.split_whitespace().next())
    };
    let resident_kib: u64 = field("VmRSS:")?.parse().ok()?;
    let threads: u64 = field("Threads:")?.parse().ok()?;
    Some(Usage { resident_bytes: resident_kib * 1024, threads })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_thread_started_after_is_an_io_flusher() {
        // A thread of its own: the test harness's other threads keep theirs.
        std::thread::spawn(|| {
            super::daemon_mode();
            if !super::is_io_flusher() {
                // Only a process without CAP_SYS_RESOURCE may fail (some
                // sandboxes drop it even for root); t-cas-io-flusher checks
                // the daemon's threads on a real device.
                assert!(
                    !has_sys_resource(),
                    "with CAP_SYS_RESOURCE the thread could not become an IO flusher"
                );
                eprintln!("skipped: no CAP_SYS_RESOURCE here, so no IO_FLUSHER to check");
                return;
            }
            let child = std::thread::spawn(super::is_io_flusher).join().unwrap();
            assert!(child, "a thread started after daemon_mode inherits IO_FLUSHER");
        })
        .join()
        .unwrap();
    }

    /// Whether this process has CAP_SYS_RESOURCE (bit 24 of CapEff).
    fn has_sys_resource() -> bool {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                let hex =
                    s.lines().find(|l| l.starts_with("CapEff:"))?.split_whitespace().nth(1)?.to_string();
                u64::from_str_radix(&hex, 16).ok()
            })
            .is_some_and(|caps| caps & (1 << 24) != 0)
    }

    #[test]
    fn the_process_opts_out_of_huge_pages() {
        super::daemon_mode();
        // SAFETY: PR_GET_THP_DISABLE takes only integer arguments.
        let flag = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(flag, 1, "THP disabled for this process");
    }
}
