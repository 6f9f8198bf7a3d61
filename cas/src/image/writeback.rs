//! Early writeback of closed segments, off the write path.
//!
//! When the log rolls to a new segment, the closed one is handed to this
//! image's writeback task (a thread, or stepped by a test: `crate::tasks`).
//! The task waits until every record in it has
//! completed, syncs it, and marks it synced, so a later FLUSH only has to
//! sync the current segment (and the directory) instead of every segment
//! written since the last FLUSH. It changes no durability rule: a segment
//! counts as synced only by a sync that started after all its records
//! completed, exactly as in group commit. A failed sync fails the image.
//! The kernel reports a writeback error to a file once, so a group commit
//! syncing the same segment just after this task's failed sync would
//! get 0 for data that was dropped; the segment's handle remembers the
//! failure (`SyncGuard`) and that group commit fails too, before any FLUSH
//! is acknowledged. Dropping the image stops the task after at most one
//! sync.
//!
//! Bounds: at most [`QUEUE_DEPTH`] closed segments wait; beyond that a
//! segment is simply left for the next group commit. The task ends when
//! the image drops.

use super::durability::Durability;
use crate::background::BackgroundCpu;
use crate::tasks::{Context, Step, Task, TaskHandle, Tasks, Wake};
use crate::wal::{Log, Segment};
use crossbeam::channel::{bounded, Receiver, Sender, TryRecvError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Closed segments waiting for writeback, at most.
pub const QUEUE_DEPTH: usize = 16;

/// The writeback task of one image.
pub struct Writeback {
    tx: Option<Sender<(Arc<Segment>, u64)>>,
    durability: Arc<Durability>,
    task: Option<TaskHandle>,
    wake: Wake,
    /// Segments synced by the task.
    pub syncs: Arc<AtomicU64>,
}

impl Writeback {
    pub fn start(
        name: &str,
        log: Arc<Log>,
        durability: Arc<Durability>,
        tasks: &Tasks,
        cpu: BackgroundCpu,
    ) -> Writeback {
        let (tx, rx) = bounded::<(Arc<Segment>, u64)>(QUEUE_DEPTH);
        let syncs = Arc::new(AtomicU64::new(0));
        let task =
            WritebackTask { rx, pending: None, log, durability: durability.clone(), syncs: syncs.clone() };
        let task = tasks.spawn(&format!("wal-wb-{name}"), cpu, Box::new(task));
        Writeback { tx: Some(tx), durability, wake: task.waker(), task: Some(task), syncs }
    }

    /// Queues segment `segment`, closed after record `last_seq`; skipped
    /// (left to group commit) if the queue is full.
    pub fn closed(&self, segment: Arc<Segment>, last_seq: u64) {
        if let Some(tx) = &self.tx {
            if tx.try_send((segment, last_seq)).is_ok() {
                self.wake.wake();
            }
        }
    }
}

impl Drop for Writeback {
    fn drop(&mut self) {
        // The image is going away: stop waiting for records that will
        // never complete, skip queued segments (nothing relies on them).
        self.durability.fail("the image was closed".into());
        drop(self.tx.take()); // unblocks a task waiting for a segment
        drop(self.task.take());
    }
}

struct WritebackTask {
    rx: Receiver<(Arc<Segment>, u64)>,
    /// A segment taken from the queue while its records were still in
    /// flight (stepped only: a thread waits for them instead).
    pending: Option<(Arc<Segment>, u64)>,
    log: Arc<Log>,
    durability: Arc<Durability>,
    syncs: Arc<AtomicU64>,
}

impl WritebackTask {
    /// The next closed segment: blocking for it on a thread; under a
    /// stepper, the step to return when none is queued yet.
    fn next_segment(&self, cx: &Context<'_>) -> Result<(Arc<Segment>, u64), Step> {
        if cx.may_block() {
            return self.rx.recv().map_err(|_| Step::Done);
        }
        self.rx.try_recv().map_err(|e| match e {
            TryRecvError::Empty => Step::Wait(None),
            TryRecvError::Disconnected => Step::Done,
        })
    }
}

impl Task for WritebackTask {
    fn step(&mut self, cx: &Context<'_>) -> Step {
        let (segment, last_seq) = match self.pending.take().map_or_else(|| self.next_segment(cx), Ok) {
            Ok(next) => next,
            Err(step) => return step,
        };
        let complete = if cx.may_block() {
            Some(self.durability.wait_complete(last_seq))
        } else {
            self.durability.completed(last_seq)
        };
        match complete {
            // Stepped, with records still in flight: look again once the
            // test has moved its clock.
            None => {
                self.pending = Some((segment, last_seq));
                return Step::Wait(Some(Duration::from_millis(1)));
            }
            Some(false) => return Step::Done, // the image failed; nothing more to do
            Some(true) => {}
        }
        if let Err(e) = self.log.sync_closed(&segment) {
            self.durability.fail(format!("early writeback of a closed log segment failed: {e}"));
            return Step::Done;
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Step::Again
    }
}
