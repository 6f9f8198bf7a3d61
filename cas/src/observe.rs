//! Where a request's time goes inside the engine: [`IoTimes`], the storage
//! I/O (log, manifest, chunk cache, chunk store) of one engine call, and
//! [`record`], which puts it into that request's trace.
//!
//! The I/O is counted through the context the call runs in (see
//! [`crate::io`]: `io::timed` runs a call with a timed [`IoCx`](crate::io::IoCx)).
//! It adds up per source in one [`IoTimes`] (no allocation, no lock, the
//! same size however many I/Os a request makes): how many, and their
//! total time. [`record`] turns it into at most one trace span per source,
//! laid end to end from the first I/O's start, each as long as its
//! source's total, so the trace's phases get every source's exact time
//! and no gap between I/Os is counted as I/O. An untimed context reads no
//! clock.
//!
//! What is not I/O is the request's execution (`execute` in the trace):
//! CPU, locks, waiting for earlier writes to become visible, waiting for capacity.

use trace::{IoSource, RequestTrace};

/// The I/O one timed context recorded, per source.
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

    pub(crate) fn add(&mut self, source: IoSource, begin_ns: u64, end_ns: u64) {
        self.first_begin_ns.get_or_insert(begin_ns);
        let i = source.index();
        self.ns[i] += end_ns.saturating_sub(begin_ns);
        self.ios[i] = self.ios[i].saturating_add(1);
    }
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
