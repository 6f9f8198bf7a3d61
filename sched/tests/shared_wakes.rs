//! Which events wake an idle worker of [`SharedScheduler`]. A wake costs a
//! futex wake and two context switches; on the sched benchmark a wake per
//! read completion that freed nothing cost about a quarter of the read
//! throughput, so `complete` wakes a worker only when a request is
//! admissible afterwards.

mod common;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::FakeLog;
use sched::{Config, Descriptor, Dispatch, ImageId, MonotonicClock, Next, Scheduler, SharedScheduler};

type Shared = SharedScheduler<MonotonicClock, FakeLog>;

const IMAGE: ImageId = ImageId(1);

fn shared(config: Config) -> Arc<Shared> {
    let sched = Scheduler::new(config, MonotonicClock::new()).unwrap();
    let shared = Arc::new(Shared::new(sched, FakeLog::with(&[(IMAGE, 1 << 30)])));
    shared.add_image(IMAGE).unwrap();
    shared
}

fn dispatch(shared: &Shared) -> Dispatch<common::FakeReservation> {
    match shared.next_blocking(Duration::from_secs(5)) {
        Next::Dispatch(d) => d,
        other => panic!("expected a dispatch, got {other:?}"),
    }
}

/// Starts a worker that waits for one dispatch, and returns once it waits.
fn idle_worker(shared: &Arc<Shared>) -> thread::JoinHandle<Dispatch<common::FakeReservation>> {
    let s = shared.clone();
    let worker = thread::spawn(move || dispatch(&s));
    let deadline = Instant::now() + Duration::from_secs(10);
    while shared.idle_workers() == 0 {
        assert!(Instant::now() < deadline, "the worker never went idle");
        thread::sleep(Duration::from_millis(1));
    }
    worker
}

#[test]
fn a_completion_that_frees_nothing_wakes_no_worker() {
    let shared = shared(Config::default());
    shared.submit(IMAGE, Descriptor::read(1, 0, 4096)).unwrap();
    let first = dispatch(&shared);
    let worker = idle_worker(&shared);
    let wakes = shared.worker_wakes();
    shared.complete(IMAGE, first.request).unwrap();
    assert_eq!(shared.worker_wakes(), wakes, "nothing was admissible, yet an idle worker was woken");
    // A submit with an idle worker wakes it, and it gets the request.
    shared.submit(IMAGE, Descriptor::read(2, 4096, 4096)).unwrap();
    assert_eq!(worker.join().unwrap().request.0, 2);
    assert_eq!(shared.worker_wakes(), wakes + 1);
}

#[test]
fn a_completion_that_frees_a_request_wakes_a_worker() {
    // One read credit: the second read waits for the first to complete.
    let shared = shared(Config { read_credits: 1, ..Config::default() });
    shared.submit(IMAGE, Descriptor::read(1, 0, 4096)).unwrap();
    let first = dispatch(&shared);
    shared.submit(IMAGE, Descriptor::read(2, 4096, 4096)).unwrap();
    let worker = idle_worker(&shared);
    let wakes = shared.worker_wakes();
    shared.complete(IMAGE, first.request).unwrap();
    assert_eq!(worker.join().unwrap().request.0, 2, "the freed read goes to the woken worker");
    assert_eq!(shared.worker_wakes(), wakes + 1);
}

#[test]
fn requests_held_by_a_limit_go_at_their_time_with_one_timer() {
    let shared = shared(Config::default());
    let cap = sched::Limits {
        read_iops: Some(sched::RateLimit { per_sec: 100, burst: 1 }),
        ..sched::Limits::default()
    };
    shared.set_limits(IMAGE, cap).unwrap();
    for i in 0..20 {
        shared.submit(IMAGE, Descriptor::read(i, i * 4096, 4096)).unwrap();
    }
    let start = Instant::now();
    let admitted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (s, n) = (shared.clone(), admitted.clone());
            thread::spawn(move || {
                while n.load(std::sync::atomic::Ordering::SeqCst) < 20 {
                    // The workers' idle wait in the daemon.
                    if let Next::Dispatch(d) = s.next_blocking(Duration::from_millis(200)) {
                        s.complete(IMAGE, d.request).unwrap();
                        n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let elapsed = start.elapsed();
    // 1 at once, then one every 10 ms; without a timer each would wait for
    // an idle timeout (200 ms): about 4 s.
    assert!(elapsed >= Duration::from_millis(185), "{elapsed:?}: faster than the limit");
    assert!(elapsed < Duration::from_millis(1500), "{elapsed:?}: held requests waited for idle timeouts");
    let timer = shared.timer_wakes();
    assert!((10..=25).contains(&timer), "{timer} timer wakes for 19 timed admissions");
}

#[test]
fn a_read_queued_behind_its_limit_wakes_no_worker() {
    let shared = shared(Config::default());
    let cap = sched::Limits {
        read_iops: Some(sched::RateLimit { per_sec: 1, burst: 1 }),
        ..sched::Limits::default()
    };
    shared.set_limits(IMAGE, cap).unwrap();
    let first = match shared.submit_read_in_place(IMAGE, Descriptor::read(1, 0, 4096)).unwrap() {
        sched::InPlace::Admitted(d) => d,
        other => panic!("a full bucket admits in place: {other:?}"),
    };
    let worker = idle_worker(&shared);
    let wakes = shared.worker_wakes();
    // The first held read wakes the idle worker once, to sleep to its time
    // (the timer); later held reads wake nobody.
    for id in 2..6 {
        let queued = shared.submit_read_in_place(IMAGE, Descriptor::read(id, id * 4096, 4096)).unwrap();
        assert!(matches!(queued, sched::InPlace::Queued(_)), "{queued:?}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !shared.timer_armed() {
            assert!(Instant::now() < deadline, "no worker became the timer");
            thread::sleep(Duration::from_millis(1));
        }
    }
    assert_eq!(shared.worker_wakes(), wakes + 1, "workers woken for reads their limit holds");
    shared.complete(IMAGE, first.request).unwrap();
    // The timer worker takes it at its time (1 s at 1 IOPS).
    let t = Instant::now();
    assert_eq!(worker.join().unwrap().request.0, 2);
    assert!(t.elapsed() >= Duration::from_millis(900), "{:?}", t.elapsed());
}

#[test]
fn an_earlier_deadline_gets_its_own_timer() {
    // A at 1 IOPS keeps a timer asleep to a deadline a second away; B at
    // 1000 IOPS has deadlines a millisecond away, earlier than A's.
    let shared = shared(Config::default());
    let b = ImageId(2);
    shared.add_image(b).unwrap();
    let rate = |per_sec| sched::Limits {
        read_iops: Some(sched::RateLimit { per_sec, burst: 1 }),
        ..sched::Limits::default()
    };
    shared.set_limits(IMAGE, rate(1)).unwrap();
    shared.set_limits(b, rate(1000)).unwrap();
    for i in 0..5 {
        shared.submit(IMAGE, Descriptor::read(i, i * 4096, 4096)).unwrap();
    }
    let b_done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let start = Instant::now();
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (s, n) = (shared.clone(), b_done.clone());
            thread::spawn(move || loop {
                match s.next_blocking(Duration::from_millis(200)) {
                    Next::Dispatch(d) => {
                        s.complete(d.image, d.request).unwrap();
                        if d.image == ImageId(2) {
                            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                    Next::TimedOut => {}
                    Next::Shutdown => return,
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(20)); // A's timer is asleep now
                                              // B at queue depth 1: each read is submitted when the last completed,
                                              // and waits up to a millisecond for its token.
    for i in 0..30 {
        shared.submit(b, Descriptor::read(100 + i, i * 4096, 4096)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while b_done.load(std::sync::atomic::Ordering::SeqCst) <= i && Instant::now() < deadline {
            thread::yield_now();
        }
    }
    let took = start.elapsed();
    shared.shutdown();
    for w in workers {
        w.join().unwrap();
    }
    // 30 at 1000 IOPS: about 30 ms; each behind A's timer (or an idle
    // worker's 200 ms timeout), about 3 s.
    assert!(took < Duration::from_millis(1000), "B's 30 reads at queue depth 1 took {took:?}");
}
