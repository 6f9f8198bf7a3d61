//! Where a request's time goes inside the engine: the storage I/O spans
//! (log, manifest, chunk cache, chunk store) of the engine calls a thread
//! makes while it observes them, for that request's trace.
//!
//! The request path wraps the engine call that serves one request:
//!
//! ```text
//!  worker / queue thread                    engine (this thread)
//!  observe::into(&mut trace, || {           ChunkStore::read: begin() .. end(Cache | Chunk)
//!      image.read(offset, buf)              Image::read: begin() .. end(Log) per log piece,
//!  })                                                    begin() .. end(Manifest) per lookup
//!                                           Image::write*/flush: end(Log) around the record
//!                                                        write and the group-commit sync
//! ```
//!
//! The spans collect in a thread-local buffer (no allocation, no lock),
//! bounded at [`SPANS`]: consecutive spans of one source merge into one
//! (a read of 32 cached chunks is one cache span), and past the bound a
//! span widens the last one of its source, as `RequestTrace` does. Code
//! that does not observe pays one thread-local check per I/O: `begin`
//! returns `None` and reads no clock.
//!
//! What is not a span is the request's execution (`execute` in the trace):
//! CPU, locks, waiting for earlier writes to publish, waiting for capacity.

use smallvec::SmallVec;
use std::cell::RefCell;
use trace::{IoSource, IoSpan, RequestTrace};

/// The most spans one observation keeps: as many as a trace stores.
pub const SPANS: usize = trace::MAX_IO_SPANS;

/// The spans one observation recorded, in order.
pub type Spans = SmallVec<[IoSpan; SPANS]>;

thread_local! {
    /// The spans of the observation running on this thread, if any.
    static OBSERVING: RefCell<Option<Spans>> = const { RefCell::new(None) };
}

/// Runs `f`, returning what it returned and the I/O spans the engine
/// recorded on this thread meanwhile. Observations do not nest: an inner
/// one takes the spans recorded inside it, the outer one keeps the rest.
pub fn observed<R>(f: impl FnOnce() -> R) -> (R, Spans) {
    /// Restores the outer observation even if `f` unwinds.
    struct Restore(Option<Spans>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            OBSERVING.with(|o| *o.borrow_mut() = outer);
        }
    }
    let outer = OBSERVING.with(|o| o.borrow_mut().replace(Spans::new()));
    let restore = Restore(outer);
    let result = f();
    let spans = OBSERVING.with(|o| o.borrow_mut().take());
    drop(restore);
    (result, spans.unwrap_or_default())
}

/// [`observed`], with the spans recorded into `trace`.
pub fn into<R>(trace: &mut RequestTrace, f: impl FnOnce() -> R) -> R {
    let (result, spans) = observed(f);
    record(trace, &spans);
    result
}

/// Records `spans` (from [`observed`]) into `trace`.
pub fn record(trace: &mut RequestTrace, spans: &[IoSpan]) {
    for s in spans {
        trace.io_span(s.source, s.begin_ns, s.end_ns);
    }
}

/// Starts an I/O: the time now if this thread observes, else `None`.
#[inline]
pub(crate) fn begin() -> Option<u64> {
    if OBSERVING.with(|o| o.borrow().is_some()) {
        Some(trace::now_ns())
    } else {
        None
    }
}

/// Ends the I/O `begin` started, attributing it to `source`.
#[inline]
pub(crate) fn end(source: IoSource, begun: Option<u64>) {
    if let Some(begin_ns) = begun {
        let end_ns = trace::now_ns();
        OBSERVING.with(|o| {
            if let Some(spans) = o.borrow_mut().as_mut() {
                push(spans, IoSpan { source, begin_ns, end_ns });
            }
        });
    }
}

/// Adds `span`: merged into the last span if that is of the same source,
/// else appended, else (full) widening the last span of its source.
fn push(spans: &mut Spans, span: IoSpan) {
    if let Some(last) = spans.last_mut().filter(|l| l.source == span.source) {
        last.end_ns = last.end_ns.max(span.end_ns);
        return;
    }
    if spans.len() < SPANS {
        spans.push(span);
        return;
    }
    let i = spans.iter().rposition(|s| s.source == span.source).unwrap_or(SPANS - 1);
    let into = &mut spans[i];
    into.begin_ns = into.begin_ns.min(span.begin_ns);
    into.end_ns = into.end_ns.max(span.end_ns);
    if span.source.index() > into.source.index() {
        into.source = span.source;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(source: IoSource) {
        let t = begin();
        end(source, t);
    }

    #[test]
    fn nothing_is_recorded_without_an_observer() {
        assert_eq!(begin(), None);
        io(IoSource::Chunk);
        let ((), spans) = observed(|| ());
        assert!(spans.is_empty());
    }

    #[test]
    fn runs_of_one_source_merge_and_sources_alternate() {
        let ((), spans) = observed(|| {
            io(IoSource::Manifest);
            io(IoSource::Cache);
            io(IoSource::Cache);
            io(IoSource::Chunk);
            io(IoSource::Cache);
        });
        let sources: Vec<_> = spans.iter().map(|s| s.source).collect();
        assert_eq!(sources, [IoSource::Manifest, IoSource::Cache, IoSource::Chunk, IoSource::Cache]);
        assert!(spans.windows(2).all(|w| w[0].end_ns <= w[1].begin_ns));
    }

    #[test]
    fn spans_stay_bounded() {
        let ((), spans) = observed(|| {
            for _ in 0..100 {
                io(IoSource::Cache);
                io(IoSource::Chunk);
            }
        });
        assert_eq!(spans.len(), SPANS);
        assert!(!spans.spilled());
    }

    #[test]
    fn an_inner_observation_takes_its_own_spans_and_the_outer_goes_on() {
        let ((inner, ()), outer) = observed(|| {
            io(IoSource::Log);
            let (_, inner) = observed(|| io(IoSource::Chunk));
            io(IoSource::Manifest);
            (inner, ())
        });
        assert_eq!(inner.iter().map(|s| s.source).collect::<Vec<_>>(), [IoSource::Chunk]);
        assert_eq!(outer.iter().map(|s| s.source).collect::<Vec<_>>(), [IoSource::Log, IoSource::Manifest]);
        assert_eq!(begin(), None, "the observation ended");
    }
}
