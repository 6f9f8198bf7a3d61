//! Cost of tracing one request: `RequestTrace` marks + `Tracer::finish`.
//!
//! Prints JSON (also written to `target/bench/trace.json`):
//! `{"requests", "baseline_ns_per_req", "single_thread_ns_per_req",
//!   "clock_baseline_ns_per_req", "single_thread_clock_ns_per_req",
//!   "two_threads_ns_per_req", "two_threads_independent_ns_per_req",
//!   "snapshot_us"}`.
//!
//! * `single_thread_ns_per_req`: one thread records requests with synthetic
//!   timestamps (the recording cost alone); `baseline_ns_per_req` is the
//!   same loop making the same timestamps without recording.
//! * `single_thread_clock_ns_per_req`: the same with the six timestamps read
//!   from `trace::now_ns()` as the daemon does; `clock_baseline_ns_per_req`
//!   is just those six clock reads.
//! * `two_threads_ns_per_req`: two threads recording into the same image's
//!   tracer at once; wall time per request of the slower thread.
//!   `two_threads_independent_ns_per_req` is its same-run control: two
//!   threads each recording into its own tracer (nothing shared), so the
//!   difference between the two is the cost of sharing an image's tracer,
//!   and the difference from `single_thread_ns_per_req` is the machine
//!   (cores, caches, other load).
//! * `snapshot_us`: one `Tracer::snapshot()` after `requests` reads/writes.
//!
//! Each figure is the best of 3 runs. `BENCH_TRACE_REQUESTS` sets the
//! requests per run (default 1,000,000).

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use trace::{now_ns, Gate, IoSource, Op, RequestTrace, Tracer};

/// A cheap deterministic step generator (LCG) spreading latencies over
/// many histogram buckets.
struct Steps(u64);

impl Steps {
    #[inline]
    fn next(&mut self, max: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % max
    }
}

/// One typical request: a read, 1 in 8 waiting on a gate, one I/O span.
#[inline]
fn record_one(tracer: &Tracer, steps: &mut Steps, i: u64, clock: &mut u64) {
    let mut t = RequestTrace::new(if i.is_multiple_of(4) { Op::Write } else { Op::Read }, *clock);
    t.set_location(0, (i % 128) as u16, i * 4096, 4096);
    if i.is_multiple_of(8) {
        t.wait_begin(Gate::LogCapacity, *clock);
    }
    *clock += steps.next(50_000);
    t.admitted(*clock);
    *clock += steps.next(5_000);
    t.dispatched(*clock);
    let begin = *clock + steps.next(2_000);
    *clock = begin + steps.next(200_000);
    t.io_span(IoSource::Chunk, begin, *clock);
    *clock += steps.next(2_000);
    t.executed(*clock);
    *clock += steps.next(2_000);
    tracer.finish(&t, *clock, 0);
}

/// The same step pattern without recording.
#[inline]
fn baseline_one(steps: &mut Steps, clock: &mut u64) {
    *clock += steps.next(50_000);
    *clock += steps.next(5_000);
    let begin = *clock + steps.next(2_000);
    *clock = begin + steps.next(200_000);
    *clock += steps.next(2_000);
    *clock += steps.next(2_000);
    black_box(*clock);
}

/// One request timed with the real clock, as the daemon does.
#[inline]
fn record_one_clocked(tracer: &Tracer, i: u64) {
    let mut t = RequestTrace::new(if i.is_multiple_of(4) { Op::Write } else { Op::Read }, now_ns());
    t.set_location(0, (i % 128) as u16, i * 4096, 4096);
    if i.is_multiple_of(8) {
        t.wait_begin(Gate::LogCapacity, t.seen_ns());
    }
    t.admitted(now_ns());
    t.dispatched(now_ns());
    let begin = now_ns();
    t.io_span(IoSource::Chunk, begin, now_ns());
    t.executed(now_ns());
    tracer.finish(&t, now_ns(), 0);
}

/// Two threads recording `n` requests each, into one shared tracer or
/// (the control) one tracer each; the slower thread's ns per request.
fn two_threads_run(n: u64, shared: bool) -> f64 {
    let shared_tracer = Arc::new(Tracer::new("bench"));
    let barrier = Arc::new(Barrier::new(2));
    let threads: Vec<_> = (0..2u64)
        .map(|k| {
            let tracer = if shared { Arc::clone(&shared_tracer) } else { Arc::new(Tracer::new("bench")) };
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let (mut steps, mut clock) = (Steps(k + 1), 0);
                barrier.wait();
                let started = Instant::now();
                for i in 0..n {
                    record_one(&tracer, &mut steps, i, &mut clock);
                }
                per_req(started, n)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().expect("bench thread")).fold(0.0, f64::max)
}

fn best_of_3(mut run: impl FnMut() -> f64) -> f64 {
    (0..3).map(|_| run()).fold(f64::INFINITY, f64::min)
}

fn per_req(started: Instant, n: u64) -> f64 {
    started.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let n: u64 = std::env::var("BENCH_TRACE_REQUESTS").ok().and_then(|s| s.parse().ok()).unwrap_or(1_000_000);

    let baseline = best_of_3(|| {
        let (mut steps, mut clock) = (Steps(1), 0);
        let started = Instant::now();
        for _ in 0..n {
            baseline_one(&mut steps, &mut clock);
        }
        per_req(started, n)
    });

    let single = best_of_3(|| {
        let tracer = Tracer::new("bench");
        let (mut steps, mut clock) = (Steps(1), 0);
        let started = Instant::now();
        for i in 0..n {
            record_one(&tracer, &mut steps, i, &mut clock);
        }
        per_req(started, n)
    });

    let clock_baseline = best_of_3(|| {
        let started = Instant::now();
        for _ in 0..n {
            for _ in 0..6 {
                black_box(now_ns());
            }
        }
        per_req(started, n)
    });

    let single_clock = best_of_3(|| {
        let tracer = Tracer::new("bench");
        let started = Instant::now();
        for i in 0..n {
            record_one_clocked(&tracer, i);
        }
        per_req(started, n)
    });

    let two_threads = best_of_3(|| two_threads_run(n, true));
    let two_threads_independent = best_of_3(|| two_threads_run(n, false));

    let tracer = Tracer::new("bench");
    let (mut steps, mut clock) = (Steps(1), 0);
    for i in 0..n {
        record_one(&tracer, &mut steps, i, &mut clock);
    }
    let snapshot_us = best_of_3(|| {
        let started = Instant::now();
        black_box(tracer.snapshot());
        started.elapsed().as_nanos() as f64 / 1_000.0
    });

    let round = |v: f64| (v * 10.0).round() / 10.0;
    let report = serde_json::json!({
        "requests": n,
        "baseline_ns_per_req": round(baseline),
        "single_thread_ns_per_req": round(single),
        "clock_baseline_ns_per_req": round(clock_baseline),
        "single_thread_clock_ns_per_req": round(single_clock),
        "two_threads_ns_per_req": round(two_threads),
        "two_threads_independent_ns_per_req": round(two_threads_independent),
        "snapshot_us": round(snapshot_us),
    });
    let text = serde_json::to_string_pretty(&report).expect("report serializes");
    println!("{text}");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(dir.join("trace.json"), &text))
    {
        eprintln!("bench_trace: cannot write {}: {e}", dir.display());
    }
}
