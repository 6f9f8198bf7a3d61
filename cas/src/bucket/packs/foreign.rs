//! Other stores' packs in this store: adopted (a catalog entry, durable
//! first, and a remote handle) when a fetched manifest names them or when
//! the import finds their slot indexes in the bucket, and then entered in
//! the dedup index, so a chunk another store uploaded is not stored again
//! here (cross-host dedup).
//!
//! The chunk store enters each live slot of a foreign pack's slot index
//! in its dedup index (`ChunkStore::index_foreign`, chunk/foreign.rs). A
//! crash after the catalog entry and before the journal records leaves a
//! foreign pack without entries; the next import enters them (it indexes
//! every foreign pack that has no live bits).
//!
//! **Listing.** An import LISTs `packidx/` only after the last key the
//! previous one saw; every [`FULL_SCAN_EVERY`]th import LISTs it all. A
//! slot index that lands below that key (an upload finishing out of
//! order, a store on a lower host slot) is found by the next full scan:
//! its dedup comes later, nothing is lost.

use super::packidx::PackIndex;
use super::PackTier;
use crate::chunk::{ChunkStore, ForeignImport, ForeignSlots};
use crate::error::Result;
use crate::objects::list_after;
use crate::sync::lock;

/// Imports between two listings of the whole of `packidx/` (with the
/// publish thread's import every 10 s: every 100 s).
pub const FULL_SCAN_EVERY: u64 = 10;

/// Where the next import's listing starts.
#[derive(Default)]
pub(crate) struct ImportScan {
    /// The last key listed (None: list everything).
    after: Option<String>,
    imports: u64,
}

/// The slots of `indexes`, as the chunk store enters them.
fn slots_of(indexes: &[PackIndex]) -> Vec<ForeignSlots<'_>> {
    indexes.iter().map(|i| ForeignSlots { pack: i.pack, slots: &i.slots }).collect()
}

impl PackTier {
    /// Makes other stores' packs readable in `chunks` and their chunks
    /// findable by its dedup index (see the module docs). Needs a sync to
    /// be durable.
    pub fn adopt_foreign(&self, chunks: &ChunkStore, packs: &[u32]) -> Result<ForeignImport> {
        let indexes = self.adopt_packs(packs)?;
        Ok(chunks.index_foreign(&slots_of(&indexes)))
    }

    /// Cross-host dedup: adopts every pack of another store whose slot
    /// index is in the bucket, enters the chunks of those not indexed
    /// yet, and syncs (when it entered any). The publish thread runs it
    /// every fifth round.
    pub fn import_foreign(&self, chunks: &ChunkStore) -> Result<ForeignImport> {
        let slot = self.host_slot();
        let after = {
            let scan = lock(&self.import_scan);
            if scan.imports.is_multiple_of(FULL_SCAN_EVERY) {
                None
            } else {
                scan.after.clone()
            }
        };
        let keys = list_after(self.objects.as_ref(), "packidx/", after)?;
        let mut new = Vec::new();
        for key in &keys {
            let Some(id) = key.strip_prefix("packidx/").and_then(|h| u32::from_str_radix(h, 16).ok()) else {
                continue;
            };
            if !super::catalog::owns(slot, id)
                && !crate::chunk::pack_id::before_tier(id)
                && self.phase(id).is_none()
            {
                new.push(id);
            }
        }
        let mut report = self.adopt_foreign(chunks, &new)?;
        {
            // Only once what it listed is adopted: a failed import lists it again.
            let mut scan = lock(&self.import_scan);
            scan.imports += 1;
            if let Some(last) = keys.last() {
                scan.after = Some(last.clone());
            }
        }
        // Adopted before a crash cut their entries off: enter them now.
        let unindexed: Vec<u32> = self.foreign_ids().into_iter().filter(|&id| !chunks.has_pack(id)).collect();
        let mut indexes = Vec::with_capacity(unindexed.len());
        for id in unindexed {
            indexes.push(self.pack_index(id)?);
        }
        let more = chunks.index_foreign(&slots_of(&indexes));
        report.packs += more.packs;
        report.entries += more.entries;
        report.known += more.known;
        if report.entries > 0 {
            chunks.sync()?;
        }
        Ok(report)
    }
}
