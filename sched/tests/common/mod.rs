//! Test support: a fake log ([`FakeLog`]) and an independent, brute-force
//! model of the ordering contract ([`Contract`]) that checks every dispatch.
#![allow(dead_code)] // each test binary uses a different part

use std::collections::{BTreeMap, HashMap};

use sched::{Capacity, Config, Descriptor, Dispatch, FakeClock, Gate, ImageId, Op, RequestId, Scheduler};

/// Log bytes a fake write-kind request needs: its length for WRITE, one
/// 512-byte record for WRITE_ZEROES / DISCARD.
pub fn log_bytes_needed(op: Op, len_bytes: u64) -> u64 {
    match op {
        Op::Write => len_bytes,
        Op::WriteZeroes | Op::Discard => 512,
        Op::Read | Op::Flush => 0,
    }
}

#[derive(Debug)]
pub struct FakeReservation {
    pub image: ImageId,
    pub log_bytes: u64,
}

/// Per-image log quotas. Reservations take bytes; the test releases them.
#[derive(Debug, Default)]
pub struct FakeLog {
    pub free_bytes: HashMap<ImageId, u64>,
    pub refusals: u64,
    pub reservations: u64,
}

impl FakeLog {
    pub fn with(images: &[(ImageId, u64)]) -> Self {
        FakeLog { free_bytes: images.iter().copied().collect(), ..FakeLog::default() }
    }

    pub fn release(&mut self, image: ImageId, log_bytes: u64) {
        *self.free_bytes.get_mut(&image).expect("releasing into a known image") += log_bytes;
    }
}

impl Capacity for FakeLog {
    type Reservation = FakeReservation;

    fn try_reserve(&mut self, image: ImageId, op: Op, len_bytes: u64) -> Result<FakeReservation, Gate> {
        assert!(op.is_write_kind(), "sched asked a {op:?} for log capacity");
        let need = log_bytes_needed(op, len_bytes);
        let free = self.free_bytes.get_mut(&image).expect("reserving in a known image");
        if *free < need {
            self.refusals += 1;
            return Err(Gate::LogCapacity);
        }
        *free -= need;
        self.reservations += 1;
        Ok(FakeReservation { image, log_bytes: need })
    }
}

pub fn scheduler(config: Config) -> (Scheduler<FakeClock>, FakeClock) {
    let clock = FakeClock::new();
    (Scheduler::new(config, clock.clone()).expect("valid config"), clock)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Waiting,
    InFlight,
}

#[derive(Clone, Copy, Debug)]
struct Req {
    desc: Descriptor,
    stage: Stage,
}

/// The ordering contract, restated without sched's data structures: every
/// uncompleted request of an image by arrival number, with its stage.
#[derive(Debug, Default)]
pub struct Contract {
    images: HashMap<ImageId, BTreeMap<u64, Req>>,
    index: HashMap<(ImageId, RequestId), u64>,
    arrivals: u64,
    writes_inflight: usize,
    pub read_credits: usize,
    pub write_slots: usize,
    /// Check only the rules that depend on completions (overlap, FLUSH).
    /// Threaded tests record a dispatch after the scheduler made it, so two
    /// workers can record theirs out of order; completions are recorded
    /// before the scheduler learns of them, so those rules stay exact.
    pub relaxed: bool,
}

fn range(d: &Descriptor) -> (u64, u64) {
    (d.offset_bytes, d.offset_bytes + d.len_bytes)
}

fn overlap(a: &Descriptor, b: &Descriptor) -> bool {
    let (a, b) = (range(a), range(b));
    a.0 < b.1 && b.0 < a.1
}

impl Contract {
    pub fn new(config: &Config) -> Self {
        Contract {
            read_credits: config.read_credits as usize,
            write_slots: config.write_slots as usize,
            ..Contract::default()
        }
    }

    pub fn submitted(&mut self, image: ImageId, desc: Descriptor) {
        self.arrivals += 1;
        self.images.entry(image).or_default().insert(self.arrivals, Req { desc, stage: Stage::Waiting });
        self.index.insert((image, desc.request), self.arrivals);
    }

    /// Why `reqs[at]` may not be dispatched now (ignoring log capacity and
    /// DRR), or `None` if the contract allows it.
    fn blocker(&self, image: ImageId, at: u64) -> Option<String> {
        let reqs = &self.images[&image];
        let me = reqs[&at].desc;
        for (i, earlier) in reqs.range(..at) {
            let e = earlier.desc;
            let why = if me.op == Op::Flush {
                Some("FLUSH before an earlier request completed")
            } else if e.op == Op::Flush {
                Some("passed an uncompleted FLUSH")
            } else if me.op == Op::Read && e.op.is_write_kind() && overlap(&me, &e) {
                Some("read passed an uncompleted overlapping write")
            } else if !self.relaxed
                && me.op.is_write_kind()
                && e.op.is_write_kind()
                && earlier.stage == Stage::Waiting
            {
                Some("write passed an earlier waiting write (FIFO)")
            } else if me.op.is_write_kind() && overlap(&me, &e) {
                Some("write passed an uncompleted overlapping request")
            } else {
                None
            };
            if let Some(why) = why {
                return Some(format!("{why}: {:?} (#{at}) vs {:?} (#{i}) {:?}", me, e, earlier.stage));
            }
        }
        if self.relaxed {
            return None;
        }
        if me.op == Op::Read {
            let reads = reqs.values().filter(|r| r.desc.op == Op::Read && r.stage == Stage::InFlight).count();
            if reads >= self.read_credits {
                return Some(format!("read credits exhausted ({reads} in flight)"));
            }
        }
        if me.op.is_write_kind() && self.writes_inflight >= self.write_slots {
            return Some("write slots exhausted".to_string());
        }
        None
    }

    /// Checks a dispatch against the contract; panics with the reason.
    pub fn dispatched<R: std::fmt::Debug>(&mut self, d: &Dispatch<R>) {
        let at = self.index[&(d.image, d.request)];
        let req = self.images[&d.image][&at];
        assert_eq!(req.stage, Stage::Waiting, "{:?} dispatched twice", d.request);
        assert_eq!(
            (req.desc.op, req.desc.offset_bytes, req.desc.len_bytes),
            (d.op, d.offset_bytes, d.len_bytes)
        );
        assert_eq!(d.op.is_write_kind(), d.reservation.is_some(), "reservation iff write-kind: {d:?}");
        if let Some(why) = self.blocker(d.image, at) {
            panic!("ordering contract violated on image {}: {why}", d.image);
        }
        assert_eq!(d.waits.total_ns(), d.admission_wait_ns(), "gate waits must add up: {d:?}");
        self.images.get_mut(&d.image).and_then(|r| r.get_mut(&at)).expect("known request").stage =
            Stage::InFlight;
        self.writes_inflight += usize::from(d.op.is_write_kind());
    }

    pub fn completed(&mut self, image: ImageId, request: RequestId) {
        let at = self.index.remove(&(image, request)).expect("completing a known request");
        let req = self.images.get_mut(&image).and_then(|r| r.remove(&at)).expect("known request");
        assert_eq!(req.stage, Stage::InFlight, "{request} completed before its dispatch");
        self.writes_inflight -= usize::from(req.desc.op.is_write_kind());
    }

    /// Whether an older request of `request`'s image is still waiting.
    pub fn older_waiting(&self, image: ImageId, request: RequestId) -> bool {
        let at = self.index[&(image, request)];
        self.images[&image].range(..at).any(|(_, r)| r.stage == Stage::Waiting)
    }

    /// An in-place read went back to waiting in its arrival place.
    pub fn requeued(&mut self, image: ImageId, request: RequestId) {
        let at = self.index[&(image, request)];
        let req = self.images.get_mut(&image).and_then(|r| r.get_mut(&at)).expect("known request");
        assert_eq!((req.desc.op, req.stage), (Op::Read, Stage::InFlight), "{request} requeued");
        req.stage = Stage::Waiting;
    }

    /// Waiting reads and FLUSHes the contract would admit now. Neither needs
    /// log capacity, so a work-conserving scheduler must not return `None`
    /// while one exists (the scan window aside).
    pub fn admissible_without_capacity(&self) -> Vec<(ImageId, Descriptor)> {
        let mut out = Vec::new();
        for (&image, reqs) in &self.images {
            for (&at, r) in reqs {
                if r.stage == Stage::Waiting
                    && !r.desc.op.is_write_kind()
                    && self.blocker(image, at).is_none()
                {
                    out.push((image, r.desc));
                }
            }
        }
        out
    }

    pub fn outstanding(&self) -> usize {
        self.images.values().map(BTreeMap::len).sum()
    }
}
