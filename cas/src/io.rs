//! The context one request's engine call runs in, passed down the request
//! path as a value: whether its reads may wait for a device ([`Wait`]),
//! and where its storage I/O time goes ([`IoCx::timed`]).
//!
//! ```text
//!  worker / queue thread                    engine (this call)
//!  let (r, t) = io::timed(|cx| {            ChunkStore::read_ref_in: cx.begin() .. cx.end(Cache | Chunk)
//!      image.read_in(cx, offset, buf)       Image::read_in: cx.io(Log, ..) per log piece,
//!  });                                                      cx.io(Manifest, ..) per lookup
//!  observe::record(&mut trace, &t);         Image::write_in/flush_in: cx.io(Log, ..) around the
//!                                                        record write and the group-commit sync
//! ```
//!
//! Storage and the dedup index take only the [`Wait`]; image, chunk store,
//! manifest view and the server take the whole [`IoCx`]. The context is
//! `Copy` and holds a `&Cell`, so it is passed by value and cannot leave
//! the thread it was made on. An untimed context reads no clock: `begin`
//! returns `None`.

use crate::observe::IoTimes;
use std::cell::Cell;
use trace::IoSource;

/// Whether a read may wait for a device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Wait {
    /// The read waits for the device if it must.
    #[default]
    Block,
    /// A read that would wait fails with
    /// [`Error::WouldBlock`](crate::Error::WouldBlock) instead
    /// (`preadv2(RWF_NOWAIT)`; memory-backed files always read). A ublk
    /// queue thread uses it to serve a read from memory in place and hand
    /// it to a worker otherwise. Writes and syncs are not affected.
    Never,
}

/// The context of one engine call: its [`Wait`], and the I/O times it
/// adds to, if it is timed. The default blocks and is untimed.
#[derive(Clone, Copy, Default)]
pub struct IoCx<'a> {
    pub wait: Wait,
    times: Option<&'a Cell<IoTimes>>,
}

impl std::fmt::Debug for IoCx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoCx").field("wait", &self.wait).field("timed", &self.times.is_some()).finish()
    }
}

impl<'a> IoCx<'a> {
    /// A blocking context whose I/O adds up in `times`.
    pub fn timed(times: &'a Cell<IoTimes>) -> Self {
        IoCx { wait: Wait::Block, times: Some(times) }
    }

    /// This context, with reads that must not wait ([`Wait::Never`]).
    pub fn nowait(self) -> Self {
        IoCx { wait: Wait::Never, ..self }
    }

    /// Runs the I/O `f`, attributing its time to `source` if this context
    /// is timed.
    #[inline]
    pub(crate) fn io<R>(self, source: IoSource, f: impl FnOnce() -> R) -> R {
        let begun = self.begin();
        let result = f();
        self.end(source, begun);
        result
    }

    /// Starts an I/O: the time now if this context is timed, else `None`.
    #[inline]
    pub(crate) fn begin(self) -> Option<u64> {
        self.times.map(|_| trace::now_ns())
    }

    /// Ends the I/O `begin` started, attributing it to `source`.
    #[inline]
    pub(crate) fn end(self, source: IoSource, begun: Option<u64>) {
        if let (Some(times), Some(begin_ns)) = (self.times, begun) {
            let end_ns = trace::now_ns();
            let mut t = times.get();
            t.add(source, begin_ns, end_ns);
            times.set(t);
        }
    }
}

/// Runs `f` with a fresh timed context, returning what it returned and
/// the I/O it did through that context.
pub fn timed<R>(f: impl FnOnce(IoCx<'_>) -> R) -> (R, IoTimes) {
    let times = Cell::new(IoTimes::default());
    let result = f(IoCx::timed(&times));
    (result, times.get())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::record;
    use trace::RequestTrace;

    fn io(cx: IoCx<'_>, source: IoSource) {
        let t = cx.begin();
        cx.end(source, t);
    }

    #[test]
    fn nothing_is_recorded_without_a_timed_context() {
        let cx = IoCx::default();
        assert_eq!(cx.begin(), None);
        io(cx, IoSource::Chunk);
        let ((), times) = timed(|_| ());
        assert!(times.is_empty());
        assert_eq!(cx.nowait().wait, Wait::Never);
        assert_eq!(cx.wait, Wait::Block);
    }

    #[test]
    fn io_adds_up_per_source_and_records_one_span_each() {
        let ((), times) = timed(|cx| {
            for _ in 0..100 {
                io(cx, IoSource::Manifest);
                io(cx, IoSource::Cache);
                io(cx.nowait(), IoSource::Chunk);
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
    fn two_contexts_on_one_thread_keep_their_own_io() {
        let (a, b) = (Cell::new(IoTimes::default()), Cell::new(IoTimes::default()));
        let (ca, cb) = (IoCx::timed(&a), IoCx::timed(&b));
        io(ca, IoSource::Log);
        io(cb, IoSource::Chunk);
        io(ca, IoSource::Manifest);
        io(IoCx::default(), IoSource::Cache);
        assert_eq!(a.get().sources().collect::<Vec<_>>(), [IoSource::Log, IoSource::Manifest]);
        assert_eq!(b.get().sources().collect::<Vec<_>>(), [IoSource::Chunk]);
    }
}
