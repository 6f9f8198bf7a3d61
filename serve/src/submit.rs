//! A request the frontend delivered: checked, given its job and trace, and
//! submitted the way that serves it fastest while keeping the scheduler's
//! ordering contract:
//!
//! ```text
//!  READ                         submit_read_in_place: admitted at once and
//!                               in memory -> served here (worker::read_in_place)
//!  WRITE, not FUA, <= 64 KiB,   submit_write_in_place: admitted at once ->
//!  log in memory (tmpfs)        executed here (worker::write_in_place)
//!  anything else (or not        submit: a worker (or a sync thread, for
//!  admitted at once)            FLUSH and FUA) serves it and posts a Done
//! ```
//!
//! [`submit`] answers `Completed(result)` when the request was served on
//! the calling (queue) thread, else `Pending`: its result arrives through
//! the queue's [`crate::Completions`], and [`finish`] then ends its trace.

use crate::{worker, DeviceCore, Done, Job, Sched, TagBuffers};

/// Largest write executed on the queue thread when the log is in memory
/// (as raw mode's inline limit: beyond it the copy outweighs the hand-off).
pub const WRITE_IN_PLACE_MAX_BYTES: u64 = 64 << 10;

/// One delivered request: queue `qid`'s tag `tag` asks for `op` over
/// `len_bytes` at `offset_bytes` (0 and 0 for FLUSH).
#[derive(Clone, Copy, Debug)]
pub struct Request {
    pub qid: u16,
    pub tag: u16,
    pub op: sched::Op,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    pub fua: bool,
    /// When the frontend saw it (`trace::now_ns`).
    pub seen_ns: u64,
}

/// What [`submit`] did with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submitted {
    /// Served on the calling thread, or refused: bytes transferred, or a
    /// negative errno. Its trace is finished.
    Completed(i32),
    /// A worker or sync thread serves it; its [`Done`] arrives through the
    /// queue's completions.
    Pending,
}

/// Checks `r` against the device, records its job and submits it (see the
/// module docs).
pub fn submit<B: TagBuffers>(sched: &Sched, core: &DeviceCore<B>, r: Request) -> Submitted {
    let Request { qid, tag, op, offset_bytes: offset, len_bytes: len, fua, seen_ns } = r;
    let data_op = matches!(op, sched::Op::Read | sched::Op::Write);
    if offset.checked_add(len).is_none_or(|end| end > core.image.size_bytes())
        || (data_op && len > u64::from(core.io_buf_bytes))
    {
        return Submitted::Completed(-libc::EINVAL);
    }
    let mut trace = trace::RequestTrace::new(op, seen_ns);
    trace.set_location(qid, tag, offset, len.min(u64::from(u32::MAX)) as u32);
    core.put_job(qid, tag, Job { trace, fua });
    let desc =
        sched::Descriptor { request: crate::request_id(qid, tag), op, offset_bytes: offset, len_bytes: len };
    // A read whose data is in memory is served here, in place: no hand-off
    // to a worker and back (two thread wakes). Anything else, or a read
    // that would wait for a device, goes to the workers.
    let submitted = if op == sched::Op::Write && !fua && core.log_in_memory && len <= WRITE_IN_PLACE_MAX_BYTES
    {
        // A log in memory makes the write a memory copy: executed here when
        // the scheduler admits it at once, like a read in place.
        match sched.submit_write_in_place(core.sched_id, desc) {
            Ok(sched::InPlace::Admitted(d)) => {
                return Submitted::Completed(worker::write_in_place(sched, core, qid, tag, d))
            }
            Ok(sched::InPlace::Queued(_)) => Ok(()),
            Err(e) => Err(e),
        }
    } else if op == sched::Op::Read {
        match sched.submit_read_in_place(core.sched_id, desc) {
            Ok(sched::InPlace::Admitted(d)) => match worker::read_in_place(sched, core, qid, tag, d) {
                Some(result) => return Submitted::Completed(result),
                None => Ok(()),
            },
            Ok(sched::InPlace::Queued(_)) => Ok(()),
            Err(e) => Err(e),
        }
    } else {
        sched.submit(core.sched_id, desc).map(|_| ())
    };
    match submitted {
        Ok(()) => Submitted::Pending,
        Err(e) => {
            core.take_job(qid, tag);
            if let Some(more) = core.failures.admit(trace::now_ns()) {
                tracing::warn!(qid, tag, image = %core.name, held_back = more, "scheduler refused a request: {e}");
            }
            Submitted::Completed(e.errno())
        }
    }
}

/// Ends the trace of a request a worker served; returns its result.
pub fn finish<B: TagBuffers>(core: &DeviceCore<B>, done: &Done) -> i32 {
    if core.traced {
        core.tracer.finish(&done.trace, trace::now_ns(), done.result.min(0));
    }
    done.result
}
