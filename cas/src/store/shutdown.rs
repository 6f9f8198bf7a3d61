//! Stopping a store's background compaction before a process exits
//! without dropping the store (the daemon: its threads hold the store).
//! Exiting under a pass cuts its manifest commit short: the log keeps
//! every write, and the next open deletes the `manifest.new` left behind,
//! but until then fsck reports it as an orphan file.

use super::Store;
use crate::sync::lock;
use std::time::Duration;

impl Store {
    /// Stops the background compactor after the pass under way, if any,
    /// waiting for it at most `timeout` (a pass can wait on the bucket's
    /// upload room for as long as the bucket is out of reach); returns
    /// whether it stopped in time. Open images are compacted no more.
    pub fn stop_compaction(&self, timeout: Duration) -> bool {
        let Some(service) = lock(&self.service).take() else { return true };
        let (tx, rx) = std::sync::mpsc::channel();
        let stopping = std::thread::Builder::new().name("casblk-stop-compaction".into()).spawn(move || {
            drop(service);
            let _ = tx.send(());
        });
        stopping.is_ok() && rx.recv_timeout(timeout).is_ok()
    }
}
