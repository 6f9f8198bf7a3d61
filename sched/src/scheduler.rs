//! The single-threaded, deterministic scheduler: one frontier per image,
//! shared service across images by deficit round robin (DRR) over bytes.
//!
//! ```text
//!   ring of images (front = the image being visited)
//!   +---------+---------+---------+
//!   | image 3 | image 1 | image 7 |  <- rotate when the visit ends
//!   | def 1M  | def 0   | def 256K|
//!   +---------+---------+---------+
//!   visit: deficit += quantum (once), then admit the image's oldest
//!   admissible request while its cost fits the deficit.
//!   A write the log refuses is held (gate LogCapacity) and the same visit
//!   goes on to the image's next admissible request, typically a read.
//!   No admissible request: deficit = 0, next image.
//! ```
//!
//! A request dearer than one quantum waits for several rounds. When a whole
//! round admits nothing because every candidate is still too dear, the empty
//! rounds are played at once (each such image gets the same whole number of
//! quanta), so one `next` call does at most `(images + 2) * images + 1`
//! visits (`2 * images + 1` unless logs refuse), each one a scan bounded by
//! `scan_window`.

use std::collections::{HashMap, VecDeque};

use crate::capacity::Capacity;
use crate::clock::Clock;
use crate::config::Config;
use crate::counters::ImageCounters;
use crate::descriptor::{Descriptor, ImageId, Op, RequestId, Ticket};
use crate::error::Error;
use crate::frontier::{Frontier, Pick, ScanLimits};
use crate::rate::Limits;
use crate::waits::GateWaits;

/// An admitted request, for a worker to execute.
#[derive(Debug)]
pub struct Dispatch<R> {
    pub image: ImageId,
    pub request: RequestId,
    pub ticket: Ticket,
    pub op: Op,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    /// The log reservation of a write-kind request; `None` for READ / FLUSH.
    pub reservation: Option<R>,
    pub arrival_ns: u64,
    pub admitted_ns: u64,
    /// Where `admitted_ns - arrival_ns` went, per gate.
    pub waits: GateWaits,
    /// A read admitted while an older request of its image still waited.
    pub passed_blocked_head: bool,
}

impl<R> Dispatch<R> {
    pub fn admission_wait_ns(&self) -> u64 {
        self.admitted_ns.saturating_sub(self.arrival_ns)
    }

    /// Records this dispatch in the request's trace: each gate it waited
    /// on, with its wait, then the admitted and dispatched marks at
    /// `now_ns` (the trace's clock; the scheduler's may differ).
    pub fn record_into(&self, trace: &mut trace::RequestTrace, now_ns: u64) {
        for (gate, wait_ns) in self.waits.iter() {
            if wait_ns > 0 {
                trace.add_wait(gate, wait_ns);
            }
        }
        trace.admitted(now_ns);
        trace.dispatched(now_ns);
    }
}

/// What [`Scheduler::submit_read_in_place`] did with a read.
#[derive(Debug)]
pub enum InPlace<R> {
    /// Admitted: the caller serves it now.
    Admitted(Dispatch<R>),
    /// Retained and waiting, like a [`Scheduler::submit`]: a worker serves it.
    Queued(Ticket),
}

/// See the module documentation.
pub struct Scheduler<C: Clock> {
    clock: C,
    /// The latest time handed out: [`Scheduler::tick`] never goes below it.
    last_ns: u64,
    config: Config,
    images: HashMap<ImageId, Frontier>,
    ring: VecDeque<ImageId>,
    /// The front image already got its quantum for the current visit.
    visit_open: bool,
    writes_inflight: u32,
}

impl<C: Clock> Scheduler<C> {
    pub fn new(config: Config, clock: C) -> Result<Self, Error> {
        config.validate()?;
        Ok(Scheduler {
            clock,
            last_ns: 0,
            config,
            images: HashMap::new(),
            ring: VecDeque::new(),
            visit_open: false,
            writes_inflight: 0,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The scheduler's clock, in the unit of every `_ns` it reports.
    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns().max(self.last_ns)
    }

    /// The clock, but never earlier than a time already handed out. The
    /// trace clock reads the TSC unfenced, so two threads calling in turn
    /// under the caller's lock can see it step back by tens of
    /// nanoseconds (CI saw 95 ns); a gate interval observed at the later
    /// reading would then end after the dispatch that closes it, and the
    /// waits would no longer add up to the admission wait.
    fn tick(&mut self) -> u64 {
        self.last_ns = self.last_ns.max(self.clock.now_ns());
        self.last_ns
    }

    pub fn add_image(&mut self, image: ImageId) -> Result<(), Error> {
        if self.images.contains_key(&image) {
            return Err(Error::ImageExists(image));
        }
        self.images.insert(image, Frontier::new(image, &self.config));
        self.ring.push_back(image);
        Ok(())
    }

    /// Removes an image with nothing in flight. Returns its waiting
    /// descriptors, oldest first, for the caller to fail.
    pub fn remove_image(&mut self, image: ImageId) -> Result<Vec<Descriptor>, Error> {
        let frontier = self.images.get_mut(&image).ok_or(Error::UnknownImage(image))?;
        if frontier.inflight() > 0 {
            return Err(Error::ImageBusy { image, inflight: frontier.inflight() });
        }
        let waiting = frontier.drain_waiting();
        self.images.remove(&image);
        let at = self.ring.iter().position(|&i| i == image).expect("every image is on the ring");
        if at == 0 {
            self.visit_open = false;
        }
        self.ring.remove(at);
        Ok(waiting)
    }

    /// Retains a descriptor snapshot. Never blocks; [`Error::Full`] is
    /// back-pressure (the caller keeps the request and retries after a
    /// completion).
    pub fn submit(&mut self, image: ImageId, desc: Descriptor) -> Result<Ticket, Error> {
        let now_ns = self.tick();
        let frontier = self.images.get_mut(&image).ok_or(Error::UnknownImage(image))?;
        frontier.submit(desc, now_ns)
    }

    /// Retains a READ and admits it at once if it is the request a scan of
    /// its image picks now: no older uncompleted overlapping write-kind
    /// request or FLUSH, a read credit free, and no older admissible
    /// request of the image still waiting for a worker. The caller serves
    /// it on its own thread, outside the worker pool, so DRR does not
    /// charge it to the image's deficit (the deficits share the workers);
    /// it holds a read credit and orders later requests like any admitted
    /// read, and ends with [`Scheduler::complete`], or with
    /// [`Scheduler::requeue`] if it cannot be served in place after all.
    pub fn submit_read_in_place<R>(&mut self, image: ImageId, desc: Descriptor) -> Result<InPlace<R>, Error> {
        if desc.op != Op::Read {
            return Err(Error::NotARead { image, request: desc.request });
        }
        let now_ns = self.tick();
        let limits = self.scan_limits();
        let frontier = self.images.get_mut(&image).ok_or(Error::UnknownImage(image))?;
        let ticket = frontier.submit(desc, now_ns)?;
        match frontier.scan(now_ns, limits) {
            Some(pick) if pick.ticket == ticket => {
                frontier.count_in_place();
                Ok(InPlace::Admitted(self.admit(image, pick, None, now_ns)))
            }
            _ => Ok(InPlace::Queued(ticket)),
        }
    }

    /// Retains a write-kind request and admits it at once, with its log
    /// reservation from `cap`, if it is the request a scan of its image
    /// picks now (no older uncompleted overlapping request or FLUSH, a write
    /// slot free), no other write of its image is in flight, and no other
    /// image has a write waiting. The caller executes it on its own thread:
    /// for a log whose writes are memory copies, the hand-off to a worker
    /// and back costs more than the write.
    ///
    /// The two extra conditions keep the caller from waiting and keep DRR
    /// fair. With no earlier write of the image in flight, making the
    /// caller's write visible never waits for another thread's append. Write slots are
    /// shared by every image and DRR shares them out, while a write in
    /// place is not charged to a deficit: admitting it only when no other
    /// image's write waits means it never takes a slot DRR would give
    /// elsewhere. It holds its write slot until [`Scheduler::complete`] and
    /// orders later requests like any admitted write. A refused reservation
    /// holds it like any capacity-refused write (`Queued`: a worker serves
    /// it once capacity returns).
    pub fn submit_write_in_place<K: Capacity + ?Sized>(
        &mut self,
        image: ImageId,
        desc: Descriptor,
        cap: &mut K,
    ) -> Result<InPlace<K::Reservation>, Error> {
        if !desc.op.is_write_kind() {
            return Err(Error::NotAWrite { image, request: desc.request });
        }
        let now_ns = self.tick();
        let limits = self.scan_limits();
        let retry_ns = self.config.capacity_retry_ns;
        // Writes held by their image's limit do not compete for a slot.
        let others_wait = self.images.iter().any(|(&id, f)| id != image && f.writes_competing(now_ns));
        let frontier = self.images.get_mut(&image).ok_or(Error::UnknownImage(image))?;
        let ticket = frontier.submit(desc, now_ns)?;
        if others_wait || frontier.writes_inflight() > 0 {
            return Ok(InPlace::Queued(ticket));
        }
        match frontier.scan(now_ns, limits) {
            Some(pick) if pick.ticket == ticket => match cap.try_reserve(image, desc.op, desc.len_bytes) {
                Ok(r) => {
                    frontier.count_write_in_place();
                    Ok(InPlace::Admitted(self.admit(image, pick, Some(r), now_ns)))
                }
                Err(gate) => {
                    frontier.refuse(ticket, now_ns, retry_ns, gate);
                    Ok(InPlace::Queued(ticket))
                }
            },
            _ => Ok(InPlace::Queued(ticket)),
        }
    }

    /// Hands a read admitted by [`Scheduler::submit_read_in_place`] back:
    /// it waits again in its arrival place, for a worker's
    /// [`Scheduler::next`].
    pub fn requeue(&mut self, image: ImageId, request: RequestId) -> Result<(), Error> {
        self.images.get_mut(&image).ok_or(Error::UnknownImage(image))?.requeue(request)
    }

    /// The next admitted request, or `None` when nothing is admissible now.
    /// Write-kind requests get their log reservation from `cap` here; a
    /// refusal holds the write (never fails it).
    pub fn next<K: Capacity + ?Sized>(&mut self, cap: &mut K) -> Option<Dispatch<K::Reservation>> {
        let now_ns = self.tick();
        let quantum = self.config.quantum_bytes;
        let images = self.ring.len();
        // Images whose oldest admissible request costs more than their
        // deficit in this round, and the fewest extra rounds any needs.
        let mut short: Vec<ImageId> = Vec::new();
        let mut short_rounds_min = u64::MAX;
        let mut round_visits = 0;
        // Every round without a dispatch either finds nothing admissible
        // (return) or fast-forwards so that the next round can afford a
        // request; that one is dispatched unless the log refuses it, which
        // holds the image's writes for the rest of this call. Hence at most
        // `images + 2` rounds.
        for _visit in 0..((images + 2) * images + 1) {
            let &image = self.ring.front()?;
            let limits = self.scan_limits();
            let frontier = self.images.get_mut(&image).expect("every image on the ring is registered");
            if !self.visit_open {
                frontier.deficit_bytes = frontier.deficit_bytes.saturating_add(quantum);
                self.visit_open = true;
            }
            // At most one refusal per visit: it holds the image's writes.
            let mut picked = frontier.scan(now_ns, limits);
            let mut reservation = None;
            while let Some(pick) = picked {
                if pick.desc.cost_bytes() > frontier.deficit_bytes || !pick.desc.op.is_write_kind() {
                    break;
                }
                match cap.try_reserve(image, pick.desc.op, pick.desc.len_bytes) {
                    Ok(r) => {
                        reservation = Some(r);
                        break;
                    }
                    Err(gate) => {
                        frontier.refuse(pick.ticket, now_ns, self.config.capacity_retry_ns, gate);
                        picked = frontier.scan(now_ns, limits);
                    }
                }
            }
            match picked {
                Some(pick) if pick.desc.cost_bytes() <= frontier.deficit_bytes => {
                    frontier.deficit_bytes -= pick.desc.cost_bytes();
                    return Some(self.admit(image, pick, reservation, now_ns));
                }
                Some(pick) => {
                    // Not affordable yet: keep the deficit for a later round.
                    let shortfall = pick.desc.cost_bytes() - frontier.deficit_bytes;
                    short_rounds_min = short_rounds_min.min(shortfall.div_ceil(quantum));
                    short.push(image);
                }
                None => frontier.deficit_bytes = 0,
            }
            self.ring.rotate_left(1);
            self.visit_open = false;
            round_visits += 1;
            if round_visits == images {
                if short.is_empty() {
                    return None; // a whole round found nothing admissible
                }
                // A whole round admitted nothing because every candidate was
                // too dear, and nothing changes until this call returns: play
                // the empty rounds at once (each short image gets the same
                // quanta), so the next top-up makes one affordable.
                let skipped = (short_rounds_min - 1).saturating_mul(quantum);
                for image in short.drain(..) {
                    let frontier = self.images.get_mut(&image).expect("a short image is registered");
                    frontier.deficit_bytes = frontier.deficit_bytes.saturating_add(skipped);
                }
                short_rounds_min = u64::MAX;
                round_visits = 0;
            }
        }
        unreachable!("DRR found neither a dispatch nor an idle round in {} visits", (images + 2) * images + 1)
    }

    fn scan_limits(&self) -> ScanLimits {
        ScanLimits {
            read_credits: self.config.read_credits,
            write_slot_free: self.writes_inflight < self.config.write_slots,
            window: self.config.scan_window as usize,
        }
    }

    fn admit<R>(&mut self, image: ImageId, pick: Pick, reservation: Option<R>, now_ns: u64) -> Dispatch<R> {
        let frontier = self.images.get_mut(&image).expect("admitting into a registered image");
        let admitted = frontier.admit(pick, now_ns);
        if pick.desc.op.is_write_kind() {
            assert!(reservation.is_some(), "write-kind request admitted without a log reservation");
            self.writes_inflight += 1;
        }
        Dispatch {
            image,
            request: pick.desc.request,
            ticket: pick.ticket,
            op: pick.desc.op,
            offset_bytes: pick.desc.offset_bytes,
            len_bytes: pick.desc.len_bytes,
            reservation,
            arrival_ns: admitted.arrival_ns,
            admitted_ns: now_ns,
            waits: admitted.waits,
            passed_blocked_head: pick.passed_blocked_head,
        }
    }

    /// A worker finished `request`: it stops ordering later requests and
    /// frees its read credit or write slot.
    pub fn complete(&mut self, image: ImageId, request: RequestId) -> Result<(), Error> {
        let frontier = self.images.get_mut(&image).ok_or(Error::UnknownImage(image))?;
        if frontier.complete(request)?.is_write_kind() {
            self.writes_inflight -= 1;
        }
        Ok(())
    }

    /// The engine reclaimed log space of `image`: its held writes may try
    /// again at once. Returns whether writes were held (whether the wake can
    /// change anything). Unknown images are ignored (a late wake after
    /// removal).
    pub fn capacity_released(&mut self, image: ImageId) -> bool {
        self.images.get_mut(&image).is_some_and(Frontier::capacity_released)
    }

    /// Whether some image has a request that [`Scheduler::next`] would try
    /// now, ignoring DRR deficits and log refusals. The thread-safe wrapper
    /// uses it to wake one more worker after a dispatch.
    pub fn has_candidate(&mut self) -> bool {
        let now_ns = self.tick();
        let limits = self.scan_limits();
        self.images.values_mut().any(|f| f.scan(now_ns, limits).is_some())
    }

    /// Sets `image`'s IO limits from now: a newly limited class starts
    /// with a full burst, a changed one keeps its debt (never a free
    /// burst), a removed one admits its held requests at the next scan.
    pub fn set_limits(&mut self, image: ImageId, limits: Limits) -> Result<(), Error> {
        limits.validate()?;
        let now_ns = self.tick();
        self.images.get_mut(&image).ok_or(Error::UnknownImage(image))?.set_limits(limits, now_ns);
        Ok(())
    }

    pub fn limits(&self, image: ImageId) -> Option<Limits> {
        self.images.get(&image).map(Frontier::limits)
    }

    /// The earliest time still to come at which a held write is retried,
    /// or a request held by an IO limit conforms, without a wake; callers
    /// with nothing else to wake them call [`Scheduler::next`] again by
    /// then.
    pub fn next_retry_at_ns(&self) -> Option<u64> {
        let now_ns = self.now_ns();
        self.images.values().filter_map(|f| f.retry_at_ns(now_ns)).min()
    }

    pub fn counters(&self, image: ImageId) -> Option<ImageCounters> {
        self.images.get(&image).map(Frontier::counters)
    }

    /// Registered images in ring order.
    pub fn images(&self) -> impl Iterator<Item = ImageId> + '_ {
        self.ring.iter().copied()
    }

    /// Write-kind requests in flight across all images.
    pub fn writes_inflight(&self) -> u32 {
        self.writes_inflight
    }
}

impl<C: Clock> std::fmt::Debug for Scheduler<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("config", &self.config)
            .field("ring", &self.ring)
            .field("writes_inflight", &self.writes_inflight)
            .finish_non_exhaustive()
    }
}
