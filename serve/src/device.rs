//! One attached image: what its queue threads and the workers share.
//!
//! Requests are named `qid << 16 | tag` in the scheduler; each queue has
//! its own table of per-tag jobs (a request's trace and flags while the
//! scheduler and a worker hold it), its tag buffers and its completions.

use crate::{Completions, TagBuffers};
use std::sync::{Arc, Mutex};

/// A request between its queue thread and the worker that serves it.
pub struct Job {
    pub trace: trace::RequestTrace,
    pub fua: bool,
}

/// Per hardware queue: where workers find payloads and post results, and
/// the jobs of its tags.
pub struct QueueShared<B> {
    pub completions: Completions,
    pub bufs: B,
    jobs: Vec<Mutex<Option<Job>>>,
}

/// The state of one attached image shared by its queue threads and the
/// worker pool. Requests are named `qid << 16 | tag` in the scheduler.
pub struct DeviceCore<B> {
    /// The image's id in the scheduler (unique per attachment).
    pub sched_id: sched::ImageId,
    pub name: String,
    pub image: Arc<cas::image::Image>,
    pub tracer: Arc<trace::Tracer>,
    pub depth: u16,
    pub io_buf_bytes: u32,
    pub queues: Vec<QueueShared<B>>,
    /// The image's log lives in memory (tmpfs, ramfs): its writes are
    /// memory copies, so small non-FUA writes are executed on the queue
    /// thread (`worker::write_in_place`) instead of a worker.
    pub log_in_memory: bool,
    /// Requests are traced (the daemon always traces; a benchmark turns it
    /// off to measure what tracing costs): without it no trace clock is
    /// read (the scheduler still reads its own), no I/O observed, nothing
    /// recorded in `tracer`.
    pub traced: bool,
    /// Stands in for the engine in reads served in place (see
    /// [`ReadStandIn`]); the daemon has none.
    pub read_stand_in: Option<ReadStandIn>,
    /// Stands in for the engine in every data request and FLUSH (see
    /// [`FileStandIn`](crate::FileStandIn)); the daemon has none.
    pub file_stand_in: Option<crate::FileStandIn>,
    /// Failed requests' log lines, one per window at most
    /// (`crate::failure_log`).
    pub failures: crate::failure_log::FailureLog,
    /// The tag buffers' bytes, lent from the store's memory budget for as
    /// long as the buffers live.
    _buffers: cas::store::MemoryLoan,
}

/// What a read served in place calls instead of `Image::read_nowait`, with
/// the read's offset and buffer, answering as it does: a benchmark's
/// interference floor reads nothing and takes as long as an engine read.
pub type ReadStandIn = Box<dyn Fn(u64, &mut [u8]) -> cas::Result<bool> + Send + Sync>;

/// The scheduler's name of queue `qid`'s tag `tag`.
pub fn request_id(qid: u16, tag: u16) -> sched::RequestId {
    sched::RequestId((u64::from(qid) << 16) | u64::from(tag))
}

/// The queue and tag of a scheduler request name (see [`request_id`]).
pub fn split_request(id: sched::RequestId) -> (u16, u16) {
    ((id.0 >> 16) as u16, id.0 as u16)
}

/// Bytes of a device's tag buffers: one request's largest size per tag.
pub fn tag_buffer_bytes(nr_queues: u16, depth: u16, io_buf_bytes: u32) -> u64 {
    u64::from(nr_queues) * u64::from(depth) * u64::from(io_buf_bytes)
}

impl<B: TagBuffers> DeviceCore<B> {
    /// A device of one queue per element of `bufs` (each with `depth`
    /// tags of up to `io_buf_bytes`), its buffers' memory lent by `loan`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        sched_id: sched::ImageId,
        name: &str,
        image: Arc<cas::image::Image>,
        log_in_memory: bool,
        bufs: Vec<B>,
        depth: u16,
        io_buf_bytes: u32,
        loan: cas::store::MemoryLoan,
    ) -> std::io::Result<DeviceCore<B>> {
        let nr_queues = u16::try_from(bufs.len()).expect("at most u16::MAX queues");
        assert_eq!(
            loan.bytes(),
            tag_buffer_bytes(nr_queues, depth, io_buf_bytes),
            "the loan covers the buffers"
        );
        let mut queues = Vec::with_capacity(bufs.len());
        for (qid, bufs) in bufs.into_iter().enumerate() {
            // Requests are checked against io_buf_bytes at submission; with
            // these, `request_bytes` never meets a tag or length it lacks.
            assert!(
                bufs.tags() >= usize::from(depth),
                "queue {qid}: {} tag buffers for depth {depth}",
                bufs.tags()
            );
            assert!(
                bufs.min_bytes() >= io_buf_bytes as usize,
                "queue {qid}: a {} byte tag buffer for requests of up to {io_buf_bytes}",
                bufs.min_bytes()
            );
            queues.push(QueueShared {
                completions: Completions::new()?,
                bufs,
                jobs: (0..depth).map(|_| Mutex::new(None)).collect(),
            });
        }
        Ok(DeviceCore {
            sched_id,
            name: name.to_string(),
            image,
            tracer: Arc::new(trace::Tracer::new(name)),
            depth,
            io_buf_bytes,
            queues,
            log_in_memory,
            traced: true,
            read_stand_in: None,
            file_stand_in: None,
            failures: Default::default(),
            _buffers: loan,
        })
    }

    fn slot(&self, qid: u16, tag: u16) -> &Mutex<Option<Job>> {
        &self.queues[usize::from(qid)].jobs[usize::from(tag)]
    }

    pub fn put_job(&self, qid: u16, tag: u16, job: Job) {
        let mut slot = self.slot(qid, tag).lock().unwrap_or_else(|p| p.into_inner());
        assert!(slot.is_none(), "queue {qid} tag {tag} already has a request in flight");
        *slot = Some(job);
    }

    pub fn take_job(&self, qid: u16, tag: u16) -> Option<Job> {
        self.slot(qid, tag).lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}
