//! The in-process load generator, shaped like the daemon's request path
//! (ublk/src/daemon/{queue,worker}.rs) without ublk. One "queue thread" per
//! stream keeps `queue_depth` requests outstanding (closed loop, like fio
//! at a fixed iodepth) and submits descriptor snapshots to a
//! [`SharedScheduler`]; a pool of workers takes admitted requests with
//! `next_blocking`, runs them on the cas image, completes them in the
//! scheduler and hands the result back to the queue thread, which records
//! the request's latency and finishes its trace.
//!
//! ```text
//!  queue thread (per stream)                 workers (pool)
//!  stamp payload, RequestTrace::new(seen)
//!  submit(desc) ------------------------->  next_blocking
//!                                           record_into(trace, now)   gates, admitted, dispatched
//!                                           cas read / write_reserved (observe::into: the engine's I/O spans)
//!                                           executed(now); complete(image, request)
//!  Tracer::finish(trace, now, result) <-- mailbox --'
//! ```
//!
//! Reads go in place as in the daemon: `submit_read_in_place`, and when
//! admitted at once the queue thread reads with `Image::read_nowait` and
//! completes the request itself; a read that would wait for the device is
//! requeued to the workers. `SCHED_BENCH_IN_PLACE=0` sends every read to
//! the workers (the daemon before in-place reads), for comparisons.
//!
//! With [`Tracing::Off`] every trace step is skipped (no `RequestTrace`, no
//! trace clock reads, no `Tracer`); everything else is the same.
//!
//! Each outstanding request owns one slot (its payload or destination
//! buffer and its trace); the request id is `generation << 8 | slot`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sched::{
    Config, Descriptor, Dispatch, ImageCounters, ImageId, InPlace, MonotonicClock, Next, Op, RequestId,
    Scheduler, SharedScheduler,
};
use trace::{RequestTrace, Tracer};

use crate::engine::{Engine, EngineCapacity};
use crate::mailbox::Mailbox;

const SLOT_BITS: u32 = 8;
/// How long the end of an arm waits for outstanding requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long an idle worker waits before checking for shutdown (as the
/// daemon's workers do).
const IDLE_WAIT: Duration = Duration::from_millis(200);

/// Whether requests are traced (the daemon always traces; `Off` exists to
/// measure what tracing costs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tracing {
    On,
    Off,
}

/// One closed-loop request stream against one image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stream {
    pub image: ImageId,
    pub op: Op,
    pub block_bytes: u64,
    pub queue_depth: usize,
    /// Offsets are random multiples of `block_bytes` below this.
    pub span_bytes: u64,
    /// Reads only: 0 reads from the engine; otherwise a read in place is
    /// this many rounds of register arithmetic instead (floor.rs): the
    /// same request path, no memory traffic, no system calls.
    pub spin_rounds: u64,
}

/// What one stream measured.
pub struct StreamResult {
    pub stream: Stream,
    /// Completion latency, submit to completion seen by the queue thread.
    pub latency_ns: Histogram<u64>,
    /// Requests completed within the arm's window.
    pub requests: u64,
    pub errors: u64,
    /// Admission waits (`admitted - arrival`) of its requests.
    pub admission_wait_ns: Histogram<u64>,
}

pub struct ArmResult {
    /// The measuring window: completions after it are not counted.
    pub secs: f64,
    pub streams: Vec<StreamResult>,
    /// The scheduler's counters per image at the end of the arm.
    pub sched: Vec<(ImageId, ImageCounters)>,
    /// The tracers' snapshots per image (empty with `Tracing::Off`).
    pub traces: Vec<(ImageId, trace::ImageStats)>,
    /// CPU time the request path's threads (queue threads and workers)
    /// spent running, in ns; engine threads (compaction) not included.
    pub request_path_cpu_ns: u64,
}

impl ArmResult {
    pub fn stream(&self, op: Op) -> &StreamResult {
        self.streams.iter().find(|s| s.stream.op == op).expect("the arm has a stream of this op")
    }
}

/// The pattern the first 8 bytes of image A's block at `offset` hold.
pub fn block_pattern(offset_bytes: u64) -> [u8; 8] {
    (offset_bytes / 4096).to_le_bytes()
}

/// Makes every 4 KiB block of a write payload distinct from every other
/// block written in the run, image A's included (like guest data, unlike a
/// constant fill that would deduplicate into one chunk and leave compaction
/// nothing to store). Bit 63 of the second word tells it from A's pattern,
/// whose second word is 0.
fn stamp(buf: &mut [u8], stream: u64, generation: u64) {
    for (i, block) in buf.chunks_mut(4096).enumerate() {
        block[..8].copy_from_slice(&(stream << 56 | generation).to_le_bytes());
        block[8..16].copy_from_slice(&(1 << 63 | i as u64).to_le_bytes());
    }
}

struct Completion {
    slot: usize,
    ok: bool,
    trace: Option<RequestTrace>,
}

/// A request's buffer and, while a worker has not taken it, its trace.
struct Slot {
    buf: Vec<u8>,
    trace: Option<RequestTrace>,
}

/// What workers need to know about a stream.
struct StreamShared {
    stream: Stream,
    /// The queue number the trace shows.
    qid: u16,
    slots: Vec<Mutex<Slot>>,
    done: Mailbox<Completion>,
    admission_wait_ns: Mutex<Histogram<u64>>,
    errors: AtomicU64,
    tracer: Option<Arc<Tracer>>,
}

type Shared = SharedScheduler<MonotonicClock, EngineCapacity>;

/// Runs `streams` together for `secs` on `engine` with `workers` workers
/// and a fresh scheduler of `config`.
pub fn run_arm(
    engine: &Engine,
    config: Config,
    workers: usize,
    streams: &[Stream],
    secs: f64,
    tracing: Tracing,
) -> ArmResult {
    let sched = Scheduler::new(config, MonotonicClock::new()).expect("benchmark config is valid");
    let shared: Arc<Shared> = Arc::new(SharedScheduler::new(sched, engine.capacity()));
    engine.listen(&shared, |s, image| s.capacity_released(image));

    let mut by_image = HashMap::new();
    for (n, s) in streams.iter().enumerate() {
        assert!(s.queue_depth < 1 << SLOT_BITS, "queue depth fits the slot bits");
        shared.add_image(s.image).expect("one stream per image");
        let slots = (0..s.queue_depth)
            .map(|_| Mutex::new(Slot { buf: vec![0; s.block_bytes as usize], trace: None }))
            .collect();
        let tracer = (tracing == Tracing::On).then(|| Arc::new(Tracer::new(format!("image-{}", s.image))));
        let ss = StreamShared {
            stream: *s,
            qid: n as u16,
            slots,
            done: Mailbox::new(s.queue_depth),
            admission_wait_ns: Mutex::new(latency_histogram()),
            errors: AtomicU64::new(0),
            tracer,
        };
        by_image.insert(s.image, Arc::new(ss));
    }
    let by_image = Arc::new(by_image);
    let cpu_ns = Arc::new(AtomicU64::new(0));

    let pool: Vec<_> = (0..workers)
        .map(|i| {
            let (shared, by_image, cpu_ns) = (shared.clone(), by_image.clone(), cpu_ns.clone());
            let images: HashMap<ImageId, Arc<cas::Image>> =
                streams.iter().map(|s| (s.image, engine.image(s.image).clone())).collect();
            thread::Builder::new()
                .name(format!("bench-worker-{i}"))
                .spawn(move || {
                    let cpu = thread_cpu_ns();
                    worker(&shared, &images, &by_image, tracing);
                    cpu_ns.fetch_add(thread_cpu_ns() - cpu, Ordering::Relaxed);
                })
                .expect("spawn a worker")
        })
        .collect();

    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let queues: Vec<_> = (0..streams.len())
        .map(|n| {
            let (shared, ss, cpu_ns) = (shared.clone(), by_image[&streams[n].image].clone(), cpu_ns.clone());
            let image = engine.image(streams[n].image).clone();
            thread::Builder::new()
                .name(format!("bench-queue-{n}"))
                .spawn(move || {
                    let cpu = thread_cpu_ns();
                    let result = queue_thread(&shared, &ss, &image, deadline, n as u64);
                    cpu_ns.fetch_add(thread_cpu_ns() - cpu, Ordering::Relaxed);
                    result
                })
                .expect("spawn a queue thread")
        })
        .collect();
    let results: Vec<(Histogram<u64>, u64, u64)> =
        queues.into_iter().map(|q| q.join().expect("queue thread panicked")).collect();
    shared.shutdown();
    for w in pool {
        w.join().expect("worker panicked");
    }
    engine.unlisten();
    let streams: Vec<StreamResult> = results
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
    let sched = streams
        .iter()
        .map(|s| (s.stream.image, shared.counters(s.stream.image).expect("a registered image")))
        .collect();
    let traces = streams
        .iter()
        .filter_map(|s| by_image[&s.stream.image].tracer.as_ref().map(|t| (s.stream.image, t.snapshot())))
        .collect();
    let request_path_cpu_ns = cpu_ns.load(Ordering::Relaxed);
    ArmResult { secs, streams, sched, traces, request_path_cpu_ns }
}

/// Nanoseconds the calling thread has run on a CPU (the first field of
/// /proc/thread-self/schedstat).
fn thread_cpu_ns() -> u64 {
    let text =
        std::fs::read_to_string("/proc/thread-self/schedstat").expect("read /proc/thread-self/schedstat");
    text.split_whitespace().next().and_then(|f| f.parse().ok()).expect("a schedstat line")
}

/// Keeps `queue_depth` requests outstanding until `deadline`; returns the
/// latency histogram, requests completed within the window, and errors.
fn queue_thread(
    shared: &Shared,
    ss: &StreamShared,
    image: &cas::Image,
    deadline: Instant,
    seed: u64,
) -> (Histogram<u64>, u64, u64) {
    let s = ss.stream;
    let mut rng = StdRng::seed_from_u64(0x5c4ed ^ seed);
    let mut hist = latency_histogram();
    let mut submitted_at = vec![Instant::now(); s.queue_depth];
    let mut generation = 0u64;
    let (mut requests, mut errors, mut outstanding) = (0u64, 0u64, 0usize);
    let trace_op = match s.op {
        Op::Read => trace::Op::Read,
        Op::Write => trace::Op::Write,
        other => panic!("the load generator sends no {other:?}"),
    };
    let in_place = std::env::var("SCHED_BENCH_IN_PLACE").map_or(true, |v| v != "0");
    let mut submit = |slot: usize, submitted_at: &mut Vec<Instant>, ready: &mut Vec<Completion>| -> bool {
        generation += 1;
        let offset = rng.gen_range(0..s.span_bytes / s.block_bytes) * s.block_bytes;
        {
            let mut sl = ss.slots[slot].lock().expect("slot lock");
            if s.op == Op::Write {
                stamp(&mut sl.buf, seed, generation);
            }
            submitted_at[slot] = Instant::now();
            if ss.tracer.is_some() {
                // Built in the slot: no copy of the trace afterwards.
                let t = sl.trace.insert(RequestTrace::new(trace_op, trace::now_ns()));
                t.set_location(ss.qid, slot as u16, offset, s.block_bytes as u32);
            }
        }
        let request = RequestId(generation << SLOT_BITS | slot as u64);
        let desc = Descriptor { request, op: s.op, offset_bytes: offset, len_bytes: s.block_bytes };
        if s.op != Op::Read || !in_place {
            return shared.submit(s.image, desc).is_ok();
        }
        match shared.submit_read_in_place(s.image, desc) {
            Ok(InPlace::Admitted(d)) => {
                if let Some(c) = read_in_place(shared, ss, image, slot, d) {
                    ready.push(c);
                }
                true
            }
            Ok(InPlace::Queued(_)) => true,
            Err(_) => false,
        }
    };
    // Reads completed in place, not yet counted and resubmitted.
    let mut ready = Vec::with_capacity(s.queue_depth);
    for slot in 0..s.queue_depth {
        if submit(slot, &mut submitted_at, &mut ready) {
            outstanding += 1;
        } else {
            errors += 1;
        }
    }
    let mut batch = Vec::with_capacity(s.queue_depth);
    while outstanding > 0 {
        if !ready.is_empty() {
            batch.append(&mut ready);
        } else if !ss.done.take_all(&mut batch, deadline.max(Instant::now()) + DRAIN_TIMEOUT) {
            errors += outstanding as u64; // requests that never completed
            break;
        }
        for c in batch.drain(..) {
            outstanding -= 1;
            let now = Instant::now();
            if let (Some(tracer), Some(t)) = (&ss.tracer, &c.trace) {
                tracer.finish(t, trace::now_ns(), if c.ok { 0 } else { -5 });
            }
            if now <= deadline {
                let ns = now.duration_since(submitted_at[c.slot]).as_nanos() as u64;
                hist.saturating_record(ns);
                requests += 1;
                errors += u64::from(!c.ok);
                if submit(c.slot, &mut submitted_at, &mut ready) {
                    outstanding += 1;
                } else {
                    errors += 1;
                }
            }
        }
    }
    (hist, requests, errors)
}

/// A read admitted in place, served on the queue thread as the daemon's
/// `worker::read_in_place` does: its completion, or `None` once it is
/// handed back to the workers (its data was not in memory).
fn read_in_place(
    shared: &Shared,
    ss: &StreamShared,
    image: &cas::Image,
    slot: usize,
    d: Dispatch<cas::image::LogReservation>,
) -> Option<Completion> {
    let mut sl = ss.slots[slot].lock().expect("slot lock");
    let Slot { buf, trace } = &mut *sl;
    // The scheduler runs on the trace clock: its admission time is this
    // read's admission, dispatch and start, as in the daemon.
    let begin_ns = trace.is_some().then_some(d.admitted_ns);
    let mut spans = cas::observe::IoTimes::default();
    let read = match ss.stream.spin_rounds {
        0 if trace.is_some() => {
            let (read, observed) = cas::observe::observed(|| image.read_nowait(d.offset_bytes, buf));
            spans = observed;
            read
        }
        0 => image.read_nowait(d.offset_bytes, buf),
        rounds => {
            crate::floor::spin(rounds);
            buf[..8].copy_from_slice(&block_pattern(d.offset_bytes));
            Ok(true)
        }
    };
    let result = match read {
        Ok(false) => {
            drop(sl);
            shared.requeue(d.image, d.request).expect("requeue an admitted read");
            return None;
        }
        Ok(true) => verify(buf, d.offset_bytes),
        Err(e) => Err(e.to_string()),
    };
    // As the daemon: the trace is finished here, its completion at its
    // execution's end (one clock read for both).
    if let (Some(t), Some(begin_ns), Some(tracer)) = (trace.as_mut(), begin_ns, &ss.tracer) {
        d.record_into(t, begin_ns);
        cas::observe::record(t, &spans);
        let end_ns = trace::now_ns();
        t.executed(end_ns);
        tracer.finish(t, end_ns, if result.is_ok() { 0 } else { -5 });
    }
    *trace = None;
    drop(sl);
    ss.admission_wait_ns.lock().expect("histogram lock").saturating_record(d.admission_wait_ns());
    if let Err(e) = &result {
        eprintln!("bench_sched: in-place read on image {} failed: {e}", d.image);
    }
    if shared.complete(d.image, d.request).is_err() {
        ss.errors.fetch_add(1, Ordering::Relaxed);
    }
    Some(Completion { slot, ok: result.is_ok(), trace: None })
}

fn worker(
    shared: &Shared,
    images: &HashMap<ImageId, Arc<cas::Image>>,
    by_image: &HashMap<ImageId, Arc<StreamShared>>,
    tracing: Tracing,
) {
    loop {
        let d = match shared.next_blocking(IDLE_WAIT) {
            Next::Dispatch(d) => d,
            Next::TimedOut => continue,
            Next::Shutdown => return,
        };
        let ss = &by_image[&d.image];
        ss.admission_wait_ns.lock().expect("histogram lock").saturating_record(d.admission_wait_ns());
        let slot = (d.request.0 & ((1 << SLOT_BITS) - 1)) as usize;
        let image = &images[&d.image];
        let (result, trace) = {
            let mut sl = ss.slots[slot].lock().expect("slot lock");
            let Slot { buf, trace } = &mut *sl;
            let mut trace = trace.take();
            // As the daemon's worker: one clock read marks admission,
            // dispatch and the start of the I/O.
            let begin_ns = (tracing == Tracing::On).then(trace::now_ns);
            if let (Some(t), Some(now)) = (&mut trace, begin_ns) {
                d.record_into(t, now);
            }
            let run = || match d.op {
                Op::Read => image
                    .read(d.offset_bytes, buf)
                    .map_err(|e| e.to_string())
                    .and_then(|()| verify(buf, d.offset_bytes)),
                Op::Write => {
                    let r = d.reservation.expect("a write is dispatched with its reservation");
                    image.write_reserved(r, d.offset_bytes, buf, false).map_err(|e| e.to_string())
                }
                other => Err(format!("the load generator sends no {other:?}")),
            };
            // As the daemon's worker: the engine's I/O spans go into the trace.
            let result = match &mut trace {
                Some(t) => {
                    let result = cas::observe::into(t, run);
                    t.executed(trace::now_ns());
                    result
                }
                None => run(),
            };
            (result, trace)
        };
        if let Err(e) = &result {
            eprintln!("bench_sched: {:?} on image {} failed: {e}", d.op, d.image);
        }
        if shared.complete(d.image, d.request).is_err() {
            ss.errors.fetch_add(1, Ordering::Relaxed);
        }
        // After the queue thread gave up waiting (and counted this request
        // as an error), the post is never taken.
        ss.done.post(Completion { slot, ok: result.is_ok(), trace });
    }
}

/// Nanoseconds up to 2 minutes, 3 significant digits.
fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000_000, 3).expect("histogram bounds")
}

/// Read data must be what image A was seeded with.
fn verify(buf: &[u8], offset_bytes: u64) -> Result<(), String> {
    for (i, block) in buf.chunks(4096).enumerate() {
        let want = block_pattern(offset_bytes + i as u64 * 4096);
        if block[..8] != want {
            return Err(format!("block at {} holds wrong data", offset_bytes + i as u64 * 4096));
        }
    }
    Ok(())
}
