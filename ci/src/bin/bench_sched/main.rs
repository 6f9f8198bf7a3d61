//! `ci/bench sched`: the scheduler under a mixed load, against its same-run
//! baselines. Writes `target/bench/sched.json`:
//!
//! ```text
//! { "read_only":  { read_p50_us, read_p99_us, read_max_us, reads_per_s },
//!   "write_only": { write_mib_s },
//!   "mixed":      { read_p50_us, read_p99_us, read_max_us, reads_per_s,
//!                   write_mib_s, read_admission_wait_ms_max, errors } }
//! ```
//!
//! Arms, each `SCHED_BENCH_SECS` (default 10) on a fresh engine:
//! read-only (image A: 4 KiB random reads, QD8), write-only (image B: 1 MiB
//! writes, QD32, into a log small enough to fill), and mixed (both at once).
//! Targets: mixed read p99 <= 1.5 x read-only p99; read admission wait
//! <= 50 ms; mixed write MiB/s >= 0.9 x write-only; zero errors.
//!
//! The engine is [`engine::FakeEngine`] (in memory, log drained at a fixed
//! rate) until the cas engine implements [`engine::Engine`].

mod engine;
mod load;

use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::{Engine, FakeEngine};
use load::{block_pattern, run_arm, ArmResult, Stream};
use sched::{Config, ImageId, Op};
use serde_json::json;

const MIB: u64 = 1 << 20;
const IMAGE_A: ImageId = ImageId(1);
const IMAGE_B: ImageId = ImageId(2);
const A_SPAN_BYTES: u64 = 64 * MIB;
const B_SPAN_BYTES: u64 = 128 * MIB;
/// Fake engine: log quota per image and its drain (compaction) rate.
const LOG_QUOTA_BYTES: u64 = 16 * MIB;
const DRAIN_BYTES_PER_S: u64 = 256 * MIB;
/// Worker pool; `write_slots` leaves the rest for reads.
const WORKERS: usize = 4;
const WRITE_SLOTS: u32 = 2;

const READS: Stream =
    Stream { image: IMAGE_A, op: Op::Read, block_bytes: 4096, queue_depth: 8, span_bytes: A_SPAN_BYTES };
const WRITES: Stream =
    Stream { image: IMAGE_B, op: Op::Write, block_bytes: MIB, queue_depth: 32, span_bytes: B_SPAN_BYTES };

/// A fresh engine with image A seeded with its block pattern (through the
/// engine's own write path, so a real engine gets real data).
fn fresh_engine() -> Arc<FakeEngine> {
    let engine = FakeEngine::start(LOG_QUOTA_BYTES, DRAIN_BYTES_PER_S);
    engine.add_image(IMAGE_A, A_SPAN_BYTES);
    engine.add_image(IMAGE_B, B_SPAN_BYTES);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut chunk = vec![0u8; MIB as usize];
    for offset in (0..A_SPAN_BYTES).step_by(MIB as usize) {
        for (i, block) in chunk.chunks_mut(4096).enumerate() {
            block[..8].copy_from_slice(&block_pattern(offset + i as u64 * 4096));
        }
        let reservation = loop {
            if let Some(r) = engine.try_reserve(IMAGE_A, Op::Write, MIB) {
                break r;
            }
            assert!(Instant::now() < deadline, "seeding image A: the log never drained");
            std::thread::sleep(Duration::from_millis(1));
        };
        engine.write_reserved(IMAGE_A, offset, &chunk, reservation).expect("seed image A");
    }
    engine
}

fn run(streams: &[Stream], secs: f64) -> ArmResult {
    let engine = fresh_engine();
    let config = Config { write_slots: WRITE_SLOTS, ..Config::default() };
    let result = run_arm(engine.clone(), config, streams, secs, WORKERS);
    engine.stop();
    result
}

fn us(ns: u64) -> f64 {
    (ns as f64 / 100.0).round() / 10.0
}

fn read_figures(arm: &ArmResult) -> serde_json::Value {
    let r = arm.streams.iter().find(|s| s.stream.op == Op::Read).expect("arm has a read stream");
    json!({
        "read_p50_us": us(r.latency_ns.value_at_quantile(0.50)),
        "read_p99_us": us(r.latency_ns.value_at_quantile(0.99)),
        "read_max_us": us(r.latency_ns.max()),
        "reads_per_s": (r.requests as f64 / arm.secs).round(),
    })
}

fn write_mib_s(arm: &ArmResult) -> f64 {
    let w = arm.streams.iter().find(|s| s.stream.op == Op::Write).expect("arm has a write stream");
    let mib_s = (w.requests * w.stream.block_bytes) as f64 / MIB as f64 / arm.secs;
    (mib_s * 10.0).round() / 10.0
}

fn errors(arm: &ArmResult) -> u64 {
    arm.streams.iter().map(|s| s.errors).sum()
}

fn main() {
    let secs: f64 = std::env::var("SCHED_BENCH_SECS").map_or(10.0, |s| s.parse().expect("SCHED_BENCH_SECS"));
    println!(
        "bench_sched: fake engine (log {} MiB/image, drains {} MiB/s), {WORKERS} workers, \
         {WRITE_SLOTS} write slots, {secs} s per arm",
        LOG_QUOTA_BYTES / MIB,
        DRAIN_BYTES_PER_S / MIB
    );
    let read_only = run(&[READS], secs);
    let write_only = run(&[WRITES], secs);
    let mixed = run(&[READS, WRITES], secs);

    let mut mixed_json = read_figures(&mixed);
    let reads = mixed.streams.iter().find(|s| s.stream.op == Op::Read).expect("mixed reads");
    mixed_json["write_mib_s"] = json!(write_mib_s(&mixed));
    mixed_json["read_admission_wait_ms_max"] =
        json!((reads.admission_wait_ns.max() as f64 / 1e4).round() / 100.0);
    mixed_json["errors"] = json!(errors(&mixed));
    let out = json!({
        "read_only": read_figures(&read_only),
        "write_only": { "write_mib_s": write_mib_s(&write_only) },
        "mixed": mixed_json,
    });
    let baseline_errors = errors(&read_only) + errors(&write_only);

    let ro = &out["read_only"];
    let mx = &out["mixed"];
    let f = |v: &serde_json::Value| v.as_f64().expect("a number");
    println!(
        "{:<11} {:>10} {:>10} {:>10} {:>11} {:>11}",
        "arm", "p50 us", "p99 us", "max us", "reads/s", "write MiB/s"
    );
    for (name, arm) in [("read_only", ro), ("mixed", mx)] {
        println!(
            "{name:<11} {:>10} {:>10} {:>10} {:>11} {:>11}",
            f(&arm["read_p50_us"]),
            f(&arm["read_p99_us"]),
            f(&arm["read_max_us"]),
            f(&arm["reads_per_s"]),
            arm.get("write_mib_s").map_or("-".to_string(), |v| f(v).to_string())
        );
    }
    println!("{:<11} {:>58}", "write_only", f(&out["write_only"]["write_mib_s"]));
    let checks = [
        ("mixed.read_p99_us <= 1.5 x read_only", f(&mx["read_p99_us"]) <= 1.5 * f(&ro["read_p99_us"])),
        ("mixed.read_admission_wait_ms_max <= 50", f(&mx["read_admission_wait_ms_max"]) <= 50.0),
        (
            "mixed.write_mib_s >= 0.9 x write_only",
            f(&mx["write_mib_s"]) >= 0.9 * f(&out["write_only"]["write_mib_s"]),
        ),
        ("errors == 0", errors(&mixed) == 0 && baseline_errors == 0),
    ];
    for (name, arm) in [("read_only", &read_only), ("mixed", &mixed)] {
        let r = arm.streams.iter().find(|s| s.stream.op == Op::Read).expect("read stream");
        let w = &r.admission_wait_ns;
        println!(
            "{name}: read admission wait p50 {} us, p99 {} us, max {} us",
            us(w.value_at_quantile(0.5)),
            us(w.value_at_quantile(0.99)),
            us(w.max())
        );
    }
    for (what, ok) in checks {
        println!("target {what}: {}", if ok { "met" } else { "MISSED" });
    }
    let path = casblk_ci::write_results("sched", &out);
    println!("wrote {}", path.display());
}
