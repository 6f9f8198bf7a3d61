//! Helpers shared by the integration tests: a fake-clock request generator.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use trace::{counters_from_value, Gate, IoSource, Op, RequestTrace, Snapshot, Tracer};

/// Seed from `TRACE_TEST_SEED`, else `default`; printed so a failure can be replayed.
pub fn seed(default: u64) -> u64 {
    let seed = std::env::var("TRACE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    eprintln!("seed {seed} (set TRACE_TEST_SEED to replay)");
    seed
}

/// Scale factor for random test sizes, from `TRACE_TEST_SCALE` (default 1).
pub fn scale() -> u64 {
    std::env::var("TRACE_TEST_SCALE").ok().and_then(|s| s.parse().ok()).unwrap_or(1)
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Drives one request through every step with fake timestamps starting at
/// `start_ns`, with random gate waits and I/O spans; returns the trace and
/// its completion time.
pub fn random_request(rng: &mut StdRng, op: Op, start_ns: u64) -> (RequestTrace, u64) {
    let mut now = start_ns;
    let mut t = RequestTrace::new(op, start_ns);
    let mut step = |rng: &mut StdRng, max: u64| {
        now += rng.gen_range(0..=max);
        now
    };
    t.set_location(rng.gen_range(0..4), rng.gen_range(0..128), rng.gen_range(0..1u64 << 30) * 512, 4096);
    for _ in 0..rng.gen_range(0..4) {
        let gate = Gate::ALL[rng.gen_range(0..Gate::COUNT)];
        t.wait_begin(gate, step(rng, 1_000));
        if rng.gen_bool(0.5) {
            t.wait_end(step(rng, 5_000_000));
        }
    }
    t.admitted(step(rng, 10_000_000));
    t.dispatched(step(rng, 50_000));
    for _ in 0..rng.gen_range(0..5) {
        let source = IoSource::ALL[rng.gen_range(0..IoSource::COUNT)];
        let begin = step(rng, 20_000);
        let end = if rng.gen_bool(0.2) { begin + rng.gen_range(0..100_000) } else { step(rng, 200_000) };
        t.io_span(source, begin, end);
    }
    t.executed(step(rng, 20_000));
    let completed = step(rng, 20_000);
    (t, completed)
}

/// A snapshot with every op, phase, gate and counter kind populated.
pub fn populated_snapshot() -> Snapshot {
    let tracer = Tracer::new("vm1");
    let mut rng = rng(11);
    let mut clock = 1_000u64;
    for i in 0..2_000u64 {
        let op = Op::ALL[(i % Op::COUNT as u64) as usize];
        let (t, done) = random_request(&mut rng, op, clock);
        tracer.finish(&t, done, if i % 97 == 0 { -5 } else { 0 });
        clock = done;
    }
    // Make sure each gate and source appears at least once.
    for gate in Gate::ALL {
        for source in IoSource::ALL {
            let mut t = RequestTrace::new(Op::Read, clock);
            t.wait_begin(gate, clock);
            t.admitted(clock + 5_000_000);
            t.dispatched(clock + 5_100_000);
            t.io_span(source, clock + 5_200_000, clock + 5_300_000);
            tracer.finish(&t, clock + 5_400_000 + rng.gen_range(0..1_000), 0);
        }
    }
    let mut image = tracer.snapshot();
    image.state = "live".into();
    image.attach(
        "sched",
        counters_from_value("sched", &serde_json::json!({"refused_turns": 12, "admitted": 2100})).unwrap(),
    );
    image.attach(
        "cas",
        counters_from_value("cas", &serde_json::json!({"log_bytes": 1u64 << 30, "compaction": {"runs": 3}}))
            .unwrap(),
    );
    let mut idle = Tracer::new("vm2").snapshot();
    idle.state = "recovering".into();
    idle.attach("sched", counters_from_value("sched", &serde_json::json!({"refused_turns": 0})).unwrap());
    let mut snapshot = Snapshot::new(vec![image, idle]);
    snapshot.attach(
        "chunk_store",
        counters_from_value("chunk_store", &serde_json::json!({"dedup_ratio": 1.74, "chunks": 81234}))
            .unwrap(),
    );
    snapshot
}
