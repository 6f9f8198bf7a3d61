//! Early writeback of closed segments, off the write path.
//!
//! When the log rolls to a new segment, the closed one is handed to this
//! image's writeback thread. The thread waits until every record in it has
//! completed, syncs it, and marks it synced, so a later FLUSH only has to
//! sync the current segment (and the directory) instead of every segment
//! written since the last FLUSH. It changes no durability rule: a segment
//! counts as synced only by a sync that started after all its records
//! completed, exactly as in group commit. A failed sync fails the image.
//! The kernel reports a writeback error to a file once, so a group commit
//! syncing the same segment just after this thread's failed sync would
//! get 0 for data that was dropped; the segment's handle remembers the
//! failure (`SyncGuard`) and that group commit fails too, before any FLUSH
//! is acknowledged. Dropping the image stops the thread after at most one
//! sync.
//!
//! Bounds: at most [`QUEUE_DEPTH`] closed segments wait; beyond that a
//! segment is simply left for the next group commit. The thread ends when
//! the image drops.

use super::durability::Durability;
use crate::background::BackgroundCpu;
use crate::wal::{Log, Segment};
use crossbeam::channel::{bounded, Sender};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Closed segments waiting for writeback, at most.
pub const QUEUE_DEPTH: usize = 16;

/// The writeback thread of one image.
pub struct Writeback {
    tx: Option<Sender<(Arc<Segment>, u64)>>,
    durability: Arc<Durability>,
    thread: Option<JoinHandle<()>>,
    /// Segments synced by the thread.
    pub syncs: Arc<AtomicU64>,
}

impl Writeback {
    pub fn start(name: &str, log: Arc<Log>, durability: Arc<Durability>, cpu: BackgroundCpu) -> Writeback {
        let (tx, rx) = bounded::<(Arc<Segment>, u64)>(QUEUE_DEPTH);
        let syncs = Arc::new(AtomicU64::new(0));
        let count = syncs.clone();
        let shared = durability.clone();
        let thread = std::thread::Builder::new()
            .name(format!("wal-wb-{name}").chars().take(15).collect())
            .spawn(move || {
                cpu.apply_to_current_thread();
                for (segment, last_seq) in rx {
                    if !durability.wait_complete(last_seq) {
                        return; // the image failed; nothing more to do
                    }
                    match log.sync_closed(&segment) {
                        Ok(()) => {
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            durability.fail(format!("early writeback of a closed log segment failed: {e}"));
                            return;
                        }
                    }
                }
            })
            .expect("spawn the WAL writeback thread");
        Writeback { tx: Some(tx), durability: shared, thread: Some(thread), syncs }
    }

    /// Queues segment `segment`, closed after record `last_seq`; skipped
    /// (left to group commit) if the queue is full.
    pub fn closed(&self, segment: Arc<Segment>, last_seq: u64) {
        if let Some(tx) = &self.tx {
            let _ = tx.try_send((segment, last_seq));
        }
    }
}

impl Drop for Writeback {
    fn drop(&mut self) {
        // The image is going away: stop waiting for records that will
        // never complete, skip queued segments (nothing relies on them).
        self.durability.fail("the image was closed".into());
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
