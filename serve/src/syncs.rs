//! Sync threads: FLUSH and FUA requests wait for fsync, so they run here,
//! never on the worker pool, and a cold read never queues behind another
//! image's fsync.
//!
//! A worker that is dispatched a request waiting for media offers it to
//! the pool's bounded queue and goes back to the scheduler. If the queue
//! is full (more syncs in flight than [`SYNC_QUEUE`]; the scheduler admits
//! about one FLUSH per image plus its write slots, so this is a backstop)
//! the worker serves the request itself: nothing waits for room, nothing
//! is refused.
//!
//! Shutdown: each worker holds a sender; when the last worker exits the
//! queue disconnects, and the sync threads serve what is left and exit.

use crate::worker::Started;
use crate::{Sched, TagBuffers};
use crossbeam::channel::{bounded, Receiver, Sender, TrySendError};
use std::sync::Arc;

/// Requests the queue holds before workers serve syncs themselves.
pub const SYNC_QUEUE: usize = 256;

/// The sending side, one clone per worker.
pub struct SyncPool<B> {
    tx: Option<Sender<Started<B>>>,
}

impl<B> Clone for SyncPool<B> {
    fn clone(&self) -> Self {
        SyncPool { tx: self.tx.clone() }
    }
}

impl<B: TagBuffers> SyncPool<B> {
    /// Starts `threads` sync threads (0: workers serve syncs themselves).
    pub fn spawn(threads: usize, sched: &Arc<Sched>) -> (SyncPool<B>, Vec<std::thread::JoinHandle<()>>) {
        if threads == 0 {
            return (SyncPool { tx: None }, Vec::new());
        }
        let (tx, rx) = bounded(SYNC_QUEUE);
        let handles = (0..threads)
            .map(|i| {
                let (rx, sched): (Receiver<Started<B>>, _) = (rx.clone(), sched.clone());
                std::thread::Builder::new()
                    .name(format!("casblk-sync-{i}"))
                    .spawn(move || {
                        while let Ok(started) = rx.recv() {
                            started.serve(&sched);
                        }
                    })
                    .expect("spawning a sync thread")
            })
            .collect();
        (SyncPool { tx: Some(tx) }, handles)
    }

    /// Queues `started` for a sync thread, or gives it back when the queue
    /// is full (the caller serves it).
    pub fn offer(&self, started: Started<B>) -> Option<Started<B>> {
        let Some(tx) = &self.tx else { return Some(started) };
        match tx.try_send(started) {
            Ok(()) => None,
            Err(TrySendError::Full(s) | TrySendError::Disconnected(s)) => Some(s),
        }
    }
}
