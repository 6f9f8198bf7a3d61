//! Other stores' packs in this store: adopted (a catalog entry, durable
//! first, and a remote handle) when a fetched manifest names them or when
//! the import finds their slot indexes in the bucket, and then entered in
//! the dedup index, so a chunk another store uploaded is not stored again
//! here (cross-host dedup).
//!
//! Each live slot of a foreign pack's slot index becomes an index entry
//! (journal `Put`, durable with the next sync) unless the index already
//! has a live entry for that hash. The pack gets live bits like an own
//! pack, but it is never swept, repacked or deleted (`Writer::is_sealed`
//! holds for it, GC skips it): other stores' manifests name it. A crash
//! after the catalog entry and before the journal records leaves a foreign
//! pack without entries; the next import enters them (it indexes every
//! foreign pack that has no live bits). Past the index's memory budget the
//! summary samples, as for own chunks: dedup is lost, nothing fails.
//!
//! **Listing.** An import LISTs `packidx/` only after the last key the
//! previous one saw; every [`FULL_SCAN_EVERY`]th import LISTs it all. A
//! slot index that lands below that key (an upload finishing out of
//! order, a store on a lower host slot) is found by the next full scan:
//! its dedup comes later, nothing is lost.

use super::packidx::PackIndex;
use crate::chunk::{lock, ChunkLoc, ChunkStore, JournalOp, PackState};
use crate::error::{Error, Result};
use crate::objects::list_after;

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

/// What an import did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ForeignImport {
    /// Packs adopted or indexed now.
    pub packs: u64,
    /// Index entries added, and slots skipped because the index had the
    /// chunk already.
    pub entries: u64,
    pub known: u64,
}

impl ChunkStore {
    /// Makes other stores' packs readable here and their chunks findable
    /// by the dedup index (see the module docs). Needs a sync to be
    /// durable.
    pub fn adopt_foreign(&self, packs: &[u32]) -> Result<ForeignImport> {
        let r =
            self.remote.as_ref().ok_or_else(|| Error::InvalidArgument("the store has no remote".into()))?;
        let indexes = r.adopt_foreign(packs)?;
        Ok(self.index_foreign(&indexes))
    }

    /// Cross-host dedup: adopts every pack of another store whose slot
    /// index is in the bucket, enters the chunks of those not indexed
    /// yet, and syncs (when it entered any). The publish thread runs it
    /// every fifth round.
    pub fn import_foreign(&self) -> Result<ForeignImport> {
        let r =
            self.remote.as_ref().ok_or_else(|| Error::InvalidArgument("the store has no remote".into()))?;
        let slot = r.host_slot();
        let after = {
            let scan = lock(&r.import_scan);
            if scan.imports.is_multiple_of(FULL_SCAN_EVERY) {
                None
            } else {
                scan.after.clone()
            }
        };
        let keys = list_after(r.objects.as_ref(), "packidx/", after)?;
        let mut new = Vec::new();
        for key in &keys {
            let Some(id) = key.strip_prefix("packidx/").and_then(|h| u32::from_str_radix(h, 16).ok()) else {
                continue;
            };
            if id >> super::catalog::SEQ_BITS != 0 && !super::catalog::owns(slot, id) && r.phase(id).is_none()
            {
                new.push(id);
            }
        }
        let mut report = self.adopt_foreign(&new)?;
        {
            // Only once what it listed is adopted: a failed import lists it again.
            let mut scan = lock(&r.import_scan);
            scan.imports += 1;
            if let Some(last) = keys.last() {
                scan.after = Some(last.clone());
            }
        }
        // Adopted before a crash cut their entries off: enter them now.
        let unindexed: Vec<u32> = {
            let w = lock(&self.writer);
            r.foreign().into_iter().filter(|id| !w.packs.contains_key(id)).collect()
        };
        let mut indexes = Vec::with_capacity(unindexed.len());
        for id in unindexed {
            indexes.push(r.pack_index(id)?);
        }
        let more = self.index_foreign(&indexes);
        report.packs += more.packs;
        report.entries += more.entries;
        report.known += more.known;
        if report.entries > 0 {
            self.sync()?;
        }
        Ok(report)
    }

    /// Enters the live slots of `indexes` in the dedup index.
    fn index_foreign(&self, indexes: &[PackIndex]) -> ForeignImport {
        let mut report = ForeignImport::default();
        let mut guard = lock(&self.writer);
        let w = &mut *guard;
        for pi in indexes {
            if w.packs.contains_key(&pi.pack) {
                continue;
            }
            report.packs += 1;
            let slots = u32::try_from(pi.slots.len()).unwrap_or(u32::MAX);
            let mut state = PackState::new(slots, slots, Default::default());
            let mut puts = Vec::new();
            {
                let idx = self.read_index();
                let live = |at: ChunkLoc| w.is_live(at);
                let mut cost = Default::default();
                for (slot, entry) in pi.slots.iter().enumerate() {
                    let Some((hash, crc)) = entry else { continue };
                    if matches!(idx.probe(hash, &live, &mut cost), Ok(Some(_))) {
                        report.known += 1;
                        continue;
                    }
                    puts.push((*hash, ChunkLoc { pack: pi.pack, slot: slot as u32, crc: *crc }));
                }
            }
            {
                let mut idx = self.write_index(w);
                for &(hash, at) in &puts {
                    idx.put(hash, at);
                }
            }
            for &(hash, at) in &puts {
                state.live_bits.set(at.slot);
                state.live += 1;
                w.pending.push(JournalOp::Put { hash, pack: at.pack, slot: at.slot, crc: at.crc });
            }
            w.seq += puts.len() as u64;
            report.entries += puts.len() as u64;
            w.packs.insert(pi.pack, state);
        }
        report
    }
}
