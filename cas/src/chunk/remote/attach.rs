//! Opening a chunk store with a remote: the catalog read and checked (or,
//! on the first open with a remote, a host slot claimed and a catalog
//! written), then the uploads of sealed packs started again.

use super::catalog::{Catalog, PackPhase, CATALOG_FILE};
use super::{host_slot, Remote, RemoteOptions, UploadJob};
use crate::chunk::{lock, ChunkStore, PackState};
use crate::error::{Error, Result};
use crate::storage::Storage;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Host slot claims tried before the open fails.
const CLAIM_ROUNDS: u32 = 8;

/// The store's catalog at open, if it has one or `opts` asks for a remote:
/// checked against the store, and without the sealed packs the open
/// deleted (no live slot left: nothing to upload).
pub(crate) fn attach(
    storage: &dyn Storage,
    dir: &Path,
    store_id: u64,
    opts: Option<&RemoteOptions>,
    packs: &BTreeMap<u32, PackState>,
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
            c.packs.retain(|id, p| p.phase == PackPhase::Uploaded || packs.contains_key(id));
            if c.packs.len() != before {
                c.write(storage, dir)?;
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
    pub(crate) fn start_remote(&mut self, opts: &RemoteOptions, catalog: Catalog) -> Result<()> {
        let sealed: Vec<(u32, u32)> = catalog
            .packs
            .iter()
            .filter(|(_, p)| p.phase == PackPhase::Sealed)
            .map(|(&id, p)| (id, p.slots))
            .collect();
        let r = Arc::new(Remote::new(self.storage.clone(), self.dir.clone(), opts, catalog));
        {
            let w = lock(&self.writer);
            let files = self.read_files();
            for (id, slots) in sealed {
                if let (Some(p), Some(file)) = (w.packs.get(&id), files.get(&id)) {
                    r.requeue(UploadJob { id, slots, file: file.clone(), live: p.live_bits.clone() });
                }
            }
        }
        self.remote = Some(r.clone());
        self.seal_durable(0)?;
        r.start(opts.upload_threads)
    }
}
