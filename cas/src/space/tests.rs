use super::*;
use std::sync::atomic::AtomicBool;

const MIB: u64 = 1 << 20;

/// A reserve of 100 MiB over a free space the test sets.
fn reserve(wait_ms: u64) -> (SpaceReserve, Arc<AtomicU64>) {
    let avail = Arc::new(AtomicU64::new(1000 * MIB));
    let probe = avail.clone();
    (SpaceReserve::new(100 * MIB, 0, wait_ms, Box::new(move || Some(probe.load(Ordering::Relaxed)))), avail)
}

#[test]
fn writes_need_the_whole_reserve_and_ranges_half_of_it() {
    let (r, avail) = reserve(60_000);
    let t0 = Instant::now();
    assert_eq!(r.check_at(SpaceClass::Write, t0), SpaceVerdict::Grant);
    avail.store(80 * MIB, Ordering::Relaxed);
    let t1 = t0 + Duration::from_millis(PROBE_MAX_AGE_MS);
    assert_eq!(r.check_at(SpaceClass::Write, t1), SpaceVerdict::Wait);
    assert_eq!(r.check(SpaceClass::Range), SpaceVerdict::Grant);
    assert!(matches!(r.phase(), SpacePhase::Low { .. }));
    avail.store(40 * MIB, Ordering::Relaxed);
    assert_eq!(r.check(SpaceClass::Range), SpaceVerdict::Wait);
    avail.store(100 * MIB, Ordering::Relaxed);
    assert_eq!(r.check(SpaceClass::Write), SpaceVerdict::Grant);
    assert_eq!(r.phase(), SpacePhase::Ok);
    let c = r.counters();
    assert_eq!((c.waits, c.refusals, c.low_episodes), (2, 0, 1));
}

#[test]
fn going_low_wakes_gc_once_per_episode() {
    let (r, avail) = reserve(60_000);
    let woken = Arc::new(AtomicU64::new(0));
    let w = woken.clone();
    r.set_low_listener(Arc::new(move || {
        w.fetch_add(1, Ordering::Relaxed);
    }));
    avail.store(10 * MIB, Ordering::Relaxed);
    for _ in 0..3 {
        assert_eq!(r.check(SpaceClass::Write), SpaceVerdict::Wait);
    }
    assert_eq!(woken.load(Ordering::Relaxed), 1);
    avail.store(500 * MIB, Ordering::Relaxed);
    let t0 = Instant::now();
    assert_eq!(r.check_at(SpaceClass::Write, t0), SpaceVerdict::Grant);
    avail.store(10 * MIB, Ordering::Relaxed);
    let later = t0 + Duration::from_millis(PROBE_MAX_AGE_MS);
    assert_eq!(r.check_at(SpaceClass::Write, later), SpaceVerdict::Wait);
    assert_eq!(woken.load(Ordering::Relaxed), 2);
    assert_eq!(r.counters().low_episodes, 2);
}

#[test]
fn the_wait_is_bounded() {
    let (r, avail) = reserve(1_000);
    avail.store(10 * MIB, Ordering::Relaxed);
    let t0 = Instant::now();
    assert_eq!(r.check_at(SpaceClass::Write, t0), SpaceVerdict::Wait);
    assert_eq!(r.check_at(SpaceClass::Write, t0 + Duration::from_millis(999)), SpaceVerdict::Wait);
    let late = r.check_at(SpaceClass::Write, t0 + Duration::from_millis(1_000));
    assert!(matches!(&late, SpaceVerdict::Refuse(why) if why.contains("no space came back")), "{late:?}");
    // Exhausted by the timer: the first count seen is the mark.
    r.garbage_seen(3);
    assert_eq!(r.phase(), SpacePhase::Exhausted);
    assert_eq!(r.counters().refusals, 1);
}

#[test]
fn a_fruitless_gc_pass_after_going_low_exhausts_and_garbage_makes_it_wait_again() {
    let (r, avail) = reserve(60_000);
    avail.store(10 * MIB, Ordering::Relaxed);
    let t0 = Instant::now();
    let before = t0 - Duration::from_millis(5);
    assert_eq!(r.check_at(SpaceClass::Write, t0), SpaceVerdict::Wait);
    // A pass that began before the store went low proves nothing.
    r.gc_finished_at(before, 0, 0, t0 + Duration::from_millis(1));
    assert!(matches!(r.phase(), SpacePhase::Low { .. }));
    // A pass that freed something neither.
    r.gc_finished_at(t0, 0, 4096, t0 + Duration::from_millis(2));
    assert!(matches!(r.phase(), SpacePhase::Low { .. }));
    r.gc_finished_at(t0, 7, 0, t0 + Duration::from_millis(3));
    assert_eq!(r.phase(), SpacePhase::Exhausted);
    let refused = r.check_at(SpaceClass::Write, t0 + Duration::from_millis(4));
    assert!(
        matches!(&refused, SpaceVerdict::Refuse(why) if why.contains("GC could not free more")),
        "{refused:?}"
    );
    // Mappings the exhausting pass had seen are not new garbage.
    r.garbage_seen(7);
    assert_eq!(r.phase(), SpacePhase::Exhausted);
    r.garbage_seen(8);
    assert!(matches!(r.phase(), SpacePhase::Low { .. }), "a trim after the pass makes writes wait again");
    assert_eq!(r.check(SpaceClass::Write), SpaceVerdict::Wait);
    // A failed pass counts as one that freed nothing.
    r.gc_finished(Instant::now(), 8, 0);
    assert_eq!(r.phase(), SpacePhase::Exhausted);
    r.garbage_appeared();
    assert!(matches!(r.phase(), SpacePhase::Low { .. }), "an image removed makes writes wait again");
    // An exhausted store whose GC frees some waits again too.
    r.gc_finished(Instant::now(), 8, 0);
    assert_eq!(r.phase(), SpacePhase::Exhausted);
    r.gc_finished(Instant::now(), 8, 4096);
    assert!(matches!(r.phase(), SpacePhase::Low { .. }));
}

#[test]
fn no_reserve_or_no_probe_grants_everything() {
    let called = Arc::new(AtomicBool::new(false));
    let c = called.clone();
    let off = SpaceReserve::new(
        0,
        0,
        1,
        Box::new(move || {
            c.store(true, Ordering::Relaxed);
            Some(0)
        }),
    );
    assert_eq!(off.check(SpaceClass::Write), SpaceVerdict::Grant);
    assert!(!called.load(Ordering::Relaxed), "a reserve of 0 never probes");
    let blind = SpaceReserve::new(100 * MIB, 0, 1, Box::new(|| None));
    assert_eq!(blind.check(SpaceClass::Write), SpaceVerdict::Grant);
}

#[test]
fn probes_are_cached_only_while_far_above_the_reserve() {
    let probes = Arc::new(AtomicU64::new(0));
    let avail = Arc::new(AtomicU64::new(1000 * MIB));
    let (p, a) = (probes.clone(), avail.clone());
    let r = SpaceReserve::new(
        100 * MIB,
        0,
        60_000,
        Box::new(move || {
            p.fetch_add(1, Ordering::Relaxed);
            Some(a.load(Ordering::Relaxed))
        }),
    );
    let t0 = Instant::now();
    for i in 0..10 {
        r.check_at(SpaceClass::Write, t0 + Duration::from_millis(i));
    }
    assert_eq!(probes.load(Ordering::Relaxed), 1);
    r.check_at(SpaceClass::Write, t0 + Duration::from_millis(PROBE_MAX_AGE_MS));
    assert_eq!(probes.load(Ordering::Relaxed), 2);
    avail.store(150 * MIB, Ordering::Relaxed);
    r.check_at(SpaceClass::Write, t0 + Duration::from_millis(2 * PROBE_MAX_AGE_MS));
    for i in 0..5 {
        r.check_at(SpaceClass::Write, t0 + Duration::from_millis(2 * PROBE_MAX_AGE_MS + i));
    }
    assert_eq!(probes.load(Ordering::Relaxed), 8, "near the reserve every ask probes");
}

#[test]
fn default_reserve_is_one_percent_within_its_bounds() {
    assert_eq!(default_reserve_bytes(100 << 30), (100u64 << 30) / 100);
    assert_eq!(default_reserve_bytes(10 << 30), 256 << 20);
    assert_eq!(default_reserve_bytes(1 << 50), 4 << 30);
    assert_eq!(default_reserve_bytes(1 << 30), (1 << 30) / 10);
}

#[test]
fn a_granted_roll_never_takes_the_reserve() {
    let avail = Arc::new(AtomicU64::new(108 * MIB));
    let probe = avail.clone();
    let r =
        SpaceReserve::new(100 * MIB, 8 * MIB, 60_000, Box::new(move || Some(probe.load(Ordering::Relaxed))));
    assert_eq!(r.check(SpaceClass::Write), SpaceVerdict::Grant, "100 MiB left after the roll");
    avail.store(108 * MIB - 1, Ordering::Relaxed);
    r.refresh();
    assert_eq!(r.check(SpaceClass::Write), SpaceVerdict::Wait, "the roll would take the reserve");
    assert!(matches!(r.phase(), SpacePhase::Low { .. }), "refresh moves the phase without an ask");
    avail.store(200 * MIB, Ordering::Relaxed);
    r.refresh();
    assert_eq!(r.phase(), SpacePhase::Ok);
}

#[test]
fn each_writer_has_one_grace_roll_per_episode_above_half_the_reserve() {
    let (r, avail) = reserve(60_000);
    let (a, b) = (GraceToken::default(), GraceToken::default());
    avail.store(60 * MIB, Ordering::Relaxed);
    assert_eq!(r.check_with_grace(SpaceClass::Write, &a), SpaceVerdict::Grant, "a's grace");
    assert_eq!(r.check_with_grace(SpaceClass::Write, &a), SpaceVerdict::Wait, "used");
    assert_eq!(r.check_with_grace(SpaceClass::Write, &b), SpaceVerdict::Grant, "b's grace");
    avail.store(40 * MIB, Ordering::Relaxed);
    let c = GraceToken::default();
    assert_eq!(r.check_with_grace(SpaceClass::Write, &c), SpaceVerdict::Wait, "below half the reserve");
    // Back above the reserve and below again: a new episode, a new grace.
    avail.store(500 * MIB, Ordering::Relaxed);
    r.refresh();
    avail.store(60 * MIB, Ordering::Relaxed);
    r.refresh();
    assert_eq!(r.check_with_grace(SpaceClass::Write, &a), SpaceVerdict::Grant);
    assert_eq!(r.counters().graces, 3);
    assert_eq!(r.counters().low_episodes, 2);
}
