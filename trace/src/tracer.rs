//! The per-image recorder that finished requests go into.
//!
//! ```text
//!  thread A ─┐ finish()   ┌─ shard 0: spin lock<[op] -> counts, total + phase histograms, gate sums>
//!  thread B ─┼──────────> ├─ shard 1 ...                  (thread -> shard by a thread-local slot)
//!  thread C ─┘            └─ shard S-1
//!                         slowest: AtomicU64 floor + Mutex<Vec<32 reads>>   (rarely locked)
//!  snapshot() locks each shard in turn and merges them into `ImageStats`.
//! ```
//!
//! Each thread gets a process-wide slot number on its first use; it records
//! into shard `slot % shards`, so up to `shards` threads never share a lock
//! and the lock they take is uncontended except while a snapshot merges
//! that shard. Memory is bounded: per shard and op at most one total and
//! [`Phase::COUNT`] phase histograms (24 KiB each up to 1 s values, growing
//! to about 40 KiB at the one-hour cap), allocated on first use.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::clock::ns_to_ms;
use crate::hist::{LatencyHist, LATENCY_BUCKET_BOUNDS_US};
use crate::phases::{phase_durations, Timeline};
use crate::schema::{GateStats, ImageStats, OpStats};
use crate::slowest::{Finished, Slowest};
use crate::{now_ns, Gate, Op, Phase, RequestTrace};

/// Default number of slowest reads kept per image.
pub const SLOWEST_READS: usize = 32;

/// Most shards a tracer may have.
pub const MAX_SHARDS: usize = 64;

/// Tracer settings.
#[derive(Clone, Debug)]
pub struct TracerConfig {
    /// Lock shards (1..=[`MAX_SHARDS`]); default: available CPUs, at most 8.
    pub shards: usize,
    /// Slowest completed reads kept (default [`SLOWEST_READS`]).
    pub slowest_reads: usize,
    /// Log (`tracing::warn!`) a request slower than this, at most once a
    /// second per image; `None` never. Default 1000 ms.
    pub warn_slow_ms: Option<u64>,
}

impl Default for TracerConfig {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        TracerConfig { shards: cpus.clamp(1, 8), slowest_reads: SLOWEST_READS, warn_slow_ms: Some(1_000) }
    }
}

/// Records finished requests of one image; share it as `Arc<Tracer>`.
pub struct Tracer {
    name: String,
    shards: Box<[Padded<ShardLock>]>,
    slowest: Slowest,
    since_ns: AtomicU64,
    warn_slow_ns: u64,
    last_warn_ns: AtomicU64,
}

/// Keeps each shard's lock on its own cache lines (128 bytes covers the
/// adjacent-line prefetcher), so recorders on different shards do not
/// bounce one line between cores.
#[repr(align(128))]
struct Padded<T>(T);

/// A shard's lock. Each thread has its own shard, so the lock is almost
/// never contended: a spin lock takes one atomic to lock and a plain store
/// to unlock (std's Mutex unlock is a second locked instruction, about a
/// quarter of `finish`). A snapshot holding the shard makes `finish` yield.
type ShardLock = spin::mutex::SpinMutex<Shard, spin::relax::Yield>;

#[derive(Default)]
struct Shard {
    ops: [Option<Box<OpAcc>>; Op::COUNT],
}

#[derive(Clone)]
struct OpAcc {
    count: u64,
    errors: u64,
    bytes: u64,
    total: LatencyHist,
    phases: [Option<Box<LatencyHist>>; Phase::COUNT],
    gates: [GateAcc; Gate::COUNT],
}

#[derive(Clone, Copy, Default)]
struct GateAcc {
    requests: u64,
    waits: u64,
    wait_ns_total: u64,
    wait_ns_max: u64,
}

impl Tracer {
    pub fn new(name: impl Into<String>) -> Tracer {
        Tracer::with_config(name, TracerConfig::default())
    }

    pub fn with_config(name: impl Into<String>, config: TracerConfig) -> Tracer {
        assert!((1..=MAX_SHARDS).contains(&config.shards), "tracer shards must be 1..={MAX_SHARDS}");
        Tracer {
            name: name.into(),
            shards: (0..config.shards).map(|_| Padded(ShardLock::new(Shard::default()))).collect(),
            slowest: Slowest::new(config.slowest_reads),
            since_ns: AtomicU64::new(now_ns()),
            warn_slow_ns: config.warn_slow_ms.map_or(u64::MAX, |ms| ms.saturating_mul(1_000_000)),
            last_warn_ns: AtomicU64::new(0),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Records a request that completed at `completed_ns` with `result`
    /// (0 or a negative errno). A gate wait still open is closed at
    /// `completed_ns`. Never fails and never blocks on other recorders
    /// beyond a short, usually uncontended shard lock.
    pub fn finish(&self, trace: &RequestTrace, completed_ns: u64, result: i32) {
        let timeline = Timeline::of(trace, completed_ns);
        let phases = phase_durations(trace, &timeline);
        let total_ns = timeline.total_ns();
        let mut gate_wait_ns = trace.gate_wait_ns;
        let mut gate_waits = trace.gate_waits.map(u32::from);
        if let Some((gate, since_ns)) = trace.open_gate {
            let i = gate.index();
            gate_wait_ns[i] = gate_wait_ns[i].saturating_add(timeline.completed_ns.saturating_sub(since_ns));
            gate_waits[i] = gate_waits[i].saturating_add(1);
        }

        {
            let mut shard = self.shard().lock();
            let acc = shard.ops[trace.op.index()].get_or_insert_with(|| Box::new(OpAcc::new()));
            acc.count += 1;
            acc.errors += u64::from(result < 0);
            acc.bytes += u64::from(trace.len_bytes);
            acc.total.record(total_ns);
            for phase in Phase::ALL {
                if phases.present(phase) {
                    let h = acc.phases[phase.index()].get_or_insert_with(|| Box::new(LatencyHist::new()));
                    h.record(phases.get(phase));
                }
            }
            for (i, g) in acc.gates.iter_mut().enumerate() {
                if gate_waits[i] > 0 {
                    g.requests += 1;
                    g.waits += u64::from(gate_waits[i]);
                    g.wait_ns_total = g.wait_ns_total.saturating_add(gate_wait_ns[i]);
                    g.wait_ns_max = g.wait_ns_max.max(gate_wait_ns[i]);
                }
            }
        }

        let is_slow_read = trace.op == Op::Read && self.slowest.may_enter(total_ns);
        let warn = total_ns >= self.warn_slow_ns && self.claim_warn(timeline.completed_ns);
        if is_slow_read || warn {
            let finished =
                Finished { trace: trace.clone(), timeline, phases, gate_wait_ns, gate_waits, result };
            if warn {
                tracing::warn!(
                    image = %self.name,
                    op = trace.op.name(),
                    total_ms = ns_to_ms(total_ns),
                    offset_bytes = trace.offset_bytes,
                    len_bytes = trace.len_bytes,
                    "slow request: {}",
                    finished.summary()
                );
            }
            if is_slow_read {
                self.slowest.offer(finished);
            }
        }
    }

    /// This image's statistics (no counters attached; the daemon adds them).
    pub fn snapshot(&self) -> ImageStats {
        let mut merged: [Option<OpAcc>; Op::COUNT] = Default::default();
        for Padded(shard) in self.shards.iter() {
            let shard = shard.lock();
            for (into, from) in merged.iter_mut().zip(shard.ops.iter()) {
                if let Some(from) = from {
                    match into {
                        Some(into) => into.merge(from),
                        None => *into = Some(OpAcc::clone(from)),
                    }
                }
            }
        }
        let mut stats = ImageStats {
            name: self.name.clone(),
            since_ms: ns_to_ms(self.since_ns.load(Ordering::Relaxed)),
            slowest_reads: self.slowest.snapshot(),
            ..Default::default()
        };
        for op in Op::ALL {
            *stats.ops.get_mut(op) = match &merged[op.index()] {
                Some(acc) => acc.stats(),
                None => OpAcc::empty_stats(),
            };
        }
        stats
    }

    /// The statistics of an image with no tracer yet (one being recovered):
    /// every op present, all zeros.
    pub fn idle_stats(name: &str) -> ImageStats {
        let mut stats = ImageStats { name: name.into(), since_ms: ns_to_ms(now_ns()), ..Default::default() };
        for op in Op::ALL {
            *stats.ops.get_mut(op) = OpAcc::empty_stats();
        }
        stats
    }

    /// Forgets everything recorded so far; `since_ms` restarts now.
    pub fn reset(&self) {
        for Padded(shard) in self.shards.iter() {
            *shard.lock() = Shard::default();
        }
        self.slowest.clear();
        self.since_ns.store(now_ns(), Ordering::Relaxed);
    }

    #[inline]
    fn shard(&self) -> &ShardLock {
        &self.shards[thread_slot() % self.shards.len()].0
    }

    /// Rate limit for slow-request warnings: one per second per image.
    fn claim_warn(&self, now_ns: u64) -> bool {
        let last = self.last_warn_ns.load(Ordering::Relaxed);
        (last == 0 || now_ns.saturating_sub(last) >= 1_000_000_000)
            && self
                .last_warn_ns
                .compare_exchange(last, now_ns.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer").field("name", &self.name).field("shards", &self.shards.len()).finish()
    }
}

/// This thread's slot, assigned round-robin on first use.
#[inline]
fn thread_slot() -> usize {
    static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    SLOT.with(|slot| {
        let mut s = slot.get();
        if s == usize::MAX {
            s = NEXT_SLOT.fetch_add(1, Ordering::Relaxed);
            slot.set(s);
        }
        s
    })
}

impl OpAcc {
    fn new() -> OpAcc {
        OpAcc {
            count: 0,
            errors: 0,
            bytes: 0,
            total: LatencyHist::new(),
            phases: Default::default(),
            gates: [GateAcc::default(); Gate::COUNT],
        }
    }

    fn merge(&mut self, other: &OpAcc) {
        self.count += other.count;
        self.errors += other.errors;
        self.bytes += other.bytes;
        self.total.merge(&other.total);
        for (into, from) in self.phases.iter_mut().zip(other.phases.iter()) {
            if let Some(from) = from {
                match into {
                    Some(into) => into.merge(from),
                    None => *into = Some(from.clone()),
                }
            }
        }
        for (into, from) in self.gates.iter_mut().zip(other.gates.iter()) {
            into.requests += from.requests;
            into.waits += from.waits;
            into.wait_ns_total = into.wait_ns_total.saturating_add(from.wait_ns_total);
            into.wait_ns_max = into.wait_ns_max.max(from.wait_ns_max);
        }
    }

    fn stats(&self) -> OpStats {
        let mut out = OpStats {
            count: self.count,
            errors: self.errors,
            bytes: self.bytes,
            latency: self.total.stats(),
            latency_us_total: self.total.sum_us(),
            latency_buckets: self.total.cumulative_counts(),
            ..OpAcc::empty_stats()
        };
        for phase in Phase::ALL {
            if let Some(h) = &self.phases[phase.index()] {
                *out.phases.get_mut(phase) = h.stats();
            }
        }
        for gate in Gate::ALL {
            let g = self.gates[gate.index()];
            out.gates.insert(
                gate.name().into(),
                GateStats {
                    requests: g.requests,
                    waits: g.waits,
                    wait_ms_total: ns_to_ms(g.wait_ns_total),
                    wait_ms_max: ns_to_ms(g.wait_ns_max),
                },
            );
        }
        out
    }

    fn empty_stats() -> OpStats {
        let mut out =
            OpStats { latency_buckets: vec![0; LATENCY_BUCKET_BOUNDS_US.len()], ..OpStats::default() };
        for gate in Gate::ALL {
            out.gates.insert(gate.name().into(), GateStats::default());
        }
        out
    }
}
