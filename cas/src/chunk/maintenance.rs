//! The chunk store's side of GC: epochs, marking, sweeping slots,
//! repacking a pack's live chunks, and deleting emptied packs.
//!
//! GC works on slots, not on index entries: mark sets the keep bit of each
//! slot a manifest leaf leads to, sweep frees the live slots not kept, and
//! repack moves a pack's live slots. Index entries are never removed; an
//! entry whose slot is freed or whose pack is gone is stale (dedup/).
//!
//! crate::gc sequences these; each step is crash-safe on its own:
//! - the epoch bump clears the keep bits and mark sets them (in memory:
//!   nothing on disk changes);
//! - sweep clears live bits and queues journal frees; until a sync makes
//!   them durable a crash simply brings the slots back;
//! - repack copies live chunks into the active pack and queues journal
//!   puts with their new locations and frees of the old slots; until a
//!   sync makes both the copies and the records durable, a crash leaves the
//!   chunks live in the old pack;
//! - a pack is deleted only after a sync has made every change that freed
//!   its slots durable; a deletion lost in a crash leaves a pack with no
//!   live slot, which the next open deletes.
//!
//! Locks: every step changes bits under the writer lock, a bounded batch at
//! a time; the index is only read (and, by repack, appended to).

use super::forward::Move;
use super::journal::JournalOp;
use super::pack::{self, CHUNK_BYTES};
use super::{lock, ChunkHash, ChunkLoc, ChunkRef, ChunkStore};
use crate::dedup::run;
use crate::error::{Error, Result};
use crate::format;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Slots read per pread while repacking (1 MiB).
const REPACK_READ_SLOTS: usize = 256;

/// One pack as GC sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackUsage {
    pub id: u32,
    /// Slots the file spans.
    pub slots: u32,
    pub live: u32,
    pub capacity: u32,
    /// The pack new chunks are appended to (never repacked).
    pub active: bool,
    /// Sealed for upload, or uploaded (seal.rs, tier.rs): its bytes are
    /// frozen, so it is never repacked or deleted.
    pub sealed: bool,
}

impl PackUsage {
    /// Dead slots over spanned slots (0 for an empty pack).
    pub fn dead_fraction(&self) -> f64 {
        if self.slots == 0 {
            0.0
        } else {
            f64::from(self.slots - self.live) / f64::from(self.slots)
        }
    }

    pub fn file_bytes(&self) -> u64 {
        pack::slot_offset(self.slots)
    }
}

/// Refuses to move or delete the active pack or a sealed one.
fn refuse_frozen(w: &super::Writer, id: u32) -> Result<()> {
    if w.active.as_ref().is_some_and(|a| a.id == id) {
        return Err(Error::InvalidArgument(format!("pack {id} is the active pack")));
    }
    if w.is_sealed(id) {
        return Err(Error::InvalidArgument(format!("pack {id:#010x} is sealed for upload")));
    }
    Ok(())
}

/// What a sweep did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SweepCounts {
    pub scanned: u64,
    pub removed: u64,
}

/// What a repack did.
#[derive(Clone, Debug, Default)]
pub(crate) struct RepackCounts {
    pub moved: u64,
    pub bytes_written: u64,
    /// Where each moved chunk went: the pack's forward table.
    pub moves: Vec<Move>,
    /// Chunks moved by their content alone (no entry named their slot).
    pub adopted: u64,
}

impl ChunkStore {
    /// Starts a GC epoch (see pin.rs): clears every keep bit, then bumps
    /// the epoch and waits for the previous epoch's pins. Bits set between
    /// the two only keep more. Returns the new epoch.
    pub(crate) fn gc_advance_epoch(&self, wait: Duration) -> Result<u32> {
        {
            let mut w = lock(&self.writer);
            for p in w.packs.values_mut() {
                p.keep_bits.clear_all();
            }
        }
        self.pins.advance(wait)
    }

    /// Keeps the slots `refs` lead to (a located ref: its slot, or where
    /// forward tables send it; otherwise the index's entry for its tag).
    /// Returns how many lead to no live slot.
    pub(crate) fn gc_mark(&self, _epoch: u32, refs: &[ChunkRef]) -> Result<u64> {
        // Other stores' chunks (fetched images): nothing here to keep.
        let foreign = self.foreign_packs();
        let mut guard = lock(&self.writer);
        let w = &mut *guard;
        let mut missing = 0;
        for r in refs {
            if r.at.is_some_and(|at| foreign.contains(&at.pack)) {
                continue;
            }
            let direct = r.at.and_then(|at| {
                if w.packs.contains_key(&at.pack) {
                    Some(at)
                } else {
                    self.forward_target(at, |p| w.packs.contains_key(&p))
                }
            });
            let at = match direct.filter(|&at| w.is_live(at)) {
                Some(at) => Some(at),
                None => {
                    self.read_index_lookups.fetch_add(1, Ordering::Relaxed);
                    let live = |at: ChunkLoc| w.is_live(at);
                    self.read_index().find(&r.tag, &live)?.map(|e| e.at)
                }
            };
            match at {
                Some(at) => w.keep(at),
                None => missing += 1,
            }
        }
        Ok(missing)
    }

    /// Frees every live slot not kept in this pass (neither marked nor
    /// touched under a pin of this epoch). The frees become durable with
    /// the next sync. One pack per writer lock hold.
    pub(crate) fn gc_sweep(&self, _epoch: u32) -> Result<SweepCounts> {
        self.check_poison()?;
        let mut counts = SweepCounts::default();
        // Other stores' packs are never swept: their manifests name them.
        let foreign = self.foreign_packs();
        let ids: Vec<u32> =
            lock(&self.writer).packs.keys().copied().filter(|id| !foreign.contains(id)).collect();
        let mut dead: Vec<u32> = Vec::new();
        for id in ids {
            let mut guard = lock(&self.writer);
            let w = &mut *guard;
            let Some(p) = w.packs.get_mut(&id) else { continue };
            counts.scanned += u64::from(p.live);
            dead.clear();
            dead.extend(p.live_bits.and_not(&p.keep_bits));
            for &slot in &dead {
                p.live_bits.clear(slot);
            }
            p.live -= dead.len() as u32;
            w.pending.extend(dead.iter().map(|&slot| JournalOp::Free { pack: id, slot }));
            w.seq += dead.len() as u64;
            counts.removed += dead.len() as u64;
        }
        Ok(counts)
    }

    /// Every pack with its live and spanned slots.
    pub fn pack_usage(&self) -> Vec<PackUsage> {
        let w = lock(&self.writer);
        let active = w.active.as_ref().map(|a| a.id);
        w.packs
            .iter()
            .map(|(&id, p)| PackUsage {
                id,
                slots: p.slots,
                live: p.live,
                capacity: p.capacity,
                active: Some(id) == active,
                sealed: w.is_sealed(id),
            })
            .collect()
    }

    /// Closes the active pack for GC when at least `dead_fraction` of the
    /// slots it spans are dead, so that this pass can repack it like any
    /// other: without it a store smaller than one pack kept every chunk it
    /// ever dropped (a guest's fstrim gave the store nothing back). Every
    /// insert runs under the writer lock, so no write into the pack is in
    /// flight; the next insert starts a new pack. Not with a remote tier,
    /// where a closed pack is sealed for upload and never repacked here.
    /// Returns whether it closed one.
    pub(crate) fn gc_retire_active(&self, dead_fraction: f64) -> bool {
        let mut guard = lock(&self.writer);
        let w = &mut *guard;
        if w.host_slot.is_some() {
            return false;
        }
        self.note_slots(w);
        let Some(id) = w.active.as_ref().map(|a| a.id) else { return false };
        let Some(p) = w.packs.get(&id) else { return false };
        if p.slots == 0 || f64::from(p.slots - p.live) / f64::from(p.slots) < dead_fraction {
            return false;
        }
        w.active = None;
        true
    }

    /// Copies the live chunks of pack `id` (not the active pack) into the
    /// active pack, puts index entries for the copies and frees the old
    /// slots. Each chunk read is hashed and looked up: the entry naming its
    /// slot (whose crc32c must match) is moved with it; a chunk with a live
    /// copy in another pack (stored twice while the summary did not cover
    /// it) is forwarded to that copy; one no entry names (its entry a merge
    /// dropped for a newer copy's) is moved by its content, counted in
    /// `adopted` (damaged bytes would still fail the crc32c of the leaves
    /// that name them). Durable after the next sync; the old pack is then
    /// deleted by `gc_delete_pack`.
    pub(crate) fn gc_repack(&self, id: u32) -> Result<RepackCounts> {
        self.check_poison()?;
        let live: Vec<u32> = {
            let w = lock(&self.writer);
            refuse_frozen(&w, id)?;
            let Some(p) = w.packs.get(&id) else { return Err(Error::NotFound(format!("pack {id}"))) };
            p.live_bits.iter().collect()
        };
        let Some(file) = self.read_files().get(&id).cloned() else {
            return Err(Error::NotFound(format!("pack {id}")));
        };
        let mut counts = RepackCounts::default();
        let mut buf = Vec::new();
        let mut start = 0;
        while start < live.len() {
            // A run of slots read with one pread: consecutive live slots.
            let mut end = start + 1;
            while end < live.len() && end - start < REPACK_READ_SLOTS && live[end] == live[end - 1] + 1 {
                end += 1;
            }
            let slots = &live[start..end];
            buf.resize(slots.len() * CHUNK_BYTES, 0);
            let offset = pack::slot_offset(slots[0]);
            file.read_exact_at(&mut buf, offset)?;
            // What each slot holds: its entry here, or a newer copy elsewhere.
            let mut copy: Vec<(usize, ChunkHash, u32)> = Vec::new();
            let mut elsewhere: Vec<(u32, ChunkLoc)> = Vec::new();
            {
                let w = lock(&self.writer);
                let idx = self.read_index();
                for (j, &slot) in slots.iter().enumerate() {
                    let data = &buf[j * CHUNK_BYTES..(j + 1) * CHUNK_BYTES];
                    let hash = ChunkHash::of(data);
                    let here = |at: ChunkLoc| at.pack == id && at.slot == slot;
                    let entry: Option<run::Entry> = idx.find(&hash.tag(), &here)?;
                    match entry.filter(|e| e.hash == hash) {
                        Some(e) if e.at.crc == format::crc32c(data) => copy.push((j, hash, e.at.crc)),
                        _ => {
                            let other = |at: ChunkLoc| at.pack != id && w.is_live(at);
                            match idx.find(&hash.tag(), &other)?.filter(|e| e.hash == hash) {
                                Some(e) => elsewhere.push((slot, e.at)),
                                // No entry names this slot and no copy is
                                // live elsewhere: a second copy whose entry
                                // a merge dropped for the newer one's (or
                                // damage). Moved by its content; a leaf's
                                // crc32c still catches damaged bytes.
                                None => {
                                    counts.adopted += 1;
                                    copy.push((j, hash, format::crc32c(data)));
                                }
                            }
                        }
                    }
                }
            }
            let mut guard = lock(&self.writer);
            let w = &mut *guard;
            let placed = self.write_chunks(
                w,
                copy.iter().map(|&(j, _, _)| &buf[j * CHUNK_BYTES..(j + 1) * CHUNK_BYTES]),
                &mut counts.bytes_written,
            )?;
            {
                let mut idx = self.write_index(w);
                for (&(_, hash, _), p) in copy.iter().zip(&placed) {
                    idx.put(hash, *p);
                }
            }
            let moves = copy.iter().map(|&(j, _, _)| slots[j]).zip(placed.iter().copied()).chain(elsewhere);
            for (slot, to) in moves {
                let old = w.packs.get_mut(&id).expect("repacked pack is open");
                old.live_bits.clear(slot);
                old.live -= 1;
                w.pending.push(JournalOp::Free { pack: id, slot });
                w.seq += 1;
                counts.moves.push(Move { slot, to_pack: to.pack, to_slot: to.slot });
            }
            for (&(_, hash, _), p) in copy.iter().zip(&placed) {
                let new = w.packs.get_mut(&p.pack).expect("placed in an open pack");
                new.live_bits.set(p.slot);
                new.keep_bits.set(p.slot);
                new.live += 1;
                w.pending.push(JournalOp::Put { hash, pack: p.pack, slot: p.slot, crc: p.crc });
                w.seq += 1;
                counts.moved += 1;
            }
            start = end;
        }
        Ok(counts)
    }

    /// Deletes pack `id`, which must have no live entries: syncs first so
    /// the changes that emptied it are durable, then writes its forward
    /// table if a repack moved chunks out of it (`moves`: leaves still name
    /// the old slots), then unlinks the file and syncs the directory.
    /// Returns the bytes the file spanned.
    ///
    /// The table is written after the sync, so every place it names holds
    /// its chunk durably. A crash between the two leaves the pack with no
    /// index entry and no table: open deletes it, and reads of the leaves
    /// that name it find their chunks through the index (counted) until a
    /// compaction rewrites those blocks.
    pub(crate) fn gc_delete_pack(&self, id: u32, moves: Vec<Move>) -> Result<u64> {
        self.sync()?;
        let deletable = |w: &super::Writer| -> Result<()> {
            refuse_frozen(w, id)?;
            let Some(p) = w.packs.get(&id) else {
                return Err(Error::NotFound(format!("pack {id}")));
            };
            assert_eq!(p.live, 0, "pack {id} still has live chunks and must not be deleted");
            Ok(())
        };
        // Checked before the table is written (a pack that is not deleted
        // keeps no table); it stays true: nothing is added to a pack that
        // is not active.
        deletable(&lock(&self.writer))?;
        if !moves.is_empty() {
            self.write_forward(id, moves)?;
        }
        let bytes = {
            let mut w = lock(&self.writer);
            deletable(&w)?;
            let p = &w.packs[&id];
            let bytes = pack::slot_offset(p.slots);
            w.packs.remove(&id);
            // No entry points into it, so no reader is between its entry
            // and this handle (see the module docs).
            self.write_files().remove(&id);
            bytes
        };
        // Readers holding the handle keep reading the unlinked file.
        self.storage.remove_file(&self.dir.join(pack::pack_file_name(id)))?;
        self.count_syncs(1);
        self.storage.sync_dir(&self.dir)?;
        Ok(bytes)
    }
}
