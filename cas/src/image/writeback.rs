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
    /// The segment being written back, once taken from the queue.
    pending: Option<(Arc<Segment>, u64)>,
    log: Arc<Log>,
    durability: Arc<Durability>,
    syncs: Arc<AtomicU64>,
}

impl Task for WritebackTask {
    fn step(&mut self, cx: &Context<'_>) -> Step {
        if self.pending.is_none() {
            let next = if cx.may_block() {
                self.rx.recv().ok()
            } else {
                match self.rx.try_recv() {
                    Ok(next) => Some(next),
                    Err(TryRecvError::Empty) => return Step::Wait(None),
                    Err(TryRecvError::Disconnected) => None,
                }
            };
            let Some(next) = next else { return Step::Done };
            self.pending = Some(next);
        }
        let Some((segment, last_seq)) = &self.pending else { return Step::Again };
        let complete = if cx.may_block() {
            Some(self.durability.wait_complete(*last_seq))
        } else {
            self.durability.completed(*last_seq)
        };
        match complete {
            // Stepped, with records still in flight: look again once the
            // test has moved its clock.
            None => return Step::Wait(Some(Duration::from_millis(1))),
            Some(false) => return Step::Done, // the image failed; nothing more to do
            Some(true) => {}
        }
        if let Err(e) = self.log.sync_closed(segment) {
            self.durability.fail(format!("early writeback of a closed log segment failed: {e}"));
            return Step::Done;
        }
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.pending = None;
        Step::Again
    }
}
