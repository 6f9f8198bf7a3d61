//! (a) A full log makes writes wait; they resume after reclamation with zero
//! errors: at once on a `capacity_released` wake, and by the periodic retry
//! when the release sends no wake.

mod common;

use std::time::Duration;

use common::{scheduler, FakeLog};
use sched::{Clock, Config, Descriptor, Gate, ImageId, Op, RequestId};

const IMG: ImageId = ImageId(1);
const MIB: u64 = 1 << 20;

#[test]
fn full_log_holds_writes_until_a_wake_then_all_complete() {
    // Enough write slots that the log, not a slot, holds W2.
    let config = Config { write_slots: 4, ..Config::default() };
    let (mut s, clock) = scheduler(config.clone());
    s.add_image(IMG).unwrap();
    let mut log = FakeLog::with(&[(IMG, 2 * MIB)]);
    for i in 0..4 {
        s.submit(IMG, Descriptor::write(i, i * MIB, MIB)).unwrap();
    }
    let w0 = s.next(&mut log).expect("W0 fits the log");
    let w1 = s.next(&mut log).expect("W1 fits the log");
    assert!(s.next(&mut log).is_none(), "W2 must wait: the log is full");
    assert_eq!(log.refusals, 1);
    s.complete(IMG, w0.request).unwrap();
    s.complete(IMG, w1.request).unwrap();

    // Held writes are not retried on every call (no refusal storm) ...
    for _ in 0..100 {
        clock.advance(Duration::from_millis(1) / 4);
        assert!(s.next(&mut log).is_none());
    }
    assert_eq!(log.refusals, 1, "a held write is retried only on a wake or its deadline");

    // ... and a 31 s wait (the seed's longest) is still a wait, not an
    // error, through hundreds of periodic retries.
    for _ in 0..3100 {
        clock.advance(Duration::from_millis(10));
        assert!(s.next(&mut log).is_none());
    }
    assert!(log.refusals > 600, "retried every 50 ms: {}", log.refusals);
    // The release comes between two retries: only its wake can admit W2 now.
    let retry_at_ns = s.next_retry_at_ns().expect("W2 is held");
    assert!(retry_at_ns > clock.now_ns());
    log.release(IMG, MIB);
    s.capacity_released(IMG);
    let w2 = s.next(&mut log).expect("the wake lets W2 reserve before its retry deadline");
    assert_eq!(w2.request, RequestId(2));
    assert!(w2.waits.log_capacity_ns >= 31_000_000_000, "{:?}", w2.waits);
    assert_eq!(w2.waits.total_ns(), w2.admission_wait_ns());

    log.release(IMG, MIB);
    s.capacity_released(IMG);
    let w3 = s.next(&mut log).expect("W3 after the next release");
    s.complete(IMG, w2.request).unwrap();
    s.complete(IMG, w3.request).unwrap();

    let c = s.counters(IMG).unwrap();
    assert_eq!((c.submitted_requests, c.admitted_requests, c.completed_requests), (4, 4, 4));
    assert!(c.refused_turns >= 1);
    assert_eq!(c.refused_submits, 0);
    assert!(c.gate_wait_ns_total.get(Gate::LogCapacity) > 0);
}

#[test]
fn periodic_retry_admits_a_write_when_the_release_sends_no_wake() {
    let config = Config { capacity_retry_ns: 50_000_000, ..Config::default() };
    let (mut s, clock) = scheduler(config);
    s.add_image(IMG).unwrap();
    let mut log = FakeLog::with(&[(IMG, 0)]);
    s.submit(IMG, Descriptor::write(7, 0, 64 << 10)).unwrap();
    assert!(s.next(&mut log).is_none());
    assert_eq!(s.next_retry_at_ns(), Some(50_000_000), "callers learn when to call again");

    log.release(IMG, MIB); // reclamation without a wake
    clock.advance(Duration::from_millis(49));
    assert!(s.next(&mut log).is_none(), "before the deadline only a wake retries");
    clock.advance(Duration::from_millis(1));
    let w = s.next(&mut log).expect("the periodic retry finds the released space");
    assert_eq!(w.op, Op::Write);
    assert_eq!(w.waits.log_capacity_ns, 50_000_000);
    assert_eq!(s.next_retry_at_ns(), None, "nothing is held any more");
    s.complete(IMG, w.request).unwrap();
}

#[test]
fn a_refused_retry_moves_the_deadline() {
    let (mut s, clock) = scheduler(Config::default());
    s.add_image(IMG).unwrap();
    let mut log = FakeLog::with(&[(IMG, 0)]);
    s.submit(IMG, Descriptor::write(1, 0, 4096)).unwrap();
    assert!(s.next(&mut log).is_none());
    clock.advance(Duration::from_millis(50));
    assert!(s.next(&mut log).is_none(), "still full at the retry");
    assert_eq!(log.refusals, 2);
    assert_eq!(s.next_retry_at_ns(), Some(100_000_000));
}
