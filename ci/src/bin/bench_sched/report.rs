//! What the benchmark prints about one arm beyond its JSON figures: where
//! reads were served from, what the writers and the compactor did, the
//! scheduler's counters and the tracer's view (phases, gates, the slowest
//! read), so that a missed target can be explained from the output alone.

use serde_json::{json, Value};

use casblk_ci::engine::EngineDelta;
use casblk_ci::frontend::ArmResult;
use sched::Op;

const MIB: u64 = 1 << 20;

pub fn us(ns: u64) -> f64 {
    (ns as f64 / 100.0).round() / 10.0
}

/// The read figures of an arm, as the JSON contract names them.
pub fn read_figures(arm: &ArmResult) -> Value {
    let r = arm.stream(Op::Read);
    json!({
        "read_p50_us": us(r.latency_ns.value_at_quantile(0.50)),
        "read_p99_us": us(r.latency_ns.value_at_quantile(0.99)),
        "read_max_us": us(r.latency_ns.max()),
        "reads_per_s": (r.requests as f64 / arm.secs).round(),
    })
}

pub fn write_mib_s(arm: &ArmResult) -> f64 {
    let w = arm.stream(Op::Write);
    let mib_s = (w.requests * w.stream.block_bytes) as f64 / MIB as f64 / arm.secs;
    (mib_s * 10.0).round() / 10.0
}

pub fn errors(arm: &ArmResult) -> u64 {
    arm.streams.iter().map(|s| s.errors).sum()
}

/// Prints what the engine, the scheduler and the tracer saw in an arm.
pub fn describe(name: &str, arm: &ArmResult, d: &EngineDelta, cpu_secs: f64) {
    println!(
        "  {name}: this process used {:.2} cores ({:.2} in queue threads and workers)",
        cpu_secs / arm.secs,
        arm.request_path_cpu_ns as f64 / 1e9 / arm.secs
    );
    if d.read_bytes > 0 {
        let pct = |b: u64| 100.0 * b as f64 / d.read_bytes as f64;
        let lookups = (d.cache_hits + d.cache_misses).max(1);
        println!(
            "  {name}: reads hit chunks {:.1}% (chunk cache {:.1}% of {} chunk reads, the rest pack files), \
             log {:.1}%, holes {:.1}%",
            pct(d.read_chunk_bytes),
            100.0 * d.cache_hits as f64 / lookups as f64,
            d.cache_hits + d.cache_misses,
            pct(d.read_log_bytes),
            pct(d.read_hole_bytes)
        );
    }
    if d.payload_bytes_written > 0 {
        println!(
            "  {name}: wrote {} MiB, compacted {} MiB, {} log segments reclaimed, {} forced log syncs",
            d.payload_bytes_written / MIB,
            d.compacted_bytes / MIB,
            d.segments_reclaimed,
            d.forced_log_syncs
        );
    }
    for (image, c) in &arm.sched {
        println!(
            "  {name}: sched image {image}: admitted {}, refused turns (log full) {}, reads past a blocked \
             head {}, independent-read wait max {:.2} ms, ordinary-head wait max {:.2} ms",
            c.admitted_requests,
            c.refused_turns,
            c.reads_passed_blocked_head,
            c.independent_read_wait_ns_max as f64 / 1e6,
            c.ordinary_head_wait_ns_max as f64 / 1e6
        );
    }
    for (image, t) in &arm.traces {
        for (op, s) in [("read", &t.ops.read), ("write", &t.ops.write)] {
            if s.count == 0 {
                continue;
            }
            // Execution: the engine's I/O spans by source, and the rest.
            let p = &s.phases;
            let exec: Vec<String> = [
                ("io_cache", &p.io_cache),
                ("io_log", &p.io_log),
                ("io_manifest", &p.io_manifest),
                ("io_chunk", &p.io_chunk),
                ("execute", &p.execute),
            ]
            .iter()
            .filter(|(_, l)| l.count > 0)
            .map(|(phase, l)| format!("{phase} {:.1} (max {:.1})", l.latency_us_p99, l.latency_us_max))
            .collect();
            let gates: Vec<String> = s
                .gates
                .iter()
                .filter(|(_, g)| g.requests > 0)
                .map(|(gate, g)| format!("{gate} {} max {:.2} ms", g.requests, g.wait_ms_max))
                .collect();
            println!(
                "  {name}: trace image {image} {op}: {} traced, p99 {:.1} us (phase p99s: admission {:.1}, \
                 {}, complete {:.1} us), waited on: {}",
                s.count,
                s.latency.latency_us_p99,
                p.admission.latency_us_p99,
                exec.join(", "),
                p.complete.latency_us_p99,
                if gates.is_empty() { "nothing".to_string() } else { gates.join(", ") }
            );
        }
        if let Some(slow) = t.slowest_reads.first() {
            let p = &slow.phases;
            let ms = |ns: u64| ns as f64 / 1e6;
            println!(
                "  {name}: slowest read of image {image}: {:.2} ms = admission {:.2} + dispatch {:.2} + \
                 execute {:.2} + complete {:.2}",
                ms(slow.total_ns),
                ms(p.admission_ns),
                ms(p.dispatch_ns),
                ms(p.execute_ns + p.io_cache_ns + p.io_log_ns + p.io_manifest_ns + p.io_chunk_ns),
                ms(p.complete_ns)
            );
        }
    }
    for s in &arm.streams {
        if s.stream.op == Op::Read {
            let w = &s.admission_wait_ns;
            println!(
                "  {name}: read admission wait p50 {} us, p99 {} us, max {} us",
                us(w.value_at_quantile(0.5)),
                us(w.value_at_quantile(0.99)),
                us(w.max())
            );
        }
    }
}
