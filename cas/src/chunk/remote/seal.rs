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
        let (jobs, taken) = {
            let mut guard = lock(&self.writer);
            if guard.to_seal.is_empty() {
                return Ok(());
            }
            let w = &mut *guard;
            let files = self.read_files();
            let mut jobs = Vec::new();
            let mut taken = Vec::new();
            w.to_seal.retain(|&(id, seq)| {
                if seq > durable_seq {
                    return true;
                }
                taken.push((id, seq));
                if let (Some(p), Some(file)) = (w.packs.get(&id), files.get(&id)) {
                    let live = p.live_bits.clone();
                    jobs.push(UploadJob { id, slots: p.slots, file: file.clone(), live });
                }
                false
            });
            (jobs, taken)
        };
        r.seal(jobs).inspect_err(|e| {
            // Still to seal (by a reopen: the store is poisoned).
            lock(&self.writer).to_seal.extend(taken);
            self.poison(e);
        })
    }

    /// Closes the active pack (if it holds a chunk) and seals it for
    /// upload; returns its id. Without a remote, does nothing.
    pub fn seal_active(&self) -> Result<Option<u32>> {
        if self.remote.is_none() {
            return Ok(None);
        }
        let id = {
            let mut w = lock(&self.writer);
            if w.active.as_ref().is_none_or(|a| a.next_slot == 0) {
                return Ok(None);
            }
            w.close_active().expect("checked above")
        };
        self.sync()?;
        Ok(Some(id))
    }

    /// Whether chunks go to a remote (and inserts may wait for upload room).
    pub fn has_remote(&self) -> bool {
        self.remote.is_some()
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
            let active = lock(&self.writer).active.as_ref().map_or(0, |a| {
                if a.next_slot == 0 {
                    0
                } else {
                    slot_offset(a.next_slot)
                }
            });
            let sealed = r.sealed_bytes();
            if sealed + active <= r.pending_max_bytes {
                if waited {
                    r.note_wait(started.elapsed());
                }
                return Ok(());
            }
            waited = true;
            if sealed <= r.pending_max_bytes && active > 0 && self.seal_active()?.is_some() {
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

    /// Whether every pack of `packs` is whole in the bucket (uploaded, or
    /// another store's), as a manifest naming them must be before it is
    /// published. `Ok(false)`: some are on their way; this seals the
    /// active pack if it is one of them, and closed packs waiting for a
    /// sync. An error: some can never be (no remote; a pack from before
    /// the store had one, host slot 0).
    pub fn packs_in_bucket(&self, packs: &std::collections::BTreeSet<u32>) -> Result<bool> {
        let Some(r) = &self.remote else {
            return Err(crate::Error::InvalidArgument("the store has no remote".into()));
        };
        let slot = r.host_slot();
        let mut ready = true;
        let mut seal_active = false;
        let mut sync = false;
        for &id in packs {
            match r.phase(id) {
                Some(super::PackPhase::Uploaded | super::PackPhase::Foreign) => {}
                Some(super::PackPhase::Sealed) => ready = false,
                None if super::catalog::owns(slot, id) => {
                    ready = false;
                    let w = lock(&self.writer);
                    if w.active.as_ref().is_some_and(|a| a.id == id) {
                        seal_active = true;
                    } else {
                        sync |= w.to_seal.iter().any(|&(s, _)| s == id);
                    }
                }
                None => {
                    return Err(crate::Error::InvalidArgument(format!(
                        "pack {id:#010x} {}",
                        if id >> super::catalog::SEQ_BITS == 0 {
                            "is from before the store had a remote and is never uploaded"
                        } else {
                            "is another store's and not known here"
                        }
                    )))
                }
            }
        }
        if seal_active {
            self.seal_active()?;
        } else if sync {
            self.sync()?;
        }
        Ok(ready)
    }

    /// Waits until an upload finishes or `timeout` passes; with no
    /// uploader thread, uploads what is queued on this thread instead.
    pub fn wait_uploads(&self, timeout: Duration) -> Result<()> {
        let Some(r) = &self.remote else { return Ok(()) };
        if r.has_threads() {
            r.wait_changed(timeout);
            Ok(())
        } else {
            r.upload_queued().map(|_| ())
        }
    }

    /// Other stores' packs, read from the bucket.
    pub(crate) fn foreign_packs(&self) -> std::collections::BTreeSet<u32> {
        self.remote.as_ref().map_or_else(Default::default, |r| r.foreign())
    }

    /// The remote's objects, if the store has one.
    pub fn objects(&self) -> Option<&std::sync::Arc<dyn crate::objects::Objects>> {
        self.remote.as_ref().map(|r| &r.objects)
    }

    /// What the uploads have done, with a remote.
    pub fn remote_stats(&self) -> Option<RemoteStats> {
        self.remote.as_ref().map(|r| r.stats())
    }
}

#[cfg(test)]
mod tests {
    use crate::chunk::remote::RemoteOptions;
    use crate::chunk::{lock, ChunkHash, ChunkStore, ChunkStoreOptions, CHUNK_BYTES, PACK_HEADER_BYTES};
    use crate::objects::MemObjects;
    use crate::storage::MemStorage;
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    /// A closed pack is sealed only once the sync covering its last write
    /// is durable, whatever else a sync made durable.
    #[test]
    fn a_closed_pack_waits_for_the_sync_that_covers_it() {
        let remote = RemoteOptions {
            upload_threads: 0,
            claim_bound: Duration::from_millis(1),
            ..RemoteOptions::new(Arc::new(MemObjects::new()))
        };
        let opts = ChunkStoreOptions {
            pack_bytes: PACK_HEADER_BYTES + 8 * CHUNK_BYTES as u64,
            remote: Some(remote),
            ..Default::default()
        };
        let c = ChunkStore::open(Arc::new(MemStorage::new()), Path::new("/c"), opts).unwrap();
        let blocks: Vec<Vec<u8>> = (1..=9u8).map(|i| vec![i; CHUNK_BYTES]).collect();
        let items: Vec<(ChunkHash, &[u8])> = blocks.iter().map(|b| (ChunkHash::of(b), &b[..])).collect();
        c.insert_missing(&c.pin(), &items).unwrap();
        let (id, seq) = lock(&c.writer).to_seal[0];
        c.seal_durable(seq - 1).unwrap();
        assert_eq!(c.remote_stats().unwrap().sealed_packs, 0, "sealed before its writes were durable");
        assert_eq!(lock(&c.writer).to_seal, vec![(id, seq)]);
        c.sync().unwrap();
        assert_eq!(c.remote_stats().unwrap().sealed_packs, 1);
        assert!(lock(&c.writer).to_seal.is_empty());
    }
}
