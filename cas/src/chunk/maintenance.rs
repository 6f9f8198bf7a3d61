//! The chunk store's side of GC: epochs, marking, sweeping index entries,
//! repacking a pack's live chunks, and deleting emptied packs.
//!
//! crate::gc sequences these; each step is crash-safe on its own:
//! - mark only stamps in-memory epochs (nothing on disk changes);
//! - sweep removes index entries and queues journal removes; until a sync
//!   makes them durable a crash simply brings the entries back;
//! - repack copies live chunks into the active pack and queues journal
//!   puts with their new locations; until a sync makes both the copies and
//!   the puts durable, a crash leaves the index on the old pack;
//! - a pack is deleted only after a sync has made every change that moved
//!   or removed its entries durable, so no durable entry ever points at a
//!   deleted pack; a deletion lost in a crash leaves an unreferenced pack
//!   that the next open deletes.
//!
//! Locks: every step changes the index under the writer lock, one shard at
//! a time; a shard is write-locked only for the entries it changes (the
//! sweep finds them under the read lock), so readers of other shards never
//! wait and readers of that shard wait O(entries changed).

use super::forward::Move;
use super::index::{self, Key, Loc, SHARDS};
use super::journal::JournalOp;
use super::pack::{self, CHUNK_BYTES};
use super::{lock, ChunkStore, ChunkTag};
use crate::error::{Error, Result};
use crate::format;
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
}

impl ChunkStore {
    /// Starts a GC epoch: see pin.rs. Returns the new epoch.
    pub(crate) fn gc_advance_epoch(&self, wait: Duration) -> Result<u32> {
        self.pins.advance(wait)
    }

    /// Stamps the chunks `tags` name live in `epoch`; returns how many are
    /// not stored.
    /// Under the writer lock like every index change (a shard growth copies
    /// the shard and must not miss a stamp).
    pub(crate) fn gc_mark(&self, epoch: u32, tags: &[ChunkTag]) -> u64 {
        let mut w = lock(&self.writer);
        let mut missing = 0;
        for tag in tags {
            let key = Key::of_tag(tag);
            match self.index.write(&mut w, index::shard_of(&key)).get_mut(&key) {
                Some(loc) => loc.epoch = loc.epoch.max(epoch),
                None => missing += 1,
            }
        }
        missing
    }

    /// Removes every entry not stamped with `epoch` (neither marked nor
    /// touched under a pin of this epoch). The removes become durable with
    /// the next sync.
    ///
    /// One shard at a time: under the writer lock (no entry changes), the
    /// dead entries are found under the shard's read lock, then removed
    /// under its write lock.
    pub(crate) fn gc_sweep(&self, epoch: u32) -> Result<SweepCounts> {
        self.check_poison()?;
        let mut counts = SweepCounts::default();
        let mut dead: Vec<(Key, Loc)> = Vec::new();
        for s in 0..SHARDS {
            dead.clear();
            let mut guard = lock(&self.writer);
            let w = &mut *guard;
            {
                let shard = self.index.read(s);
                counts.scanned += shard.len() as u64;
                dead.extend(shard.iter().filter(|(_, l)| l.epoch < epoch).map(|(k, l)| (*k, *l)));
            }
            if dead.is_empty() {
                continue;
            }
            let mut shard = self.index.write(w, s);
            for (key, _) in &dead {
                shard.remove(key);
            }
            drop(shard);
            for (key, loc) in &dead {
                w.packs.get_mut(&loc.pack).expect("entry's pack is open").live -= 1;
                w.pending.push(JournalOp::Remove { hash: key.0 });
            }
            w.seq += dead.len() as u64;
            counts.removed += dead.len() as u64;
            drop(guard);
            for (key, _) in &dead {
                self.cache.remove(key);
            }
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
            })
            .collect()
    }

    /// Copies the live chunks of pack `id` (not the active pack) into the
    /// active pack and points their index entries at the copies. Durable
    /// after the next sync; the old pack is then deleted by `gc_delete_pack`.
    pub(crate) fn gc_repack(&self, id: u32) -> Result<RepackCounts> {
        self.check_poison()?;
        if lock(&self.writer).active.as_ref().is_some_and(|a| a.id == id) {
            return Err(Error::InvalidArgument(format!("pack {id} is the active pack")));
        }
        let Some(file) = self.read_files().get(&id).cloned() else {
            return Err(Error::NotFound(format!("pack {id}")));
        };
        let mut live: Vec<(Key, Loc)> = Vec::new();
        self.index.for_each(|k, l| {
            if l.pack == id {
                live.push((*k, *l));
            }
        });
        live.sort_unstable_by_key(|(_, l)| l.slot);
        let mut counts = RepackCounts::default();
        let mut buf = Vec::new();
        let mut start = 0;
        while start < live.len() {
            // A run of slots read with one pread: consecutive live slots.
            let mut end = start + 1;
            while end < live.len()
                && end - start < REPACK_READ_SLOTS
                && live[end].1.slot == live[end - 1].1.slot + 1
            {
                end += 1;
            }
            let run = &live[start..end];
            buf.resize(run.len() * CHUNK_BYTES, 0);
            let offset = pack::slot_offset(run[0].1.slot);
            file.read_exact_at(&mut buf, offset)?;
            for (j, (_, loc)) in run.iter().enumerate() {
                let data = &buf[j * CHUNK_BYTES..(j + 1) * CHUNK_BYTES];
                let actual = format::crc32c(data);
                if actual != loc.crc {
                    return Err(Error::ChecksumMismatch {
                        path: file.path().to_path_buf(),
                        offset: offset + (j * CHUNK_BYTES) as u64,
                        expected: loc.crc,
                        actual,
                    });
                }
            }
            let mut guard = lock(&self.writer);
            let w = &mut *guard;
            let placed = self.write_chunks(w, buf.chunks_exact(CHUNK_BYTES), &mut counts.bytes_written)?;
            for ((key, old), p) in run.iter().zip(&placed) {
                {
                    let mut shard = self.index.write(w, index::shard_of(key));
                    let Some(loc) = shard.get_mut(key) else { continue };
                    if loc.pack != id || loc.slot != old.slot {
                        continue;
                    }
                    loc.pack = p.pack;
                    loc.slot = p.slot;
                }
                w.packs.get_mut(&id).expect("repacked pack is open").live -= 1;
                w.packs.get_mut(&p.pack).expect("placed in an open pack").live += 1;
                w.pending.push(JournalOp::Put { hash: key.0, pack: p.pack, slot: p.slot, crc: p.crc });
                w.seq += 1;
                counts.moved += 1;
                counts.moves.push(Move { slot: old.slot, to_pack: p.pack, to_slot: p.slot });
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
            if w.active.as_ref().is_some_and(|a| a.id == id) {
                return Err(Error::InvalidArgument(format!("pack {id} is the active pack")));
            }
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
