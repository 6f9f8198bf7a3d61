//! A clock read on two cores can step back by tens of nanoseconds (the
//! trace clock reads the TSC unfenced). The scheduler's waits must still
//! add up to the admission wait: a gate interval never ends after the
//! dispatch that closes it.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use common::FakeLog;
use sched::{Clock, Config, Descriptor, ImageId, Scheduler};

const IMG: ImageId = ImageId(1);
const MIB: u64 = 1 << 20;

/// A clock the test sets to any time, backwards included.
#[derive(Clone, Default)]
struct SetClock(Arc<AtomicU64>);

impl SetClock {
    fn set(&self, ns: u64) {
        self.0.store(ns, Ordering::SeqCst);
    }
}

impl Clock for SetClock {
    fn now_ns(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

#[test]
fn waits_add_up_when_the_clock_steps_back() {
    let clock = SetClock::default();
    let mut s = Scheduler::new(Config::default(), clock.clone()).unwrap();
    s.add_image(IMG).unwrap();
    let mut log = FakeLog::with(&[(IMG, MIB)]);

    s.submit(IMG, Descriptor::write(0, 0, MIB)).unwrap();
    s.submit(IMG, Descriptor::write(1, 8 * MIB, MIB)).unwrap();
    clock.set(1_000);
    let w0 = s.next(&mut log).expect("W0 fits");
    assert!(s.next(&mut log).is_none(), "W1 waits for log capacity, observed at 1000 ns");

    clock.set(905); // another core's reading, 95 ns behind
    s.complete(IMG, w0.request).unwrap();
    log.release(IMG, MIB);
    s.capacity_released(IMG);
    let w1 = s.next(&mut log).expect("W1 after the release");
    assert_eq!(w1.waits.total_ns(), w1.admission_wait_ns(), "{w1:?}");
    assert!(w1.admitted_ns >= 1_000, "time handed out never goes back: {w1:?}");
    assert!(s.now_ns() >= 1_000);
}
