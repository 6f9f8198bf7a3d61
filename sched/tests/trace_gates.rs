//! sched -> trace: a writer blocked on log capacity shows the gate
//! `log_capacity` in its trace, and a read that bypassed it shows none.
//! The dispatch is recorded with `Dispatch::record_into`, the same call the
//! daemon's workers make.

mod common;

use std::time::Duration;

use common::{scheduler, FakeLog};
use sched::{Clock, Config, Descriptor, Gate, ImageId, Op};

const IMG: ImageId = ImageId(1);
const MIB: u64 = 1 << 20;

#[test]
fn blocked_writer_shows_log_capacity_and_the_bypassing_read_shows_no_gate() {
    let (mut s, clock) = scheduler(Config::default());
    s.add_image(IMG).unwrap();
    let mut log = FakeLog::with(&[(IMG, MIB)]);
    let tracer = trace::Tracer::new("img");

    s.submit(IMG, Descriptor::write(0, 0, MIB)).unwrap();
    s.submit(IMG, Descriptor::write(1, 8 * MIB, MIB)).unwrap(); // waits: the log holds one MiB
    s.submit(IMG, Descriptor::read(2, 32 * MIB, 4096)).unwrap(); // independent of both writes
    let finish = |d: sched::Dispatch<common::FakeReservation>, clock: &sched::FakeClock| {
        let mut t = trace::RequestTrace::new(d.op, d.arrival_ns);
        d.record_into(&mut t, clock.now_ns());
        tracer.finish(&t, clock.now_ns() + 1_000, 0);
        d
    };

    let w0 = finish(s.next(&mut log).expect("W0 fits"), &clock);
    let r2 = s.next(&mut log).expect("R2 bypasses the capacity-blocked W1");
    assert_eq!(r2.op, Op::Read);
    assert!(r2.passed_blocked_head);
    let r2 = finish(r2, &clock);
    s.complete(IMG, r2.request).unwrap();

    clock.advance(Duration::from_millis(5));
    s.complete(IMG, w0.request).unwrap();
    log.release(IMG, MIB);
    s.capacity_released(IMG);
    let w1 = finish(s.next(&mut log).expect("W1 after the release"), &clock);
    assert!(w1.waits.get(Gate::LogCapacity) >= 5_000_000, "{:?}", w1.waits);
    s.complete(IMG, w1.request).unwrap();

    let snap = tracer.snapshot();
    let write_gate = &snap.ops.write.gates[Gate::LogCapacity.name()];
    assert_eq!(write_gate.requests, 1, "exactly the blocked writer waited on log capacity");
    assert!(write_gate.wait_ms_max >= 5.0, "{write_gate:?}");
    for (name, g) in &snap.ops.read.gates {
        assert_eq!(g.requests, 0, "the bypassing read waited on {name}");
    }
    let slow = &snap.slowest_reads;
    assert_eq!(slow.len(), 1);
    assert!(slow[0].gates.is_empty(), "the read's retained example shows no gate: {:?}", slow[0].gates);
}
