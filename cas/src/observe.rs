//! Where a request's time goes inside the engine: the storage I/O (log,
//! manifest, chunk cache, chunk store) of the engine calls a thread makes
//! while it observes them, for that request's trace.
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
//! The I/O adds up per source in a thread-local [`IoTimes`] (no
//! allocation, no lock, the same size however many I/Os a request makes):
//! how many, and their total time. [`record`] turns it into at most one
//! trace span per source, laid end to end from the first I/O's start, each
//! as long as its source's total, so the trace's phases get every
//! source's exact time and no gap between I/Os is counted as I/O. Code
//! that does not observe pays one thread-local check per I/O: `begin`
//! returns `None` and reads no clock.
//!
//! What is not I/O is the request's execution (`execute` in the trace):
//! CPU, locks, waiting for earlier writes to become visible, waiting for capacity.

use std::cell::RefCell;
use trace::{IoSource, RequestTrace};

/// The I/O one observation recorded, per source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoTimes {
    first_begin_ns: Option<u64>,
    ns: [u64; IoSource::COUNT],
    ios: [u32; IoSource::COUNT],
}

impl IoTimes {
    /// The sources used, in [`IoSource::ALL`] order.
    pub fn sources(&self) -> impl Iterator<Item = IoSource> + '_ {
        IoSource::ALL.into_iter().filter(|s| self.ios[s.index()] > 0)
    }

    /// I/Os of `source`.
    pub fn ios(&self, source: IoSource) -> u32 {
        self.ios[source.index()]
    }

    /// Total time of `source`'s I/Os.
    pub fn ns(&self, source: IoSource) -> u64 {
        self.ns[source.index()]
    }

    pub fn is_empty(&self) -> bool {
        self.first_begin_ns.is_none()
    }

    fn add(&mut self, source: IoSource, begin_ns: u64, end_ns: u64) {
        self.first_begin_ns.get_or_insert(begin_ns);
        let i = source.index();
        self.ns[i] += end_ns.saturating_sub(begin_ns);
        self.ios[i] = self.ios[i].saturating_add(1);
    }
}

thread_local! {
    /// The I/O of the observation running on this thread, if any.
    static OBSERVING: RefCell<Option<IoTimes>> = const { RefCell::new(None) };
}

/// Runs `f`, returning what it returned and the I/O the engine did on this
/// thread meanwhile. Observations do not nest: an inner one takes the I/O
/// done inside it, the outer one keeps the rest.
pub fn observed<R>(f: impl FnOnce() -> R) -> (R, IoTimes) {
    /// Restores the outer observation, also if `f` unwinds.
    struct Restore(Option<IoTimes>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            OBSERVING.with(|o| *o.borrow_mut() = outer);
        }
    }
    let outer = OBSERVING.with(|o| o.borrow_mut().replace(IoTimes::default()));
    let restore = Restore(outer);
    let result = f();
    let times = OBSERVING.with(|o| o.borrow_mut().take());
    drop(restore);
    (result, times.unwrap_or_default())
}

/// [`observed`], with the I/O recorded into `trace`.
pub fn into<R>(trace: &mut RequestTrace, f: impl FnOnce() -> R) -> R {
    let (result, times) = observed(f);
    record(trace, &times);
    result
}

/// Records `times` into `trace`: one span per source used, end to end
/// from the first I/O's start, each as long as its source's total (the
/// I/Os ran one after another on one thread, so the spans end no later
/// than the last I/O did).
pub fn record(trace: &mut RequestTrace, times: &IoTimes) {
    let Some(mut at) = times.first_begin_ns else { return };
    for source in times.sources() {
        let end = at + times.ns(source);
        trace.io_span(source, at, end);
        at = end;
    }
}

/// Runs the I/O `f`, attributing its time to `source` if this thread
/// observes.
#[inline]
pub(crate) fn io<R>(source: IoSource, f: impl FnOnce() -> R) -> R {
    let begun = begin();
    let result = f();
    end(source, begun);
    result
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
            if let Some(times) = o.borrow_mut().as_mut() {
                times.add(source, begin_ns, end_ns);
            }
        });
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
        let ((), times) = observed(|| ());
        assert!(times.is_empty());
    }

    #[test]
    fn io_adds_up_per_source_and_records_one_span_each() {
        let ((), times) = observed(|| {
            for _ in 0..100 {
                io(IoSource::Manifest);
                io(IoSource::Cache);
                io(IoSource::Chunk);
            }
        });
        assert_eq!(
            times.sources().collect::<Vec<_>>(),
            [IoSource::Cache, IoSource::Manifest, IoSource::Chunk]
        );
        assert_eq!((times.ios(IoSource::Cache), times.ios(IoSource::Log)), (100, 0));
        let mut t = RequestTrace::new(trace::Op::Read, 0);
        record(&mut t, &times);
        let spans = t.io_spans();
        assert_eq!(spans.len(), 3);
        assert!(spans.windows(2).all(|w| w[0].end_ns == w[1].begin_ns), "end to end");
        for s in spans {
            assert_eq!(s.end_ns - s.begin_ns, times.ns(s.source));
        }
    }

    #[test]
    fn an_inner_observation_takes_its_own_io_and_the_outer_goes_on() {
        let ((inner, ()), outer) = observed(|| {
            io(IoSource::Log);
            let (_, inner) = observed(|| io(IoSource::Chunk));
            io(IoSource::Manifest);
            (inner, ())
        });
        assert_eq!(inner.sources().collect::<Vec<_>>(), [IoSource::Chunk]);
        assert_eq!(outer.sources().collect::<Vec<_>>(), [IoSource::Log, IoSource::Manifest]);
        assert_eq!(begin(), None, "the observation ended");
    }
}
