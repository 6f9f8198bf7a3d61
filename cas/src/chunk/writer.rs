//! The append path: `insert_missing`, pack rotation, `sync`, and the
//! index flush.
//!
//! Ordering rules (why the index never points at lost bytes):
//! 1. chunk bytes are written to a pack (one pwrite per run of up to
//!    `RUN_CHUNKS`), then entered in the dedup index's memtable, their
//!    slots' live bits set and journal puts queued, all under the writer
//!    lock;
//! 2. `sync` syncs every pack written since the last sync, then the store
//!    directory if a pack was created, then appends and syncs one journal
//!    batch with the queued changes. Only then are they durable.
//!
//! Syncs are serialised and sequence-numbered: a `sync` returns once every
//! index change made before it was called is durable, including changes
//! another caller queued (so a chunk found as a duplicate is durable when
//! the finder's `sync` returns).
//!
//! A flush (after a sync, once the journal has grown past its threshold)
//! makes the memtable a run: under the writer lock it freezes the memtable
//! (still read), copies the live bits and takes the queued changes; then,
//! holding only the sync lock, it syncs the packs, writes the run (merged
//! with the newest runs, see dedup/), the slots file, the root, and a new
//! empty journal, and finally swaps the run into the index.

use super::journal::JournalOp;
use super::pack::{self, PackHeader, CHUNK_BYTES, PACK_HEADER_BYTES};
use super::{
    lock, ActivePack, ChunkHash, ChunkLoc, ChunkPin, ChunkRef, ChunkStore, InsertStats, PackState, Writer,
};
use crate::dedup::key::{Key, PrefixBuild};
use crate::dedup::root::Root;
use crate::dedup::slots::{self, Bits};
use crate::dedup::{self, ProbeCost};
use crate::error::{Error, Result};
use crate::format;
use crate::storage::OpenMode;
use std::collections::hash_map::{Entry, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Chunks per pwrite (4 MiB): bounds the run buffer.
pub(crate) const RUN_CHUNKS: usize = 1024;

/// Most journal records a flush waits for, however large the store.
const FLUSH_RECORDS_MAX: u64 = 1 << 21;

/// Journal records past which the index of a store of `live` chunks is
/// flushed: what `min_bytes` of journal holds, or 1/32 of the chunks
/// stored (at most `FLUSH_RECORDS_MAX`), whichever is more. Growing with
/// the store keeps the summary's rebuild at each flush (a copy of the
/// whole summary) at about 128 bytes per insert; the memtable holds at
/// most this many entries.
pub(crate) fn flush_records(live: u64, min_bytes: u64) -> u64 {
    (min_bytes / super::journal::RECORD_BYTES as u64).max((live / 32).min(FLUSH_RECORDS_MAX)).max(1)
}

impl ChunkStore {
    /// Stores every chunk of `chunks` that is not stored yet, exactly once
    /// across concurrent callers (as far as the dedup index finds it: see
    /// `ChunkStoreOptions::index_memory_budget_bytes`), and returns what it
    /// did. Each entry is `(blake3 hash, 4096 bytes)`; all-zero blocks are
    /// refused (they are holes). Chunks are readable at once and durable
    /// after [`sync`].
    ///
    /// `pin` (from [`ChunkStore::pin`]) must stay alive until the manifest
    /// commit that references these chunks returns: it keeps a concurrent
    /// GC from sweeping them, including chunks that were already stored.
    ///
    /// On an I/O error the chunks of earlier runs of this call are written
    /// but never entered in the index (their slots are dead).
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

        // Classify (the writer lock keeps the index and the bits still):
        // stored, repeated in this call, missing.
        let mut missing: Vec<usize> = Vec::new();
        let mut locs: Vec<Option<ChunkLoc>> = vec![None; chunks.len()];
        // Repeats of a missing chunk: (entry, its first occurrence).
        let mut repeats: Vec<(usize, usize)> = Vec::new();
        let mut seen: HashMap<Key, usize, PrefixBuild> = HashMap::default();
        let mut cost = ProbeCost::default();
        {
            let idx = self.read_index();
            let live = |at: ChunkLoc| w.is_live(at);
            for (i, (hash, _)) in chunks.iter().enumerate() {
                match idx.probe(hash, &live, &mut cost)? {
                    Some(at) => {
                        stats.dup_chunks += 1;
                        locs[i] = Some(at);
                    }
                    None => match seen.entry(Key(*hash)) {
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
        }
        self.index_page_reads.fetch_add(cost.page_reads, Ordering::Relaxed);
        // Duplicates found are kept by a GC pass running now (pin.rs).
        for at in locs.iter().flatten() {
            w.keep(*at);
        }
        if !missing.is_empty() {
            let placed =
                self.write_chunks(w, missing.iter().map(|&i| chunks[i].1), &mut stats.bytes_written)?;
            {
                let mut idx = self.write_index(w);
                for (&i, p) in missing.iter().zip(&placed) {
                    idx.put(chunks[i].0, *p);
                }
            }
            for (&i, p) in missing.iter().zip(&placed) {
                let pack = w.packs.get_mut(&p.pack).expect("placed in an open pack");
                pack.live_bits.set(p.slot);
                pack.keep_bits.set(p.slot);
                pack.live += 1;
                w.pending.push(JournalOp::Put { hash: chunks[i].0, pack: p.pack, slot: p.slot, crc: p.crc });
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

    /// Appends `datas` to the active pack(s), one pwrite per run, and
    /// returns where each went (with its crc32c). Nothing is entered in the index; if a run
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
    pub(super) fn note_slots(&self, w: &mut Writer) {
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
        if w.host_slot.is_some() {
            // Full, so it is sealed for upload once a sync covers its last
            // write (this call's runs into it are entered in the index after it).
            w.close_active();
        }
        let id = w.next_pack_id;
        if let Some(h) = w.host_slot {
            if !super::pack_id::owns(h, id) {
                return Err(Error::Unavailable(
                    format!("host slot {h}"),
                    format!("its {} pack ids are used up", 1u32 << super::pack_id::SEQ_BITS),
                ));
            }
        }
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
        w.packs.insert(id, PackState::new(0, self.slots_per_pack, Bits::default()));
        self.write_files().insert(id, file.clone());
        w.active = Some(ActivePack { id, file: file.clone(), next_slot: 0, capacity: self.slots_per_pack });
        Ok((id, file, 0, self.slots_per_pack as usize))
    }

    /// Makes every chunk inserted (and every index change made) before this
    /// call durable: syncs the packs written since the last sync, the
    /// directory if a pack was created, then appends and syncs one journal
    /// batch; then flushes the index if the journal has grown past its
    /// threshold. A failure poisons the store (see the module docs).
    pub fn sync(&self) -> Result<()> {
        let target = lock(&self.writer).seq;
        let mut s = lock(&self.sync_state);
        if s.durable_seq >= target {
            // A sync that covered these changes may have failed to seal.
            self.check_poison()?;
            return self.seal_durable(s.durable_seq);
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
        if s.journal.len_bytes() > self.flush_threshold_bytes() {
            self.flush(&mut s)?;
        } else if s.merge.as_ref().is_some_and(|j| j.is_finished()) {
            self.merge_runs(&mut s, None)?;
        }
        self.seal_durable(s.durable_seq)
    }

    /// Journal bytes past which the index is flushed (`flush_records`).
    fn flush_threshold_bytes(&self) -> u64 {
        flush_records(self.len(), self.checkpoint_min_bytes) * super::journal::RECORD_BYTES as u64
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

    /// Flushes the index (see the module docs): the memtable becomes a
    /// level-0 run, the live bits a slots file, a new root names them, and
    /// the journal starts empty. Every change made before it is durable
    /// when it returns. Then installs a finished merge and starts the next
    /// one due (`merge_runs`). A failure poisons the store.
    pub(crate) fn flush(&self, s: &mut super::SyncState) -> Result<()> {
        self.check_poison()?;
        let (frozen, bits, ops, upto, dirty, dir_dirty, next_pack_id) = {
            let mut w = lock(&self.writer);
            let frozen = self.write_index(&mut w).freeze();
            let ops = std::mem::take(&mut w.pending);
            (
                frozen,
                Arc::new(self.bits_snapshot(&w)),
                ops,
                w.seq,
                std::mem::take(&mut w.dirty),
                std::mem::take(&mut w.dir_dirty),
                w.next_pack_id,
            )
        };
        drop(ops); // The run and the slots file hold everything they said.
        let result = (|| {
            self.sync_packs(&dirty, dir_dirty)?;
            let (run_id, slots_id) = (s.root.next_file_id, s.root.next_file_id + 1);
            let valid = |at: ChunkLoc| slots::is_live(&bits, at);
            let entries = dedup::sorted_entries(&frozen);
            let new = dedup::write_merged(
                self.storage.as_ref(),
                &self.dir,
                self.store_id,
                run_id,
                0,
                &[],
                &entries,
                &valid,
            )?;
            slots::write(self.storage.as_ref(), &self.dir, slots_id, &slots::encode(self.store_id, &bits))?;
            self.count_syncs(2 + u64::from(new.is_some()));
            self.storage.sync_dir(&self.dir)?;
            let mut runs = s.root.runs.clone();
            runs.extend(new.as_ref().map(|r| r.id));
            let generation = s.root.generation + 1;
            let root = Root {
                store_id: self.store_id,
                generation,
                next_file_id: slots_id + 1,
                next_pack_id,
                journal_generation: generation as u32,
                slots_id,
                runs,
                summary_limit: self.read_index().summary_limit() as u32,
            };
            self.count_syncs(2);
            root.write(self.storage.as_ref(), &self.dir)?;
            // From here the old journal is stale (the root names another
            // generation): it must not be appended to.
            self.count_syncs(2);
            s.journal.rewrite(self.storage.as_ref(), &self.dir, &[], root.journal_generation)?;
            Ok((root, new))
        })();
        let (root, new) = match result {
            Ok(r) => r,
            Err(e) => {
                self.poison(&e);
                return Err(e);
            }
        };
        let install = {
            let mut w = lock(&self.writer);
            self.write_index(&mut w).begin_flush(new)
        };
        if let Err(e) = self.install_in_steps(install) {
            // The run is on disk and named; reading its keys back failed.
            self.poison(&e);
            return Err(e);
        }
        let old_slots = std::mem::replace(&mut s.root, root).slots_id;
        s.durable_seq = s.durable_seq.max(upto);
        // A file the new root no longer names that a crash or a failed
        // unlink leaves is deleted by the next open.
        if old_slots != 0 {
            self.remove_index_file(&self.dir.join(slots::slots_file_name(old_slots)));
        }
        tracing::debug!(entries = frozen.len(), "chunk index flushed");
        self.merge_runs(s, Some(&bits))
    }

    /// Runs at which a sync waits for the running merge: lookups read a
    /// page of each run the summary names, and the summary names a run in
    /// 8 bits.
    pub(crate) const MERGE_WAIT_RUNS: usize = 4 * dedup::FAN_IN;

    /// Installs the running merge if it has finished (or waits for it, once
    /// there are `MERGE_WAIT_RUNS` runs), then, given `durable_bits`,
    /// starts the next merge due; in line, when merges are not in the
    /// background, until none is due.
    ///
    /// `durable_bits` must be the live bits as they are durable now (a
    /// flush's slots file): a merge drops the entries of slots they show
    /// free, and a free queued but not yet in the journal comes back live
    /// after a crash, so judging by newer bits could drop the only entry of
    /// a chunk that is still stored. (A background merge is installed by a
    /// later sync, which has journaled every free older than its bits; an
    /// in-line one is installed at once, hence the rule.)
    ///
    /// A failed merge is dropped (its unnamed run is deleted now or by the
    /// next open) and retried by a later flush, unless the runs have piled
    /// up to `MERGE_WAIT_RUNS`: then it poisons the store.
    pub(crate) fn merge_runs(
        &self,
        s: &mut super::SyncState,
        durable_bits: Option<&Arc<slots::PackBits>>,
    ) -> Result<()> {
        loop {
            if let Some(job) = &s.merge {
                let piled_up = self.read_index().runs().count() >= Self::MERGE_WAIT_RUNS;
                if !job.is_finished() {
                    if !piled_up {
                        return Ok(());
                    }
                    self.index_merge_waits.fetch_add(1, Ordering::Relaxed);
                }
                let job = s.merge.take().expect("checked");
                let (inputs, run_id) = (job.inputs.clone(), job.run_id);
                let (result, took) = job.wait();
                let installed = match result {
                    Ok(new) => self.install_merge(s, &inputs, new),
                    Err(e) if !piled_up => {
                        tracing::warn!(error = %e, "chunk index merge failed; a later flush retries it");
                        for name in [dedup::run::run_file_name(run_id), dedup::run::keys_spill_name(run_id)] {
                            let path = self.dir.join(name);
                            if self.storage.exists(&path) {
                                self.remove_index_file(&path);
                            }
                        }
                        return Ok(());
                    }
                    Err(e) => Err(e),
                };
                if let Err(e) = installed {
                    self.poison(&e);
                    return Err(e);
                }
                self.index_merges.fetch_add(1, Ordering::Relaxed);
                self.index_merge_ms_max.fetch_max(took.as_millis() as u64, Ordering::Relaxed);
            }
            let Some(bits) = durable_bits else { return Ok(()) };
            let Some((inputs, level)) = self.read_index().plan_merge() else { return Ok(()) };
            let run_id = s.root.next_file_id;
            s.root.next_file_id += 1;
            let bits = bits.clone();
            let valid: dedup::merge::Valid = Box::new(move |at: ChunkLoc| slots::is_live(&bits, at));
            let spec = dedup::merge::MergeSpec {
                storage: self.storage.clone(),
                dir: self.dir.clone(),
                store_id: self.store_id,
                run_id,
                level,
                inputs,
            };
            let runner = match &self.merge_tasks {
                Some(tasks) => dedup::merge::MergeRunner::Task(tasks),
                None => dedup::merge::MergeRunner::InLine,
            };
            match dedup::merge::MergeJob::start(spec, valid, runner) {
                Ok(job) => s.merge = Some(job),
                Err(e) => {
                    self.poison(&e);
                    return Err(e);
                }
            }
            if self.merge_tasks.is_some() {
                return Ok(());
            }
        }
    }

    /// Names a merged run in a new root in place of its inputs (the
    /// journal and slots file stay), installs it in the index, and deletes
    /// the inputs.
    fn install_merge(
        &self,
        s: &mut super::SyncState,
        inputs: &[Arc<dedup::run::Run>],
        new: Option<dedup::run::Run>,
    ) -> Result<()> {
        self.count_syncs(1);
        self.storage.sync_dir(&self.dir)?;
        let first =
            s.root.runs.iter().position(|&id| id == inputs[0].id).expect("merged runs are in the root");
        let mut runs = s.root.runs.clone();
        runs.splice(first..first + inputs.len(), new.as_ref().map(|r| r.id));
        let root = Root { generation: s.root.generation + 1, runs, ..s.root.clone() };
        self.count_syncs(2);
        root.write(self.storage.as_ref(), &self.dir)?;
        let install = {
            let mut w = lock(&self.writer);
            self.write_index(&mut w).begin_merge(inputs, new)
        };
        self.install_in_steps(install)?;
        s.root = root;
        for run in inputs {
            self.remove_index_file(run.path());
        }
        Ok(())
    }

    /// Summary partitions an install step replaces under the writer and
    /// index locks (of 4,096): at 64 M chunks about 1/16 of a summary
    /// rebuild, so inserts wait tens of milliseconds, not the whole rebuild.
    pub(crate) const INSTALL_STEP_PARTITIONS: usize = 256;

    /// Runs an install (dedup::Install) a batch of partitions per hold of
    /// the writer and index locks, then finishes it (halving the summary
    /// if it is over its budget). Called under the sync lock, so runs
    /// change only here meanwhile.
    fn install_in_steps(&self, mut install: dedup::Install) -> Result<()> {
        loop {
            let mut w = lock(&self.writer);
            if self.write_index(&mut w).install_step(&mut install, Self::INSTALL_STEP_PARTITIONS)? {
                let budget = self.summary_budget(&w);
                let mut idx = self.write_index(&mut w);
                idx.set_summary_budget(budget);
                idx.finish_install(install);
                return Ok(());
            }
        }
    }

    /// Deletes an index file no root names any more; one a failure leaves
    /// is deleted by the next open.
    fn remove_index_file(&self, path: &std::path::Path) {
        if let Err(e) = self.storage.remove_file(path) {
            tracing::warn!(path = %path.display(), error = %e, "chunk index file left for the next open");
        }
    }

    /// The live bits of every pack, for a flush's slots file or a merge.
    fn bits_snapshot(&self, w: &Writer) -> slots::PackBits {
        w.packs.iter().map(|(&id, p)| (id, p.live_bits.clone())).collect()
    }

    /// What the summary may take: the index's budget less the memtables
    /// (two at their largest) and the slot bits.
    pub(crate) fn summary_budget(&self, w: &Writer) -> u64 {
        let live: u64 = w.packs.values().map(|p| u64::from(p.live)).sum();
        let mem = 2 * dedup::mem_bytes_for(flush_records(live, self.checkpoint_min_bytes) as usize);
        self.index_budget_bytes().saturating_sub(mem + w.bits_bytes())
    }
}
