//! The lease on `MemObjects` with short real timings (lease 400 ms).

use super::*;
use crate::objects::{MemObjects, ObjectFault};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

const PREFIX: &str = "images/vm1/lease/";

fn cfg() -> LeaseConfig {
    LeaseConfig {
        lease: Duration::from_millis(400),
        claim_bound: Duration::from_millis(40),
        margin: Duration::from_millis(40),
    }
}

#[test]
fn acquire_renew_release_then_another_store_acquires_at_once() {
    let o = MemObjects::new();
    let mut a = Lease::acquire(Arc::new(o.clone()), PREFIX, 0xa, cfg(), 1).unwrap();
    assert_eq!(a.epoch(), 1);
    assert!(a.is_valid());
    a.renew().unwrap();
    a.renew().unwrap();
    a.release().unwrap();
    let started = Instant::now();
    let b = Lease::acquire(Arc::new(o.clone()), PREFIX, 0xb, cfg(), 1).unwrap();
    assert_eq!(b.epoch(), 2);
    assert!(started.elapsed() < cfg().lease, "a released lease is taken without waiting it out");
}

#[test]
fn a_renewing_holder_is_never_taken_over() {
    let o = MemObjects::new();
    let stop = AtomicBool::new(false);
    let mut a = Lease::acquire(Arc::new(o.clone()), PREFIX, 0xa, cfg(), 1).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(a.renew_every());
                a.renew().unwrap();
                assert!(a.is_valid());
            }
        });
        let mut results = Vec::new();
        for _ in 0..3 {
            let started = Instant::now();
            results.push((
                Lease::acquire(Arc::new(o.clone()), PREFIX, 0xb, cfg(), 3).map(|l| l.epoch()),
                started.elapsed(),
            ));
        }
        stop.store(true, Ordering::Relaxed);
        for (r, took) in results {
            assert_eq!(
                r.err(),
                Some(LeaseError::Held { store: 0xa, epoch: 1 }),
                "taken from a renewing holder"
            );
            assert!(took < cfg().lease, "refused only after {took:?}");
        }
    });
}

#[test]
fn a_silent_holder_expires_and_is_fenced() {
    let o = MemObjects::new();
    let mut a = Lease::acquire(Arc::new(o.clone()), PREFIX, 0xa, cfg(), 1).unwrap();
    // A stops renewing (a crash, a partition): B waits out its silence.
    let started = Instant::now();
    let b = Lease::acquire(Arc::new(o.clone()), PREFIX, 0xb, cfg(), 1).unwrap();
    assert!(started.elapsed() >= cfg().lease + cfg().margin);
    assert_eq!(b.epoch(), 2);
    assert!(!a.is_valid(), "the old holder's deadline passed before the new one won");
    assert_eq!(a.renew().unwrap_err(), LeaseError::Lost { by_store: 0xb, epoch: 2 });
    assert!(!a.is_valid());
}

#[test]
fn a_store_that_cannot_renew_runs_out_and_is_then_replaced() {
    let o = MemObjects::new();
    let mut a = Lease::acquire(Arc::new(o.clone()), PREFIX, 0xa, cfg(), 1).unwrap();
    o.set_fault(ObjectFault::Unreachable);
    assert!(matches!(a.renew(), Err(LeaseError::Store(e)) if e.kind == ObjectErrorKind::Unreachable));
    std::thread::sleep(cfg().lease);
    assert!(!a.is_valid(), "a lease that could not be renewed must run out");
    o.clear_fault();
    assert!(matches!(a.renew(), Err(LeaseError::Lost { .. })), "renewing past the deadline");
    let b = Lease::acquire(Arc::new(o.clone()), PREFIX, 0xb, cfg(), 1).unwrap();
    assert_eq!(b.epoch(), 2);
}

/// Stores racing for a free lease, with store latency so that their LISTs
/// and PUTs interleave: each winner stays in its critical section for as
/// long as its lease is valid (without renewing), and no two are ever in
/// it together. A later store may win once the first one's lease ran out.
#[test]
fn racing_stores_never_hold_it_together() {
    for round in 0..6u64 {
        let o = Arc::new(MemObjects::new());
        o.set_latency(Duration::from_millis(round % 3 * 4));
        let holders = AtomicUsize::new(0);
        let wins = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for store in 1..=4u64 {
                let (o, holders, wins) = (o.clone(), &holders, &wins);
                s.spawn(move || {
                    if let Ok(lease) = Lease::acquire(o.clone(), PREFIX, store * 7 + round, cfg(), 3) {
                        assert_eq!(
                            holders.fetch_add(1, Ordering::SeqCst),
                            0,
                            "two holders at once (round {round})"
                        );
                        wins.fetch_add(1, Ordering::SeqCst);
                        while lease.is_valid() {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        holders.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert!(wins.load(Ordering::SeqCst) >= 1, "round {round}: nobody won a free lease");
    }
}

/// A claim that does not decode (damage, or a newer format during an
/// upgrade) counts as held: it is waited out, never taken at once.
#[test]
fn a_claim_that_does_not_decode_is_waited_out() {
    let o = MemObjects::new();
    let a = Lease::acquire(Arc::new(o.clone()), PREFIX, 0xa, cfg(), 1).unwrap();
    let k = key(PREFIX, a.epoch(), 0xa);
    let mut bytes = o.get(&k).unwrap();
    bytes[20] ^= 1;
    o.put(&k, &bytes).unwrap();
    let started = Instant::now();
    let b = Lease::acquire(Arc::new(o.clone()), PREFIX, 0xb, cfg(), 1).unwrap();
    assert!(started.elapsed() >= cfg().lease + cfg().margin, "taken after {:?}", started.elapsed());
    assert_eq!(b.epoch(), 2);
}

/// A claim of the same epoch with a lower id that landed late (and was
/// never marked released) must not hide the real holder's renewals.
#[test]
fn a_late_lower_claim_does_not_hide_the_renewing_holder() {
    let o = MemObjects::new();
    let stop = AtomicBool::new(false);
    let mut a = Lease::acquire(Arc::new(o.clone()), PREFIX, 0x50, cfg(), 1).unwrap();
    // Store 0x30's claim at A's epoch, written too late to win, left held.
    let late = Claim { store: 0x30, epoch: a.epoch(), renewals: 0, released: false, stamp: 0 };
    o.put(&key(PREFIX, late.epoch, late.store), &encode(&late, cfg().lease)).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(a.renew_every());
                a.renew().unwrap();
            }
        });
        let r = Lease::acquire(Arc::new(o.clone()), PREFIX, 0xc, cfg(), 2).map(|l| l.epoch());
        stop.store(true, Ordering::Relaxed);
        assert_eq!(r.err(), Some(LeaseError::Held { store: 0x50, epoch: 1 }), "taken from a renewing holder");
    });
}
