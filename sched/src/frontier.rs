//! One image's frontier: the bounded set of descriptor snapshots it retains
//! (waiting and in flight), and the ordering contract that decides which
//! waiting request may be admitted next.
//!
//! ```text
//!  entries (BTreeMap, by arrival ticket; oldest first)
//!  +------+------+------+------+------+------+------+
//!  |  W0  |  R1  |  W2  |  R3  |  F4  |  R5  |  W6  |
//!  |flight| wait | wait | wait | wait | wait | wait |
//!  +------+------+------+------+------+------+------+
//!    |      |      |      |      |      '------'-- behind FLUSH F4: wait
//!    |      |      |      |      '-- FLUSH: waits until W0..R3 complete
//!    |      |      |      '-- read: admitted unless it overlaps W0 or W2
//!    |      |      '-- write: FIFO head of writes; needs no overlap with
//!    |      |          W0 / R1, a write slot and a log reservation
//!    |      '-- read: admitted unless it overlaps W0, or credits are out
//!    '-- in flight: still orders overlapping later requests
//! ```
//!
//! A scan walks at most `scan_window` entries oldest first and returns the
//! first one that may go; every waiting entry it passes is "observed" with
//! the gate that holds it (see [`crate::waits`]).
//!
//! An image's IO limits ([`crate::rate`]) are a gate in the same walk: a
//! read after `Overlap`, a write after `Overlap` and before it asks for a
//! write slot or log room. Held requests of a class stay in arrival order
//! (a small read never passes a large one held by a bytes limit), still
//! order the requests behind them like any waiting request, and hold no
//! credit, slot, reservation or deficit: a capped class never slows the
//! other class of its image, nor another image.

use std::collections::{BTreeMap, HashMap};

use trace::Gate;

use crate::config::Config;
use crate::counters::{ImageCounters, LimitCounters};
use crate::descriptor::{overlaps, Descriptor, ImageId, Op, RequestId, Ticket};
use crate::error::Error;
use crate::rate::{Limiter, Limits};
use crate::waits::{GateTrack, GateWaits};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Waiting,
    InFlight,
}

/// One retained descriptor snapshot (charged `DESCRIPTOR_SLOT_BYTES`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Entry {
    pub(crate) desc: Descriptor,
    state: State,
    pub(crate) arrival_ns: u64,
    track: GateTrack,
    /// Charged to its class's limits already (a requeued read is not
    /// charged twice).
    charged: bool,
}

/// The first admissible entry a scan found.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pick {
    pub(crate) ticket: Ticket,
    pub(crate) desc: Descriptor,
    /// An older request of this image was still waiting.
    pub(crate) passed_blocked_head: bool,
}

/// What admission returns to the scheduler for the dispatch record.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Admitted {
    pub(crate) arrival_ns: u64,
    pub(crate) waits: GateWaits,
}

/// Limits that come from outside the image at scan time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScanLimits {
    pub(crate) read_credits: u32,
    pub(crate) write_slot_free: bool,
    pub(crate) window: usize,
}

#[derive(Debug)]
pub(crate) struct Frontier {
    image: ImageId,
    entries: BTreeMap<Ticket, Entry>,
    by_request: HashMap<RequestId, Ticket>,
    next_ticket: u64,
    limit: usize,
    inflight: usize,
    reads_inflight: u32,
    writes_inflight: u32,
    writes_waiting: u32,
    flushes_uncompleted: u32,
    /// A write of this image was refused log capacity and no wake came yet.
    capacity_blocked: bool,
    /// When a refused write is tried again without a wake.
    capacity_retry_at_ns: u64,
    /// The gate the last refusal named: the log's quota, or the store's
    /// space reserve.
    capacity_gate: Gate,
    /// DRR deficit in bytes.
    pub(crate) deficit_bytes: u64,
    limiter: Limiter,
    /// From the last scan: when the first rate-held read or write conforms.
    rate_retry_at_ns: Option<u64>,
    /// From the last scan: when the first rate-held write conforms (0 if
    /// none was held).
    write_rate_ready_ns: u64,
    counters: ImageCounters,
    // Reused scan buffers: ranges of uncompleted writes and reads seen so far.
    scratch_writes: Vec<(u64, u64)>,
    scratch_reads: Vec<(u64, u64)>,
}

impl Frontier {
    pub(crate) fn new(image: ImageId, config: &Config) -> Self {
        Frontier {
            image,
            entries: BTreeMap::new(),
            by_request: HashMap::new(),
            next_ticket: 0,
            limit: config.frontier_limit(),
            inflight: 0,
            reads_inflight: 0,
            writes_inflight: 0,
            writes_waiting: 0,
            flushes_uncompleted: 0,
            capacity_blocked: false,
            capacity_retry_at_ns: 0,
            capacity_gate: Gate::LogCapacity,
            deficit_bytes: 0,
            limiter: Limiter::default(),
            rate_retry_at_ns: None,
            write_rate_ready_ns: 0,
            counters: ImageCounters::default(),
            scratch_writes: Vec::new(),
            scratch_reads: Vec::new(),
        }
    }

    pub(crate) fn submit(&mut self, desc: Descriptor, now_ns: u64) -> Result<Ticket, Error> {
        desc.validate()?;
        if self.by_request.contains_key(&desc.request) {
            return Err(Error::DuplicateRequest { image: self.image, request: desc.request });
        }
        if self.entries.len() >= self.limit {
            self.counters.refused_submits += 1;
            return Err(Error::Full { image: self.image, limit: self.limit });
        }
        let ticket = Ticket(self.next_ticket);
        self.next_ticket += 1;
        // Behind an uncompleted FLUSH a request is not scanned until the
        // FLUSH completes, so its gate is known now.
        let gate = (self.flushes_uncompleted > 0).then_some(Gate::FlushBarrier);
        let entry = Entry {
            desc,
            state: State::Waiting,
            arrival_ns: now_ns,
            track: GateTrack::new(now_ns, gate),
            charged: false,
        };
        self.entries.insert(ticket, entry);
        self.by_request.insert(desc.request, ticket);
        match desc.op {
            Op::Flush => self.flushes_uncompleted += 1,
            op if op.is_write_kind() => self.writes_waiting += 1,
            _ => {}
        }
        self.counters.submitted_requests += 1;
        Ok(ticket)
    }

    /// The oldest admissible request, observing the gate of every waiting
    /// request passed on the way.
    pub(crate) fn scan(&mut self, now_ns: u64, limits: ScanLimits) -> Option<Pick> {
        let mut writes = std::mem::take(&mut self.scratch_writes);
        let mut reads = std::mem::take(&mut self.scratch_reads);
        writes.clear();
        reads.clear();
        let capacity_waits = self.capacity_blocked && now_ns < self.capacity_retry_at_ns;
        let mut older_uncompleted = false;
        let mut older_waiting = false;
        // The gate of the oldest waiting write; later writes queue behind it.
        let mut write_queue_gate: Option<Gate> = None;
        // A read is held by the rate limit: later reads queue behind it.
        let mut read_rate_held = false;
        let mut rate_retry_at_ns: Option<u64> = None;
        let mut write_rate_ready_ns = 0;
        let mut pick = None;
        for (&ticket, entry) in self.entries.iter_mut().take(limits.window) {
            let desc = entry.desc;
            if desc.op == Op::Flush {
                if entry.state == State::Waiting {
                    if older_uncompleted {
                        entry.track.observe(now_ns, Gate::FlushBarrier);
                    } else {
                        pick = Some(Pick { ticket, desc, passed_blocked_head: false });
                    }
                }
                // Nothing younger than an uncompleted FLUSH may pass it.
                break;
            }
            let range = desc.range().expect("a data request has a range");
            let hits = |seen: &[(u64, u64)]| seen.iter().any(|&r| overlaps(r, range));
            if entry.state == State::Waiting {
                // When this request's class has tokens for it, if later.
                let mut rate_held = || match self.limiter.ready_at_ns(desc.op, desc.cost_bytes()) {
                    Some(ready_ns) if ready_ns > now_ns && !entry.charged => {
                        rate_retry_at_ns = Some(rate_retry_at_ns.map_or(ready_ns, |r| r.min(ready_ns)));
                        Some(ready_ns)
                    }
                    _ => None,
                };
                let gate = if desc.op == Op::Read {
                    if hits(&writes) {
                        Some(Gate::Overlap)
                    } else if read_rate_held || rate_held().is_some() {
                        read_rate_held = true;
                        Some(Gate::RateLimit)
                    } else if self.reads_inflight >= limits.read_credits {
                        Some(Gate::ReadCredits)
                    } else {
                        None
                    }
                } else if let Some(gate) = write_queue_gate {
                    Some(gate)
                } else if hits(&writes) || hits(&reads) {
                    Some(Gate::Overlap)
                } else if let Some(ready_ns) = rate_held() {
                    write_rate_ready_ns = ready_ns;
                    Some(Gate::RateLimit)
                } else if !limits.write_slot_free {
                    Some(Gate::SchedulerTurn)
                } else if capacity_waits {
                    Some(self.capacity_gate)
                } else {
                    None
                };
                let Some(gate) = gate else {
                    pick = Some(Pick { ticket, desc, passed_blocked_head: older_waiting });
                    break;
                };
                entry.track.observe(now_ns, gate);
                if desc.op.is_write_kind() {
                    write_queue_gate = Some(gate);
                }
                older_waiting = true;
            }
            older_uncompleted = true;
            if desc.op == Op::Read {
                reads.push(range);
            } else {
                writes.push(range);
            }
        }
        self.scratch_writes = writes;
        self.scratch_reads = reads;
        self.rate_retry_at_ns = rate_retry_at_ns;
        self.write_rate_ready_ns = write_rate_ready_ns;
        pick
    }

    /// The engine refused `ticket`'s reservation at `gate` (the log's
    /// quota or the store's space reserve): hold this image's writes until
    /// a wake or `now + retry_ns`, so later scans pass over them to the
    /// image's reads (the refused ticket goes to the back of the line).
    pub(crate) fn refuse(&mut self, ticket: Ticket, now_ns: u64, retry_ns: u64, gate: Gate) {
        let entry = self.entries.get_mut(&ticket).expect("a refused ticket is retained");
        entry.track.observe(now_ns, gate);
        self.capacity_gate = gate;
        self.capacity_blocked = true;
        self.capacity_retry_at_ns = now_ns.saturating_add(retry_ns);
        self.counters.refused_turns += 1;
    }

    /// Moves `ticket` in flight and records its admission.
    pub(crate) fn admit(&mut self, pick: Pick, now_ns: u64) -> Admitted {
        let entry = self.entries.get_mut(&pick.ticket).expect("a picked ticket is retained");
        assert_eq!(entry.state, State::Waiting, "ticket {:?} admitted twice", pick.ticket);
        entry.state = State::InFlight;
        self.inflight += 1;
        let waits = entry.track.finish(now_ns);
        let wait_ns = now_ns.saturating_sub(entry.arrival_ns);
        let arrival_ns = entry.arrival_ns;
        if !entry.charged {
            entry.charged = true;
            self.limiter.charge(pick.desc.op, pick.desc.cost_bytes(), now_ns);
        }
        match pick.desc.op {
            Op::Read => self.reads_inflight += 1,
            Op::Flush => {}
            _ => {
                self.writes_waiting -= 1;
                self.writes_inflight += 1;
                // A reservation succeeded: the log has room again.
                self.capacity_blocked = false;
            }
        }
        let c = &mut self.counters;
        c.admitted_requests += 1;
        c.gate_wait_ns_total.accumulate(&waits);
        c.rate_limited_admissions += u64::from(waits.rate_limit_ns > 0);
        if pick.desc.op == Op::Read && pick.passed_blocked_head {
            c.reads_passed_blocked_head += 1;
            c.independent_read_wait_ns_max = c.independent_read_wait_ns_max.max(wait_ns);
        } else {
            c.ordinary_head_wait_ns_max = c.ordinary_head_wait_ns_max.max(wait_ns);
        }
        Admitted { arrival_ns, waits }
    }

    /// Puts an admitted read back to waiting, in its original place in the
    /// arrival order: it was admitted to be served in place and could not
    /// be. Its admission wait restarts from its arrival, so the gate waits
    /// of its eventual dispatch still add up to `admitted - arrival`.
    pub(crate) fn requeue(&mut self, request: RequestId) -> Result<(), Error> {
        let image = self.image;
        let &ticket = self.by_request.get(&request).ok_or(Error::UnknownRequest { image, request })?;
        let entry = self.entries.get_mut(&ticket).expect("the request index points at a retained entry");
        if entry.state != State::InFlight {
            return Err(Error::NotDispatched { image, request });
        }
        if entry.desc.op != Op::Read {
            return Err(Error::NotARead { image, request });
        }
        entry.state = State::Waiting;
        entry.track = GateTrack::new(entry.arrival_ns, None);
        self.inflight -= 1;
        self.reads_inflight -= 1;
        let c = &mut self.counters;
        c.admitted_requests -= 1;
        c.reads_in_place -= 1;
        c.reads_requeued += 1;
        Ok(())
    }

    pub(crate) fn count_in_place(&mut self) {
        self.counters.reads_in_place += 1;
    }

    pub(crate) fn count_write_in_place(&mut self) {
        self.counters.writes_in_place += 1;
    }

    /// Forgets a completed request; returns its op.
    pub(crate) fn complete(&mut self, request: RequestId) -> Result<Op, Error> {
        let image = self.image;
        let &ticket = self.by_request.get(&request).ok_or(Error::UnknownRequest { image, request })?;
        let entry = self.entries.get(&ticket).expect("the request index points at a retained entry");
        if entry.state != State::InFlight {
            return Err(Error::NotDispatched { image, request });
        }
        let op = entry.desc.op;
        self.entries.remove(&ticket);
        self.by_request.remove(&request);
        self.inflight -= 1;
        match op {
            Op::Read => self.reads_inflight -= 1,
            Op::Flush => self.flushes_uncompleted -= 1,
            _ => self.writes_inflight -= 1,
        }
        self.counters.completed_requests += 1;
        Ok(op)
    }

    /// A reclamation wake: refused writes may try again at once. Returns
    /// whether writes were held.
    pub(crate) fn capacity_released(&mut self) -> bool {
        let held = self.capacity_blocked && self.writes_waiting > 0;
        self.capacity_blocked = false;
        held
    }

    /// When, after `now_ns`, this image next retries a refused write, or a
    /// request held by its limits conforms (as of the last scan), without a
    /// wake. A deadline already past is no deadline: its request is held
    /// by another gate now, whose release wakes a worker.
    pub(crate) fn retry_at_ns(&self, now_ns: u64) -> Option<u64> {
        let capacity =
            (self.capacity_blocked && self.writes_waiting > 0).then_some(self.capacity_retry_at_ns);
        [capacity, self.rate_retry_at_ns].into_iter().flatten().filter(|&t| t > now_ns).min()
    }

    /// Applies new limits from `now_ns` (see [`Limiter::set`]).
    pub(crate) fn set_limits(&mut self, limits: Limits, now_ns: u64) {
        self.limiter.set(limits, now_ns);
        // Held requests are looked at again by the next scan.
        self.rate_retry_at_ns = None;
        self.write_rate_ready_ns = 0;
    }

    pub(crate) fn limits(&self) -> Limits {
        self.limiter.limits()
    }

    /// Writes of this image wait and, as of the last scan, are not all
    /// held by its write limit at `now_ns`: they compete for write slots.
    pub(crate) fn writes_competing(&self, now_ns: u64) -> bool {
        self.writes_waiting > 0 && self.write_rate_ready_ns <= now_ns
    }

    pub(crate) fn inflight(&self) -> usize {
        self.inflight
    }

    /// Write-kind requests of this image in flight now.
    pub(crate) fn writes_inflight(&self) -> u32 {
        self.writes_inflight
    }

    /// Drops every waiting descriptor (image removal, with nothing in
    /// flight); returns them oldest first so the caller can fail them.
    pub(crate) fn drain_waiting(&mut self) -> Vec<Descriptor> {
        assert_eq!(self.inflight, 0, "draining image {} with requests in flight", self.image);
        let waiting: Vec<Ticket> =
            self.entries.iter().filter(|(_, e)| e.state == State::Waiting).map(|(&t, _)| t).collect();
        let mut out = Vec::with_capacity(waiting.len());
        for ticket in waiting {
            let entry = self.entries.remove(&ticket).expect("listed above");
            self.by_request.remove(&entry.desc.request);
            out.push(entry.desc);
        }
        self.writes_waiting = 0;
        self.flushes_uncompleted = 0;
        out
    }

    pub(crate) fn counters(&self) -> ImageCounters {
        ImageCounters {
            pending_requests: (self.entries.len() - self.inflight) as u64,
            inflight_requests: self.inflight as u64,
            limits: LimitCounters::from(self.limiter.limits()),
            ..self.counters
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DESCRIPTOR_SLOT_BYTES;

    #[test]
    fn a_retained_descriptor_fits_its_quota_charge() {
        // Entry + its map key + its index row, with room for map nodes.
        let direct = std::mem::size_of::<Entry>()
            + std::mem::size_of::<Ticket>()
            + std::mem::size_of::<(RequestId, Ticket)>();
        assert!(
            (direct as u64) * 3 / 2 <= DESCRIPTOR_SLOT_BYTES,
            "entry costs {direct} bytes before overhead; raise DESCRIPTOR_SLOT_BYTES"
        );
    }
}
