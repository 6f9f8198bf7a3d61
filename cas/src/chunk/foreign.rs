//! Other stores' packs in the dedup index: the tier adopts them (a
//! durable record and a handle reading the bucket; `crate::bucket`), and
//! the core enters the live slots of their slot indexes here, so a chunk
//! another store uploaded is not stored again (cross-host dedup).
//!
//! Each live slot becomes an index entry (journal `Put`, durable with the
//! next sync) unless the index already has a live entry for that hash.
//! The pack gets live bits like an own pack, but it is never swept,
//! repacked or deleted (`Writer::is_sealed` holds for it, GC skips it):
//! other stores' manifests name it. Past the index's memory budget the
//! summary samples, as for own chunks: dedup is lost, nothing fails.

use super::{lock, ChunkHash, ChunkLoc, ChunkStore, JournalOp, PackState};

/// What entering other stores' packs did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ForeignImport {
    /// Packs adopted or indexed now.
    pub packs: u64,
    /// Index entries added, and slots skipped because the index had the
    /// chunk already.
    pub entries: u64,
    pub known: u64,
}

/// The slots of another store's pack: `(hash, crc32c)` per slot, None for
/// a dead one.
pub struct ForeignSlots<'a> {
    pub pack: u32,
    pub slots: &'a [Option<(ChunkHash, u32)>],
}

impl ChunkStore {
    /// Enters the live slots of `packs` in the dedup index (packs it has
    /// already are skipped). Needs a sync to be durable.
    pub fn index_foreign(&self, packs: &[ForeignSlots<'_>]) -> ForeignImport {
        let mut report = ForeignImport::default();
        let mut guard = lock(&self.writer);
        let w = &mut *guard;
        for pi in packs {
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

    /// True when pack `id` has slots in this store (own, or foreign and
    /// indexed).
    pub fn has_pack(&self, id: u32) -> bool {
        lock(&self.writer).packs.contains_key(&id)
    }
}
