//! Multi-threaded smoke test of [`SharedScheduler`]: submitter threads per
//! image, a worker pool, a "compactor" thread that reclaims completed log and
//! sends wakes (sometimes not), all on real time. Every dispatch is checked
//! against the contract; every request completes; shutdown wakes everyone.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{Contract, FakeLog};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sched::{
    Config, Descriptor, Error, ImageId, MonotonicClock, Next, Op, RequestId, Scheduler, SharedScheduler,
};

type Shared = SharedScheduler<MonotonicClock, FakeLog>;

const IMAGES: u32 = 3;
const REQUESTS_PER_IMAGE: u64 = 2000;
const BLOCK: u64 = 4096;

fn submitter(shared: &Shared, contract: &Mutex<Contract>, image: ImageId, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    for n in 0..REQUESTS_PER_IMAGE {
        let id = (u64::from(image.0) << 32) | n;
        let d = match rng.gen_range(0..10) {
            0..=4 => Descriptor::read(id, rng.gen_range(0..256) * BLOCK, BLOCK),
            5..=8 => Descriptor::write(id, rng.gen_range(0..256) * BLOCK, rng.gen_range(1..=16) * BLOCK),
            _ => Descriptor::flush(id),
        };
        // Recorded before it is submitted, so a worker that gets the
        // dispatch finds it (one submitter per image keeps the order).
        contract.lock().unwrap().submitted(image, d);
        if let Err(e) = shared.submit_timeout(image, d, Duration::from_secs(10)) {
            panic!("submit on image {image} failed: {e}");
        }
        if rng.gen_bool(0.05) {
            thread::sleep(Duration::from_micros(200));
        }
    }
}

#[test]
fn threads_submit_execute_complete_and_shut_down() {
    let config = Config {
        frontier_quota_bytes: 64 * sched::DESCRIPTOR_SLOT_BYTES,
        write_slots: 2,
        capacity_retry_ns: 2_000_000,
        ..Config::default()
    };
    let images: Vec<ImageId> = (0..IMAGES).map(ImageId).collect();
    // A small log (256 KiB) so that writes wait for reclamation often.
    let log = FakeLog::with(&images.iter().map(|&i| (i, 256 << 10)).collect::<Vec<_>>());
    let sched = Scheduler::new(config.clone(), MonotonicClock::new()).unwrap();
    let shared = Arc::new(Shared::new(sched, log));
    for &i in &images {
        shared.add_image(i).unwrap();
    }
    let mut contract = Contract::new(&config);
    contract.relaxed = true;
    let contract = Arc::new(Mutex::new(contract));
    // Completed reservations waiting for the compactor: (image, log bytes).
    let reclaimable = Arc::new(Mutex::new(Vec::<(ImageId, u64)>::new()));
    let done = Arc::new(AtomicBool::new(false));

    let compactor = {
        let (shared, reclaimable, done) = (shared.clone(), reclaimable.clone(), done.clone());
        thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(99);
            while !done.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_micros(500));
                let batch: Vec<_> = std::mem::take(&mut *reclaimable.lock().unwrap());
                for (image, bytes) in batch {
                    shared.with_capacity(|log| log.release(image, bytes));
                    if rng.gen_bool(0.7) {
                        shared.capacity_released(image); // else the periodic retry finds it
                    }
                }
            }
        })
    };

    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (shared, contract, reclaimable) = (shared.clone(), contract.clone(), reclaimable.clone());
            thread::spawn(move || {
                let mut served = 0u64;
                loop {
                    match shared.next_blocking(Duration::from_millis(20)) {
                        Next::Dispatch(d) => {
                            contract.lock().unwrap().dispatched(&d);
                            if d.op != Op::Read {
                                thread::sleep(Duration::from_micros(50)); // "execute"
                            }
                            contract.lock().unwrap().completed(d.image, d.request);
                            if let Some(r) = d.reservation {
                                reclaimable.lock().unwrap().push((r.image, r.log_bytes));
                            }
                            shared.complete(d.image, d.request).unwrap();
                            served += 1;
                        }
                        Next::TimedOut => {}
                        Next::Shutdown => return served,
                    }
                }
            })
        })
        .collect();

    let submitters: Vec<_> = images
        .iter()
        .map(|&image| {
            let (shared, contract) = (shared.clone(), contract.clone());
            thread::spawn(move || submitter(&shared, &contract, image, u64::from(image.0)))
        })
        .collect();
    for s in submitters {
        s.join().expect("submitter panicked");
    }

    let deadline = Instant::now() + Duration::from_secs(30);
    while contract.lock().unwrap().outstanding() > 0 {
        assert!(Instant::now() < deadline, "requests did not drain");
        thread::sleep(Duration::from_millis(2));
    }
    shared.shutdown();
    let served: u64 = workers.into_iter().map(|w| w.join().expect("worker panicked")).sum();
    done.store(true, Ordering::SeqCst);
    compactor.join().unwrap();

    assert_eq!(served, u64::from(IMAGES) * REQUESTS_PER_IMAGE);
    let mut refused_turns = 0;
    for &i in &images {
        let c = shared.counters(i).unwrap();
        assert_eq!(c.completed_requests, REQUESTS_PER_IMAGE);
        refused_turns += c.refused_turns;
    }
    assert!(refused_turns > 0, "the small log should have made writes wait");
    assert_eq!(shared.submit(images[0], Descriptor::flush(1)), Err(Error::ShuttingDown));
}

#[test]
fn a_blocked_worker_times_out_and_shutdown_wakes_it() {
    let sched = Scheduler::new(Config::default(), MonotonicClock::new()).unwrap();
    let shared = Arc::new(Shared::new(sched, FakeLog::with(&[(ImageId(0), 0)])));
    shared.add_image(ImageId(0)).unwrap();
    let t0 = Instant::now();
    assert!(matches!(shared.next_blocking(Duration::from_millis(5)), Next::TimedOut));
    assert!(t0.elapsed() >= Duration::from_millis(5));

    // A held write: the waiting worker wakes at the retry deadline on its
    // own, and a shutdown ends its wait.
    shared.submit(ImageId(0), Descriptor::write(1, 0, BLOCK)).unwrap();
    let waiter = {
        let shared = shared.clone();
        thread::spawn(move || matches!(shared.next_blocking(Duration::from_secs(60)), Next::Shutdown))
    };
    thread::sleep(Duration::from_millis(20));
    shared.shutdown();
    assert!(waiter.join().unwrap(), "shutdown must end the worker's wait");
    assert!(shared.is_shutdown());
    assert!(matches!(shared.complete(ImageId(0), RequestId(1)), Err(Error::NotDispatched { .. })));
}

/// Targeted wakes must fan out: a completed FLUSH frees four reads while
/// five workers sleep with long timeouts; each read must reach a worker by
/// a wake (a chain of one wake per dispatch), not by a worker's timeout.
#[test]
fn a_completed_flush_wakes_enough_workers_for_everything_it_freed() {
    let sched = Scheduler::new(Config::default(), MonotonicClock::new()).unwrap();
    let shared = Arc::new(Shared::new(sched, FakeLog::with(&[(ImageId(0), 0)])));
    let image = ImageId(0);
    shared.add_image(image).unwrap();
    shared.submit(image, Descriptor::read(0, 0, BLOCK)).unwrap();
    let Next::Dispatch(r0) = shared.next_blocking(Duration::from_secs(1)) else { panic!("R0 is admissible") };
    shared.submit(image, Descriptor::flush(1)).unwrap();
    for i in 2..6 {
        shared.submit(image, Descriptor::read(i, i * BLOCK, BLOCK)).unwrap();
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let workers: Vec<_> = (0..5)
        .map(|_| {
            let (shared, tx) = (shared.clone(), tx.clone());
            // Each worker takes one request and holds it (no completion).
            thread::spawn(move || {
                if let Next::Dispatch(d) = shared.next_blocking(Duration::from_secs(60)) {
                    tx.send((d.op, d.request)).unwrap();
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(20)); // let them fall asleep
    shared.complete(image, r0.request).unwrap();
    let wake_bound = Duration::from_secs(5); // far below the workers' 60 s timeout
    let (op, flush) = rx.recv_timeout(wake_bound).expect("the completion wakes a worker for the FLUSH");
    assert_eq!(op, Op::Flush);
    shared.complete(image, flush).unwrap();
    let mut reads: Vec<u64> =
        (0..4).map(|_| rx.recv_timeout(wake_bound).expect("every freed read wakes a worker").1 .0).collect();
    reads.sort_unstable();
    assert_eq!(reads, vec![2, 3, 4, 5]);
    shared.shutdown();
    for w in workers {
        w.join().unwrap();
    }
}
