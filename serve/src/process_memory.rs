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

/// Applies the daemon's memory settings to this process, before it starts
/// threads. A setting the system lacks (a kernel without THP, a libc other
/// than glibc) is skipped and logged at debug level.
pub fn daemon_mode() {
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_process_opts_out_of_huge_pages() {
        super::daemon_mode();
        // SAFETY: PR_GET_THP_DISABLE takes only integer arguments.
        let flag = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(flag, 1, "THP disabled for this process");
    }
}
