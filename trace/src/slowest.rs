//! The N slowest completed reads of an image, with their full breakdown.
//!
//! Bounded: at most `capacity` entries (32 by default), each a copy of the
//! fixed-size trace. The hot path only loads an atomic: `floor_ns` is the
//! total of the current N-th slowest (0 while fewer than N are kept), and a
//! read no slower than it is dropped without taking the lock. Once warm,
//! only a new top-N read takes the lock, so it is rarely contended.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::clock::ns_to_ms;
use crate::phases::{PhaseDurations, Timeline};
use crate::request::RequestTrace;
use crate::schema::{GateWait, IoSpanStats, PhaseDurationsNs, SlowRequest};
use crate::{Gate, Phase};

/// A finished request as kept in the slowest set.
#[derive(Clone, Debug)]
pub(crate) struct Finished {
    pub trace: RequestTrace,
    pub timeline: Timeline,
    pub phases: PhaseDurations,
    /// Gate waits including a wait still open at completion.
    pub gate_wait_ns: [u64; Gate::COUNT],
    pub gate_waits: [u32; Gate::COUNT],
    pub result: i32,
}

pub(crate) struct Slowest {
    capacity: usize,
    floor_ns: AtomicU64,
    entries: Mutex<Vec<Finished>>,
}

impl Slowest {
    pub fn new(capacity: usize) -> Slowest {
        Slowest { capacity, floor_ns: AtomicU64::new(0), entries: Mutex::new(Vec::with_capacity(capacity)) }
    }

    /// Whether a request of `total_ns` might enter the set (cheap check).
    #[inline]
    pub fn may_enter(&self, total_ns: u64) -> bool {
        self.capacity > 0 && total_ns >= self.floor_ns.load(Ordering::Relaxed)
    }

    /// Offers a finished request; kept if it is among the slowest.
    pub fn offer(&self, finished: Finished) {
        let total_ns = finished.timeline.total_ns();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() < self.capacity {
            entries.push(finished);
        } else {
            let (min_i, min) = entries
                .iter()
                .enumerate()
                .min_by_key(|(_, f)| f.timeline.total_ns())
                .expect("a full set is not empty");
            if total_ns <= min.timeline.total_ns() {
                return;
            }
            entries[min_i] = finished;
        }
        if entries.len() == self.capacity {
            let floor = entries.iter().map(|f| f.timeline.total_ns()).min().unwrap_or(0);
            self.floor_ns.store(floor, Ordering::Relaxed);
        }
    }

    pub fn clear(&self) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.clear();
        self.floor_ns.store(0, Ordering::Relaxed);
    }

    /// The kept requests, slowest first.
    pub fn snapshot(&self) -> Vec<SlowRequest> {
        let mut kept: Vec<Finished> = self.entries.lock().unwrap_or_else(|e| e.into_inner()).clone();
        kept.sort_by_key(|f| std::cmp::Reverse(f.timeline.total_ns()));
        kept.iter().map(Finished::to_slow_request).collect()
    }
}

impl Finished {
    pub fn to_slow_request(&self) -> SlowRequest {
        let t = &self.trace;
        let p = |phase: Phase| self.phases.get(phase);
        let mut gates: Vec<GateWait> = Gate::ALL
            .iter()
            .filter(|g| self.gate_waits[g.index()] > 0)
            .map(|g| GateWait {
                gate: g.name().into(),
                waits: self.gate_waits[g.index()],
                wait_ns: self.gate_wait_ns[g.index()],
            })
            .collect();
        gates.sort_by_key(|g| std::cmp::Reverse(g.wait_ns));
        let tl = &self.timeline;
        let io = t
            .io_spans()
            .iter()
            .map(|s| {
                let begin = s.begin_ns.clamp(tl.dispatched_ns, tl.executed_ns);
                let end = s.end_ns.clamp(begin, tl.executed_ns);
                IoSpanStats {
                    source: s.source.name().into(),
                    start_ns: begin - tl.seen_ns,
                    duration_ns: end - begin,
                }
            })
            .collect();
        SlowRequest {
            op: t.op.name().into(),
            queue: t.queue,
            tag: t.tag,
            offset_bytes: t.offset_bytes,
            len_bytes: t.len_bytes,
            result: self.result,
            seen_ns: tl.seen_ns,
            total_ns: tl.total_ns(),
            phases: PhaseDurationsNs {
                admission_ns: p(Phase::Admission),
                dispatch_ns: p(Phase::Dispatch),
                io_cache_ns: p(Phase::IoCache),
                io_log_ns: p(Phase::IoLog),
                io_manifest_ns: p(Phase::IoManifest),
                io_chunk_ns: p(Phase::IoChunk),
                execute_ns: p(Phase::Execute),
                complete_ns: p(Phase::Complete),
            },
            gates,
            io,
            io_spans_merged: t.spans_merged,
        }
    }

    /// One line for logs: total and the largest phases and gates.
    pub fn summary(&self) -> String {
        let mut parts: Vec<(u64, String)> = Phase::ALL
            .iter()
            .filter(|&&ph| self.phases.get(ph) > 0)
            .map(|&ph| {
                (self.phases.get(ph), format!("{} {:.3} ms", ph.name(), ns_to_ms(self.phases.get(ph))))
            })
            .collect();
        parts.sort_by_key(|(ns, _)| std::cmp::Reverse(*ns));
        let mut out = parts.into_iter().take(3).map(|(_, s)| s).collect::<Vec<_>>().join(", ");
        for g in Gate::ALL {
            let ns = self.gate_wait_ns[g.index()];
            if self.gate_waits[g.index()] > 0 {
                out.push_str(&format!("; waited {:.3} ms on {}", ns_to_ms(ns), g.name()));
            }
        }
        out
    }
}
