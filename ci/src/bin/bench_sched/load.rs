//! The in-process load generator: shaped like the daemon. One "queue
//! thread" per stream keeps `queue_depth` requests outstanding (closed
//! loop, like fio at a fixed iodepth) and submits descriptor snapshots; a
//! worker pool pulls admitted requests from the [`SharedScheduler`], runs
//! them on the engine, completes them and hands the result back to the
//! queue thread, which records the request's latency.
//!
//! ```text
//!  queue thread (per stream)          workers (pool)
//!  submit(slot) ----------------->  next_blocking -> engine -> complete
//!  record latency(slot) <-- channel ------------------------------'
//! ```
//!
//! Each outstanding request owns one slot buffer (payload or destination);
//! the request id is `generation << 8 | slot`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam::channel::{self, Receiver, Sender};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sched::{Config, Descriptor, ImageId, MonotonicClock, Next, Op, RequestId, Scheduler, SharedScheduler};

use crate::engine::{Engine, EngineCapacity};

const SLOT_BITS: u32 = 8;
/// How long the end of an arm waits for outstanding requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// One closed-loop request stream against one image.
#[derive(Clone, Copy, Debug)]
pub struct Stream {
    pub image: ImageId,
    pub op: Op,
    pub block_bytes: u64,
    pub queue_depth: usize,
    /// Offsets are random multiples of `block_bytes` below this.
    pub span_bytes: u64,
}

/// What one stream measured.
pub struct StreamResult {
    pub stream: Stream,
    /// Completion latency, submit to completion seen by the queue thread.
    pub latency_ns: Histogram<u64>,
    pub requests: u64,
    pub errors: u64,
    /// Admission waits (`admitted - arrival`) of its requests.
    pub admission_wait_ns: Histogram<u64>,
}

pub struct ArmResult {
    pub secs: f64,
    pub streams: Vec<StreamResult>,
}

/// Returns the pattern a block of an image holds: its block index.
pub fn block_pattern(offset_bytes: u64) -> [u8; 8] {
    (offset_bytes / 4096).to_le_bytes()
}

struct Completion {
    slot: usize,
    ok: bool,
}

/// What workers need to know about a stream.
struct StreamShared {
    stream: Stream,
    buffers: Vec<Mutex<Vec<u8>>>,
    done: Sender<Completion>,
    admission_wait_ns: Mutex<Histogram<u64>>,
    errors: AtomicU64,
}

type Shared<E> = SharedScheduler<MonotonicClock, EngineCapacity<E>>;

/// Runs `streams` together for `secs` on `engine` with `workers` workers.
pub fn run_arm<E: Engine>(
    engine: Arc<E>,
    config: Config,
    streams: &[Stream],
    secs: f64,
    workers: usize,
) -> ArmResult {
    let sched = Scheduler::new(config, MonotonicClock::new()).expect("benchmark config is valid");
    let shared: Arc<Shared<E>> = Arc::new(SharedScheduler::new(sched, EngineCapacity(engine.clone())));
    let weak = Arc::downgrade(&shared);
    engine.set_capacity_listener(Arc::new(move |image| {
        if let Some(s) = weak.upgrade() {
            s.capacity_released(image);
        }
    }));

    let mut receivers = Vec::new();
    let mut by_image = HashMap::new();
    for (n, s) in streams.iter().enumerate() {
        assert!(s.queue_depth < 1 << SLOT_BITS, "queue depth fits the slot bits");
        shared.add_image(s.image).expect("one stream per image");
        let (tx, rx) = channel::bounded(s.queue_depth);
        let fill = if s.op == Op::Write { 0xa5 } else { 0 };
        let buffers = (0..s.queue_depth).map(|_| Mutex::new(vec![fill; s.block_bytes as usize])).collect();
        let ss = StreamShared {
            stream: *s,
            buffers,
            done: tx,
            admission_wait_ns: Mutex::new(latency_histogram()),
            errors: AtomicU64::new(0),
        };
        by_image.insert(s.image, Arc::new(ss));
        receivers.push((n, rx));
    }
    let by_image = Arc::new(by_image);

    let pool: Vec<_> = (0..workers)
        .map(|_| {
            let (shared, engine, by_image) = (shared.clone(), engine.clone(), by_image.clone());
            thread::spawn(move || worker(&shared, &*engine, &by_image))
        })
        .collect();

    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let queues: Vec<_> = receivers
        .into_iter()
        .map(|(n, rx)| {
            let (shared, ss) = (shared.clone(), by_image[&streams[n].image].clone());
            thread::spawn(move || queue_thread(&shared, &ss, rx, deadline, n as u64))
        })
        .collect();
    let results: Vec<(Histogram<u64>, u64, u64)> =
        queues.into_iter().map(|q| q.join().expect("queue thread panicked")).collect();
    let secs = start.elapsed().as_secs_f64();
    shared.shutdown();
    for w in pool {
        w.join().expect("worker panicked");
    }
    let streams = results
        .into_iter()
        .zip(streams)
        .map(|((latency_ns, requests, errors), s)| {
            let ss = &by_image[&s.image];
            StreamResult {
                stream: *s,
                latency_ns,
                requests,
                errors: errors + ss.errors.load(Ordering::SeqCst),
                admission_wait_ns: ss.admission_wait_ns.lock().expect("histogram lock").clone(),
            }
        })
        .collect();
    ArmResult { secs, streams }
}

/// Keeps `queue_depth` requests outstanding until `deadline`; returns the
/// latency histogram, completed requests within the window, and errors.
fn queue_thread<E: Engine>(
    shared: &Shared<E>,
    ss: &StreamShared,
    done: Receiver<Completion>,
    deadline: Instant,
    seed: u64,
) -> (Histogram<u64>, u64, u64) {
    let s = ss.stream;
    let mut rng = StdRng::seed_from_u64(0x5c4ed ^ seed);
    let mut hist = latency_histogram();
    let mut submitted_at = vec![Instant::now(); s.queue_depth];
    let mut generation = 0u64;
    let (mut requests, mut errors, mut outstanding) = (0u64, 0u64, 0usize);
    let mut submit = |slot: usize, submitted_at: &mut Vec<Instant>| -> bool {
        generation += 1;
        let offset = rng.gen_range(0..s.span_bytes / s.block_bytes) * s.block_bytes;
        let request = RequestId(generation << SLOT_BITS | slot as u64);
        let desc = Descriptor { request, op: s.op, offset_bytes: offset, len_bytes: s.block_bytes };
        submitted_at[slot] = Instant::now();
        shared.submit(s.image, desc).is_ok()
    };
    for slot in 0..s.queue_depth {
        if submit(slot, &mut submitted_at) {
            outstanding += 1;
        } else {
            errors += 1;
        }
    }
    while outstanding > 0 {
        let wait = deadline.max(Instant::now()) + DRAIN_TIMEOUT - Instant::now();
        let Ok(c) = done.recv_timeout(wait) else {
            errors += outstanding as u64; // requests that never completed
            break;
        };
        outstanding -= 1;
        let now = Instant::now();
        if now <= deadline {
            let ns = now.duration_since(submitted_at[c.slot]).as_nanos() as u64;
            hist.saturating_record(ns);
            requests += 1;
            errors += u64::from(!c.ok);
            if submit(c.slot, &mut submitted_at) {
                outstanding += 1;
            } else {
                errors += 1;
            }
        }
    }
    (hist, requests, errors)
}

fn worker<E: Engine>(shared: &Shared<E>, engine: &E, by_image: &HashMap<ImageId, Arc<StreamShared>>) {
    loop {
        let d = match shared.next_blocking(Duration::from_millis(20)) {
            Next::Dispatch(d) => d,
            Next::TimedOut => continue,
            Next::Shutdown => return,
        };
        let ss = &by_image[&d.image];
        ss.admission_wait_ns.lock().expect("histogram lock").saturating_record(d.admission_wait_ns());
        let slot = (d.request.0 & ((1 << SLOT_BITS) - 1)) as usize;
        let result = {
            let mut buf = ss.buffers[slot].lock().expect("slot buffer lock");
            match d.op {
                Op::Read => {
                    engine.read(d.image, d.offset_bytes, &mut buf).and_then(|()| verify(&buf, d.offset_bytes))
                }
                Op::Write => {
                    let r = d.reservation.expect("a write is dispatched with its reservation");
                    engine.write_reserved(d.image, d.offset_bytes, &buf, r)
                }
                Op::Flush => engine.flush(d.image),
                other => Err(format!("the load generator sends no {other:?}")),
            }
        };
        if let Err(e) = &result {
            eprintln!("bench_sched: {:?} on image {} failed: {e}", d.op, d.image);
        }
        if shared.complete(d.image, d.request).is_err() {
            ss.errors.fetch_add(1, Ordering::Relaxed);
        }
        // The channel holds queue_depth completions, so this never blocks.
        // It fails only after the queue thread gave up waiting for this
        // request, and counted it as an error already.
        let _ = ss.done.send(Completion { slot, ok: result.is_ok() });
    }
}

/// Nanoseconds up to 2 minutes, 3 significant digits.
fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000_000, 3).expect("histogram bounds")
}

/// Read data must be what the image was seeded with.
fn verify(buf: &[u8], offset_bytes: u64) -> Result<(), String> {
    for (i, block) in buf.chunks(4096).enumerate() {
        let want = block_pattern(offset_bytes + i as u64 * 4096);
        if block[..8] != want {
            return Err(format!("block at {} holds wrong data", offset_bytes + i as u64 * 4096));
        }
    }
    Ok(())
}
