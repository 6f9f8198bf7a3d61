//! Sealed packs uploaded to the bucket (issue 18, stage 2): the
//! catalog of sealed and uploaded packs, the host slot that keeps pack ids
//! unique across the stores sharing a bucket, the uploader threads, and
//! the bound on bytes not yet uploaded.
//!
//! Lifecycle of a pack of a store with a remote (packs are numbered
//! `host_slot << 24 | seq`):
//! 1. **Active**: appended to, as without a remote.
//! 2. **Sealed**: when it fills, or when [`ChunkStore::seal_active`](crate::chunk::ChunkStore::seal_active) or
//!    the upload bound closes it, it stops taking chunks; after the next
//!    sync covers its last write the chunk store hands it to this tier
//!    ([`Tier::sealed`]), which enters it in the catalog as sealed
//!    (catalog.rs) and queues it for upload. Open never resumes a sealed
//!    pack; GC neither repacks nor deletes it.
//! 3. **Uploaded**: `PUT packs/<id:08x>/<part:04x>` with the pack's bytes
//!    (header and every slot it spans) in 16 MiB parts (upload.rs says
//!    why), a HEAD of each that sees its whole length, `PUT
//!    packidx/<id:08x>` (packidx.rs), then the catalog records it. A crash
//!    before that leaves it sealed, and the next open queues it again; the
//!    PUTs are repeated whole (same key, same bytes).
//!
//! The local file stays after the upload (reads from remote packs and the
//! eviction of local copies are stage 3). Packs from before the store had
//! a remote (host slot 0) are never uploaded.
//!
//! **Bound.** Bytes sealed but not uploaded, plus the active pack's, may
//! reach `pending_max_bytes`; [`PackTier::wait_upload_room`] (called by
//! compaction before it stores chunks) waits until they are under it,
//! sealing the active pack when that is what fills it. Each caller checks
//! before a batch of inserts (compaction: before each batch, outside its
//! pin), so it may pass the bound by one batch. Guests' writes then
//! wait on log capacity, as they do behind a slow compactor: they wait,
//! never fail. Uploads retry with backoff for as long as they fail; the
//! last error is in [`RemoteStats`].
//!
//! Memory: each uploader thread holds one pack's bytes while it uploads
//! it (64 MiB by default).
//!
//! The chunk core sees this tier only through its traits
//! (crate::chunk::tier): attach.rs implements [`TierOpen`](crate::chunk::tier::TierOpen) and
//! [`TierAttach`](crate::chunk::tier::TierAttach), [`PackTier`]
//! implements [`Tier`]; what callers above the chunk store ask of the
//! tier (room for uploads, packs in the bucket, other stores' packs) are
//! methods of [`PackTier`] that take the chunk store.

pub(crate) mod attach;
pub mod catalog;
pub mod check;
mod extent_cache;
mod foreign;
pub mod host_slot;
mod pack_file;
pub mod packidx;
mod room;
pub mod scrub;
mod upload;
mod uploader;

pub use upload::{pack_key, packidx_key, PART_BYTES};

pub use crate::chunk::ForeignImport;
pub use attach::{open_chunks, Attach};
pub use catalog::{Catalog, CatalogEntry, PackPhase};
pub use foreign::FULL_SCAN_EVERY;
pub(crate) use pack_file::{RemotePackFile, RemoteReads};

use super::RemoteOptions;
use crate::background::BackgroundCpu;
use crate::chunk::pack::slot_offset;
use crate::chunk::tier::{SealedPack, Tier};
use crate::chunk::PackFiles;
use crate::error::{Error, Result};
use crate::objects::Objects;
use crate::storage::Storage;
use crate::tasks::{TaskHandle, Tasks, Wake};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, Weak};
use std::time::Duration;

/// What the remote side of a chunk store has done ([`PackTier::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RemoteStats {
    pub host_slot: u8,
    /// Packs sealed and not yet uploaded, and their bytes.
    pub sealed_packs: u64,
    pub pending_upload_bytes: u64,
    /// Packs uploaded in the catalog, and bytes uploaded since open.
    pub uploaded_packs: u64,
    pub uploaded_bytes: u64,
    /// Failed upload attempts since open (each is retried), and the last
    /// one's message.
    pub upload_errors: u64,
    pub last_error: Option<String>,
    /// Times compaction waited on `pending_max_bytes`, and for how long.
    pub upload_waits: u64,
    pub upload_wait_ms: u64,
    /// Uploaded packs still local, and their bytes; packs deleted locally
    /// (read from the bucket since) since open.
    pub local_uploaded_packs: u64,
    pub local_uploaded_bytes: u64,
    pub evicted_packs: u64,
    /// Other stores' packs that images fetched from the bucket name.
    pub foreign_packs: u64,
    /// Reads of remote packs served by the extent cache; ranged GETs, their
    /// bytes, and GETs retried.
    pub cache_hits: u64,
    pub gets: u64,
    pub get_bytes: u64,
    pub get_retries: u64,
}

struct State {
    catalog: Catalog,
    queue: VecDeque<SealedPack>,
    /// Uploaded packs with a local file, oldest upload first, and bytes.
    local_uploaded: VecDeque<(u32, u64)>,
    stop: bool,
    stats: RemoteStats,
}

/// The remote side of an open chunk store, shared with its uploader
/// threads: the tier its sealed packs go to.
pub struct PackTier {
    /// Itself, for the uploader tasks it starts.
    me: Weak<PackTier>,
    objects: Arc<dyn Objects>,
    pending_max_bytes: u64,
    upload_threads: usize,
    /// Who runs the uploaders.
    tasks: Tasks,
    store_id: u64,
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    /// The store's open pack files: eviction swaps a pack's local handle
    /// for a remote one there.
    files: Arc<RwLock<PackFiles>>,
    reads: Arc<RemoteReads>,
    local_keep_bytes: u64,
    state: Mutex<State>,
    /// Signalled when a job is queued, a pack uploaded, or on stop (and the
    /// uploaders woken).
    changed: Condvar,
    /// Serialises catalog writes, so an older catalog never replaces a newer.
    catalog_write: Mutex<()>,
    uploaders: Mutex<Vec<(TaskHandle, Wake)>>,
    /// Where the next import's listing of `packidx/` starts (foreign.rs).
    pub(crate) import_scan: Mutex<foreign::ImportScan>,
}

impl PackTier {
    pub(crate) fn new(
        storage: Arc<dyn Storage>,
        dir: PathBuf,
        opts: &RemoteOptions,
        catalog: Catalog,
        files: Arc<RwLock<PackFiles>>,
        reads: Arc<RemoteReads>,
    ) -> Arc<PackTier> {
        Arc::new_cyclic(|me| PackTier {
            me: me.clone(),
            objects: opts.objects.clone(),
            pending_max_bytes: opts.pending_max_bytes,
            upload_threads: opts.upload_threads,
            tasks: opts.tasks.clone(),
            store_id: catalog.store_id,
            storage,
            dir,
            files,
            reads,
            local_keep_bytes: opts.local_keep_bytes,
            state: Mutex::new(State {
                stats: RemoteStats { host_slot: catalog.host_slot, ..RemoteStats::default() },
                catalog,
                queue: VecDeque::new(),
                local_uploaded: VecDeque::new(),
                stop: false,
            }),
            changed: Condvar::new(),
            catalog_write: Mutex::new(()),
            uploaders: Mutex::new(Vec::new()),
            import_scan: Mutex::default(),
        })
    }

    /// The bucket.
    pub fn objects(&self) -> &Arc<dyn Objects> {
        &self.objects
    }

    fn state(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// True when uploader tasks run.
    pub(crate) fn has_threads(&self) -> bool {
        !crate::sync::lock(&self.uploaders).is_empty()
    }

    /// Something changed (a job queued, a pack uploaded, a stop): wakes
    /// the waiters and the uploaders.
    fn notify(&self) {
        self.changed.notify_all();
        for (_, wake) in crate::sync::lock(&self.uploaders).iter() {
            wake.wake();
        }
    }

    /// Records `jobs` as sealed, durably, then queues them. The caller has
    /// made every slot they span durable.
    fn seal(&self, jobs: Vec<SealedPack>) -> Result<()> {
        if jobs.is_empty() {
            return Ok(());
        }
        let _w = crate::sync::lock(&self.catalog_write);
        let bytes = {
            let mut s = self.state();
            for j in &jobs {
                s.catalog.packs.insert(j.id, CatalogEntry { phase: PackPhase::Sealed, slots: j.slots });
            }
            s.catalog.encode()
        };
        self.write_catalog(&bytes)?;
        self.state().queue.extend(jobs);
        self.notify();
        Ok(())
    }

    /// Queues a pack the catalog already holds as sealed (at open).
    pub(crate) fn requeue(&self, job: SealedPack) {
        self.state().queue.push_back(job);
        self.notify();
    }

    /// Bytes of sealed packs not yet uploaded.
    pub(crate) fn sealed_bytes(&self) -> u64 {
        self.state().catalog.pending_bytes()
    }

    /// Waits until something changes or `timeout` passes.
    pub(crate) fn wait_changed(&self, timeout: Duration) {
        let s = self.state();
        let _ = self.changed.wait_timeout(s, timeout);
    }

    pub(crate) fn note_wait(&self, waited: Duration) {
        let mut s = self.state();
        s.stats.upload_waits += 1;
        s.stats.upload_wait_ms += waited.as_millis() as u64;
    }

    /// What the uploads and the reads of the bucket have done.
    pub fn stats(&self) -> RemoteStats {
        let s = self.state();
        let mut st = s.stats.clone();
        st.sealed_packs = s.catalog.packs.values().filter(|p| p.phase == PackPhase::Sealed).count() as u64;
        st.foreign_packs = s.catalog.packs.values().filter(|p| p.phase == PackPhase::Foreign).count() as u64;
        st.uploaded_packs = s.catalog.packs.len() as u64 - st.sealed_packs - st.foreign_packs;
        st.pending_upload_bytes = s.catalog.pending_bytes();
        st.local_uploaded_packs = s.local_uploaded.len() as u64;
        st.local_uploaded_bytes = s.local_uploaded.iter().map(|p| p.1).sum();
        let c = &self.reads.counters;
        st.cache_hits = c.cache_hits.load(Ordering::Relaxed);
        st.gets = c.gets.load(Ordering::Relaxed);
        st.get_bytes = c.get_bytes.load(Ordering::Relaxed);
        st.get_retries = c.get_retries.load(Ordering::Relaxed);
        st
    }

    /// Uploads every queued pack on the calling thread; stops at the first
    /// failure (the pack stays queued). Returns the packs uploaded.
    pub(crate) fn upload_queued(&self) -> Result<u64> {
        let mut n = 0;
        loop {
            let Some(job) = self.state().queue.pop_front() else { return Ok(n) };
            if let Err(e) = self.upload_one(&job) {
                self.state().queue.push_front(job);
                return Err(e);
            }
            n += 1;
        }
    }

    /// Uploads one pack and records it (see the module docs); a failure is
    /// counted, logged and returned.
    fn upload_one(&self, job: &SealedPack) -> Result<()> {
        let result = upload::put_pack(self.objects.as_ref(), self.store_id, job)
            .and_then(|bytes| self.mark_uploaded(job.id).map(|()| bytes));
        match result {
            Ok(bytes) => {
                {
                    let mut s = self.state();
                    s.stats.uploaded_bytes += bytes;
                    s.local_uploaded.push_back((job.id, slot_offset(job.slots)));
                }
                self.notify();
                if let Err(e) = self.evict_local() {
                    // Retried by the next eviction (see `evict`).
                    tracing::warn!(error = %e, "deleting the local copy of an uploaded pack failed");
                }
                Ok(())
            }
            Err(e) => {
                tracing::warn!(pack = job.id, error = %e, "pack upload failed; retrying");
                let mut s = self.state();
                s.stats.upload_errors += 1;
                s.stats.last_error = Some(e.to_string());
                Err(e)
            }
        }
    }

    /// Notes an uploaded pack whose local file is kept (at open).
    pub(crate) fn note_local_uploaded(&self, id: u32, bytes: u64) {
        self.state().local_uploaded.push_back((id, bytes));
    }

    /// Deletes the local files of the oldest uploaded packs while they
    /// take more than `local_keep_bytes`: each pack's handle becomes a
    /// remote one first, so readers go to the bucket (a reader holding the
    /// old handle still reads the unlinked file).
    fn evict_local(&self) -> Result<()> {
        loop {
            let (id, bytes) = {
                let s = self.state();
                let local: u64 = s.local_uploaded.iter().map(|p| p.1).sum();
                if local <= self.local_keep_bytes {
                    return Ok(());
                }
                *s.local_uploaded.front().expect("over the bound, so not empty")
            };
            let remote = Arc::new(RemotePackFile::new(id, bytes, self.reads.clone()));
            let replaced = {
                let mut files = self.files.write().unwrap_or_else(|p| p.into_inner());
                files.get_mut(&id).map(|f| *f = remote).is_some()
            };
            if replaced {
                // On a failure the pack stays first in line, and the next
                // eviction (after the next upload, or the next open) retries.
                self.storage.remove_file(&self.dir.join(crate::chunk::pack::pack_file_name(id)))?;
                self.storage.sync_dir(&self.dir)?;
            }
            let mut s = self.state();
            s.local_uploaded.pop_front();
            s.stats.evicted_packs += u64::from(replaced);
        }
    }

    /// Where pack `id` is in its upload, if the catalog holds it.
    pub(crate) fn phase(&self, id: u32) -> Option<PackPhase> {
        self.state().catalog.packs.get(&id).map(|p| p.phase)
    }

    /// The foreign packs of the catalog.
    pub(crate) fn foreign_ids(&self) -> std::collections::BTreeSet<u32> {
        let s = self.state();
        s.catalog.packs.iter().filter(|(_, p)| p.phase == PackPhase::Foreign).map(|(&id, _)| id).collect()
    }

    /// This store's host slot.
    pub(crate) fn host_slot(&self) -> u8 {
        self.state().catalog.host_slot
    }

    /// The slot index of pack `id` from the bucket.
    pub(crate) fn pack_index(&self, id: u32) -> Result<packidx::PackIndex> {
        let key = upload::packidx_key(id);
        let what = PathBuf::from(format!("{}/{key}", self.objects.describe()));
        let bytes = self.objects.get(&key).map_err(|e| match e.kind {
            crate::objects::ObjectErrorKind::NotFound => Error::Unavailable(
                what.display().to_string(),
                "a published manifest names a pack the bucket does not hold".into(),
            ),
            _ => e.into(),
        })?;
        let idx = packidx::PackIndex::decode(&bytes, &what)?;
        if idx.pack != id {
            return Err(Error::Corruption {
                path: what,
                offset: 0,
                detail: format!("names pack {:#010x}", idx.pack),
            });
        }
        Ok(idx)
    }

    /// Records other stores' packs as foreign, durably, and gives each a
    /// remote handle: their sizes come from their slot indexes in the
    /// bucket (`packidx/`, written after the pack was confirmed). Returns
    /// the slot indexes of the packs it adopted.
    fn adopt_packs(&self, ids: &[u32]) -> Result<Vec<packidx::PackIndex>> {
        let mut found = Vec::with_capacity(ids.len());
        let mut indexes = Vec::with_capacity(ids.len());
        for &id in ids {
            if self.phase(id).is_some() || catalog::owns(self.host_slot(), id) {
                continue;
            }
            let idx = self.pack_index(id)?;
            found.push((id, u32::try_from(idx.slots.len()).unwrap_or(u32::MAX)));
            indexes.push(idx);
        }
        if found.is_empty() {
            return Ok(indexes);
        }
        let _w = crate::sync::lock(&self.catalog_write);
        let bytes = {
            let mut s = self.state();
            for &(id, slots) in &found {
                s.catalog.packs.insert(id, CatalogEntry { phase: PackPhase::Foreign, slots });
            }
            s.catalog.encode()
        };
        if let Err(e) = self.write_catalog(&bytes) {
            let mut s = self.state();
            for (id, _) in &found {
                s.catalog.packs.remove(id);
            }
            return Err(e);
        }
        let mut files = self.files.write().unwrap_or_else(|p| p.into_inner());
        for (id, slots) in found {
            let len = crate::chunk::pack::slot_offset(slots);
            files.entry(id).or_insert_with(|| Arc::new(RemotePackFile::new(id, len, self.reads.clone())));
        }
        Ok(indexes)
    }

    /// Replaces the catalog file; the caller holds `catalog_write`.
    fn write_catalog(&self, bytes: &[u8]) -> Result<()> {
        crate::storage::write_atomic(self.storage.as_ref(), &self.dir, catalog::CATALOG_FILE, bytes)
    }

    fn mark_uploaded(&self, id: u32) -> Result<()> {
        let _w = crate::sync::lock(&self.catalog_write);
        let bytes = {
            let mut s = self.state();
            if let Some(p) = s.catalog.packs.get_mut(&id) {
                p.phase = PackPhase::Uploaded;
            }
            s.catalog.encode()
        };
        let written = self.write_catalog(&bytes);
        if written.is_err() {
            // Not durable: it stays sealed and is uploaded again.
            if let Some(p) = self.state().catalog.packs.get_mut(&id) {
                p.phase = PackPhase::Sealed;
            }
        }
        written
    }
}

impl Tier for PackTier {
    fn sealed(&self, packs: Vec<SealedPack>) -> Result<()> {
        self.seal(packs)
    }

    fn foreign(&self) -> std::collections::BTreeSet<u32> {
        self.foreign_ids()
    }

    fn evict(&self) -> Result<()> {
        self.evict_local()
    }

    fn bucket_copy(&self, id: u32) -> Option<Arc<dyn crate::storage::StorageFile>> {
        let slots = match self.state().catalog.packs.get(&id) {
            Some(e) if e.phase == crate::chunk::pack_id::PackPhase::Uploaded => e.slots,
            _ => return None,
        };
        let len = crate::chunk::pack::slot_offset(slots);
        Some(Arc::new(RemotePackFile::new(id, len, self.reads.clone())))
    }

    /// Starts the uploaders (`upload_threads` of them, uploader.rs).
    fn run(&self) -> Result<()> {
        for i in 0..self.upload_threads {
            let task = uploader::UploadTask { tier: self.me.clone(), failures: 0 };
            let name = format!("casblk-upload-{i}");
            let handle = self.tasks.try_spawn(&name, BackgroundCpu::Normal, Box::new(task))?;
            let wake = handle.waker();
            crate::sync::lock(&self.uploaders).push((handle, wake));
        }
        Ok(())
    }

    /// Stops the uploaders (an upload under way finishes or fails first)
    /// and waits for them.
    fn stop(&self) {
        self.state().stop = true;
        self.notify();
        // Out of the lock first: a stopping uploader may notify.
        let uploaders = std::mem::take(&mut *crate::sync::lock(&self.uploaders));
        drop(uploaders);
    }
}
