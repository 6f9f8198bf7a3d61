//! Per-image IO limits in the scheduler, in simulated time: the loops are
//! event-driven (when `next` finds nothing, the clock jumps to
//! `next_retry_at_ns`), so they also show the retry time is never early
//! (a jump always admits) and never late (the rate is met).

mod common;

use std::collections::BTreeMap;

use common::{scheduler, Contract, FakeLog};
use sched::{Clock, Config, Descriptor, FakeClock, Gate, ImageId, InPlace, Limits, Op, RateLimit, Scheduler};

const A: ImageId = ImageId(1);
const B: ImageId = ImageId(2);
const MIB: u64 = 1 << 20;
const SEC: u64 = 1_000_000_000;

fn read_iops(per_sec: u64) -> Limits {
    Limits { read_iops: Some(RateLimit::new(per_sec)), ..Limits::default() }
}

struct Sim {
    s: Scheduler<FakeClock>,
    clock: FakeClock,
    log: FakeLog,
    contract: Contract,
    next_id: u64,
    /// Admission times per image and op.
    admitted: BTreeMap<(ImageId, Op), Vec<u64>>,
}

impl Sim {
    fn new(images: &[ImageId]) -> Self {
        let config = Config::default();
        let (mut s, clock) = scheduler(config.clone());
        for &i in images {
            s.add_image(i).unwrap();
        }
        let log = FakeLog::with(&images.iter().map(|&i| (i, u64::MAX / 4)).collect::<Vec<_>>());
        Sim { s, clock, log, contract: Contract::new(&config), next_id: 0, admitted: BTreeMap::new() }
    }

    fn submit(&mut self, image: ImageId, op: Op, offset_bytes: u64, len_bytes: u64) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let d = match op {
            Op::Read => Descriptor::read(id, offset_bytes, len_bytes),
            Op::Write => Descriptor::write(id, offset_bytes, len_bytes),
            Op::Flush => Descriptor::flush(id),
            other => panic!("{other:?}"),
        };
        self.contract.submitted(image, d);
        self.s.submit(image, d).unwrap();
        id
    }

    /// Dispatches everything admissible now; completes each at once and
    /// calls `refill` for it. Returns the dispatches.
    fn drain_now(
        &mut self,
        mut refill: impl FnMut(&mut Sim, ImageId, Op),
    ) -> Vec<sched::Dispatch<common::FakeReservation>> {
        let mut out = Vec::new();
        while let Some(d) = self.s.next(&mut self.log) {
            self.contract.dispatched(&d);
            assert_eq!(d.waits.total_ns(), d.admission_wait_ns(), "{d:?}");
            self.admitted.entry((d.image, d.op)).or_default().push(d.admitted_ns);
            self.contract.completed(d.image, d.request);
            self.s.complete(d.image, d.request).unwrap();
            if let Some(r) = &d.reservation {
                self.log.release(d.image, r.log_bytes);
            }
            refill(self, d.image, d.op);
            out.push(d);
        }
        out
    }

    /// Jumps to the next retry deadline; false if there is none.
    fn jump(&mut self) -> bool {
        let now = self.clock.now_ns();
        match self.s.next_retry_at_ns() {
            Some(t) if t > now => {
                self.clock.advance_ns(t - now);
                true
            }
            _ => false,
        }
    }

    /// Runs until `until_ns` of simulated time, refilling as requests
    /// complete; every jump must admit something.
    fn run_until(&mut self, until_ns: u64, mut refill: impl FnMut(&mut Sim, ImageId, Op)) {
        loop {
            self.drain_now(&mut refill);
            let before = self.clock.now_ns();
            if !self.jump() || self.clock.now_ns() >= until_ns {
                self.clock.advance_ns(until_ns.saturating_sub(self.clock.now_ns()));
                self.drain_now(&mut refill);
                return;
            }
            let got = self.drain_now(&mut refill);
            assert!(
                !got.is_empty(),
                "a retry deadline at {} (from {before}) admitted nothing",
                self.clock.now_ns()
            );
        }
    }

    /// Keeps 32 4 KiB reads of `A` outstanding: submits them, and returns
    /// the refill that replaces each completed one.
    fn reads_32_deep(&mut self) -> impl FnMut(&mut Sim, ImageId, Op) + Copy {
        for i in 0..32 {
            self.submit(A, Op::Read, i * 4096, 4096);
        }
        |sim: &mut Sim, image: ImageId, _op: Op| {
            let id = sim.next_id;
            sim.submit(image, Op::Read, (id % 1000) * 4096, 4096);
        }
    }

    fn count(&self, image: ImageId, op: Op, from_ns: u64, to_ns: u64) -> usize {
        self.admitted
            .get(&(image, op))
            .map_or(0, |v| v.iter().filter(|&&t| t >= from_ns && t < to_ns).count())
    }
}

#[test]
fn iops_cap_is_met_every_second_and_the_burst_once() {
    let mut sim = Sim::new(&[A]);
    sim.s.set_limits(A, read_iops(500)).unwrap();
    let refill = sim.reads_32_deep();
    sim.run_until(60 * SEC, refill);
    let total = sim.count(A, Op::Read, 0, 60 * SEC);
    assert!((30_000..=30_000 + 50 + 1).contains(&total), "{total} reads in 60 s at 500 IOPS");
    assert_eq!(sim.count(A, Op::Read, 0, 1), 50, "the burst passes at once");
    for sec in 1..60 {
        let n = sim.count(A, Op::Read, sec * SEC, (sec + 1) * SEC);
        assert!((495..=505).contains(&n), "second {sec}: {n}");
    }
    let c = sim.s.counters(A).unwrap();
    assert_eq!(c.limits.read_iops, 500);
    assert_eq!(c.limits.read_iops_burst, 50);
    assert!(c.rate_limited_admissions > 29_000, "{c:?}");
    assert!(c.gate_wait_ns_total.get(Gate::RateLimit) > 0);
}

#[test]
fn bytes_cap_holds_small_requests_behind_a_large_one() {
    let mut sim = Sim::new(&[A]);
    let cap = Limits { write_bytes_per_sec: Some(RateLimit::new(20 * MIB)), ..Limits::default() };
    sim.s.set_limits(A, cap).unwrap();
    // Mixed sizes: 4 KiB and 512 KiB alternating, 16 deep, disjoint ranges.
    for i in 0..16 {
        sim.submit(A, Op::Write, i * MIB, if i.is_multiple_of(2) { 4096 } else { 512 << 10 });
    }
    let mut big = 0u64;
    let refill = move |sim: &mut Sim, image: ImageId, _op: Op| {
        let id = sim.next_id;
        big += 1;
        let len = if big.is_multiple_of(2) { 4096 } else { 512 << 10 };
        sim.submit(image, Op::Write, (id % 64) * MIB, len);
    };
    sim.run_until(30 * SEC, refill);
    let lens: u64 = sim.admitted[&(A, Op::Write)].len() as u64;
    assert!(lens > 200, "{lens} writes");
    // Bytes admitted each second after the first: 20 MiB within 1 MiB
    // (one 512 KiB request either way, plus the rounding of the window).
    let c = sim.s.counters(A).unwrap();
    assert_eq!(c.limits.write_bytes_per_sec, 20 * MIB);
    let per_sec_requests: Vec<usize> =
        (1..30).map(|s| sim.count(A, Op::Write, s * SEC, (s + 1) * SEC)).collect();
    // Half 4 KiB, half 512 KiB: 20 MiB/s is about 78 requests a second.
    for (s, &n) in per_sec_requests.iter().enumerate() {
        assert!((76..=81).contains(&n), "second {}: {n} requests ({per_sec_requests:?})", s + 1);
    }
}

#[test]
fn a_capped_image_never_holds_up_another() {
    let mut sim = Sim::new(&[A, B]);
    sim.s.set_limits(A, Limits { write_iops: Some(RateLimit::new(10)), ..read_iops(100) }).unwrap();
    for i in 0..64 {
        sim.submit(A, Op::Read, i * 4096, 4096);
        sim.submit(A, Op::Write, MIB + i * 4096, 4096);
    }
    sim.drain_now(|_, _, _| {}); // A's bursts
    for round in 0..50 {
        let ids: Vec<u64> = (0..8)
            .map(|i: u64| {
                sim.submit(B, if i.is_multiple_of(2) { Op::Read } else { Op::Write }, i * 4096, 4096)
            })
            .collect();
        let got = sim.drain_now(|_, _, _| {});
        let b: Vec<_> = got.iter().filter(|d| d.image == B).collect();
        assert_eq!(b.len(), ids.len(), "round {round}: B waited for A's limit");
        sim.clock.advance_ns(SEC / 1000);
    }
    let b = sim.s.counters(B).unwrap();
    assert_eq!(b.gate_wait_ns_total.get(Gate::RateLimit), 0);
    assert_eq!(b.rate_limited_admissions, 0);
    // A's writes are held by A's limit, so they do not compete with B's
    // for a write slot: B's write still goes in place.
    let d = Descriptor::write(10_000, 65 * MIB, 4096);
    sim.contract.submitted(B, d);
    let got = sim.s.submit_write_in_place(B, d, &mut sim.log).unwrap();
    assert!(matches!(got, InPlace::Admitted(_)), "{got:?}");
}

#[test]
fn a_capped_writer_keeps_reads_and_flush_order() {
    let mut sim = Sim::new(&[A]);
    sim.s
        .set_limits(A, Limits { write_iops: Some(RateLimit { per_sec: 10, burst: 1 }), ..Limits::default() })
        .unwrap();
    for i in 0..8 {
        sim.submit(A, Op::Write, i * 4096, 4096);
    }
    let first = sim.drain_now(|_, _, _| {});
    assert_eq!(first.len(), 1, "the burst of one");
    // A read elsewhere passes the held writes at once; one overlapping a
    // held write waits behind it.
    let free = sim.submit(A, Op::Read, 64 * MIB, 4096);
    let overlapping = sim.submit(A, Op::Read, 3 * 4096, 4096);
    let got = sim.drain_now(|_, _, _| {});
    assert_eq!(got.iter().map(|d| d.request.0).collect::<Vec<_>>(), vec![free]);
    let flush = sim.submit(A, Op::Flush, 0, 0);
    let behind = sim.submit(A, Op::Read, 80 * MIB, 4096);
    assert!(
        sim.drain_now(|_, _, _| {}).is_empty(),
        "the FLUSH waits for the held writes, the read for the FLUSH"
    );
    let mut order = Vec::new();
    while sim.jump() || !order.contains(&behind) {
        for d in sim.drain_now(|_, _, _| {}) {
            if d.request.0 == overlapping {
                assert!(d.waits.get(Gate::Overlap) > 0, "{d:?}");
            }
            if d.request.0 == flush {
                assert!(d.waits.get(Gate::FlushBarrier) > 0, "{d:?}");
                assert_eq!(d.waits.get(Gate::RateLimit), 0, "a FLUSH is never limited");
            }
            order.push(d.request.0);
        }
        if sim.clock.now_ns() > 10 * SEC {
            panic!("stuck: {order:?}");
        }
    }
    let at = |id| order.iter().position(|&r| r == id).unwrap();
    assert!(at(overlapping) > at(3), "{order:?}");
    assert_eq!(order.iter().filter(|&&r| r < 8).count(), 7);
    assert!(at(flush) > at(7) && at(behind) > at(flush), "{order:?}");
    // 7 held writes at 10 IOPS: the last one 0.7 s in.
    assert_eq!(sim.clock.now_ns(), 700_000_000);
}

#[test]
fn held_time_is_the_rate_limit_wait() {
    let mut sim = Sim::new(&[A]);
    sim.s
        .set_limits(A, Limits { read_iops: Some(RateLimit { per_sec: 4, burst: 1 }), ..Limits::default() })
        .unwrap();
    sim.submit(A, Op::Read, 0, 4096);
    sim.submit(A, Op::Read, 4096, 4096);
    assert_eq!(sim.drain_now(|_, _, _| {}).len(), 1);
    assert_eq!(sim.s.next_retry_at_ns(), Some(SEC / 4));
    assert!(sim.jump());
    let d = sim.drain_now(|_, _, _| {});
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].waits.get(Gate::RateLimit), SEC / 4);
    assert_eq!(d[0].admission_wait_ns(), SEC / 4);
    assert_eq!(sim.s.counters(A).unwrap().rate_limited_admissions, 1);
}

#[test]
fn in_place_reads_are_limited_and_charged_once() {
    let mut sim = Sim::new(&[A]);
    sim.s
        .set_limits(A, Limits { read_iops: Some(RateLimit { per_sec: 10, burst: 1 }), ..Limits::default() })
        .unwrap();
    let in_place = |sim: &mut Sim, id: u64| {
        let d = Descriptor::read(id, id * 4096, 4096);
        sim.contract.submitted(A, d);
        sim.s.submit_read_in_place::<()>(A, d).unwrap()
    };
    let InPlace::Admitted(first) = in_place(&mut sim, 100) else { panic!("a full bucket admits in place") };
    // Handed back with the bucket empty: it waits again, already paid for,
    // and goes at once.
    sim.s.requeue(A, first.request).unwrap();
    let again = sim.s.next(&mut sim.log).expect("the requeued read is not charged twice");
    assert_eq!(again.request, first.request);
    assert!(matches!(in_place(&mut sim, 101), InPlace::Queued(_)), "the bucket is empty");
    sim.s.complete(A, again.request).unwrap();
    assert!(sim.s.next(&mut sim.log).is_none());
    // One charge of 100 ms against a 100 ms burst: the next token at 100 ms.
    assert_eq!(sim.s.next_retry_at_ns(), Some(SEC / 10));
    assert_eq!(sim.s.counters(A).unwrap().reads_in_place, 0, "net of the one handed back");
}

#[test]
fn a_changed_limit_holds_from_the_change() {
    let mut sim = Sim::new(&[A]);
    sim.s.set_limits(A, read_iops(500)).unwrap();
    let refill = sim.reads_32_deep();
    sim.run_until(3 * SEC, refill);
    sim.s.set_limits(A, read_iops(2000)).unwrap();
    sim.run_until(6 * SEC, refill);
    sim.s.set_limits(A, read_iops(100)).unwrap();
    sim.run_until(9 * SEC, refill);
    for (from, rate) in [(1, 500), (2, 500), (3, 2000), (4, 2000), (5, 2000), (6, 100), (7, 100), (8, 100)] {
        let n = sim.count(A, Op::Read, from * SEC, (from + 1) * SEC) as u64;
        // The first second after a raise may also spend the new burst.
        let extra = if from == 3 { rate / 10 } else { 1 };
        assert!(n + rate / 100 >= rate && n <= rate + extra, "second {from}: {n} at {rate}/s");
    }
    sim.s.set_limits(A, Limits::default()).unwrap();
    let got = sim.drain_now(|_, _, _| {});
    assert_eq!(got.len(), 32, "no limit: every held read goes at once");
}

#[test]
fn bad_limits_and_unknown_images_are_refused() {
    let (mut s, _clock) = scheduler(Config::default());
    s.add_image(A).unwrap();
    for bad in [
        read_iops(0),
        Limits { read_iops: Some(RateLimit { per_sec: 5, burst: 0 }), ..Limits::default() },
        Limits { write_iops: Some(RateLimit { per_sec: 5, burst: 301 }), ..Limits::default() },
        Limits { read_bytes_per_sec: Some(RateLimit::new(4096)), ..Limits::default() },
    ] {
        let e = s.set_limits(A, bad).unwrap_err();
        assert!(matches!(e, sched::Error::InvalidLimit { .. }), "{e}");
        assert_eq!(e.errno(), -libc_einval());
    }
    assert!(matches!(s.set_limits(B, read_iops(5)), Err(sched::Error::UnknownImage(B))));
    assert_eq!(s.limits(A), Some(Limits::default()), "a refused change changes nothing");
}

fn libc_einval() -> i32 {
    22
}

#[test]
fn reads_held_by_a_bytes_cap_keep_their_order() {
    let mut sim = Sim::new(&[A]);
    let cap =
        Limits { read_bytes_per_sec: Some(RateLimit { per_sec: MIB, burst: MIB }), ..Limits::default() };
    sim.s.set_limits(A, cap).unwrap();
    // 1 MiB empties the bucket; then 512 KiB conforms at 0.5 s, but 4 KiB
    // would at 4 ms: it must not pass the larger read ahead of it.
    let big = sim.submit(A, Op::Read, 0, MIB);
    let half = sim.submit(A, Op::Read, 8 * MIB, 512 << 10);
    let small = sim.submit(A, Op::Read, 16 * MIB, 4096);
    let mut order = Vec::new();
    loop {
        order.extend(sim.drain_now(|_, _, _| {}).iter().map(|d| d.request.0));
        if order.len() == 3 || !sim.jump() {
            break;
        }
    }
    assert_eq!(order, [big, half, small], "at {} ns", sim.clock.now_ns());
}
