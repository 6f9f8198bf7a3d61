//! Opening a chunk store with this tier ([`Attach`], the chunk core's
//! [`TierOpen`]): the catalog read and checked (or, on the first open
//! with a remote, a host slot claimed and a catalog written), handles for
//! the packs only in the bucket, then the uploads of sealed packs started
//! again ([`TierAttach::start`]).

use super::catalog::{Catalog, PackPhase, CATALOG_FILE};
use super::extent_cache::ExtentCache;
use super::{host_slot, PackTier, RemoteOptions, RemotePackFile, RemoteReads};
use crate::chunk::tier::{SealedPack, Tier, TierAttach, TierOpen};
use crate::chunk::{ChunkStore, ChunkStoreOptions, PackFiles};
use crate::error::{Error, Result};
use crate::storage::{OpenMode, Storage, StorageFile};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, RwLock};

/// The extent cache's file name in `chunks/`.
pub const CACHE_FILE: &str = "remote-cache";

/// The shared state of remote pack reads: the extent cache in
/// `chunks/remote-cache`, emptied.
fn remote_reads(storage: &dyn Storage, dir: &Path, opts: &RemoteOptions) -> Result<Arc<RemoteReads>> {
    let file = storage.open(&dir.join(CACHE_FILE), OpenMode::Create)?;
    Ok(Arc::new(RemoteReads {
        objects: opts.objects.clone(),
        cache: ExtentCache::new(file, opts.cache_bytes)?,
        counters: Default::default(),
        read_retry: opts.read_retry,
    }))
}

/// Refuses a bucket that does not hold this store's host slot claim (see
/// host_slot.rs); a bucket that cannot be reached now is let through (the
/// store works locally and uploads once it answers).
fn check_claim(o: &RemoteOptions, c: &Catalog) -> Result<()> {
    let key = host_slot::key(c.host_slot, c.store_id);
    match o.objects.head(&key) {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(Error::Unavailable(
            o.objects.describe(),
            format!(
                "it does not hold this store's claim of host slot {} ({key}): not the bucket the store uploads to",
                c.host_slot
            ),
        )),
        Err(e) if e.is_transient() => {
            tracing::warn!(error = %e, "the bucket did not answer at open; uploads wait for it");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Host slot claims tried before the open fails.
const CLAIM_ROUNDS: u32 = 8;

/// The store's catalog at open, if it has one or `opts` asks for a remote:
/// checked against the store, and without the sealed packs the open is
/// about to delete or lacks (`kept(id)` false: no live slot, or no file):
/// nothing of them is left to upload.
fn attach(
    storage: &dyn Storage,
    dir: &Path,
    store_id: u64,
    opts: Option<&RemoteOptions>,
    kept: &dyn Fn(u32) -> bool,
) -> Result<Option<Catalog>> {
    match Catalog::read(storage, dir)? {
        Some(mut c) => {
            if c.store_id != store_id {
                return Err(Error::Corruption {
                    path: dir.join(CATALOG_FILE),
                    offset: 0,
                    detail: format!("the remote catalog belongs to store {:#018x}", c.store_id),
                });
            }
            let before = c.packs.len();
            c.packs.retain(|&id, p| matches!(p.phase, PackPhase::Uploaded | PackPhase::Foreign) || kept(id));
            if c.packs.len() != before {
                c.write(storage, dir)?;
            }
            if let Some(o) = opts {
                check_claim(o, &c)?;
            }
            if opts.is_none() && c.pending_bytes() > 0 {
                tracing::warn!(
                    pending_bytes = c.pending_bytes(),
                    "sealed packs wait for upload: the store was opened without its remote"
                );
            }
            Ok(Some(c))
        }
        None => {
            let Some(o) = opts else { return Ok(None) };
            let slot = host_slot::claim(o.objects.as_ref(), store_id, o.claim_bound, CLAIM_ROUNDS)?;
            tracing::info!(host_slot = slot, remote = %o.objects.describe(), "claimed a host slot");
            let c = Catalog { store_id, host_slot: slot, packs: BTreeMap::new() };
            c.write(storage, dir)?;
            Ok(Some(c))
        }
    }
}

/// Attaches this tier to a chunk store at open: with `remote`, the
/// store's packs go to its bucket; without, a store that had a bucket
/// still keeps its host slot and never resumes a sealed pack (and fails
/// to open if some packs are only in the bucket).
pub struct Attach {
    remote: Option<RemoteOptions>,
    started: Arc<OnceLock<Arc<PackTier>>>,
}

impl Attach {
    pub fn new(remote: Option<RemoteOptions>) -> Attach {
        Attach { remote, started: Arc::default() }
    }

    /// The tier the open started (None: no remote, or not opened yet).
    pub fn started(&self) -> Option<Arc<PackTier>> {
        self.started.get().cloned()
    }
}

/// Opens the chunk store in `dir` with this tier (`remote`: its bucket, if
/// any); returns the tier too when it started (with a remote).
pub fn open_chunks(
    storage: Arc<dyn Storage>,
    dir: &Path,
    opts: ChunkStoreOptions,
    remote: Option<&RemoteOptions>,
) -> Result<(ChunkStore, Option<Arc<PackTier>>)> {
    let attach = Attach::new(remote.cloned());
    let chunks = ChunkStore::open_with_tier(storage, dir, opts, Some(&attach))?;
    Ok((chunks, attach.started()))
}

impl TierOpen for Attach {
    fn attach(
        &self,
        storage: &Arc<dyn Storage>,
        dir: &Path,
        store_id: u64,
        kept: &dyn Fn(u32) -> bool,
    ) -> Result<Option<Box<dyn TierAttach>>> {
        let Some(catalog) = attach(storage.as_ref(), dir, store_id, self.remote.as_ref(), kept)? else {
            return Ok(None);
        };
        Ok(Some(Box::new(Attached {
            storage: storage.clone(),
            dir: dir.to_path_buf(),
            remote: self.remote.clone(),
            catalog,
            reads: None,
            started: self.started.clone(),
        })))
    }
}

/// The tier attached at open, before the store is built.
struct Attached {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    remote: Option<RemoteOptions>,
    catalog: Catalog,
    /// Made by `remote_files`, with a remote.
    reads: Option<Arc<RemoteReads>>,
    started: Arc<OnceLock<Arc<PackTier>>>,
}

impl TierAttach for Attached {
    fn host_slot(&self) -> u8 {
        self.catalog.host_slot
    }

    fn packs(&self) -> Vec<(u32, PackPhase, u32)> {
        self.catalog.packs.iter().map(|(&id, p)| (id, p.phase, p.slots)).collect()
    }

    fn has_bucket(&self) -> bool {
        self.remote.is_some()
    }

    /// With a remote: the extent cache emptied, and a handle per pack.
    fn remote_files(&mut self, packs: &[(u32, u64)]) -> Result<Option<Vec<Arc<dyn StorageFile>>>> {
        let Some(r) = &self.remote else { return Ok(None) };
        let reads = remote_reads(self.storage.as_ref(), &self.dir, r)?;
        let files = packs
            .iter()
            .map(|&(id, len)| Arc::new(RemotePackFile::new(id, len, reads.clone())) as Arc<dyn StorageFile>)
            .collect();
        self.reads = Some(reads);
        Ok(Some(files))
    }

    fn start(
        self: Box<Self>,
        files: Arc<RwLock<PackFiles>>,
        sealed: Vec<SealedPack>,
        uploaded_local: Vec<(u32, u64)>,
    ) -> Result<Option<Arc<dyn Tier>>> {
        let (Some(opts), Some(reads)) = (&self.remote, self.reads) else { return Ok(None) };
        let r = PackTier::new(self.storage, self.dir, opts, self.catalog, files, reads);
        for p in sealed {
            r.requeue(p);
        }
        for (id, bytes) in uploaded_local {
            r.note_local_uploaded(id, bytes);
        }
        let _ = self.started.set(r.clone());
        Ok(Some(r))
    }
}
