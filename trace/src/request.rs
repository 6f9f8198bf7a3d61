//! One request's trace: the value carried with a request from the moment
//! its tag reaches the daemon until it completes.
//!
//! A [`RequestTrace`] is a fixed-size value (no heap allocation: the I/O
//! spans live in an inline array of [`MAX_IO_SPANS`]). Each owner of the
//! request in turn marks its step with a timestamp from [`crate::now_ns`]
//! (or a fake clock):
//!
//! ```text
//!  ublk queue thread     sched                worker / cas engine          queue thread
//!  new(op, seen) ──> wait_begin(gate,t)... ──> dispatched(t)              ──> Tracer::finish(
//!                    admitted(t)              io_span(source, b, e)...         trace, completed,
//!                                             executed(t)                      result)
//! ```
//!
//! Every mark is a plain store; marks are optional and inferred when absent
//! (see [`crate::PhaseDurations`]). Gate waits are intervals: `wait_begin`
//! opens one (idempotent for the same gate, so a scheduler may call it on
//! every refused turn), a different gate closes the open one and opens its
//! own, and `wait_end`, `admitted` or `dispatched` close it.

use smallvec::SmallVec;

use crate::Gate;

/// The most I/O spans one trace stores. Further spans merge into a stored
/// span (see [`RequestTrace::io_span`]), so a trace never allocates. Four:
/// one per source (cache, log, manifest, chunk); the engine merges runs of
/// one source before it reports them (`cas::observe`), and a smaller trace
/// is cheaper to move.
pub const MAX_IO_SPANS: usize = 4;

/// Timestamp value meaning "not marked".
const UNSET: u64 = u64::MAX;

/// The block operation a request performs: the one `Op` of the request
/// path (`sched` and `serve` use this type).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Read,
    Write,
    Flush,
    Discard,
    WriteZeroes,
}

impl Op {
    /// Number of ops; the length of per-op arrays.
    pub const COUNT: usize = 5;
    pub const ALL: [Op; Op::COUNT] = [Op::Read, Op::Write, Op::Flush, Op::Discard, Op::WriteZeroes];

    /// Position in [`Op::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// WRITE, WRITE_ZEROES and DISCARD change the image: they reserve log
    /// capacity, keep FIFO order among themselves and order overlapping
    /// reads (the scheduler's ordering contract).
    pub fn is_write_kind(self) -> bool {
        matches!(self, Op::Write | Op::WriteZeroes | Op::Discard)
    }

    /// Stable snake_case name used in JSON and tables.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Discard => "discard",
            Op::WriteZeroes => "write_zeroes",
        }
    }
}

/// Where a storage I/O span got or put its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoSource {
    /// The in-memory chunk cache (a copy, no device I/O).
    Cache,
    /// The image's write-ahead log.
    Log,
    /// Manifest pages (block -> chunk map) read from the store.
    Manifest,
    /// Chunk payloads in the shared chunk store.
    Chunk,
}

impl IoSource {
    /// Number of sources; the length of per-source arrays.
    pub const COUNT: usize = 4;
    /// In attribution priority order, lowest first: where spans of two
    /// sources overlap, the time goes to the later one here (the slower
    /// medium), see [`crate::PhaseDurations`].
    pub const ALL: [IoSource; IoSource::COUNT] =
        [IoSource::Cache, IoSource::Log, IoSource::Manifest, IoSource::Chunk];

    /// Position in [`IoSource::ALL`] (also its attribution priority).
    pub fn index(self) -> usize {
        self as usize
    }

    /// Stable snake_case name used in JSON and tables.
    pub fn name(self) -> &'static str {
        match self {
            IoSource::Cache => "cache",
            IoSource::Log => "log",
            IoSource::Manifest => "manifest",
            IoSource::Chunk => "chunk",
        }
    }
}

/// One storage I/O interval of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoSpan {
    pub source: IoSource,
    pub begin_ns: u64,
    /// `u64::MAX` while the span is open (closed at `executed` on finish).
    pub end_ns: u64,
}

/// Handle of an open I/O span, returned by [`RequestTrace::io_begin`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoSpanId(u8);

/// The per-request record; see the module docs for the protocol.
#[derive(Clone, Debug)]
pub struct RequestTrace {
    pub(crate) op: Op,
    pub(crate) queue: u16,
    pub(crate) tag: u16,
    pub(crate) len_bytes: u32,
    pub(crate) offset_bytes: u64,
    pub(crate) seen_ns: u64,
    pub(crate) admitted_ns: u64,
    pub(crate) dispatched_ns: u64,
    pub(crate) executed_ns: u64,
    pub(crate) spans: SmallVec<[IoSpan; MAX_IO_SPANS]>,
    /// Spans folded into a stored one because the array was full.
    pub(crate) spans_merged: u32,
    pub(crate) gate_wait_ns: [u64; Gate::COUNT],
    /// Wait intervals per gate, saturating (u16 keeps the record within
    /// four cache lines with seven gates).
    pub(crate) gate_waits: [u16; Gate::COUNT],
    pub(crate) open_gate: Option<(Gate, u64)>,
}

impl RequestTrace {
    /// Starts a trace for a request whose tag the daemon saw at `seen_ns`.
    #[inline]
    pub fn new(op: Op, seen_ns: u64) -> Self {
        RequestTrace {
            op,
            queue: 0,
            tag: 0,
            len_bytes: 0,
            offset_bytes: 0,
            seen_ns,
            admitted_ns: UNSET,
            dispatched_ns: UNSET,
            executed_ns: UNSET,
            spans: SmallVec::new(),
            spans_merged: 0,
            gate_wait_ns: [0; Gate::COUNT],
            gate_waits: [0; Gate::COUNT],
            open_gate: None,
        }
    }

    /// Records where the request came from and what it covers (shown in
    /// slow examples; `len_bytes` also feeds the byte counters).
    #[inline]
    pub fn set_location(&mut self, queue: u16, tag: u16, offset_bytes: u64, len_bytes: u32) {
        self.queue = queue;
        self.tag = tag;
        self.offset_bytes = offset_bytes;
        self.len_bytes = len_bytes;
    }

    pub fn op(&self) -> Op {
        self.op
    }

    pub fn seen_ns(&self) -> u64 {
        self.seen_ns
    }

    pub fn admitted_ns(&self) -> Option<u64> {
        marked(self.admitted_ns)
    }

    pub fn dispatched_ns(&self) -> Option<u64> {
        marked(self.dispatched_ns)
    }

    pub fn executed_ns(&self) -> Option<u64> {
        marked(self.executed_ns)
    }

    /// The request starts waiting on `gate` at `now_ns`. Calling it again for
    /// the gate already open does nothing (a scheduler may call it on every
    /// refused turn); a different gate closes the open wait at `now_ns`.
    #[inline]
    pub fn wait_begin(&mut self, gate: Gate, now_ns: u64) {
        match self.open_gate {
            Some((open, _)) if open == gate => {}
            Some(_) => {
                self.wait_end(now_ns);
                self.open_gate = Some((gate, now_ns));
            }
            None => self.open_gate = Some((gate, now_ns)),
        }
    }

    /// Closes the open gate wait, if any, at `now_ns`.
    #[inline]
    pub fn wait_end(&mut self, now_ns: u64) {
        if let Some((gate, since_ns)) = self.open_gate.take() {
            self.add_wait(gate, now_ns.saturating_sub(since_ns));
        }
    }

    /// Adds a finished wait of `wait_ns` on `gate` (for callers that time
    /// waits themselves).
    #[inline]
    pub fn add_wait(&mut self, gate: Gate, wait_ns: u64) {
        let i = gate.index();
        self.gate_wait_ns[i] = self.gate_wait_ns[i].saturating_add(wait_ns);
        self.gate_waits[i] = self.gate_waits[i].saturating_add(1);
    }

    /// Total time waited on `gate` so far (closed waits only).
    pub fn wait_ns(&self, gate: Gate) -> u64 {
        self.gate_wait_ns[gate.index()]
    }

    /// The scheduler admitted the request; closes any open gate wait.
    #[inline]
    pub fn admitted(&mut self, now_ns: u64) {
        self.wait_end(now_ns);
        self.admitted_ns = now_ns;
    }

    /// A worker picked the admitted request up; closes any open gate wait.
    #[inline]
    pub fn dispatched(&mut self, now_ns: u64) {
        self.wait_end(now_ns);
        self.dispatched_ns = now_ns;
    }

    /// The worker finished executing; what follows is handing the result
    /// back to the queue thread and completing the tag.
    #[inline]
    pub fn executed(&mut self, now_ns: u64) {
        self.executed_ns = now_ns;
    }

    /// Records a finished storage I/O interval.
    ///
    /// Spans are meant to be coarse (one per source per batch of I/O). When
    /// [`MAX_IO_SPANS`] are stored, the new span widens the last stored span
    /// of the same source (or, if none, the last span, whose source becomes
    /// the higher-priority of the two); the gap between them then counts as
    /// I/O time and `io_spans_merged` in the example says so.
    #[inline]
    pub fn io_span(&mut self, source: IoSource, begin_ns: u64, end_ns: u64) {
        self.store_span(IoSpan { source, begin_ns, end_ns: end_ns.max(begin_ns) });
    }

    /// Opens a storage I/O span at `now_ns`; close it with [`Self::io_end`].
    /// A span still open at finish ends at `executed`.
    #[inline]
    pub fn io_begin(&mut self, source: IoSource, now_ns: u64) -> IoSpanId {
        let i = self.store_span(IoSpan { source, begin_ns: now_ns, end_ns: UNSET });
        IoSpanId(u8::try_from(i).expect("MAX_IO_SPANS fits in u8"))
    }

    /// Closes the span opened by `io_begin`.
    #[inline]
    pub fn io_end(&mut self, id: IoSpanId, now_ns: u64) {
        if let Some(span) = self.spans.get_mut(usize::from(id.0)) {
            if span.end_ns == UNSET {
                span.end_ns = now_ns.max(span.begin_ns);
            }
        }
    }

    /// The stored I/O spans, in recording order.
    pub fn io_spans(&self) -> &[IoSpan] {
        &self.spans
    }

    /// Stores `span`, returning the index it went to.
    #[inline]
    fn store_span(&mut self, span: IoSpan) -> usize {
        if self.spans.len() < MAX_IO_SPANS {
            self.spans.push(span);
            self.spans.len() - 1
        } else {
            self.merge_span(span)
        }
    }

    #[cold]
    fn merge_span(&mut self, span: IoSpan) -> usize {
        self.spans_merged = self.spans_merged.saturating_add(1);
        let i = self.spans.iter().rposition(|s| s.source == span.source).unwrap_or(self.spans.len() - 1);
        let into = &mut self.spans[i];
        into.begin_ns = into.begin_ns.min(span.begin_ns);
        into.end_ns = into.end_ns.max(span.end_ns);
        if span.source.index() > into.source.index() {
            into.source = span.source;
        }
        i
    }
}

fn marked(ns: u64) -> Option<u64> {
    (ns != UNSET).then_some(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_is_small_and_inline() {
        let size = std::mem::size_of::<RequestTrace>();
        assert!(size <= 256, "RequestTrace grew to {size} bytes");
        let mut t = RequestTrace::new(Op::Read, 0);
        for i in 0..(MAX_IO_SPANS as u64 * 3) {
            t.io_span(IoSource::Chunk, i * 10, i * 10 + 5);
        }
        assert!(!t.spans.spilled(), "spans must never allocate");
        assert_eq!(t.spans_merged, 2 * MAX_IO_SPANS as u32);
    }

    #[test]
    fn repeated_wait_begin_on_the_same_gate_keeps_the_first_start() {
        let mut t = RequestTrace::new(Op::Write, 100);
        t.wait_begin(Gate::LogCapacity, 100);
        t.wait_begin(Gate::LogCapacity, 150);
        t.wait_begin(Gate::LogCapacity, 180);
        t.admitted(300);
        assert_eq!(t.wait_ns(Gate::LogCapacity), 200);
        assert_eq!(t.gate_waits[Gate::LogCapacity.index()], 1);
    }

    #[test]
    fn switching_gates_closes_the_previous_wait() {
        let mut t = RequestTrace::new(Op::Read, 0);
        t.wait_begin(Gate::Overlap, 10);
        t.wait_begin(Gate::SchedulerTurn, 40);
        t.wait_end(45);
        t.wait_begin(Gate::Overlap, 50);
        t.admitted(60);
        assert_eq!(t.wait_ns(Gate::Overlap), 30 + 10);
        assert_eq!(t.gate_waits[Gate::Overlap.index()], 2);
        assert_eq!(t.wait_ns(Gate::SchedulerTurn), 5);
    }

    #[test]
    fn io_begin_end_pairs_even_when_interleaved() {
        let mut t = RequestTrace::new(Op::Read, 0);
        let a = t.io_begin(IoSource::Log, 10);
        let b = t.io_begin(IoSource::Chunk, 12);
        t.io_end(b, 30);
        t.io_end(a, 20);
        t.io_end(a, 99); // closing twice keeps the first end
        assert_eq!(t.io_spans()[0], IoSpan { source: IoSource::Log, begin_ns: 10, end_ns: 20 });
        assert_eq!(t.io_spans()[1], IoSpan { source: IoSource::Chunk, begin_ns: 12, end_ns: 30 });
    }

    #[test]
    fn merged_span_takes_the_slower_source() {
        let mut t = RequestTrace::new(Op::Read, 0);
        for i in 0..MAX_IO_SPANS as u64 {
            t.io_span(IoSource::Cache, i * 10, i * 10 + 1);
        }
        t.io_span(IoSource::Chunk, 200, 250);
        let last = *t.io_spans().last().unwrap();
        let last_begin = (MAX_IO_SPANS as u64 - 1) * 10;
        assert_eq!(last, IoSpan { source: IoSource::Chunk, begin_ns: last_begin, end_ns: 250 });
    }

    #[test]
    fn io_begin_on_a_full_trace_returns_the_span_it_merged_into() {
        let mut t = RequestTrace::new(Op::Read, 0);
        for i in 0..MAX_IO_SPANS as u64 {
            t.io_span(IoSource::Chunk, i * 10, i * 10 + 1);
        }
        // Cache has no stored span: merges into the last (chunk) span.
        let id = t.io_begin(IoSource::Cache, 100);
        t.io_end(id, 120);
        let last = *t.io_spans().last().unwrap();
        let last_begin = (MAX_IO_SPANS as u64 - 1) * 10;
        assert_eq!(last, IoSpan { source: IoSource::Chunk, begin_ns: last_begin, end_ns: 120 });
    }
}
