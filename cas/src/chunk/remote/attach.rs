//! Opening a chunk store with a remote: the catalog read and checked (or,
//! on the first open with a remote, a host slot claimed and a catalog
//! written), then the uploads of sealed packs started again.

use super::catalog::{Catalog, PackPhase, CATALOG_FILE};
use super::extent_cache::ExtentCache;
use super::{host_slot, Remote, RemoteOptions, RemoteReads, UploadJob};
use crate::chunk::{lock, ChunkStore};
use crate::error::{Error, Result};
use crate::storage::{OpenMode, Storage};
use std::collections::BTreeMap;

/// The extent cache's file name in `chunks/`.
pub const CACHE_FILE: &str = "remote-cache";
use std::path::Path;
use std::sync::Arc;

/// The shared state of remote pack reads: the extent cache in
/// `chunks/remote-cache`, emptied.
pub(crate) fn remote_reads(
    storage: &dyn Storage,
    dir: &Path,
    opts: &RemoteOptions,
) -> Result<Arc<RemoteReads>> {
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
pub(crate) fn attach(
    storage: &dyn Storage,
    dir: &Path,
    store_id: u64,
    opts: Option<&RemoteOptions>,
    kept: impl Fn(u32) -> bool,
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

impl ChunkStore {
    /// Queues the sealed packs of `catalog` and those the open found
    /// closed but not sealed, then starts the uploader threads.
    /// `local` lists the packs with a local file.
    pub(crate) fn start_remote(
        &mut self,
        opts: &RemoteOptions,
        catalog: Catalog,
        reads: Arc<RemoteReads>,
        local: &[u32],
    ) -> Result<()> {
        let listed: Vec<(u32, PackPhase, u32)> =
            catalog.packs.iter().map(|(&id, p)| (id, p.phase, p.slots)).collect();
        let r = Arc::new(Remote::new(
            self.storage.clone(),
            self.dir.clone(),
            opts,
            catalog,
            self.files.clone(),
            reads,
        ));
        {
            let w = lock(&self.writer);
            let files = self.read_files();
            for (id, phase, slots) in listed {
                let (Some(p), Some(file)) = (w.packs.get(&id), files.get(&id)) else { continue };
                match phase {
                    PackPhase::Sealed => {
                        r.requeue(UploadJob { id, slots, file: file.clone(), live: p.live_bits.clone() })
                    }
                    PackPhase::Uploaded if local.binary_search(&id).is_ok() => {
                        r.note_local_uploaded(id, crate::chunk::pack::slot_offset(slots))
                    }
                    PackPhase::Uploaded | PackPhase::Foreign => {}
                }
            }
        }
        self.remote = Some(r.clone());
        self.seal_durable(0)?;
        if let Err(e) = r.evict() {
            tracing::warn!(error = %e, "deleting local copies of uploaded packs failed; retried after the next upload");
        }
        r.start(opts.upload_threads)
    }
}
