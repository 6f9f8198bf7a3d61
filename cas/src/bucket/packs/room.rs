//! What the callers above the chunk store ask of the uploads: room under
//! the bound of bytes not yet uploaded (compaction waits for it before it
//! stores chunks), whether packs are whole in the bucket (publication
//! waits for it before it names them), and uploads run on the calling
//! thread (see the parent module).

use super::{PackPhase, PackTier};
use crate::chunk::pack_id;
use crate::chunk::{ChunkStore, Closing};
use crate::error::Result;
use std::time::{Duration, Instant};

/// How long one wait for upload room sleeps before it looks again.
const ROOM_POLL: Duration = Duration::from_millis(100);

impl PackTier {
    /// Waits until the bytes sealed and not yet uploaded, plus the active
    /// pack's of `chunks`, are within `pending_max_bytes`, sealing the
    /// active pack when it is what fills the bound; fails only if the
    /// store fails. With no uploader thread it uploads on the calling
    /// thread.
    pub fn wait_upload_room(&self, chunks: &ChunkStore) -> Result<()> {
        let started = Instant::now();
        let mut waited = false;
        loop {
            chunks.check_poison()?;
            let active = chunks.active_bytes();
            let sealed = self.sealed_bytes();
            if sealed + active <= self.pending_max_bytes {
                if waited {
                    self.note_wait(started.elapsed());
                }
                return Ok(());
            }
            waited = true;
            if sealed <= self.pending_max_bytes && active > 0 && chunks.seal_active()?.is_some() {
                continue;
            }
            if self.has_threads() {
                self.wait_changed(ROOM_POLL);
            } else if self.upload_queued().is_err() {
                std::thread::sleep(ROOM_POLL);
            }
        }
    }

    /// Uploads every sealed pack queued, on the calling thread (for stores
    /// opened with no uploader thread); stops at the first failure.
    /// Returns the packs uploaded.
    pub fn upload_sealed(&self) -> Result<u64> {
        self.upload_queued()
    }

    /// Whether every pack of `packs` is whole in the bucket (uploaded, or
    /// another store's), as a manifest naming them must be before it is
    /// published. `Ok(false)`: some are on their way; this seals the
    /// active pack of `chunks` if it is one of them, and closed packs
    /// waiting for a sync. An error: some can never be (a pack from
    /// before the store had a remote, host slot 0).
    pub fn packs_in_bucket(
        &self,
        chunks: &ChunkStore,
        packs: &std::collections::BTreeSet<u32>,
    ) -> Result<bool> {
        let slot = self.host_slot();
        let mut ready = true;
        let mut seal_active = false;
        let mut sync = false;
        for &id in packs {
            match self.phase(id) {
                Some(PackPhase::Uploaded | PackPhase::Foreign) => {}
                Some(PackPhase::Sealed) => ready = false,
                None if pack_id::owns(slot, id) => {
                    ready = false;
                    match chunks.closing(id) {
                        Closing::Active => seal_active = true,
                        Closing::AwaitingSync => sync = true,
                        Closing::No => {}
                    }
                }
                None => {
                    return Err(crate::Error::InvalidArgument(format!(
                        "pack {id:#010x} {}",
                        if pack_id::before_tier(id) {
                            "is from before the store had a remote and is never uploaded"
                        } else {
                            "is another store's and not known here"
                        }
                    )))
                }
            }
        }
        if seal_active {
            chunks.seal_active()?;
        } else if sync {
            chunks.sync()?;
        }
        Ok(ready)
    }

    /// Waits until an upload finishes or `timeout` passes; with no
    /// uploader thread, uploads what is queued on this thread instead.
    pub fn wait_uploads(&self, timeout: Duration) -> Result<()> {
        if self.has_threads() {
            self.wait_changed(timeout);
            Ok(())
        } else {
            self.upload_queued().map(|_| ())
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::bucket::packs::open_chunks;
    use crate::bucket::RemoteOptions;
    use crate::chunk::{lock, ChunkHash, ChunkStoreOptions, CHUNK_BYTES, PACK_HEADER_BYTES};
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
            ..Default::default()
        };
        let (c, tier) =
            open_chunks(Arc::new(MemStorage::new()), Path::new("/c"), opts, Some(&remote)).unwrap();
        let tier = tier.unwrap();
        let blocks: Vec<Vec<u8>> = (1..=9u8).map(|i| vec![i; CHUNK_BYTES]).collect();
        let items: Vec<(ChunkHash, &[u8])> = blocks.iter().map(|b| (ChunkHash::of(b), &b[..])).collect();
        c.insert_missing(&c.pin(), &items).unwrap();
        let (id, seq) = lock(&c.writer).to_seal[0];
        c.seal_durable(seq - 1).unwrap();
        assert_eq!(tier.stats().sealed_packs, 0, "sealed before its writes were durable");
        assert_eq!(lock(&c.writer).to_seal, vec![(id, seq)]);
        c.sync().unwrap();
        assert_eq!(tier.stats().sealed_packs, 1);
        assert!(lock(&c.writer).to_seal.is_empty());
    }
}
