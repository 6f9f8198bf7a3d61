//! The chunk store's side of uploads: sealing packs once a sync covers
//! them, closing the active pack on demand, and the wait on the bound of
//! bytes not yet uploaded (see the parent module).

use super::{RemoteStats, UploadJob};
use crate::chunk::pack::slot_offset;
use crate::chunk::{lock, ChunkStore};
use crate::error::Result;
use std::time::{Duration, Instant};

/// How long one wait for upload room sleeps before it looks again.
const ROOM_POLL: Duration = Duration::from_millis(100);

impl ChunkStore {
    /// Seals the packs closed before change `durable_seq` (which a sync
    /// has made durable): records them in the catalog and queues their
    /// upload. A failure to write the catalog poisons the store.
    pub(crate) fn seal_durable(&self, durable_seq: u64) -> Result<()> {
        let Some(r) = &self.remote else { return Ok(()) };
        let jobs = {
            let mut guard = lock(&self.writer);
            if guard.to_seal.is_empty() {
                return Ok(());
            }
            let w = &mut *guard;
            let files = self.read_files();
            let mut jobs = Vec::new();
            w.to_seal.retain(|&(id, seq)| {
                if seq > durable_seq {
                    return true;
                }
                if let (Some(p), Some(file)) = (w.packs.get(&id), files.get(&id)) {
                    jobs.push(UploadJob {
                        id,
                        slots: p.slots,
                        file: file.clone(),
                        live: p.live_bits.clone(),
                    });
                }
                false
            });
            jobs
        };
        r.seal(jobs).inspect_err(|e| self.poison(e))
    }

    /// Closes the active pack (if it holds a chunk) and seals it for
    /// upload; returns its id. Without a remote, does nothing.
    pub fn seal_active(&self) -> Result<Option<u32>> {
        if self.remote.is_none() {
            return Ok(None);
        }
        let id = {
            let mut guard = lock(&self.writer);
            let w = &mut *guard;
            if w.active.as_ref().is_none_or(|a| a.next_slot == 0) {
                return Ok(None);
            }
            let a = w.active.take().expect("checked above");
            if let Some(p) = w.packs.get_mut(&a.id) {
                p.slots = p.slots.max(a.next_slot);
            }
            w.seq += 1;
            let seq = w.seq;
            w.to_seal.push((a.id, seq));
            a.id
        };
        self.sync()?;
        Ok(Some(id))
    }

    /// Waits until the bytes sealed and not yet uploaded, plus the active
    /// pack's, are within the remote's `pending_max_bytes`, sealing the
    /// active pack when it is what fills the bound. Returns at once
    /// without a remote; fails only if the store fails. With no uploader
    /// thread it uploads on the calling thread.
    pub fn wait_upload_room(&self) -> Result<()> {
        let Some(r) = &self.remote else { return Ok(()) };
        let started = Instant::now();
        let mut waited = false;
        loop {
            self.check_poison()?;
            let active = lock(&self.writer).active.as_ref().map_or(0, |a| slot_offset(a.next_slot));
            let sealed = r.sealed_bytes();
            if sealed + active <= r.pending_max_bytes {
                if waited {
                    r.note_wait(started.elapsed());
                }
                return Ok(());
            }
            waited = true;
            if sealed <= r.pending_max_bytes && active > 0 {
                self.seal_active()?;
                continue;
            }
            if r.has_threads() {
                r.wait_changed(ROOM_POLL);
            } else if r.upload_queued().is_err() {
                std::thread::sleep(ROOM_POLL);
            }
        }
    }

    /// Uploads every sealed pack queued, on the calling thread (for stores
    /// opened with no uploader thread); stops at the first failure.
    /// Returns the packs uploaded.
    pub fn upload_sealed(&self) -> Result<u64> {
        match &self.remote {
            Some(r) => r.upload_queued(),
            None => Ok(0),
        }
    }

    /// What the uploads have done, with a remote.
    pub fn remote_stats(&self) -> Option<RemoteStats> {
        self.remote.as_ref().map(|r| r.stats())
    }
}
