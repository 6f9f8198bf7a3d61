//! `cas::heap`: free memory inside the arenas goes back to the kernel. Its
//! own test binary: it measures the process's resident memory, which other
//! tests running beside it would move.

use cas::heap::Trimmer;
use std::time::{Duration, Instant};

fn resident_anon_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon in /proc/self/status");
    kib << 10
}

#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn freed_fragments_go_back_to_the_kernel_at_most_once_per_interval() {
    let trimmer = Trimmer::new(Duration::from_secs(60));
    // 64 MiB in 4 KiB allocations (below the mmap threshold, so inside an
    // arena), then all but every 8th freed: 56 MiB free in runs of 28 KiB
    // between kept blocks, not at the top of the heap, so only malloc_trim
    // can return them.
    let all: Vec<Vec<u8>> = (0..16384).map(|i| vec![(i as u8) | 1; 4096]).collect();
    let kept: Vec<Vec<u8>> = all.into_iter().step_by(8).collect();
    let before = resident_anon_bytes();
    let now = Instant::now();
    assert!(trimmer.release_free(now), "the first trim runs");
    let after = resident_anon_bytes();
    assert!(
        after + (32 << 20) < before,
        "at least 32 of the 56 freed MiB went back: {} -> {} MiB",
        before >> 20,
        after >> 20
    );
    assert!(!trimmer.release_free(now + Duration::from_secs(59)), "a trim within the interval is skipped");
    assert!(trimmer.release_free(now + Duration::from_secs(60)), "one after it runs");
    assert!(kept.iter().enumerate().all(|(i, v)| v[0] == ((8 * i) as u8) | 1), "kept blocks intact");
}
