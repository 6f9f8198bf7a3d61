//! What tracing costs, measured in the benchmark's own run: the read-only
//! workload (image A, 4 KiB random reads, QD8) run in short segments with
//! tracing on and off, interleaved in ABBA order (on off, off on, on off,
//! ...) so that a drift of the machine's speed during the run falls on both
//! sides alike.
//!
//! ```text
//!  segment:  1    2    3    4    5    6   ...   2 x pairs
//!  tracing:  on   off  off  on   on   off ...
//!  per pair: 100 * (1 - traced reads/s / untraced reads/s)
//!  trace_overhead_pct = the median of the pairs
//! ```
//!
//! Why this workload: it has the highest request rate of the benchmark and
//! the least work per request (a 4 KiB read from the chunk cache or a pack
//! file), so the fixed per-request cost of tracing is the largest share of
//! the work there; on the mixed arm the same cost hides behind 1 MiB writes
//! and compaction, whose throughput swings too much to resolve 3%.
//!
//! The median of the pairs is the figure: on a shared machine a burst of
//! load from another tenant lands in one segment and swings the pooled
//! ratio by tens of percent (seen here: single pairs of +60% and -48%), but
//! moves the median by one pair. It is not clamped: a negative value means
//! the difference is below the run's noise. Two cross-checks are printed
//! with it: the pooled ratio (all traced reads over all untraced reads),
//! and the CPU time per read of the request path's threads, traced against
//! untraced.

use sched::{Config, Op};

use casblk_ci::engine::Engine;
use casblk_ci::frontend::{run_arm, Stream, Tracing};

pub struct Overhead {
    /// The median of `pair_pct`: the reported figure.
    pub pct: f64,
    /// `100 * (1 - all traced reads/s / all untraced reads/s)`.
    pub pooled_pct: f64,
    pub traced_reads_per_s: f64,
    pub untraced_reads_per_s: f64,
    /// `100 * (1 - on / off)` of each pair, in run order.
    pub pair_pct: Vec<f64>,
    /// `100 * (traced CPU ns per read / untraced - 1)`, request-path threads.
    pub cpu_pct: f64,
}

/// Reads, seconds and request-path CPU ns of one side.
#[derive(Default)]
struct Side {
    reads: u64,
    secs: f64,
    cpu_ns: u64,
}

pub fn measure(
    engine: &Engine,
    config: &Config,
    workers: usize,
    reads: Stream,
    pairs: usize,
    segment_secs: f64,
) -> Overhead {
    assert!(reads.op == Op::Read, "the overhead arm is a read workload");
    assert!(pairs > 0, "the overhead arm needs at least one pair");
    let (mut on, mut off) = (Side::default(), Side::default());
    let mut pair_pct = Vec::with_capacity(pairs);
    for pair in 0..pairs {
        let order = if pair % 2 == 0 { [Tracing::On, Tracing::Off] } else { [Tracing::Off, Tracing::On] };
        let mut rate = [0.0f64; 2]; // [on, off]
        for tracing in order {
            let arm = run_arm(engine, config.clone(), workers, &[reads], segment_secs, tracing, &|_, _| {});
            let r = arm.stream(Op::Read);
            assert_eq!(r.errors, 0, "the overhead arm's reads failed");
            let side = if tracing == Tracing::On { &mut on } else { &mut off };
            side.reads += r.requests;
            side.secs += arm.secs;
            side.cpu_ns += arm.request_path_cpu_ns;
            rate[usize::from(tracing == Tracing::Off)] = r.requests as f64 / arm.secs;
        }
        pair_pct.push(100.0 * (1.0 - rate[0] / rate[1]));
    }
    let traced = on.reads as f64 / on.secs;
    let untraced = off.reads as f64 / off.secs;
    let cpu_per_read = |s: &Side| s.cpu_ns as f64 / s.reads as f64;
    let pct = casblk_ci::median(&pair_pct);
    Overhead {
        pct,
        pooled_pct: 100.0 * (1.0 - traced / untraced),
        traced_reads_per_s: traced,
        untraced_reads_per_s: untraced,
        pair_pct,
        cpu_pct: 100.0 * (cpu_per_read(&on) / cpu_per_read(&off) - 1.0),
    }
}

impl Overhead {
    pub fn print(&self, segment_secs: f64) {
        let pairs: Vec<String> = self.pair_pct.iter().map(|p| format!("{p:.1}")).collect();
        println!(
            "trace overhead: {:.2}% (median of {} on/off pairs of {segment_secs} s); cross-checks: pooled \
             {:.2}% ({:.0} reads/s traced vs {:.0} untraced), request-path CPU per read {:+.2}%; per pair, %: {}",
            self.pct,
            self.pair_pct.len(),
            self.pooled_pct,
            self.traced_reads_per_s,
            self.untraced_reads_per_s,
            self.cpu_pct,
            pairs.join(" ")
        );
    }
}
