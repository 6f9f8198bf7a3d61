//! Reads served in place on their queue thread (`submit_read_in_place`):
//! admitted at once only where the ordering contract and the read credits
//! allow it, ordering later requests like any admitted read, and handed
//! back to the workers in their arrival place by `requeue`.

mod common;

use std::time::Duration;

use common::{scheduler, FakeLog, FakeReservation};
use sched::{Config, Descriptor, Error, Gate, ImageId, InPlace, RequestId};

const IMG: ImageId = ImageId(1);
const MIB: u64 = 1 << 20;

type Got = InPlace<FakeReservation>;

fn admitted(got: Result<Got, Error>) -> sched::Dispatch<FakeReservation> {
    match got.unwrap() {
        InPlace::Admitted(d) => d,
        other => panic!("expected the read admitted in place, got {other:?}"),
    }
}

fn queued(got: Result<Got, Error>) {
    match got.unwrap() {
        InPlace::Queued(_) => {}
        other => panic!("expected the read queued, got {other:?}"),
    }
}

#[test]
fn an_independent_read_passes_a_held_write_in_place_and_an_overlapping_one_waits() {
    let (mut s, _clock) = scheduler(Config::default());
    s.add_image(IMG).unwrap();
    let mut log = FakeLog::with(&[(IMG, 0)]); // the log is full: W0 is held
    s.submit(IMG, Descriptor::write(0, 0, MIB)).unwrap();
    assert!(s.next(&mut log).is_none());
    queued(s.submit_read_in_place(IMG, Descriptor::read(1, 4096, 4096)));
    let r = admitted(s.submit_read_in_place(IMG, Descriptor::read(2, 8 * MIB, 4096)));
    assert_eq!(r.request, RequestId(2));
    assert!(r.passed_blocked_head);
    assert!(r.reservation.is_none());
    assert!(s.next(&mut log).is_none(), "R1 still overlaps W0");
    s.complete(IMG, r.request).unwrap();
    let c = s.counters(IMG).unwrap();
    assert_eq!((c.reads_in_place, c.reads_requeued, c.reads_passed_blocked_head), (1, 0, 1));
}

#[test]
fn a_later_overlapping_write_and_a_flush_wait_for_a_read_in_place() {
    let (mut s, _clock) = scheduler(Config::default());
    s.add_image(IMG).unwrap();
    let mut log = FakeLog::with(&[(IMG, 64 * MIB)]);
    let r = admitted(s.submit_read_in_place(IMG, Descriptor::read(0, 0, 8192)));
    s.submit(IMG, Descriptor::write(1, 4096, 4096)).unwrap();
    s.submit(IMG, Descriptor::flush(2)).unwrap();
    assert!(s.next(&mut log).is_none(), "W1 overlaps the read in flight; F2 is behind both");
    s.complete(IMG, r.request).unwrap();
    let w = s.next(&mut log).expect("W1 once the read completed");
    assert_eq!(w.request, RequestId(1));
    assert!(s.next(&mut log).is_none(), "F2 waits for W1");
    s.complete(IMG, w.request).unwrap();
    assert_eq!(s.next(&mut log).unwrap().request, RequestId(2));
    // Behind an uncompleted FLUSH, no read goes in place.
    queued(s.submit_read_in_place(IMG, Descriptor::read(3, 32 * MIB, 4096)));
}

#[test]
fn reads_in_place_hold_read_credits() {
    let config = Config { read_credits: 2, ..Config::default() };
    let (mut s, _clock) = scheduler(config);
    s.add_image(IMG).unwrap();
    let a = admitted(s.submit_read_in_place(IMG, Descriptor::read(0, 0, 4096)));
    let _b = admitted(s.submit_read_in_place(IMG, Descriptor::read(1, MIB, 4096)));
    queued(s.submit_read_in_place(IMG, Descriptor::read(2, 2 * MIB, 4096)));
    s.complete(IMG, a.request).unwrap();
    // R2 waits (for a worker) ahead of any new read: FIFO among reads.
    queued(s.submit_read_in_place(IMG, Descriptor::read(3, 3 * MIB, 4096)));
    let mut log = FakeLog::with(&[(IMG, 0)]);
    assert_eq!(s.next(&mut log).unwrap().request, RequestId(2));
}

#[test]
fn a_requeued_read_waits_in_its_arrival_place_and_its_waits_add_up() {
    let (mut s, clock) = scheduler(Config::default());
    s.add_image(IMG).unwrap();
    let mut log = FakeLog::with(&[(IMG, 64 * MIB)]);
    let r = admitted(s.submit_read_in_place(IMG, Descriptor::read(0, 0, 4096)));
    s.submit(IMG, Descriptor::write(1, 0, 4096)).unwrap(); // overlaps R0, arrives later
    clock.advance(Duration::from_micros(40));
    s.requeue(IMG, r.request).unwrap();
    clock.advance(Duration::from_micros(60));
    let again = s.next(&mut log).expect("the requeued read goes first: it is older than W1");
    assert_eq!(again.request, RequestId(0));
    assert_eq!(again.admission_wait_ns(), 100_000, "measured from its arrival");
    assert_eq!(again.waits.total_ns(), again.admission_wait_ns());
    assert_eq!(again.waits.get(Gate::SchedulerTurn), 100_000);
    assert!(s.next(&mut log).is_none(), "W1 still waits for the read");
    s.complete(IMG, again.request).unwrap();
    assert_eq!(s.next(&mut log).unwrap().request, RequestId(1));
    let c = s.counters(IMG).unwrap();
    assert_eq!((c.reads_in_place, c.reads_requeued), (0, 1));
    assert_eq!(c.admitted_requests, 2, "a requeued read is admitted once");
}

#[test]
fn in_place_calls_refuse_what_they_cannot_serve() {
    let (mut s, _clock) = scheduler(Config::default());
    s.add_image(IMG).unwrap();
    assert!(matches!(
        s.submit_read_in_place::<FakeReservation>(IMG, Descriptor::write(0, 0, 4096)),
        Err(Error::NotARead { .. })
    ));
    s.submit(IMG, Descriptor::write(1, 0, 4096)).unwrap();
    assert!(matches!(s.requeue(IMG, RequestId(1)), Err(Error::NotDispatched { .. })));
    let mut log = FakeLog::with(&[(IMG, 64 * MIB)]);
    let w = s.next(&mut log).unwrap();
    assert!(matches!(s.requeue(IMG, w.request), Err(Error::NotARead { .. })));
    assert!(matches!(s.requeue(IMG, RequestId(7)), Err(Error::UnknownRequest { .. })));
    assert!(matches!(
        s.submit_read_in_place::<FakeReservation>(ImageId(9), Descriptor::read(2, 0, 4096)),
        Err(Error::UnknownImage(_))
    ));
}

#[test]
fn a_write_in_place_takes_its_reservation_and_slot_and_orders_later_requests() {
    let config = Config { write_slots: 1, ..Config::default() };
    let (mut s, _clock) = scheduler(config);
    s.add_image(IMG).unwrap();
    let mut log = FakeLog::with(&[(IMG, 64 * MIB)]);
    let w = admitted(s.submit_write_in_place(IMG, Descriptor::write(0, 0, 4096), &mut log));
    assert!(w.reservation.is_some(), "admitted with its log reservation");
    // The only write slot is taken: the next write waits, and an overlapping
    // read waits for the write in flight.
    queued(s.submit_write_in_place(IMG, Descriptor::write(1, MIB, 4096), &mut log));
    queued(s.submit_read_in_place(IMG, Descriptor::read(2, 0, 4096)));
    assert!(s.next(&mut log).is_none());
    s.complete(IMG, w.request).unwrap();
    assert_eq!(s.next(&mut log).unwrap().request, RequestId(1));
    let c = s.counters(IMG).unwrap();
    assert_eq!(c.writes_in_place, 1);
    assert!(matches!(
        s.submit_write_in_place(IMG, Descriptor::read(3, 0, 4096), &mut log),
        Err(Error::NotAWrite { .. })
    ));
}

#[test]
fn a_write_in_place_the_log_refuses_is_held_not_failed() {
    let (mut s, _clock) = scheduler(Config::default());
    s.add_image(IMG).unwrap();
    let mut log = FakeLog::with(&[(IMG, 0)]);
    queued(s.submit_write_in_place(IMG, Descriptor::write(0, 0, 4096), &mut log));
    assert!(s.next(&mut log).is_none(), "held while the log is full");
    log.release(IMG, 64 * MIB);
    s.capacity_released(IMG);
    let w = s.next(&mut log).expect("served once capacity returns");
    assert_eq!(w.request, RequestId(0));
    assert!(w.reservation.is_some());
    assert_eq!(s.counters(IMG).unwrap().writes_in_place, 0);
}

#[test]
fn a_write_goes_in_place_only_alone_in_its_image_and_with_no_other_image_waiting() {
    let (mut s, _clock) = scheduler(Config::default());
    let other = ImageId(2);
    s.add_image(IMG).unwrap();
    s.add_image(other).unwrap();
    let mut log = FakeLog::with(&[(IMG, 64 * MIB), (other, 64 * MIB)]);
    // A write of the image in flight on a worker: the next one is queued,
    // so making a write visible on the caller's thread never waits for
    // that append.
    s.submit(IMG, Descriptor::write(0, 0, 4096)).unwrap();
    let w0 = s.next(&mut log).unwrap();
    queued(s.submit_write_in_place(IMG, Descriptor::write(1, MIB, 4096), &mut log));
    s.complete(IMG, w0.request).unwrap();
    let w1 = s.next(&mut log).unwrap();
    s.complete(IMG, w1.request).unwrap();
    // Another image's write waits for a shared slot: DRR gives it out, so
    // this image's write does not go in place past it.
    let mut full = FakeLog::with(&[(IMG, 64 * MIB), (other, 0)]);
    s.submit(other, Descriptor::write(2, 0, 4096)).unwrap();
    assert!(s.next(&mut full).is_none(), "the other image's write is held by its log");
    queued(s.submit_write_in_place(IMG, Descriptor::write(3, 2 * MIB, 4096), &mut log));
    s.capacity_released(other);
    let a = s.next(&mut log).expect("both served by workers, through DRR");
    let b = s.next(&mut log).expect("both served by workers, through DRR");
    let mut got = [a.request, b.request];
    got.sort();
    assert_eq!(got, [RequestId(2), RequestId(3)]);
    s.complete(a.image, a.request).unwrap();
    s.complete(b.image, b.request).unwrap();
    // Alone: in place.
    let w5 = admitted(s.submit_write_in_place(IMG, Descriptor::write(5, 3 * MIB, 4096), &mut log));
    assert!(w5.reservation.is_some());
}
