//! The append path: `insert_missing`, pack rotation, and `sync`.
//!
//! Ordering rules (why the index never points at lost bytes):
//! 1. chunk bytes are written to a pack (one pwrite per run of up to
//!    `RUN_CHUNKS`), then published in the in-memory index and queued as
//!    journal puts, all under the writer lock (each entry under its shard's
//!    write lock, held for that one insert);
//! 2. `sync` syncs every pack written since the last sync, then the store
//!    directory if a pack was created, then appends and syncs one journal
//!    batch with the queued changes. Only then are they durable.
//!
//! Syncs are serialised and sequence-numbered: a `sync` returns once every
//! index change made before it was called is durable, including changes
//! another caller queued (so a chunk found as a duplicate is durable when
//! the finder's `sync` returns).
//!
//! Index growth (`reserve`): a shard that lacks room for the entries about
//! to be published is copied into a table of the grown capacity while its
//! readers keep reading (only the read lock is held; every other change
//! needs the writer lock, which the grower holds), then the copy is
//! swapped in under the write lock, an O(1) hold. The old table is freed
//! after the lock is released. The budget is checked, for every shard
//! that must grow, before anything is allocated.

use super::index::{self, Key, Loc, PrefixBuild, SHARDS};
use super::journal::{self, JournalOp};
use super::pack::{self, PackHeader, CHUNK_BYTES, PACK_HEADER_BYTES};
use super::{
    lock, ActivePack, ChunkHash, ChunkLoc, ChunkPin, ChunkRef, ChunkStore, GrowthPhase, InsertStats,
    PackState, Writer,
};
use crate::error::{Error, Result};
use crate::format;
use crate::storage::OpenMode;
use std::collections::hash_map::{Entry, HashMap};

/// Chunks per pwrite (4 MiB): bounds the run buffer.
pub(crate) const RUN_CHUNKS: usize = 1024;

impl ChunkStore {
    /// Stores every chunk of `chunks` that is not stored yet, exactly once
    /// across concurrent callers, and returns what it did. Each entry is
    /// `(blake3 hash, 4096 bytes)`; all-zero blocks are refused (they are
    /// holes). Chunks are readable at once and durable after [`sync`].
    ///
    /// `pin` (from [`ChunkStore::pin`]) must stay alive until the manifest
    /// commit that references these chunks returns: it keeps a concurrent
    /// GC from sweeping them, including chunks that were already stored.
    ///
    /// Fails with `Error::MemoryBudget`, before writing anything, when the
    /// index would grow past its budget; on an I/O error the chunks of
    /// earlier runs of this call are written but never published (their
    /// slots are dead).
    ///
    /// [`sync`]: ChunkStore::sync
    pub fn insert_missing(&self, pin: &ChunkPin<'_>, chunks: &[(ChunkHash, &[u8])]) -> Result<InsertStats> {
        self.insert_located(pin, chunks, &mut Vec::new())
    }

    /// [`ChunkStore::insert_missing`] that also says where each chunk is:
    /// `refs` gets one located [`ChunkRef`] per entry of `chunks`, in
    /// order (the stored copy for a duplicate), for the manifest leaves
    /// that will name them. Left empty on an error.
    pub fn insert_located(
        &self,
        pin: &ChunkPin<'_>,
        chunks: &[(ChunkHash, &[u8])],
        refs: &mut Vec<ChunkRef>,
    ) -> Result<InsertStats> {
        refs.clear();
        assert!(std::ptr::eq(pin.pins, &self.pins), "a pin from another chunk store");
        for (i, (_, data)) in chunks.iter().enumerate() {
            if data.len() != CHUNK_BYTES {
                return Err(Error::InvalidArgument(format!(
                    "chunk {i} is {} bytes, chunks are {CHUNK_BYTES}",
                    data.len()
                )));
            }
            if super::is_zero_block(data) {
                return Err(Error::InvalidArgument(format!(
                    "chunk {i} is all zeros: zero blocks are holes, not chunks"
                )));
            }
        }
        self.check_poison()?;
        let mut guard = lock(&self.writer);
        let w = &mut *guard;
        let mut stats = InsertStats::default();

        // Classify (the writer lock keeps the index still): stored,
        // repeated in this call, missing.
        let mut missing: Vec<usize> = Vec::new();
        let mut locs: Vec<Option<ChunkLoc>> = vec![None; chunks.len()];
        // Repeats of a missing chunk: (entry, its first occurrence).
        let mut repeats: Vec<(usize, usize)> = Vec::new();
        let mut seen: HashMap<Key, usize, PrefixBuild> = HashMap::default();
        for (i, (hash, _)) in chunks.iter().enumerate() {
            let key = Key(*hash);
            match self.index.get(&key) {
                Some(loc) => {
                    stats.dup_chunks += 1;
                    locs[i] = Some(loc.at());
                    if loc.epoch < pin.epoch {
                        let mut shard = self.index.write(w, index::shard_of(&key));
                        let loc = shard.get_mut(&key).expect("the writer lock keeps entries");
                        loc.epoch = loc.epoch.max(pin.epoch);
                    }
                }
                None => match seen.entry(key) {
                    Entry::Vacant(v) => {
                        v.insert(i);
                        missing.push(i);
                    }
                    Entry::Occupied(o) => {
                        stats.dup_chunks += 1;
                        repeats.push((i, *o.get()));
                    }
                },
            }
        }
        if !missing.is_empty() {
            self.reserve(w, missing.iter().map(|&i| Key(chunks[i].0)))?;
            let placed =
                self.write_chunks(w, missing.iter().map(|&i| chunks[i].1), &mut stats.bytes_written)?;
            for (&i, p) in missing.iter().zip(&placed) {
                let key = Key(chunks[i].0);
                let loc = Loc { pack: p.pack, slot: p.slot, crc: p.crc, epoch: pin.epoch };
                // `reserve` made room: this insert never resizes under the lock.
                self.index.write(w, index::shard_of(&key)).insert(key, loc);
                w.packs.get_mut(&p.pack).expect("placed in an open pack").live += 1;
                w.pending.push(JournalOp::Put { hash: key.0, pack: p.pack, slot: p.slot, crc: p.crc });
                locs[i] = Some(*p);
            }
            w.seq += placed.len() as u64;
            stats.new_chunks = placed.len() as u64;
        }
        for (i, first) in repeats {
            locs[i] = locs[first];
        }
        refs.extend(chunks.iter().zip(locs).map(|((hash, _), at)| {
            debug_assert!(at.is_some(), "every chunk is stored or placed");
            ChunkRef { tag: hash.tag(), at }
        }));
        Ok(stats)
    }

    /// Makes room in the index for `keys` (distinct and not stored): grows
    /// each shard that lacks room (see the module docs), or refuses with
    /// `MemoryBudget`, before allocating anything, if the grown tables and
    /// the queued journal ops would exceed the budget.
    fn reserve(&self, w: &mut Writer, keys: impl ExactSizeIterator<Item = Key>) -> Result<()> {
        let more = keys.len();
        let mut adds = [0usize; SHARDS];
        for key in keys {
            adds[index::shard_of(&key)] += 1;
        }
        let mut grow: Vec<(usize, usize)> = Vec::new();
        let mut total = Self::memory_bytes(w, more);
        for (s, &add) in adds.iter().enumerate().filter(|(_, &a)| a > 0) {
            let (len, capacity) = {
                let shard = self.index.read(s);
                (shard.len(), shard.capacity())
            };
            // capacity = entries + free slots (hashbrown's growth_left).
            if capacity - len < add {
                let grown = index::grown_capacity(capacity, len + add);
                total = total - w.table_bytes[s] + index::table_bytes(grown);
                grow.push((s, grown));
            }
        }
        let budget = self.index_budget_bytes();
        if total > budget {
            return Err(Error::MemoryBudget(format!(
                "the chunk index would grow to {total} bytes for {more} more chunks, over its budget of {budget} bytes"
            )));
        }
        for (s, capacity) in grow {
            self.grow_shard(w, s, capacity)?;
        }
        Ok(())
    }

    /// Replaces shard `s` with a copy of room `capacity`. The copy is made
    /// under the shard's read lock (readers continue; nothing else can
    /// change the shard, since that needs the writer lock `w` proves), the
    /// swap under its write lock, and the old table is freed after.
    fn grow_shard(&self, w: &mut Writer, s: usize, capacity: usize) -> Result<()> {
        let grown = {
            let shard = self.index.read(s);
            let mut grown = index::IndexMap::default();
            grown
                .try_reserve(capacity)
                .map_err(|e| Error::MemoryBudget(format!("chunk index growth refused: {e}")))?;
            grown.extend(shard.iter().map(|(k, l)| (*k, *l)));
            self.growth_hook(s, GrowthPhase::Copying);
            grown
        };
        // Until the swap nothing can change the shard: that needs `w`.
        self.growth_hook(s, GrowthPhase::Copied);
        let bytes = index::table_bytes(grown.capacity());
        let old = std::mem::replace(&mut *self.index.write(w, s), grown);
        drop(old);
        w.table_bytes_total = w.table_bytes_total - w.table_bytes[s] + bytes;
        w.table_bytes[s] = bytes;
        Ok(())
    }

    /// Appends `datas` to the active pack(s), one pwrite per run, and
    /// returns where each went (with its crc32c). Nothing is published to the index; if a run
    /// fails, the slots of earlier runs are left dead.
    pub(crate) fn write_chunks<'d>(
        &self,
        w: &mut Writer,
        datas: impl ExactSizeIterator<Item = &'d [u8]>,
        bytes_written: &mut u64,
    ) -> Result<Vec<ChunkLoc>> {
        let mut datas = datas.peekable();
        let mut placed = Vec::with_capacity(datas.len());
        while datas.peek().is_some() {
            let (id, file, first_slot, room) = self.active_pack(w, bytes_written)?;
            let n = room.min(RUN_CHUNKS).min(datas.len());
            w.buf.clear();
            for (j, data) in datas.by_ref().take(n).enumerate() {
                w.buf.extend_from_slice(data);
                let crc = format::crc32c(data);
                placed.push(ChunkLoc { pack: id, slot: first_slot + j as u32, crc });
            }
            if let Err(e) = file.write_all_at(&w.buf, pack::slot_offset(first_slot)) {
                placed.truncate(placed.len() - n);
                self.note_slots(w);
                return Err(e);
            }
            let active = w.active.as_mut().expect("active pack");
            active.next_slot += n as u32;
            w.dirty.insert(id, file);
            *bytes_written += (n * CHUNK_BYTES) as u64;
        }
        self.note_slots(w);
        Ok(placed)
    }

    /// Records the active pack's high-water slot in its counts.
    fn note_slots(&self, w: &mut Writer) {
        if let Some(a) = &w.active {
            if let Some(p) = w.packs.get_mut(&a.id) {
                p.slots = p.slots.max(a.next_slot);
            }
        }
    }

    /// The active pack with room (creating one if needed): id, file, next
    /// slot and free slots.
    fn active_pack(
        &self,
        w: &mut Writer,
        bytes_written: &mut u64,
    ) -> Result<(u32, std::sync::Arc<dyn crate::storage::StorageFile>, u32, usize)> {
        if let Some(a) = &w.active {
            if a.next_slot < a.capacity {
                return Ok((a.id, a.file.clone(), a.next_slot, (a.capacity - a.next_slot) as usize));
            }
        }
        self.note_slots(w);
        let id = w.next_pack_id;
        w.next_pack_id = id.checked_add(1).expect("pack id space exhausted");
        // Durable with the first chunks placed in the pack (journal.rs).
        w.pending.push(JournalOp::NextPack { id: w.next_pack_id });
        w.seq += 1;
        let path = self.dir.join(pack::pack_file_name(id));
        let file = self.storage.open(&path, OpenMode::CreateNew)?;
        let header = PackHeader { store_id: self.store_id, pack_id: id, capacity_slots: self.slots_per_pack };
        if let Err(e) = file.write_all_at(&header.encode(), 0) {
            // Unreferenced, so a later open deletes it if this fails too.
            let _ = self.storage.remove_file(&path);
            return Err(e);
        }
        *bytes_written += PACK_HEADER_BYTES;
        w.dir_dirty = true;
        w.dirty.insert(id, file.clone());
        w.packs.insert(id, PackState { slots: 0, capacity: self.slots_per_pack, live: 0 });
        self.write_files().insert(id, file.clone());
        w.active = Some(ActivePack { id, file: file.clone(), next_slot: 0, capacity: self.slots_per_pack });
        Ok((id, file, 0, self.slots_per_pack as usize))
    }

    /// Makes every chunk inserted (and every index change made) before this
    /// call durable: syncs the packs written since the last sync, the
    /// directory if a pack was created, then appends and syncs one journal
    /// batch. A failure poisons the store (see the module docs).
    pub fn sync(&self) -> Result<()> {
        let target = lock(&self.writer).seq;
        let mut s = lock(&self.sync_state);
        if s.durable_seq >= target {
            return Ok(());
        }
        self.check_poison()?;
        let (ops, upto, dirty, dir_dirty) = {
            let mut w = lock(&self.writer);
            let ops = std::mem::take(&mut w.pending);
            (ops, w.seq, std::mem::take(&mut w.dirty), std::mem::take(&mut w.dir_dirty))
        };
        let result = (|| {
            self.sync_packs(&dirty, dir_dirty)?;
            self.count_syncs(u64::from(!ops.is_empty()));
            s.journal.append(&ops)
        })();
        if let Err(e) = result {
            self.poison(&e);
            return Err(e);
        }
        s.durable_seq = upto;
        let live = self.len();
        if s.journal.len_bytes() > self.checkpoint_min_bytes.max(2 * journal::live_bytes(live)) {
            self.checkpoint(&mut s)?;
        }
        Ok(())
    }

    /// Syncs the packs written since the last sync, then the directory if
    /// a pack was created in it.
    fn sync_packs(
        &self,
        dirty: &std::collections::BTreeMap<u32, std::sync::Arc<dyn crate::storage::StorageFile>>,
        dir_dirty: bool,
    ) -> Result<()> {
        for file in dirty.values() {
            self.count_syncs(1);
            file.sync_data()?;
        }
        if dir_dirty {
            self.count_syncs(1);
            self.storage.sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Rewrites the journal as exactly the current index (all of it made
    /// durable first). Skipped when the snapshot would break the budget.
    /// Returns whether the journal was rewritten (false: skipped, or the
    /// rewrite failed and the queued changes went to the old journal).
    pub(crate) fn checkpoint(&self, s: &mut super::SyncState) -> Result<bool> {
        let (snapshot, ops, upto, dirty, dir_dirty) = {
            // The writer lock keeps the index still while it is copied.
            let mut w = lock(&self.writer);
            let snapshot_bytes = self.len() * std::mem::size_of::<JournalOp>() as u64;
            if w.table_bytes_total + snapshot_bytes > self.index_budget_bytes() {
                tracing::warn!(
                    snapshot_bytes,
                    "chunk index checkpoint skipped: it would exceed the memory budget"
                );
                return Ok(false);
            }
            let mut snapshot: Vec<JournalOp> = vec![JournalOp::NextPack { id: w.next_pack_id }];
            self.index.for_each(|k, l| {
                snapshot.push(JournalOp::Put { hash: k.0, pack: l.pack, slot: l.slot, crc: l.crc })
            });
            let ops = std::mem::take(&mut w.pending);
            (snapshot, ops, w.seq, std::mem::take(&mut w.dirty), std::mem::take(&mut w.dir_dirty))
        };
        if let Err(e) = self.sync_packs(&dirty, dir_dirty) {
            self.poison(&e);
            return Err(e);
        }
        // The rewrite syncs the new file and the directory.
        self.count_syncs(2);
        let before = s.journal.len_bytes();
        match s.journal.rewrite(self.storage.as_ref(), &self.dir, &snapshot) {
            Ok(()) => {
                tracing::debug!(before, after = s.journal.len_bytes(), "chunk index checkpointed");
                s.durable_seq = upto;
                return Ok(true);
            }
            Err(failure) if failure.old_journal_intact => {
                // Keep the queued changes in the old journal instead.
                tracing::warn!(error = %failure.error, "chunk index checkpoint failed; appending instead");
                self.count_syncs(u64::from(!ops.is_empty()));
                if let Err(e) = s.journal.append(&ops) {
                    self.poison(&e);
                    return Err(e);
                }
            }
            Err(failure) => {
                self.poison(&failure.error);
                return Err(failure.error);
            }
        }
        s.durable_seq = upto;
        Ok(false)
    }
}
