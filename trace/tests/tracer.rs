//! Recording requests into a `Tracer`: phases, gates, histograms, the
//! slowest reads, and concurrent recorders.

mod common;

use std::sync::Arc;

use rand::Rng;
use trace::{Gate, IoSource, Op, RequestTrace, Tracer, TracerConfig, SLOWEST_READS};

#[test]
fn every_retained_example_adds_up_to_its_total() {
    let seed = common::seed(1);
    let mut rng = common::rng(seed);
    let tracer = Tracer::new("vm1");
    let mut clock = 0;
    for _ in 0..5_000 * common::scale() {
        let op = if rng.gen_bool(0.7) { Op::Read } else { Op::Write };
        let (t, done) = common::random_request(&mut rng, op, clock);
        tracer.finish(&t, done, 0);
        clock = done;
    }
    let snap = tracer.snapshot();
    assert_eq!(snap.slowest_reads.len(), SLOWEST_READS, "seed {seed}");
    let mut with_gates = 0;
    let mut with_io = 0;
    for slow in &snap.slowest_reads {
        assert_eq!(slow.phases.sum_ns(), slow.total_ns, "seed {seed}: {slow:?}");
        let gate_ns: u64 = slow.gates.iter().map(|g| g.wait_ns).sum();
        assert!(gate_ns <= slow.total_ns, "seed {seed}: gate waits exceed the total: {slow:?}");
        for io in &slow.io {
            assert!(io.start_ns + io.duration_ns <= slow.total_ns, "seed {seed}: {slow:?}");
        }
        with_gates += usize::from(!slow.gates.is_empty());
        with_io += usize::from(!slow.io.is_empty());
    }
    // The generator makes the slowest reads the ones that waited.
    assert!(with_gates > SLOWEST_READS / 2, "seed {seed}: only {with_gates} examples had gate waits");
    assert!(with_io > 0, "seed {seed}");
    // Also through JSON: integer ns survive exactly.
    let json = serde_json::to_value(&snap).unwrap();
    for slow in json["slowest_reads"].as_array().unwrap() {
        let sum: u64 = slow["phases"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
        assert_eq!(sum, slow["total_ns"].as_u64().unwrap());
    }
}

/// A writer blocked on log capacity, and a later read of other blocks that
/// the scheduler admitted past it (bypass): the writer's record shows the
/// `log_capacity` gate with its wait, the read's shows no gate at all.
#[test]
fn blocked_writer_shows_log_capacity_and_the_bypassing_read_shows_none() {
    let tracer = Tracer::new("vm1");
    let ms = 1_000_000u64;

    let mut write = RequestTrace::new(Op::Write, 0);
    write.set_location(0, 1, 0, 1 << 20);
    write.wait_begin(Gate::LogCapacity, 0); // refused: log full
    let mut read = RequestTrace::new(Op::Read, ms);
    read.set_location(0, 2, 512 << 20, 4096);
    // The scheduler retries the write on later turns: still no capacity.
    write.wait_begin(Gate::LogCapacity, 2 * ms);
    // The read does not overlap: admitted past the blocked write.
    read.admitted(2 * ms);
    read.dispatched(2 * ms + 10_000);
    read.io_span(IoSource::Cache, 2 * ms + 20_000, 2 * ms + 30_000);
    read.executed(2 * ms + 40_000);
    tracer.finish(&read, 2 * ms + 50_000, 0);
    // Reclaim frees space after 40 ms; the write is admitted.
    write.admitted(40 * ms);
    write.dispatched(40 * ms + 5_000);
    write.io_span(IoSource::Log, 40 * ms + 10_000, 41 * ms);
    write.executed(41 * ms + 1_000);
    tracer.finish(&write, 41 * ms + 2_000, 0);

    let snap = tracer.snapshot();
    let w = &snap.ops.write;
    assert_eq!(w.count, 1);
    assert_eq!(w.gates["log_capacity"].requests, 1);
    assert_eq!(w.gates["log_capacity"].waits, 1);
    assert_eq!(w.gates["log_capacity"].wait_ms_total, 40.0);
    assert_eq!(w.gates["log_capacity"].wait_ms_max, 40.0);
    for gate in Gate::ALL.iter().filter(|&&g| g != Gate::LogCapacity) {
        assert_eq!(w.gates[gate.name()].requests, 0, "{}", gate.name());
    }
    let r = &snap.ops.read;
    assert_eq!(r.count, 1);
    for gate in Gate::ALL {
        assert_eq!(r.gates[gate.name()].requests, 0, "read waited on {}", gate.name());
    }
    assert_eq!(r.latency.latency_us_max, 1_050.0);
    assert_eq!(r.phases.admission.latency_us_max, 1_000.0);

    let slow = &snap.slowest_reads;
    assert_eq!(slow.len(), 1, "only the read is a retained read example");
    assert!(slow[0].gates.is_empty(), "{:?}", slow[0]);
    assert_eq!(slow[0].phases.io_cache_ns, 10_000);
    assert_eq!(slow[0].phases.sum_ns(), slow[0].total_ns);
    let json = serde_json::to_value(&snap).unwrap();
    assert_eq!(json["ops"]["write"]["gates"]["log_capacity"]["wait_ms_total"], 40.0);
    assert_eq!(json["slowest_reads"][0]["gates"], serde_json::json!([]));
}

#[test]
fn a_gate_still_open_at_completion_counts_until_completion() {
    let tracer = Tracer::new("vm1");
    let mut t = RequestTrace::new(Op::Read, 0);
    t.wait_begin(Gate::FlushBarrier, 100);
    tracer.finish(&t, 1_100, -5); // e.g. failed while waiting
    let snap = tracer.snapshot();
    let g = snap.ops.read.gates["flush_barrier"];
    assert_eq!((g.requests, g.waits), (1, 1));
    assert_eq!(g.wait_ms_total, 0.001);
    assert_eq!(snap.ops.read.errors, 1);
    assert_eq!(snap.slowest_reads[0].result, -5);
    assert_eq!(snap.slowest_reads[0].gates[0].wait_ns, 1_000);
}

#[test]
fn keeps_exactly_the_slowest_reads() {
    let seed = common::seed(2);
    let mut rng = common::rng(seed);
    let tracer = Tracer::new("vm1");
    let mut totals = Vec::new();
    for i in 0..10_000u64 {
        let total = rng.gen_range(0..1_000_000u64);
        let t = RequestTrace::new(Op::Read, i);
        tracer.finish(&t, i + total, 0);
        totals.push(total);
        // Slow writes are not read examples.
        let w = RequestTrace::new(Op::Write, i);
        tracer.finish(&w, i + 10_000_000, 0);
    }
    totals.sort_unstable_by(|a, b| b.cmp(a));
    let kept: Vec<u64> = tracer.snapshot().slowest_reads.iter().map(|s| s.total_ns).collect();
    assert_eq!(kept, totals[..SLOWEST_READS], "seed {seed}");
}

#[test]
fn slowest_capacity_is_configurable_and_zero_disables() {
    let config = |n| TracerConfig { slowest_reads: n, ..TracerConfig::default() };
    for n in [0, 1, 5] {
        let tracer = Tracer::with_config("vm1", config(n));
        for i in 0..20 {
            tracer.finish(&RequestTrace::new(Op::Read, 0), i * 10, 0);
        }
        let kept = tracer.snapshot().slowest_reads;
        assert_eq!(kept.len(), n);
        assert!(kept.iter().all(|s| s.total_ns >= (20 - n as u64) * 10));
    }
}

#[test]
fn percentiles_of_known_latencies() {
    let tracer = Tracer::new("vm1");
    // 1..=1000 us, in a shuffled order.
    let mut rng = common::rng(3);
    let mut values: Vec<u64> = (1..=1_000).collect();
    for i in (1..values.len()).rev() {
        values.swap(i, rng.gen_range(0..=i));
    }
    for us in values {
        let mut t = RequestTrace::new(Op::Write, 0);
        t.set_location(0, 0, 0, 8192);
        tracer.finish(&t, us * 1_000, 0);
    }
    let w = tracer.snapshot().ops.write;
    let close = |a: f64, b: f64| (a - b).abs() <= b * 0.01;
    assert_eq!(w.count, 1_000);
    assert_eq!(w.bytes, 1_000 * 8192);
    assert!(close(w.latency.latency_us_p50, 500.0), "{:?}", w.latency);
    assert!(close(w.latency.latency_us_p99, 990.0), "{:?}", w.latency);
    assert!(close(w.latency.latency_us_p999, 999.0), "{:?}", w.latency);
    assert_eq!(w.latency.latency_us_max, 1_000.0);
    assert!(close(w.latency.latency_us_mean, 500.5));
    // No marks: all of it is execution; io phases absent.
    assert_eq!(w.phases.execute.count, 1_000);
    assert_eq!(w.phases.execute.latency_us_max, 1_000.0);
    assert_eq!(w.phases.io_log.count, 0);
    assert_eq!(w.phases.admission.latency_us_max, 0.0);
}

#[test]
fn concurrent_recorders_lose_nothing() {
    let tracer = Arc::new(Tracer::with_config("vm1", TracerConfig { shards: 2, ..Default::default() }));
    let threads = 4u64;
    let per_thread = 20_000 * common::scale();
    let snapper = {
        let tracer = Arc::clone(&tracer);
        std::thread::spawn(move || {
            // Snapshots while recording must see monotonic counts.
            let mut last = 0;
            for _ in 0..50 {
                let n = tracer.snapshot().ops.read.count;
                assert!(n >= last);
                last = n;
            }
        })
    };
    let workers: Vec<_> = (0..threads)
        .map(|k| {
            let tracer = Arc::clone(&tracer);
            std::thread::spawn(move || {
                let mut rng = common::rng(100 + k);
                let mut clock = 0;
                for _ in 0..per_thread {
                    let (t, done) = common::random_request(&mut rng, Op::Read, clock);
                    tracer.finish(&t, done, 0);
                    clock = done;
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    snapper.join().unwrap();
    let snap = tracer.snapshot();
    assert_eq!(snap.ops.read.count, threads * per_thread);
    assert_eq!(snap.ops.read.latency.count, threads * per_thread);
    assert_eq!(snap.ops.read.phases.admission.count, threads * per_thread);
    assert_eq!(snap.ops.read.bytes, threads * per_thread * 4096);
    assert_eq!(snap.slowest_reads.len(), SLOWEST_READS);
}

#[test]
fn reset_forgets_and_restarts_since() {
    let tracer = Tracer::new("vm1");
    tracer.finish(&RequestTrace::new(Op::Read, 0), 10, 0);
    let before = tracer.snapshot();
    std::thread::sleep(std::time::Duration::from_millis(2));
    tracer.reset();
    let after = tracer.snapshot();
    assert_eq!(before.ops.read.count, 1);
    assert_eq!(after.ops.read.count, 0);
    assert!(after.slowest_reads.is_empty());
    assert!(after.since_ms > before.since_ms);
}
