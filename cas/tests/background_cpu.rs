//! The store's background threads (compactor, each image's log writeback)
//! run in the scheduling class `StoreOptions::background_cpu` names.
//! One test in its own binary: it finds the threads by name in
//! /proc/self/task, which other tests' stores would share.

mod common;

use cas::{BackgroundCpu, StoreOptions};
use common::*;
use std::time::{Duration, Instant};

/// Linux's policy numbers (sched.h) as /proc/<tid>/stat field 41 shows them.
fn policy_number(cpu: BackgroundCpu) -> u32 {
    match cpu {
        BackgroundCpu::Normal => 0,
        BackgroundCpu::Batch => 3,
        BackgroundCpu::Idle => 5,
    }
}

/// (thread name, policy number) of every thread of this process.
fn threads() -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc/self/task").expect("list /proc/self/task") {
        let dir = entry.expect("a task entry").path();
        let (Ok(comm), Ok(stat)) =
            (std::fs::read_to_string(dir.join("comm")), std::fs::read_to_string(dir.join("stat")))
        else {
            continue; // the thread ended meanwhile
        };
        // Fields after the parenthesised name start at field 3.
        let rest = &stat[stat.rfind(')').expect("a stat line") + 2..];
        let policy = rest.split_whitespace().nth(41 - 3).expect("a policy field").parse().expect("a number");
        out.push((comm.trim().to_string(), policy));
    }
    out
}

/// Waits until threads named `cas-compactor` and `wal-wb-<image>` exist
/// and all run under `cpu`; panics with what it saw otherwise.
fn expect_policy(cpu: BackgroundCpu, image: &str) {
    let want = policy_number(cpu);
    let wb = format!("wal-wb-{image}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen: Vec<_> =
            threads().into_iter().filter(|(name, _)| name == "cas-compactor" || *name == wb).collect();
        let named = |n: &str| seen.iter().any(|(name, _)| name == n);
        if named("cas-compactor") && named(&wb) && seen.iter().all(|&(_, p)| p == want) {
            return;
        }
        assert!(Instant::now() < deadline, "background threads {seen:?}: want policy {want} ({cpu:?})");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn background_threads_run_in_the_configured_class() {
    // The default keeps them from preempting the request path.
    assert_eq!(StoreOptions::default().background_cpu, BackgroundCpu::Batch);
    for (cpu, image) in
        [(BackgroundCpu::Batch, "b"), (BackgroundCpu::Idle, "i"), (BackgroundCpu::Normal, "n")]
    {
        let opts = StoreOptions { background_compaction: true, background_cpu: cpu, ..small_opts() };
        let (_mem, store) = mem_store(opts);
        store.create_image(image, 1 << 20).unwrap();
        let img = store.open_image(image).unwrap();
        expect_policy(cpu, image);
        // The request path itself is left alone.
        assert_eq!(cas::background::current_thread_policy(), Some(BackgroundCpu::Normal));
        drop(img);
        drop(store);
        // Dropping the store joins its threads: the next round sees only its
        // own. A joined thread may still be listed in /proc for a moment (the
        // join returns when it clears its tid, before the kernel reaps it),
        // so the listing gets a bounded while to catch up.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let left = loop {
            let left: Vec<_> = threads().into_iter().filter(|(n, _)| n == "cas-compactor").collect();
            if left.is_empty() || std::time::Instant::now() > deadline {
                break left;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert!(left.is_empty(), "compactor threads left 5 s after the store dropped: {left:?}");
    }
}
