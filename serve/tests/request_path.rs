//! The request path (serve) driven by a fake frontend the way the ublk
//! queue threads drive it: `serve::submit`, then the queue's completions
//! and `serve::finish`. Random streams of reads, writes, FUA writes,
//! flushes, discards and write-zeroes run against several images at once,
//! two queues each, through the real scheduler, workers, sync threads and
//! in-place serving, on the real engine over `MemStorage`, with logs small
//! enough that writers are held for capacity while background compaction
//! reclaims.
//!
//! The scheduler's ordering contract (docs/design.md) makes each image
//! behave as if its requests ran one at a time in arrival order, so a
//! model disk updated at submission predicts every read exactly. After
//! each round the storage crashes (unsynced bytes lost) and every sector
//! must hold what the last completed FLUSH made durable, or something
//! written after that FLUSH arrived; a sector a completed FUA request
//! wrote after that FLUSH holds that request's data or something later.
//! Read buffers are poisoned before each read, so a read that copies
//! nothing fails. The second round of each seed plays a frontend with user copy
//! ([`TestBuffers`]): the request data lives on the "kernel" side, the
//! path must load a write's data and store a read's, and the daemon-side
//! buffer is poisoned after every request, so a missed load writes poison
//! and a missed store leaves a read's poison for the check.
//!
//! `SERVE_PATH_SEEDS` (default 3) seeds of `SERVE_PATH_REQUESTS` (default
//! 1200) requests per image per round, two rounds each. A failure names its
//! seed: replay it alone with `SERVE_PATH_SEED=N`, and keep it below as a
//! named regression test.

use cas::storage::{CrashMode, MemStorage, Storage};
use cas::{Store, StoreOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sched::{ImageId, Op};
use serve::{DeviceCore, HeapBuffers, ReadStandIn, Request, Server, Submitted, TagBuffers};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECTOR: u64 = 512;
const IMAGE_BYTES: u64 = 8 << 20;
const IMAGES: usize = 3;
/// Two hardware queues per image, driven by one thread (one arrival order).
const QUEUES: u16 = 2;
const DEPTH: u16 = 8;
const IO_BUF_BYTES: u32 = 128 << 10;
/// A request that has not completed by then is a hang.
const COMPLETION_TIMEOUT: Duration = Duration::from_secs(60);

fn store_dir() -> PathBuf {
    PathBuf::from("/store")
}

fn opts() -> StoreOptions {
    StoreOptions {
        log_segment_bytes: 1 << 20,
        log_quota_bytes: 4 << 20,
        compaction_interval_ms: 10,
        ..StoreOptions::default()
    }
}

fn name(i: usize) -> String {
    format!("img{i}")
}

/// The bytes request `token` (> 0) puts into sector `sector`; 0 is zeros.
fn fill_sector(out: &mut [u8], token: u64, sector: u64) {
    if token == 0 {
        out.fill(0);
        return;
    }
    out[..8].copy_from_slice(&token.to_le_bytes());
    out[8..16].copy_from_slice(&sector.to_le_bytes());
    let mut x = token.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ sector;
    for w in out[16..].chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes()[..w.len()]);
    }
}

/// Which token a sector read back holds, if it is one at all.
fn decode_sector(buf: &[u8], sector: u64) -> Option<u64> {
    let token = u64::from_le_bytes(buf[..8].try_into().unwrap());
    let mut want = [0u8; SECTOR as usize];
    fill_sector(&mut want, token, sector);
    (buf == want).then_some(token)
}

/// A write-kind request in arrival order: its sectors and what they hold.
struct Written {
    first: u64,
    sectors: u64,
    token: u64,
}

/// One image's model: sector tokens as of the requests submitted so far,
/// and what survives a crash.
struct Model {
    current: Vec<u64>,
    /// Every write-kind request since the image was opened, in arrival order.
    log: Vec<Written>,
    /// Sector tokens as of the newest FLUSH that completed, and how much of
    /// `log` had arrived before it.
    durable: Vec<u64>,
    durable_log: usize,
    /// Per sector, the `log` index of the newest completed FUA request
    /// covering it: durable, with everything that arrived before it.
    fua: Vec<Option<usize>>,
}

impl Model {
    fn new(current: Vec<u64>) -> Model {
        let fua = vec![None; current.len()];
        Model { durable: current.clone(), current, log: Vec::new(), durable_log: 0, fua }
    }

    /// The FUA request at `log` index `at` completed.
    fn fua_completed(&mut self, at: usize) {
        let w = &self.log[at];
        for f in &mut self.fua[w.first as usize..(w.first + w.sectors) as usize] {
            *f = Some(f.map_or(at, |old| old.max(at)));
        }
    }

    fn write(&mut self, first: u64, sectors: u64, token: u64) {
        self.current[first as usize..(first + sectors) as usize].fill(token);
        self.log.push(Written { first, sectors, token });
    }

    /// May sector `s` hold `token` after a crash? What the last completed
    /// FLUSH made durable, or a later write; after a completed FUA request
    /// newer than that FLUSH, only that request's data or a later write.
    fn may_hold(&self, s: u64, token: u64) -> bool {
        let covers = |w: &Written| w.token == token && (w.first..w.first + w.sectors).contains(&s);
        match self.fua[s as usize].filter(|&at| at >= self.durable_log) {
            Some(at) => self.log[at..].iter().any(covers),
            None => self.durable[s as usize] == token || self.log[self.durable_log..].iter().any(covers),
        }
    }
}

/// What a tag's request expects when it completes.
enum Expect {
    /// Bytes transferred, and for a read the tokens of its sectors.
    Data { first: u64, tokens: Option<Vec<u64>> },
    /// A FLUSH: the model's state and log position when it arrived.
    Flush { durable: Vec<u64>, log: usize },
    /// DISCARD or WRITE_ZEROES.
    Zero,
}

/// Tag buffers with an optional user-copy frontend: with `kernel`, the
/// request data lives there (as in the kernel's request pages) and passes
/// to and from `heap`, the daemon's buffers, only through `load_write` and
/// `store_read`, which count what they move.
struct TestBuffers {
    heap: HeapBuffers,
    kernel: Option<HeapBuffers>,
    loads: AtomicU64,
    stores: AtomicU64,
    /// Of those, made on the frontend's own thread (served in place).
    loads_in_place: AtomicU64,
    stores_in_place: AtomicU64,
    /// Every copy fails, as when the frontend's device goes away.
    fail_copies: AtomicBool,
    failed: AtomicU64,
    failed_in_place: AtomicU64,
    /// `finished` calls per tag since its last completion.
    finished: Vec<AtomicU32>,
}

thread_local! {
    /// This thread drives a frontend (`drive`): requests it serves itself
    /// are served in place.
    static FRONTEND_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Counts one copy, and whether it was made in place.
fn count(all: &AtomicU64, in_place: &AtomicU64) {
    all.fetch_add(1, Ordering::Relaxed);
    if FRONTEND_THREAD.with(|f| f.get()) {
        in_place.fetch_add(1, Ordering::Relaxed);
    }
}

impl TestBuffers {
    fn new(user_copy: bool) -> TestBuffers {
        let bufs = || HeapBuffers::new(usize::from(DEPTH), IO_BUF_BYTES as usize);
        TestBuffers {
            heap: bufs(),
            kernel: user_copy.then(bufs),
            loads: AtomicU64::new(0),
            stores: AtomicU64::new(0),
            loads_in_place: AtomicU64::new(0),
            stores_in_place: AtomicU64::new(0),
            fail_copies: AtomicBool::new(false),
            failed: AtomicU64::new(0),
            failed_in_place: AtomicU64::new(0),
            finished: (0..DEPTH).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// The request's data as the frontend sees it.
    ///
    /// # Safety
    /// The frontend serves `tag`: no request of it is in flight.
    #[allow(clippy::mut_from_ref)]
    unsafe fn frontend_bytes(&self, tag: u16, len: usize) -> &mut [u8] {
        // SAFETY: the caller's contract, as request_bytes'.
        unsafe { self.kernel.as_ref().unwrap_or(&self.heap).request_bytes(tag, len) }
    }

    fn refuse_if_failing(&self) -> std::io::Result<()> {
        if self.fail_copies.load(Ordering::Relaxed) {
            count(&self.failed, &self.failed_in_place);
            return Err(std::io::Error::from_raw_os_error(libc::ENODEV));
        }
        Ok(())
    }

    /// After a request: with user copy, the daemon-side buffer is poisoned,
    /// so the next request finds none of this one's data there.
    ///
    /// # Safety
    /// As [`TestBuffers::frontend_bytes`].
    unsafe fn poison_daemon_side(&self, tag: u16) {
        if self.kernel.is_some() {
            // SAFETY: the caller's contract.
            unsafe { self.heap.request_bytes(tag, IO_BUF_BYTES as usize) }.fill(0x5A);
        }
    }
}

impl TagBuffers for TestBuffers {
    unsafe fn request_bytes(&self, tag: u16, len: usize) -> &mut [u8] {
        // SAFETY: forwarded contract.
        unsafe { self.heap.request_bytes(tag, len) }
    }

    unsafe fn load_write(&self, tag: u16, len: usize) -> std::io::Result<()> {
        if let Some(kernel) = &self.kernel {
            self.refuse_if_failing()?;
            // SAFETY: forwarded contract; the two sets are distinct memory.
            unsafe { self.heap.request_bytes(tag, len).copy_from_slice(kernel.request_bytes(tag, len)) };
            count(&self.loads, &self.loads_in_place);
        }
        Ok(())
    }

    unsafe fn store_read(&self, tag: u16, len: usize) -> std::io::Result<()> {
        if let Some(kernel) = &self.kernel {
            self.refuse_if_failing()?;
            // SAFETY: forwarded contract; the two sets are distinct memory.
            unsafe { kernel.request_bytes(tag, len).copy_from_slice(self.heap.request_bytes(tag, len)) };
            count(&self.stores, &self.stores_in_place);
        }
        Ok(())
    }

    unsafe fn finished(&self, tag: u16, _len: usize) {
        self.finished[usize::from(tag)].fetch_add(1, Ordering::Relaxed);
    }

    fn tags(&self) -> usize {
        self.heap.tags()
    }

    fn min_bytes(&self) -> usize {
        self.heap.min_bytes()
    }
}

/// What a write-kind request's completion tells the model: a FUA
/// request's `log` index.
type FuaAt = Option<usize>;

struct Frontend {
    core: Arc<DeviceCore<TestBuffers>>,
    model: Model,
    /// By `qid * DEPTH + tag`.
    expect: Vec<Option<(Request, Expect, FuaAt)>>,
    tokens: u64,
}

impl Frontend {
    /// A random request on free tag `tag` of queue `qid`, recorded in the
    /// model.
    fn next(&mut self, rng: &mut StdRng, qid: u16, tag: u16) -> Request {
        let image_sectors = IMAGE_BYTES / SECTOR;
        let sectors = if rng.gen_bool(0.7) { 8 * rng.gen_range(1..=16u64) } else { rng.gen_range(1..=64u64) };
        let first = if rng.gen_bool(0.7) {
            rng.gen_range(0..(image_sectors - sectors) / 8) * 8
        } else {
            rng.gen_range(0..image_sectors - sectors)
        };
        let (op, fua) = match rng.gen_range(0..100) {
            0..=44 => (Op::Read, false),
            45..=79 => (Op::Write, false),
            80..=84 => (Op::Write, true),
            85..=89 => (Op::Flush, false),
            90..=94 => (Op::Discard, false),
            _ => (Op::WriteZeroes, rng.gen_bool(0.2)),
        };
        let (offset_bytes, len_bytes) =
            if op == Op::Flush { (0, 0) } else { (first * SECTOR, sectors * SECTOR) };
        let bufs = &self.core.queues[usize::from(qid)].bufs;
        let expect = match op {
            Op::Read => {
                // Poison the buffer: a read that copies nothing must not
                // find the tag's last payload there and pass.
                // SAFETY: the tag is free: no one else serves it until submit.
                unsafe { bufs.frontend_bytes(tag, len_bytes as usize) }.fill(0xA5);
                Expect::Data {
                    first,
                    tokens: Some(self.model.current[first as usize..(first + sectors) as usize].to_vec()),
                }
            }
            Op::Write => {
                self.tokens += 1;
                let token = self.tokens;
                // SAFETY: the tag is free: no one else serves it until submit.
                let buf = unsafe { bufs.frontend_bytes(tag, len_bytes as usize) };
                for (i, s) in buf.chunks_mut(SECTOR as usize).enumerate() {
                    fill_sector(s, token, first + i as u64);
                }
                self.model.write(first, sectors, token);
                Expect::Data { first, tokens: None }
            }
            Op::Flush => Expect::Flush { durable: self.model.current.clone(), log: self.model.log.len() },
            Op::Discard | Op::WriteZeroes => {
                self.model.write(first, sectors, 0);
                Expect::Zero
            }
        };
        let fua_at = (fua && op != Op::Flush).then(|| self.model.log.len() - 1);
        let r = Request { qid, tag, op, offset_bytes, len_bytes, fua, seen_ns: trace::now_ns() };
        self.expect[slot(qid, tag)] = Some((r, expect, fua_at));
        r
    }

    /// Checks the result of queue `qid`'s `tag`'s request; the tag is free
    /// again.
    fn completed(&mut self, qid: u16, tag: u16, result: i32, seed: u64) {
        let (r, expect, fua_at) =
            self.expect[slot(qid, tag)].take().expect("a request in flight on this tag");
        let what = format!(
            "seed {seed}: {} {:?} at {}+{} (fua {})",
            self.core.name, r.op, r.offset_bytes, r.len_bytes, r.fua
        );
        let bufs = &self.core.queues[usize::from(qid)].bufs;
        // SAFETY: completed: the queue thread serves the tag again.
        unsafe { bufs.poison_daemon_side(tag) };
        // The party that served a READ or WRITE said when it was done with
        // its data (twice for a read handed from in place to a worker);
        // nothing else touches request data.
        let finished = bufs.finished[usize::from(tag)].swap(0, Ordering::Relaxed);
        if !matches!(r.op, Op::Read | Op::Write) {
            assert_eq!(finished, 0, "{what}: finished {finished} times");
        } else if result >= 0 {
            assert!((1..=2).contains(&finished), "{what}: finished {finished} times");
        }
        match expect {
            Expect::Data { first, tokens } => {
                assert_eq!(result, r.len_bytes as i32, "{what}");
                if let Some(tokens) = tokens {
                    // SAFETY: completed: the queue thread serves the tag again.
                    let buf = unsafe { bufs.frontend_bytes(tag, r.len_bytes as usize) };
                    for (i, (s, want)) in buf.chunks(SECTOR as usize).zip(tokens).enumerate() {
                        let sector = first + i as u64;
                        let got = decode_sector(s, sector);
                        assert_eq!(got, Some(want), "{what}: sector {sector}");
                    }
                }
            }
            Expect::Flush { durable, log } => {
                assert_eq!(result, 0, "{what}");
                if log >= self.model.durable_log {
                    (self.model.durable, self.model.durable_log) = (durable, log);
                }
            }
            Expect::Zero => assert_eq!(result, 0, "{what}"),
        }
        if let Some(at) = fua_at {
            self.model.fua_completed(at);
        }
    }
}

fn slot(qid: u16, tag: u16) -> usize {
    usize::from(qid) * usize::from(DEPTH) + usize::from(tag)
}

/// Runs `requests` random requests on one image through the path, at most
/// `DEPTH` in flight on each of its queues, like the image's ublk queue
/// threads (here one thread, so that arrival order is the model's order).
fn drive(server: &Server<TestBuffers>, f: &mut Frontend, requests: usize, seed: u64) {
    FRONTEND_THREAD.with(|t| t.set(true));
    let mut rng = StdRng::seed_from_u64(seed ^ u64::from(f.core.sched_id.0) << 32);
    let mut free: Vec<(u16, u16)> = (0..QUEUES).flat_map(|q| (0..DEPTH).map(move |t| (q, t))).collect();
    let (mut submitted, mut pending) = (0usize, 0usize);
    while submitted < requests || pending > 0 {
        while submitted < requests && !free.is_empty() {
            let (qid, tag) = free.swap_remove(rng.gen_range(0..free.len()));
            let r = f.next(&mut rng, qid, tag);
            submitted += 1;
            match serve::submit(&server.sched, &f.core, r) {
                Submitted::Completed(result) => {
                    f.completed(qid, tag, result, seed);
                    free.push((qid, tag));
                }
                Submitted::Pending => pending += 1,
            }
        }
        if pending == 0 {
            continue;
        }
        let waited = Instant::now();
        let done = loop {
            let done: Vec<(u16, serve::Done)> = (0..QUEUES)
                .flat_map(|q| {
                    f.core.queues[usize::from(q)].completions.drain().into_iter().map(move |d| (q, d))
                })
                .collect();
            if !done.is_empty() {
                break done;
            }
            assert!(waited.elapsed() < COMPLETION_TIMEOUT, "seed {seed}: {pending} requests never completed");
            std::thread::sleep(Duration::from_micros(200));
        };
        for (qid, d) in done {
            let result = serve::finish(&f.core, &d);
            f.completed(qid, d.tag, result, seed);
            free.push((qid, d.tag));
            pending -= 1;
        }
    }
}

fn attach(server: &Server<TestBuffers>, store: &Store, i: usize, seed: u64) -> Arc<DeviceCore<TestBuffers>> {
    attach_with(server, store, i, seed, None)
}

/// [`attach`], with reads in place answered by `read_stand_in`.
fn attach_with(
    server: &Server<TestBuffers>,
    store: &Store,
    i: usize,
    seed: u64,
    read_stand_in: Option<ReadStandIn>,
) -> Arc<DeviceCore<TestBuffers>> {
    let image = store.open_image(&name(i)).unwrap();
    let bytes = serve::tag_buffer_bytes(QUEUES, DEPTH, IO_BUF_BYTES);
    let loan = store.lend_memory(bytes, "test tag buffers").unwrap();
    // Half the seeds serve small writes in place, as for a log on tmpfs.
    let log_in_memory = (seed + i as u64).is_multiple_of(2);
    // The second round of each seed plays a frontend with user copy.
    let user_copy = seed % 2 == 1;
    let bufs = (0..QUEUES).map(|_| TestBuffers::new(user_copy)).collect();
    let id = ImageId(u32::try_from(seed * 16 + i as u64).expect("small seeds"));
    let mut core =
        DeviceCore::new(id, &name(i), image, log_in_memory, bufs, DEPTH, IO_BUF_BYTES, loan).unwrap();
    core.read_stand_in = read_stand_in;
    let core = Arc::new(core);
    server.attach(core.clone()).unwrap();
    core
}

/// Reads every sector of image `i` after a crash and checks it against
/// what may survive.
fn check_after_crash(store: &Store, i: usize, model: &Model, seed: u64) -> Vec<u64> {
    let image = store.open_image(&name(i)).unwrap();
    let mut buf = vec![0u8; IMAGE_BYTES as usize];
    image.read(0, &mut buf).unwrap();
    buf.chunks(SECTOR as usize)
        .enumerate()
        .map(|(s, bytes)| {
            let s = s as u64;
            let token = decode_sector(bytes, s).unwrap_or_else(|| {
                panic!("seed {seed}: {} sector {s} after the crash is no write's", name(i))
            });
            assert!(
                model.may_hold(s, token),
                "seed {seed}: {} sector {s} holds token {token} after the crash; durable {}",
                name(i),
                model.durable[s as usize]
            );
            token
        })
        .collect()
}

/// Runs one seed; returns the write turns refused for capacity, and the
/// reads and writes served in place.
fn run_seed(seed: u64, requests: usize) -> [u64; 7] {
    let mem = MemStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    let store = Store::create(storage, &store_dir(), opts()).unwrap();
    for i in 0..IMAGES {
        store.create_image(&name(i), IMAGE_BYTES).unwrap();
    }
    let mut models: Vec<Model> =
        (0..IMAGES).map(|_| Model::new(vec![0; (IMAGE_BYTES / SECTOR) as usize])).collect();
    let mut store = store;
    let (mut refused_turns, mut reads_in_place, mut writes_in_place) = (0, 0, 0);
    let [mut loads, mut stores, mut loads_in_place, mut stores_in_place] = [0; 4];
    for round in 0..2u64 {
        let server = Server::<TestBuffers>::start(sched::Config::default(), 4, 2).unwrap();
        let round_seed = seed * 2 + round;
        let frontends: Vec<Frontend> = models
            .drain(..)
            .enumerate()
            .map(|(i, model)| Frontend {
                core: attach(&server, &store, i, round_seed),
                expect: (0..QUEUES * DEPTH).map(|_| None).collect(),
                model,
                tokens: (round + 1) << 40 | (i as u64) << 32,
            })
            .collect();
        // One queue thread per image, all at once.
        let frontends: Vec<Frontend> = std::thread::scope(|s| {
            let handles: Vec<_> = frontends
                .into_iter()
                .map(|mut f| {
                    let server = &server;
                    s.spawn(move || {
                        drive(server, &mut f, requests, round_seed);
                        f
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for f in &frontends {
            let c = server.sched.counters(f.core.sched_id).unwrap();
            refused_turns += c.refused_turns;
            reads_in_place += c.reads_in_place;
            writes_in_place += c.writes_in_place;
            for q in &f.core.queues {
                loads += q.bufs.loads.load(Ordering::Relaxed);
                stores += q.bufs.stores.load(Ordering::Relaxed);
                loads_in_place += q.bufs.loads_in_place.load(Ordering::Relaxed);
                stores_in_place += q.bufs.stores_in_place.load(Ordering::Relaxed);
            }
            let waiting = server.detach(&f.core).unwrap();
            assert!(waiting.is_empty(), "seed {seed}: {} requests left waiting", waiting.len());
        }
        server.shutdown();
        models = frontends.into_iter().map(|f| f.model).collect();
        drop(store);
        mem.crash(CrashMode::LoseUnsynced);
        store = Store::open(Arc::new(mem.clone()), &store_dir(), opts()).unwrap();
        for (i, model) in models.iter_mut().enumerate() {
            let now = check_after_crash(&store, i, model, seed);
            *model = Model::new(now);
        }
    }
    println!(
        "seed {seed}: {refused_turns} write turns refused for log capacity, \
         {reads_in_place} reads and {writes_in_place} writes in place, \
         {loads} writes and {stores} reads through user copy \
         ({loads_in_place} and {stores_in_place} of them in place)"
    );
    [refused_turns, reads_in_place, writes_in_place, loads, stores, loads_in_place, stores_in_place]
}

#[test]
fn random_streams_through_the_request_path_match_the_model() {
    if let Some(seed) = std::env::var("SERVE_PATH_SEED").ok().and_then(|v| v.parse().ok()) {
        run_seed(seed, requests());
        return;
    }
    let seeds: u64 = std::env::var("SERVE_PATH_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let mut ran = [0u64; 7];
    for seed in 1..=seeds {
        let r = run_seed(seed, requests());
        ran.iter_mut().zip(r).for_each(|(a, b)| *a += b);
    }
    // The paths under test ran: writers held for log capacity, reads and
    // (on logs "in memory") small writes served in place.
    let [refused_turns, reads_in_place, writes_in_place, loads, stores, loads_in_place, stores_in_place] =
        ran;
    // User copy ran on both sides, in place and on the workers.
    assert!(loads_in_place > 0 && stores_in_place > 0, "no user copy in place");
    assert!(loads > loads_in_place && stores > stores_in_place, "no user copy on a worker");
    assert!(refused_turns > 0, "no writer was held for log capacity");
    assert!(reads_in_place > 0, "no read was served in place");
    assert!(writes_in_place > 0, "no write was served in place");
}

fn requests() -> usize {
    std::env::var("SERVE_PATH_REQUESTS").ok().and_then(|v| v.parse().ok()).unwrap_or(1200)
}

/// A frontend whose tag buffers are fewer or smaller than the device it
/// attaches is a bug caught when the device is made, not when a request
/// first reaches a missing tag.
#[test]
fn tag_buffers_smaller_than_the_device_are_refused_up_front() {
    for (tags, bytes) in [(usize::from(DEPTH) - 1, IO_BUF_BYTES as usize), (usize::from(DEPTH), 4096)] {
        let storage: Arc<dyn Storage> = Arc::new(MemStorage::new());
        let store = Store::create(storage, &store_dir(), opts()).unwrap();
        store.create_image(&name(0), IMAGE_BYTES).unwrap();
        let image = store.open_image(&name(0)).unwrap();
        let loan = store.lend_memory(serve::tag_buffer_bytes(1, DEPTH, IO_BUF_BYTES), "test").unwrap();
        let bufs = vec![HeapBuffers::new(tags, bytes)];
        let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            DeviceCore::new(ImageId(1), &name(0), image, false, bufs, DEPTH, IO_BUF_BYTES, loan)
        }));
        assert!(made.is_err(), "{tags} buffers of {bytes} bytes were accepted");
    }
}

/// Serves one request on `core` and waits for its result.
fn serve_one(server: &Server<TestBuffers>, core: &DeviceCore<TestBuffers>, r: Request) -> i32 {
    match serve::submit(&server.sched, core, r) {
        Submitted::Completed(result) => result,
        Submitted::Pending => {
            let waited = Instant::now();
            loop {
                if let Some(d) = core.queues[usize::from(r.qid)].completions.drain().into_iter().next() {
                    assert_eq!(d.tag, r.tag);
                    return serve::finish(core, &d);
                }
                assert!(waited.elapsed() < COMPLETION_TIMEOUT, "the request never completed");
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }
}

/// With user copy, a request whose data cannot pass to or from the kernel
/// (the device went away) fails with EIO: a write is not applied, a read
/// does not report success. Both ways, on a log in memory (small requests
/// served in place) and on one that is not (on the workers); image 0's
/// reads all find their data "on a device", so they go to the workers.
#[test]
fn a_user_copy_that_fails_fails_its_request_with_eio() {
    let storage: Arc<dyn Storage> = Arc::new(MemStorage::new());
    let store = Store::create(storage, &store_dir(), opts()).unwrap();
    let server = Server::<TestBuffers>::start(sched::Config::default(), 4, 2).unwrap();
    FRONTEND_THREAD.with(|t| t.set(true));
    let (mut failed, mut failed_in_place) = (0, 0);
    // Seed 1: user copy; image 0's log is on disk, image 1's in memory.
    for i in 0..2 {
        store.create_image(&name(i), IMAGE_BYTES).unwrap();
        let on_device: ReadStandIn = Box::new(|_, _| Ok(false));
        let core = attach_with(&server, &store, i, 1, (i == 0).then_some(on_device));
        let bufs = &core.queues[0].bufs;
        assert!(bufs.kernel.is_some());
        for len_bytes in [4096u64, 64 << 10] {
            let at = |op, tag| Request {
                qid: 0,
                tag,
                op,
                offset_bytes: 1 << 20,
                len_bytes,
                fua: false,
                seen_ns: 0,
            };
            let len = len_bytes as usize;
            // SAFETY: tag 0 is free between requests.
            unsafe { bufs.frontend_bytes(0, len) }.fill(0x11);
            assert_eq!(serve_one(&server, &core, at(Op::Write, 0)), len_bytes as i32);

            bufs.fail_copies.store(true, Ordering::Relaxed);
            // SAFETY: as above.
            unsafe { bufs.frontend_bytes(0, len) }.fill(0x22);
            assert_eq!(serve_one(&server, &core, at(Op::Write, 0)), -libc::EIO, "{}: a write", name(i));
            assert_eq!(serve_one(&server, &core, at(Op::Read, 1)), -libc::EIO, "{}: a read", name(i));

            bufs.fail_copies.store(false, Ordering::Relaxed);
            // SAFETY: as above, for tag 1.
            unsafe { bufs.frontend_bytes(1, len) }.fill(0xA5);
            assert_eq!(serve_one(&server, &core, at(Op::Read, 1)), len_bytes as i32);
            // SAFETY: as above.
            let read = unsafe { bufs.frontend_bytes(1, len) };
            assert!(read.iter().all(|&b| b == 0x11), "{}: the failed write was applied", name(i));
        }
        failed += bufs.failed.load(Ordering::Relaxed);
        failed_in_place += bufs.failed_in_place.load(Ordering::Relaxed);
        assert!(server.detach(&core).unwrap().is_empty());
    }
    server.shutdown();
    // Per image and size: a write and a read; image 0's on the workers,
    // image 1's in place.
    assert_eq!((failed, failed_in_place), (8, 4), "failed copies (all, in place)");
}
