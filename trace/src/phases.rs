//! Splitting a finished request's time into phases that add up exactly.
//!
//! The marks of a [`RequestTrace`] and its completion time are first made
//! a monotonic timeline (each clamped to `[seen, completed]` and to the
//! mark before it; unmarked ones inferred):
//!
//! ```text
//!  seen ──admission──> admitted ──dispatch──> dispatched ──execution──> executed ──complete──> completed
//!                                                 │  io_cache io_log io_manifest io_chunk │
//!                                                 │  (I/O spans)     + execute (the rest) │
//! ```
//!
//! * unmarked `admitted` = `seen` (no admission step), unmarked
//!   `dispatched` = `admitted` (executed in place), unmarked `executed` =
//!   `completed` (completed by the worker itself);
//! * I/O spans are clipped to `[dispatched, executed]`; where spans overlap,
//!   the time goes to the slowest source covering it (chunk > manifest >
//!   log > cache), so overlapping I/O is never counted twice;
//! * `execute` is execution time covered by no span (CPU, locks, queues).
//!
//! Hence `admission + dispatch + io_* + execute + complete == completed - seen`
//! for every request, in integer nanoseconds. Gate waits are not a phase:
//! they say *why* time passed (mostly within admission) and are reported
//! next to the phases.

use smallvec::SmallVec;

use crate::request::{IoSource, RequestTrace, MAX_IO_SPANS};

/// A phase of a request's life; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    Admission,
    Dispatch,
    IoCache,
    IoLog,
    IoManifest,
    IoChunk,
    Execute,
    Complete,
}

impl Phase {
    /// Number of phases; the length of per-phase arrays.
    pub const COUNT: usize = 8;
    pub const ALL: [Phase; Phase::COUNT] = [
        Phase::Admission,
        Phase::Dispatch,
        Phase::IoCache,
        Phase::IoLog,
        Phase::IoManifest,
        Phase::IoChunk,
        Phase::Execute,
        Phase::Complete,
    ];

    /// Position in [`Phase::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Stable snake_case name used in JSON and tables.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Admission => "admission",
            Phase::Dispatch => "dispatch",
            Phase::IoCache => "io_cache",
            Phase::IoLog => "io_log",
            Phase::IoManifest => "io_manifest",
            Phase::IoChunk => "io_chunk",
            Phase::Execute => "execute",
            Phase::Complete => "complete",
        }
    }

    /// The I/O phase of a source.
    pub fn io(source: IoSource) -> Phase {
        match source {
            IoSource::Cache => Phase::IoCache,
            IoSource::Log => Phase::IoLog,
            IoSource::Manifest => Phase::IoManifest,
            IoSource::Chunk => Phase::IoChunk,
        }
    }
}

/// A finished request's phase durations, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseDurations {
    pub ns: [u64; Phase::COUNT],
    /// Which sources had at least one span (their phase is "present" even
    /// when its clipped duration is 0).
    pub io_present: [bool; IoSource::COUNT],
}

impl PhaseDurations {
    /// Duration of `phase` in ns.
    pub fn get(&self, phase: Phase) -> u64 {
        self.ns[phase.index()]
    }

    /// Sum of all phases; equals the request's total time.
    pub fn sum_ns(&self) -> u64 {
        self.ns.iter().sum()
    }

    /// Whether the request had this phase: always, except an I/O phase,
    /// which exists only for requests with a span of that source.
    pub fn present(&self, phase: Phase) -> bool {
        match phase {
            Phase::IoCache => self.io_present[IoSource::Cache.index()],
            Phase::IoLog => self.io_present[IoSource::Log.index()],
            Phase::IoManifest => self.io_present[IoSource::Manifest.index()],
            Phase::IoChunk => self.io_present[IoSource::Chunk.index()],
            _ => true,
        }
    }
}

/// The monotonic timeline of a finished request (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timeline {
    pub seen_ns: u64,
    pub admitted_ns: u64,
    pub dispatched_ns: u64,
    pub executed_ns: u64,
    pub completed_ns: u64,
}

impl Timeline {
    pub fn of(trace: &RequestTrace, completed_ns: u64) -> Timeline {
        let seen_ns = trace.seen_ns;
        let completed_ns = completed_ns.max(seen_ns);
        let clamp = |t: u64, floor: u64| t.clamp(floor, completed_ns);
        let admitted_ns = clamp(trace.admitted_ns().unwrap_or(seen_ns), seen_ns);
        let dispatched_ns = clamp(trace.dispatched_ns().unwrap_or(admitted_ns), admitted_ns);
        let executed_ns = clamp(trace.executed_ns().unwrap_or(completed_ns), dispatched_ns);
        Timeline { seen_ns, admitted_ns, dispatched_ns, executed_ns, completed_ns }
    }

    pub fn total_ns(&self) -> u64 {
        self.completed_ns - self.seen_ns
    }
}

/// Computes the phases of `trace` completed at `completed_ns`.
pub(crate) fn phase_durations(trace: &RequestTrace, timeline: &Timeline) -> PhaseDurations {
    let mut out = PhaseDurations::default();
    let t = timeline;
    out.ns[Phase::Admission.index()] = t.admitted_ns - t.seen_ns;
    out.ns[Phase::Dispatch.index()] = t.dispatched_ns - t.admitted_ns;
    out.ns[Phase::Complete.index()] = t.completed_ns - t.executed_ns;

    let mut io_ns = [0u64; IoSource::COUNT];
    let covered_ns = attribute_io(trace, t.dispatched_ns, t.executed_ns, &mut io_ns, &mut out.io_present);
    for source in IoSource::ALL {
        out.ns[Phase::io(source).index()] = io_ns[source.index()];
    }
    out.ns[Phase::Execute.index()] = (t.executed_ns - t.dispatched_ns) - covered_ns;
    debug_assert_eq!(out.sum_ns(), t.total_ns());
    out
}

/// Attributes the union of the spans, clipped to `[lo, hi]`, to sources
/// (slowest source wins on overlap). Returns the covered time.
fn attribute_io(
    trace: &RequestTrace,
    lo: u64,
    hi: u64,
    io_ns: &mut [u64; IoSource::COUNT],
    present: &mut [bool; IoSource::COUNT],
) -> u64 {
    let mut spans: SmallVec<[(u64, u64, IoSource); MAX_IO_SPANS]> = SmallVec::new();
    for span in trace.io_spans() {
        present[span.source.index()] = true;
        // An open span ends at `executed` (= hi).
        let begin = span.begin_ns.clamp(lo, hi);
        let end = span.end_ns.clamp(lo, hi);
        if end > begin {
            spans.push((begin, end, span.source));
        }
    }
    // Fast path: spans in order and disjoint (sequential I/O).
    if spans.windows(2).all(|w| w[0].1 <= w[1].0) {
        let mut covered = 0;
        for &(b, e, source) in &spans {
            io_ns[source.index()] += e - b;
            covered += e - b;
        }
        return covered;
    }
    // Sweep the elementary intervals between span boundaries.
    let mut points: SmallVec<[u64; 2 * MAX_IO_SPANS]> = spans.iter().flat_map(|&(b, e, _)| [b, e]).collect();
    points.sort_unstable();
    points.dedup();
    let mut covered = 0;
    for w in points.windows(2) {
        let (a, b) = (w[0], w[1]);
        let owner = spans.iter().filter(|&&(sb, se, _)| sb <= a && b <= se).map(|&(_, _, s)| s).max();
        if let Some(source) = owner {
            io_ns[source.index()] += b - a;
            covered += b - a;
        }
    }
    covered
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::Op;
    use rand::{Rng, SeedableRng};

    fn phases(trace: &RequestTrace, completed_ns: u64) -> PhaseDurations {
        phase_durations(trace, &Timeline::of(trace, completed_ns))
    }

    #[test]
    fn fully_marked_request() {
        let mut t = RequestTrace::new(Op::Read, 1_000);
        t.admitted(3_000);
        t.dispatched(3_500);
        t.io_span(IoSource::Manifest, 3_600, 4_000);
        t.io_span(IoSource::Chunk, 4_100, 6_000);
        t.executed(6_200);
        let p = phases(&t, 6_300);
        assert_eq!(p.get(Phase::Admission), 2_000);
        assert_eq!(p.get(Phase::Dispatch), 500);
        assert_eq!(p.get(Phase::IoManifest), 400);
        assert_eq!(p.get(Phase::IoChunk), 1_900);
        assert_eq!(p.get(Phase::Execute), 2_700 - 2_300);
        assert_eq!(p.get(Phase::Complete), 100);
        assert_eq!(p.sum_ns(), 5_300);
        assert!(p.present(Phase::IoChunk) && !p.present(Phase::IoLog));
    }

    #[test]
    fn unmarked_steps_are_inferred() {
        let t = RequestTrace::new(Op::Flush, 10);
        let p = phases(&t, 110);
        assert_eq!(p.get(Phase::Execute), 100);
        assert_eq!(p.sum_ns(), 100);
    }

    #[test]
    fn overlapping_spans_are_counted_once_slowest_source_wins() {
        let mut t = RequestTrace::new(Op::Read, 0);
        t.dispatched(0);
        t.io_span(IoSource::Cache, 10, 50);
        t.io_span(IoSource::Chunk, 30, 80);
        t.io_span(IoSource::Log, 70, 90);
        let p = phases(&t, 100);
        assert_eq!(p.get(Phase::IoCache), 20);
        assert_eq!(p.get(Phase::IoChunk), 50);
        assert_eq!(p.get(Phase::IoLog), 10);
        assert_eq!(p.get(Phase::Execute), 20);
        assert_eq!(p.sum_ns(), 100);
    }

    #[test]
    fn out_of_order_marks_and_spans_are_clamped() {
        let mut t = RequestTrace::new(Op::Write, 1_000);
        t.admitted(900); // before seen
        t.dispatched(5_000); // after completion
        t.io_span(IoSource::Log, 100, 9_000);
        let p = phases(&t, 2_000);
        assert_eq!(p.sum_ns(), 1_000);
        assert_eq!(p.get(Phase::Admission), 0);
        assert_eq!(p.get(Phase::Dispatch), 1_000);
        assert_eq!(p.get(Phase::IoLog), 0);
        assert!(p.present(Phase::IoLog));
    }

    #[test]
    fn open_span_ends_at_executed() {
        let mut t = RequestTrace::new(Op::Read, 0);
        t.dispatched(10);
        let _open = t.io_begin(IoSource::Chunk, 20);
        t.executed(50);
        let p = phases(&t, 60);
        assert_eq!(p.get(Phase::IoChunk), 30);
        assert_eq!(p.get(Phase::Complete), 10);
    }

    /// Random marks and spans, in any order: the phases always add up.
    #[test]
    fn random_traces_always_add_up() {
        let seed: u64 = std::env::var("TRACE_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(7);
        let cases: u64 =
            std::env::var("TRACE_TEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(20_000);
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for case in 0..cases {
            let seen = rng.gen_range(0..1_000u64);
            let mut t = RequestTrace::new(Op::Read, seen);
            let pick = |rng: &mut rand::rngs::StdRng| rng.gen_range(0..2_000u64);
            if rng.gen_bool(0.8) {
                t.admitted(pick(&mut rng));
            }
            if rng.gen_bool(0.8) {
                t.dispatched(pick(&mut rng));
            }
            for _ in 0..rng.gen_range(0..12) {
                let b = pick(&mut rng);
                let e = pick(&mut rng);
                let source = IoSource::ALL[rng.gen_range(0..IoSource::COUNT)];
                t.io_span(source, b, e);
            }
            if rng.gen_bool(0.8) {
                t.executed(pick(&mut rng));
            }
            let completed = pick(&mut rng);
            let timeline = Timeline::of(&t, completed);
            let p = phase_durations(&t, &timeline);
            assert_eq!(
                p.sum_ns(),
                timeline.total_ns(),
                "seed {seed} case {case}: {t:?} completed {completed}"
            );
        }
    }
}
