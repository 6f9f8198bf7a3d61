//! The queue thread of an attached image.
//!
//! One async task per tag takes a request from the kernel, records it
//! (descriptor snapshot and trace), submits it to the scheduler and waits
//! for a worker's result; one more task keeps an eventfd read in flight on
//! the queue's ring and delivers the results workers post (see `bridge`).
//! A read the scheduler admits at once is served in place when its data is
//! in memory (`Image::read_nowait`), and so is a small non-FUA write when
//! the image's log is in memory (tmpfs); the queue thread never waits for
//! a device or a capacity wait.

use super::bridge::{DataCopy, LocalSlots};
use super::{DeviceCore, Sched};
use crate::device::params::SECTOR_SHIFT;
use crate::device::ring;
use io_uring::{opcode, types};
use libublk::io::{UblkDev, UblkQueue};
use libublk::uring_async::ublk_submit_sqe_async;
use libublk::{BufDesc, UblkError, UblkUringData};
use std::cell::Cell;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

pub fn queue_thread(qid: u16, dev: &UblkDev, core: &Arc<DeviceCore>, sched: &Arc<Sched>, spin: Duration) {
    ring::init_queue_ring(dev);
    let queue = match UblkQueue::new(qid, dev) {
        Ok(q) => Rc::new(q),
        Err(e) => {
            tracing::error!(qid, image = %core.name, "creating queue failed: {e}");
            return;
        }
    };
    let bufs = &core.queues[usize::from(qid)].bufs;
    let user_copy = dev.dev_info.flags & u64::from(libublk::sys::UBLK_F_USER_COPY) != 0;
    // Marks the buffers stopped however this thread ends (a panic too):
    // libublk closes the fd after its queue threads are gone.
    let _stopped_at_exit = user_copy.then(|| {
        // Fixed file 0 of every queue ring is the device's char device.
        bufs.set_copy(DataCopy::User(dev.tgt.fds[0]));
        StopCopyOnDrop(bufs)
    });
    let slots = Rc::new(LocalSlots::new(usize::from(core.depth)));
    let stop = Rc::new(Cell::new(false));
    let exe = smol::LocalExecutor::new();
    let mut tags = Vec::new();
    for tag in queue.tags() {
        let (q, c, s, l) = (queue.clone(), core.clone(), sched.clone(), slots.clone());
        tags.push(exe.spawn(async move {
            match serve_tag(&q, tag, user_copy, &c, &s, &l).await {
                Err(UblkError::QueueIsDown) | Ok(()) => {}
                Err(e) => tracing::error!(qid, tag, image = %c.name, "io task failed: {e}"),
            }
        }));
    }
    let efd_task = {
        let (c, l, st) = (core.clone(), slots.clone(), stop.clone());
        exe.spawn(async move { deliver_results(qid, &c, &l, &st).await })
    };
    let completions = &core.queues[usize::from(qid)].completions;
    ring::run_event_loop(&queue, &exe, spin, || {
        if !tags.iter().all(|t| t.is_finished()) {
            return false;
        }
        // Every tag task is done, so no result can still arrive: stop the
        // eventfd task, whose read must complete before its buffer goes.
        if !stop.replace(true) {
            completions.kick();
        }
        efd_task.is_finished()
    });
}

/// Sets a queue's buffers to `DataCopy::Stopped` when dropped.
struct StopCopyOnDrop<'a>(&'a super::bridge::TagBuffers);

impl Drop for StopCopyOnDrop<'_> {
    fn drop(&mut self) {
        self.0.set_copy(DataCopy::Stopped);
    }
}

/// Keeps a read of the queue's eventfd in flight and hands posted results
/// to the waiting tag tasks.
async fn deliver_results(qid: u16, core: &DeviceCore, slots: &LocalSlots, stop: &Cell<bool>) {
    let completions = &core.queues[usize::from(qid)].completions;
    let fd = completions.eventfd().as_raw_fd();
    let mut counter = [0u8; 8];
    loop {
        let sqe = opcode::Read::new(types::Fd(fd), counter.as_mut_ptr(), 8).build();
        let res = ublk_submit_sqe_async(sqe, UblkUringData::Target as u64).await.unwrap_or(-libc::EIO);
        for done in completions.drain() {
            slots.fill(done);
        }
        if stop.get() {
            return;
        }
        if res < 0 && res != -libc::EINTR && res != -libc::EAGAIN {
            tracing::error!(qid, image = %core.name, "eventfd read failed: {}", std::io::Error::from_raw_os_error(-res));
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

async fn serve_tag(
    q: &UblkQueue<'_>,
    tag: u16,
    user_copy: bool,
    core: &DeviceCore,
    sched: &Sched,
    slots: &LocalSlots,
) -> Result<(), UblkError> {
    let bufs = &core.queues[usize::from(q.get_qid())].bufs;
    // With user copy the kernel is given no buffer: data passes through
    // the char device (see `bridge`).
    let (desc, registered) = if user_copy {
        (BufDesc::Slice(&[]), None)
    } else {
        let buf = bufs.buf(tag);
        (BufDesc::Slice(buf.as_slice()), Some(buf))
    };
    q.submit_io_prep_cmd(tag, desc.clone(), 0, registered).await?;
    loop {
        let res = handle(q, tag, core, sched, slots).await;
        let iod = q.get_iod(tag);
        // Without user copy a write's data has left its tag buffer (into
        // the engine); a read's leaves at the commit below. With user copy
        // the tag buffers stay untouched: the serving thread's staging
        // buffer held the data and was released as it finished.
        if !user_copy && classify(iod.op_flags & 0xff) == Some(sched::Op::Write) {
            bufs.release_after(tag, u64::from(iod.nr_sectors) << SECTOR_SHIFT);
        }
        q.submit_io_commit_cmd(tag, desc.clone(), res).await?;
    }
}

/// The scheduler's name for a ublk operation.
fn classify(op: u32) -> Option<sched::Op> {
    Some(match op {
        libublk::sys::UBLK_IO_OP_READ => sched::Op::Read,
        libublk::sys::UBLK_IO_OP_WRITE => sched::Op::Write,
        libublk::sys::UBLK_IO_OP_FLUSH => sched::Op::Flush,
        libublk::sys::UBLK_IO_OP_DISCARD => sched::Op::Discard,
        libublk::sys::UBLK_IO_OP_WRITE_ZEROES => sched::Op::WriteZeroes,
        _ => return None,
    })
}

async fn handle(q: &UblkQueue<'_>, tag: u16, core: &DeviceCore, sched: &Sched, slots: &LocalSlots) -> i32 {
    let seen_ns = trace::now_ns();
    let iod = q.get_iod(tag);
    let Some(op) = classify(iod.op_flags & 0xff) else {
        return -libc::EOPNOTSUPP;
    };
    let fua = iod.op_flags & libublk::sys::UBLK_IO_F_FUA != 0;
    let (offset_bytes, len_bytes) = if op == sched::Op::Flush {
        (0, 0)
    } else {
        (iod.start_sector << SECTOR_SHIFT, u64::from(iod.nr_sectors) << SECTOR_SHIFT)
    };
    let request = serve::Request { qid: q.get_qid(), tag, op, offset_bytes, len_bytes, fua, seen_ns };
    match serve::submit(sched, core, request) {
        serve::Submitted::Completed(result) => result,
        serve::Submitted::Pending => serve::finish(core, &slots.wait(tag).await),
    }
}
