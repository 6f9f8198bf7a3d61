//! The in-process load generator of `ci/bench sched` and `ci/bench path`: a
//! fake frontend on the daemon's own request path (the `serve` crate:
//! scheduler, workers, sync threads, reads in place), as the ublk queue
//! threads drive it, without ublk. One "queue thread" per queue of a
//! stream (one image, `queues` queues) keeps `queue_depth` requests
//! outstanding (closed loop, like fio at a fixed iodepth): it stamps a
//! write's payload into its tag's buffer, calls `serve::submit`, and waits
//! on the queue's completions (an eventfd, polled) for the rest, ending
//! each with `serve::finish` and checking a read's data.
//!
//! ```text
//!  queue thread (per queue of a stream)      serve (the daemon's code)
//!  stamp payload in the tag buffer
//!  serve::submit(request) --------------->  in place (reads in memory) -> Completed(result)
//!                                           or the scheduler -> workers -> Done on the eventfd
//!  serve::finish(done), verify, record latency <-'
//! ```
//!
//! `SCHED_BENCH_IN_PLACE=0` is gone with the copy of the path it switched:
//! reads go in place exactly when the daemon's do. With [`Tracing::Off`]
//! the devices are untraced (`DeviceCore::traced`): no trace clock reads,
//! no I/O observed, nothing recorded; everything else is the same.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sched::{Config, ImageCounters, ImageId, Op};
use serve::{DeviceCore, HeapBuffers, Request, Server, Submitted, TagBuffers};

use crate::engine::Engine;

/// What a stream's device gets before it is attached (a stand-in for the
/// engine, tracing off, ...); `|_, _| {}` for the daemon's own set-up.
pub type Configure<'a> = &'a dyn Fn(&Stream, &mut DeviceCore<HeapBuffers>);

/// How long the end of an arm waits for outstanding requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

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
    /// Requests each queue thread keeps outstanding.
    pub queue_depth: usize,
    /// Queues of the device, each with its own thread.
    pub queues: u16,
    /// Offsets are multiples of `block_bytes` below this.
    pub span_bytes: u64,
    pub pattern: Pattern,
}

/// Where a stream's offsets go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Uniformly random over the span.
    Random,
    /// Each queue walks its own equal part of the span in order, wrapping.
    Sequential,
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

/// Offsets of one queue thread's requests.
struct Offsets {
    pattern: Pattern,
    block_bytes: u64,
    /// The part of the span this queue walks (sequential) or the span.
    start_bytes: u64,
    part_blocks: u64,
    next_block: u64,
    rng: StdRng,
}

impl Offsets {
    fn new(s: &Stream, qid: u16, seed: u64) -> Offsets {
        let blocks = s.span_bytes / s.block_bytes;
        let (start_block, part_blocks) = match s.pattern {
            Pattern::Random => (0, blocks),
            Pattern::Sequential => {
                let part = blocks / u64::from(s.queues);
                (u64::from(qid) * part, part)
            }
        };
        assert!(
            part_blocks > 0,
            "a span of {} bytes for {} queues of {} byte blocks",
            s.span_bytes,
            s.queues,
            s.block_bytes
        );
        Offsets {
            pattern: s.pattern,
            block_bytes: s.block_bytes,
            start_bytes: start_block * s.block_bytes,
            part_blocks,
            next_block: 0,
            rng: StdRng::seed_from_u64(0x5c4ed ^ seed),
        }
    }

    fn next(&mut self) -> u64 {
        let block = match self.pattern {
            Pattern::Random => self.rng.gen_range(0..self.part_blocks),
            Pattern::Sequential => {
                let b = self.next_block;
                self.next_block = (b + 1) % self.part_blocks;
                b
            }
        };
        self.start_bytes + block * self.block_bytes
    }
}

impl ArmResult {
    pub fn stream(&self, op: Op) -> &StreamResult {
        self.streams.iter().find(|s| s.stream.op == op).expect("the arm has a stream of this op")
    }
}

/// The pattern the first 8 bytes of a seeded image's block at `offset`
/// hold (its block number), which reads check.
pub fn block_pattern(offset_bytes: u64) -> [u8; 8] {
    (offset_bytes / 4096).to_le_bytes()
}

/// Makes every 4 KiB block of a write payload distinct from every other
/// block written by this process, seeded images included (like guest data,
/// unlike a constant fill that would deduplicate into one chunk and leave
/// compaction nothing to store): the first word names the queue thread and
/// the request, the second the run (`RUNS`: a store kept across runs must
/// not see one run's blocks again in the next) and the block. Bit 63 of the
/// second word tells it from a seeded pattern, whose second word is 0 or
/// random.
fn stamp(buf: &mut [u8], stream: u64, generation: u64, run: u64) {
    for (i, block) in buf.chunks_mut(4096).enumerate() {
        block[..8].copy_from_slice(&(stream << 56 | generation).to_le_bytes());
        block[8..16].copy_from_slice(&(1 << 63 | (run & 0x7fff_ffff) << 32 | i as u64).to_le_bytes());
    }
}

/// Runs of `run_arm` in this process, numbering their payloads (`stamp`).
static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Threads serving FLUSH and FUA (the daemon's count; this load sends none).
const SYNC_THREADS: usize = 4;

/// What one queue thread measured (or a stream's threads, summed).
struct QueueResult {
    latency_ns: Histogram<u64>,
    requests: u64,
    errors: u64,
    admission_wait_ns: Histogram<u64>,
    cpu_ns: u64,
}

impl QueueResult {
    fn new() -> QueueResult {
        QueueResult {
            latency_ns: latency_histogram(),
            requests: 0,
            errors: 0,
            admission_wait_ns: latency_histogram(),
            cpu_ns: 0,
        }
    }

    fn add(&mut self, other: QueueResult) {
        self.latency_ns.add(&other.latency_ns).expect("histograms of one shape");
        self.admission_wait_ns.add(&other.admission_wait_ns).expect("histograms of one shape");
        self.requests += other.requests;
        self.errors += other.errors;
        self.cpu_ns += other.cpu_ns;
    }
}

/// Runs `streams` together for `secs` on `engine` with `workers` workers
/// on a fresh request path (`serve::Server`) with a scheduler of `config`;
/// each stream's device is set up by `configure` before it is attached.
pub fn run_arm(
    engine: &Engine,
    config: Config,
    workers: usize,
    streams: &[Stream],
    secs: f64,
    tracing: Tracing,
    configure: Configure<'_>,
) -> ArmResult {
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let server =
        Server::<HeapBuffers>::start(config, workers, SYNC_THREADS).expect("benchmark config is valid");
    let cores: Vec<Arc<DeviceCore<HeapBuffers>>> = streams
        .iter()
        .map(|s| {
            let depth = u16::try_from(s.queue_depth).expect("a queue depth fits u16");
            let buf_bytes = u32::try_from(s.block_bytes).expect("a block fits u32");
            let loan = engine.lend(serve::tag_buffer_bytes(s.queues, depth, buf_bytes));
            let bufs =
                (0..s.queues).map(|_| HeapBuffers::new(s.queue_depth, s.block_bytes as usize)).collect();
            let image = engine.image(s.image).clone();
            let name = format!("image-{}", s.image);
            let mut core = DeviceCore::new(s.image, &name, image, false, bufs, depth, buf_bytes, loan)
                .expect("an eventfd for the queue");
            core.traced = tracing == Tracing::On;
            configure(s, &mut core);
            let core = Arc::new(core);
            server.attach(core.clone()).expect("one stream per image");
            core
        })
        .collect();

    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    // One thread per (stream, queue); `n` numbers them across the arm.
    let threads: Vec<(usize, thread::JoinHandle<QueueResult>)> = streams
        .iter()
        .zip(&cores)
        .enumerate()
        .flat_map(|(i, (s, core))| (0..s.queues).map(move |qid| (i, s, core, qid)))
        .enumerate()
        .map(|(n, (i, s, core, qid))| {
            let (sched, core, s) = (server.sched.clone(), core.clone(), *s);
            let handle = thread::Builder::new()
                .name(format!("bench-queue-{n}"))
                .spawn(move || {
                    let cpu = thread_cpu_ns();
                    let mut result = queue_thread(&sched, &core, s, qid, deadline, n as u64, run);
                    result.cpu_ns = thread_cpu_ns() - cpu;
                    result
                })
                .expect("spawn a queue thread");
            (i, handle)
        })
        .collect();
    let mut results: Vec<QueueResult> = streams.iter().map(|_| QueueResult::new()).collect();
    for (i, handle) in threads {
        results[i].add(handle.join().expect("queue thread panicked"));
    }
    let serve_cpu_ns = serve_threads_cpu_ns();
    let sched = streams
        .iter()
        .map(|s| (s.image, server.sched.counters(s.image).expect("a registered image")))
        .collect();
    let traces = match tracing {
        Tracing::On => cores.iter().map(|c| (c.sched_id, c.tracer.snapshot())).collect(),
        Tracing::Off => Vec::new(),
    };
    for core in &cores {
        // Refused only with requests still in flight, which the queue
        // thread already counted as errors.
        if let Err(e) = server.detach(core) {
            eprintln!("frontend: detaching image {}: {e}", core.sched_id);
        }
    }
    server.shutdown();
    let request_path_cpu_ns = serve_cpu_ns + results.iter().map(|r| r.cpu_ns).sum::<u64>();
    let streams = results
        .into_iter()
        .zip(streams)
        .map(|(r, s)| StreamResult {
            stream: *s,
            latency_ns: r.latency_ns,
            requests: r.requests,
            errors: r.errors,
            admission_wait_ns: r.admission_wait_ns,
        })
        .collect();
    ArmResult { secs, streams, sched, traces, request_path_cpu_ns }
}

/// Nanoseconds the calling thread has run on a CPU.
fn thread_cpu_ns() -> u64 {
    cas::thread_time::on_cpu_ns().expect("read /proc/thread-self/schedstat")
}

/// CPU nanoseconds of the request path's own threads (serve's workers and
/// sync threads), read before they exit.
fn serve_threads_cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.starts_with("casblk-worker") || c.starts_with("casblk-sync"))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| cas::thread_time::parse_schedstat(&s).map(|(on_cpu_ns, _)| on_cpu_ns))
        .sum()
}

/// Keeps `queue_depth` requests of stream `s` outstanding on queue `qid`
/// of `core` until `deadline`; counts what completed within the window.
fn queue_thread(
    sched: &serve::Sched,
    core: &DeviceCore<HeapBuffers>,
    s: Stream,
    qid: u16,
    deadline: Instant,
    seed: u64,
    run: u64,
) -> QueueResult {
    let mut offsets_of = Offsets::new(&s, qid, seed);
    let mut r = QueueResult::new();
    let queue = &core.queues[usize::from(qid)];
    let mut submitted_at = vec![Instant::now(); s.queue_depth];
    let mut offsets = vec![0u64; s.queue_depth];
    let mut generation = 0u64;
    let mut outstanding = 0usize;
    // Requests served in place: (tag, result, admission wait), not yet
    // counted.
    let mut ready = Vec::with_capacity(s.queue_depth);
    // Where each tag's request is, and when it was submitted.
    type Ready = Vec<(u16, i32, Option<u64>)>;
    let mut submit = |tag: u16, ready: &mut Ready, offsets: &mut [u64], submitted_at: &mut [Instant]| {
        generation += 1;
        let offset = offsets_of.next();
        offsets[usize::from(tag)] = offset;
        if s.op == Op::Write {
            // SAFETY: the tag is free: nothing else serves it until submit.
            stamp(unsafe { queue.bufs.request_bytes(tag, s.block_bytes as usize) }, seed, generation, run);
        }
        submitted_at[usize::from(tag)] = Instant::now();
        let seen_ns = if core.traced { trace::now_ns() } else { 0 };
        let request = Request {
            qid,
            tag,
            op: s.op,
            offset_bytes: offset,
            len_bytes: s.block_bytes,
            fua: false,
            seen_ns,
        };
        match serve::submit(sched, core, request) {
            // Served in place: admitted at once, no admission wait.
            Submitted::Completed(result) => ready.push((tag, result, core.traced.then_some(0))),
            Submitted::Pending => {}
        }
    };
    for tag in 0..s.queue_depth as u16 {
        submit(tag, &mut ready, &mut offsets, &mut submitted_at);
        outstanding += 1;
    }
    let mut batch: Ready = Vec::with_capacity(s.queue_depth);
    while outstanding > 0 {
        // Both sources every round, as the daemon's tag tasks do: reads that
        // keep completing in place must not hold back a worker's results.
        batch.append(&mut ready);
        for d in queue.completions.drain() {
            let result = serve::finish(core, &d);
            let wait = d.trace.admitted_ns().map(|a| a.saturating_sub(d.trace.seen_ns()));
            batch.push((d.tag, result, if core.traced { wait } else { None }));
        }
        if batch.is_empty() {
            let limit = deadline.max(Instant::now()) + DRAIN_TIMEOUT;
            if !wait_readable(&queue.completions, limit) {
                r.errors += outstanding as u64; // requests that never completed
                break;
            }
            continue;
        }
        for (tag, result, wait) in batch.drain(..) {
            outstanding -= 1;
            let now = Instant::now();
            let t = usize::from(tag);
            let ok = result == s.block_bytes as i32
                && (s.op != Op::Read
                    // SAFETY: completed: the queue thread serves the tag again.
                    || verify(unsafe { queue.bufs.request_bytes(tag, s.block_bytes as usize) }, offsets[t])
                        .map_err(|e| eprintln!("frontend: read on image {} failed: {e}", s.image))
                        .is_ok());
            if result < 0 {
                eprintln!("frontend: {:?} on image {} failed: errno {}", s.op, s.image, -result);
            }
            if let Some(w) = wait {
                r.admission_wait_ns.saturating_record(w);
            }
            if now <= deadline {
                r.latency_ns.saturating_record(now.duration_since(submitted_at[t]).as_nanos() as u64);
                r.requests += 1;
                r.errors += u64::from(!ok);
                submit(tag, &mut ready, &mut offsets, &mut submitted_at);
                outstanding += 1;
            }
        }
    }
    r
}

/// Waits until the queue's eventfd is readable (a worker posted), or
/// `limit`; clears it. False on time-out.
fn wait_readable(completions: &serve::Completions, limit: Instant) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let left = limit.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return false;
    }
    let timeout = Timespec { tv_sec: left.as_secs() as i64, tv_nsec: i64::from(left.subsec_nanos()) };
    let fd = completions.eventfd();
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    match poll(&mut fds, Some(&timeout)) {
        Ok(0) => false,
        Ok(_) => {
            let mut counter = [0u8; 8];
            let _ = rustix::io::read(fd, &mut counter);
            true
        }
        Err(_) => true, // EINTR: look again
    }
}

fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000_000, 3).expect("histogram bounds")
}

/// Read data must be what the image was seeded with ([`block_pattern`]).
fn verify(buf: &[u8], offset_bytes: u64) -> Result<(), String> {
    for (i, block) in buf.chunks(4096).enumerate() {
        let want = block_pattern(offset_bytes + i as u64 * 4096);
        if block[..8] != want {
            return Err(format!("block at {} holds wrong data", offset_bytes + i as u64 * 4096));
        }
    }
    Ok(())
}
