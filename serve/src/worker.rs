//! The worker pool: threads that take admitted requests from the
//! scheduler, run them against the store (blocking calls into `cas`), and
//! post each result back to the request's queue thread.

use crate::syncs::SyncPool;
use crate::{DeviceCore, Done, Job, Registry, Sched, TagBuffers};
use cas::io::IoCx;
use sched::{Dispatch, Next, Op};
use std::sync::Arc;
use std::time::Duration;

/// How long an idle worker waits before checking for shutdown again.
const IDLE_WAIT: Duration = Duration::from_millis(200);

/// Starts `n` workers and `syncs` sync threads; the handles of both,
/// joined after `Sched::shutdown`.
pub fn spawn<B: TagBuffers>(
    n: usize,
    syncs: usize,
    sched: &Arc<Sched>,
    registry: &Arc<Registry<B>>,
) -> Vec<std::thread::JoinHandle<()>> {
    let (pool, mut handles) = SyncPool::spawn(syncs, sched);
    handles.extend((0..n).map(|i| {
        let (sched, registry, pool) = (sched.clone(), registry.clone(), pool.clone());
        std::thread::Builder::new()
            .name(format!("casblk-worker-{i}"))
            .spawn(move || run(&sched, &registry, &pool))
            .expect("spawning a worker thread")
    }));
    handles
}

fn run<B: TagBuffers>(sched: &Sched, registry: &Registry<B>, syncs: &SyncPool<B>) {
    loop {
        match sched.next_blocking(IDLE_WAIT) {
            Next::Shutdown => return,
            Next::TimedOut => continue,
            Next::Dispatch(d) => {
                if let Some(started) = start(sched, registry, d) {
                    if started.waits_for_media() {
                        // A FLUSH or FUA write waits for fsync: a sync thread
                        // takes it so this worker stays free for reads.
                        if let Some(started) = syncs.offer(started) {
                            started.serve(sched);
                        }
                    } else {
                        started.serve(sched);
                    }
                }
            }
        }
    }
}

/// A dispatched request with its device and per-tag job taken: ready to
/// execute on whichever thread serves it.
pub struct Started<B> {
    core: Arc<DeviceCore<B>>,
    qid: u16,
    tag: u16,
    job: Job,
    d: Dispatch<cas::image::LogReservation>,
}

/// Takes the dispatched request's job and records its admission; `None`
/// when its device went away meanwhile (completed in the scheduler).
fn start<B: TagBuffers>(
    sched: &Sched,
    registry: &Registry<B>,
    d: Dispatch<cas::image::LogReservation>,
) -> Option<Started<B>> {
    let Some(core) = registry.get(d.image) else {
        // The device went away while this request waited; nothing to answer.
        let _ = sched.complete(d.image, d.request);
        return None;
    };
    let (qid, tag) = crate::split_request(d.request);
    let mut job = core.take_job(qid, tag).expect("a dispatched request has its job");
    if core.traced {
        // One clock read marks admission and dispatch.
        d.record_into(&mut job.trace, trace::now_ns());
    }
    if d.waits.log_capacity_ns > 0 {
        // The engine's count of capacity waits is this gate's count.
        core.image.note_capacity_wait();
    }
    Some(Started { core, qid, tag, job, d })
}

impl<B: TagBuffers> Started<B> {
    /// True for requests that wait for the media: FLUSH, and anything with FUA.
    pub fn waits_for_media(&self) -> bool {
        self.d.op == Op::Flush || self.job.fua
    }

    /// Executes the request, completes it in the scheduler and posts the
    /// result to its queue thread.
    pub fn serve(self, sched: &Sched) {
        let Started { core, qid, tag, mut job, d } = self;
        // The engine records its I/O spans (log, manifest, chunk cache,
        // chunks) into the trace; the rest of the execution is `execute`.
        let fua = job.fua;
        let run = |cx: IoCx<'_>| {
            execute(cx, &core, qid, tag, d.op, d.offset_bytes, d.len_bytes, d.reservation, fua)
        };
        let result = observed(core.traced, &mut job.trace, run);
        if core.traced {
            job.trace.executed(trace::now_ns());
        }
        complete(sched, &core.name, d.image, d.request);
        core.queues[usize::from(qid)].completions.post(Done { tag, result, trace: job.trace });
    }
}

/// Serves a read admitted in place (`submit_read_in_place`) on the calling
/// queue thread, if its data is in memory: returns the result to commit,
/// with the request traced and completed in the scheduler. Returns `None`
/// after handing the read back to the workers (its data must come from a
/// device); the caller then waits for a worker's result as usual.
pub fn read_in_place<B: TagBuffers>(
    sched: &Sched,
    core: &DeviceCore<B>,
    qid: u16,
    tag: u16,
    d: Dispatch<cas::image::LogReservation>,
) -> Option<i32> {
    // The scheduler runs on the trace clock (sched::MonotonicClock): its
    // admission time is this read's admission, dispatch and start.
    let begin = d.admitted_ns;
    let len = d.len_bytes as usize;
    // SAFETY: the queue thread alone serves (qid, tag) here; on a hand-off
    // below it stops using the buffer before the worker can get the read.
    let buf = unsafe { core.queues[usize::from(qid)].bufs.request_bytes(tag, len) };
    let mut read_nowait = |cx: IoCx<'_>| match (&core.read_stand_in, &core.file_stand_in) {
        (Some(stand_in), _) => stand_in(d.offset_bytes, buf),
        (None, Some(file)) => file.read_nowait(d.offset_bytes, buf),
        (None, None) => core.image.read_nowait_in(cx, d.offset_bytes, buf),
    };
    let (read, io) = if core.traced {
        cas::io::timed(read_nowait)
    } else {
        (read_nowait(IoCx::default()), Default::default())
    };
    let result = match read {
        // SAFETY: as for `buf` above; the queue thread commits only after
        // this returns.
        Ok(true) => match unsafe { core.queues[usize::from(qid)].bufs.store_read(tag, len) } {
            Ok(()) => len as i32,
            Err(e) => handing_failed(core, "read", d.offset_bytes, len, e),
        },
        Ok(false) => match sched.requeue(d.image, d.request) {
            Ok(()) => {
                // SAFETY: the queue thread still serves (qid, tag) until the
                // hand-off below is seen; `buf` is no longer used.
                unsafe { core.queues[usize::from(qid)].bufs.finished(tag, len) };
                return None;
            }
            Err(e) => {
                tracing::error!(image = %core.name, "handing a read back to the workers failed: {e}");
                -libc::EIO
            }
        },
        Err(e) => {
            if let Some(more) = core.failures.admit(trace::now_ns()) {
                tracing::warn!(image = %core.name, offset = d.offset_bytes, len, held_back = more, "read failed: {e}");
            }
            e.errno()
        }
    };
    // SAFETY: as for `buf` above, which is no longer used.
    unsafe { core.queues[usize::from(qid)].bufs.finished(tag, len) };
    let end = core.traced.then(trace::now_ns);
    complete(sched, &core.name, d.image, d.request);
    let mut job = core.take_job(qid, tag).expect("a request served in place has its job");
    if let Some(end) = end {
        d.record_into(&mut job.trace, begin);
        cas::observe::record(&mut job.trace, &io);
        job.trace.executed(end);
        // Completed as it executed: the commit follows at once on this
        // thread (one clock read for both).
        core.tracer.finish(&job.trace, end, result.min(0));
    }
    Some(result)
}

/// Executes a write admitted in place (`submit_write_in_place`) on the
/// calling queue thread and returns the result to commit, with the request
/// traced and completed in the scheduler. Only for images whose log is in
/// memory: the append is a memory copy, and the capacity was reserved at
/// admission, so nothing here waits for a device or for capacity (making
/// it visible waits at most for the image's other writes in flight, which
/// are memory copies too).
pub fn write_in_place<B: TagBuffers>(
    sched: &Sched,
    core: &DeviceCore<B>,
    qid: u16,
    tag: u16,
    d: Dispatch<cas::image::LogReservation>,
) -> i32 {
    let mut job = core.take_job(qid, tag).expect("a request served in place has its job");
    let fua = job.fua;
    if core.traced {
        d.record_into(&mut job.trace, d.admitted_ns);
    }
    let (image, request) = (d.image, d.request);
    let run =
        |cx: IoCx<'_>| execute(cx, core, qid, tag, d.op, d.offset_bytes, d.len_bytes, d.reservation, fua);
    let result = observed(core.traced, &mut job.trace, run);
    let end = core.traced.then(trace::now_ns);
    complete(sched, &core.name, image, request);
    if let Some(end) = end {
        job.trace.executed(end);
        core.tracer.finish(&job.trace, end, result.min(0));
    }
    result
}

/// Executes one request on the calling thread (a worker, a sync thread, or
/// the queue thread for a write in place) in the context `cx` and returns
/// the result to post or commit.
#[allow(clippy::too_many_arguments)]
fn execute<B: TagBuffers>(
    cx: IoCx<'_>,
    core: &DeviceCore<B>,
    qid: u16,
    tag: u16,
    op: Op,
    offset: u64,
    len: u64,
    reservation: Option<cas::image::LogReservation>,
    fua: bool,
) -> i32 {
    let bufs = &core.queues[usize::from(qid)].bufs;
    // A closure, so that a failed hand-over returns from it alone.
    let result = (move || {
        let image = &core.image;
        // A benchmark's baseline serves the data requests from a plain file
        // instead (`FileStandIn`); everything around the engine call is the
        // same.
        let file = core.file_stand_in.as_ref();
        let reserved = || reservation.expect("write-kind requests are dispatched with a log reservation");
        let result = match op {
            Op::Read => {
                // SAFETY: this thread (a worker or a sync thread) alone serves
                // (qid, tag) until it posts the result; the queue thread and the
                // kernel wait for that post. (Writes in place: the queue thread
                // itself, which commits only after this returns.)
                let buf = unsafe { bufs.request_bytes(tag, len as usize) };
                let read = match file {
                    Some(file) => file.read(offset, buf),
                    None => image.read_in(cx, offset, buf),
                };
                match read {
                    // SAFETY: as above.
                    Ok(()) => match unsafe { bufs.store_read(tag, len as usize) } {
                        Ok(()) => Ok(len as i32),
                        Err(e) => return handing_failed(core, "read", offset, len as usize, e),
                    },
                    Err(e) => Err(e),
                }
            }
            Op::Write => {
                let reservation = reserved();
                // A refused reservation fails the write without its data: not
                // loaded, and the refusal is the error. A file stand-in needs
                // no log space: it ignores the reservation, which goes back
                // unused as it drops (its image is never written, so it is
                // never refused for space).
                if reservation.refusal().is_none() || file.is_some() {
                    // SAFETY: as above; the data is the kernel's until loaded here.
                    if let Err(e) = unsafe { bufs.load_write(tag, len as usize) } {
                        // Not executed: its log reservation goes back unused as
                        // it drops.
                        return handing_failed(core, "write", offset, len as usize, e);
                    }
                }
                // SAFETY: as above.
                let buf = unsafe { bufs.request_bytes(tag, len as usize) };
                match file {
                    Some(file) => file.write(offset, buf, fua),
                    None => image.write_reserved(cx, reservation, offset, buf, fua),
                }
                .map(|()| len as i32)
            }
            Op::WriteZeroes | Op::Discard if file.is_some() => return -libc::EOPNOTSUPP,
            Op::WriteZeroes => image.write_zeroes_reserved(cx, reserved(), offset, len, fua).map(|()| 0),
            Op::Discard => image
                .discard_reserved(cx, reserved(), offset, len)
                .and_then(|()| if fua { image.flush_in(cx) } else { Ok(()) })
                .map(|()| 0),
            Op::Flush => match file {
                Some(file) => file.flush(),
                None => image.flush_in(cx),
            }
            .map(|()| 0),
        };
        result.unwrap_or_else(|e| {
            if let Some(more) = core.failures.admit(trace::now_ns()) {
                tracing::warn!(image = %core.name, ?op, offset, len, held_back = more, "request failed: {e}");
            }
            e.errno()
        })
    })();
    if matches!(op, Op::Read | Op::Write) {
        // SAFETY: this thread served (qid, tag) and holds none of its data
        // any more; the result is not posted yet.
        unsafe { bufs.finished(tag, len as usize) };
    }
    result
}

/// The result of a request whose data could not pass between the kernel
/// and its buffer (`TagBuffers::load_write`, `store_read`): the frontend's
/// device is going away or broken. Logged; the request fails with EIO.
fn handing_failed<B>(core: &DeviceCore<B>, op: &str, offset: u64, len: usize, e: std::io::Error) -> i32 {
    tracing::warn!(image = %core.name, offset, len, "moving a {op}'s data to or from the kernel failed: {e}");
    -libc::EIO
}

/// Completes a request in the scheduler; a refusal (the image went away)
/// is logged, the request's result still goes to its queue.
fn complete(sched: &Sched, name: &str, image: sched::ImageId, request: sched::RequestId) {
    if let Err(e) = sched.complete(image, request) {
        tracing::error!(image = %name, "completing a request in the scheduler failed: {e}");
    }
}

/// Runs the engine call `f` in a context timed when the device is traced
/// (`cas::io::timed`), its I/O then recorded into `trace`; untimed
/// otherwise.
fn observed<R>(traced: bool, trace: &mut trace::RequestTrace, f: impl FnOnce(IoCx<'_>) -> R) -> R {
    if traced {
        let (result, times) = cas::io::timed(f);
        cas::observe::record(trace, &times);
        result
    } else {
        f(IoCx::default())
    }
}
