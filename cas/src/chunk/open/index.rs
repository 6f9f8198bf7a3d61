//! Opening the index: the root, its slots file and its runs' fences and
//! summary keys (never the runs' entries), then the journal since the
//! last flush replayed into the memtable and the live bits. A journal
//! from before the on-disk index (version 1 or 2, no root) is replayed
//! whole; the open then flushes it as the index's first run.

use super::super::journal::{self, Journal, JournalOp};
use super::super::{corrupt, ChunkLoc, OpenReport};
use crate::dedup::key::Key;
use crate::dedup::root::Root;
use crate::dedup::run::{self, Run};
use crate::dedup::slots::{self, Bits};
use crate::dedup::summary::PARTITIONS;
use crate::dedup::{DedupIndex, MemTable};
use crate::error::{Error, Result};
use crate::storage::Storage;
use crate::thread_time::ThreadTime;
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::path::Path;
use std::time::Instant;

/// What the index holds at open.
pub(super) struct OpenedIndex {
    pub index: DedupIndex,
    /// Live slots by pack.
    pub bits: BTreeMap<u32, Bits>,
    /// No pack id below this was ever given out (journal.rs).
    pub next_pack_floor: u32,
    pub root: Root,
    pub journal: Journal,
}

/// A store id that differs between stores (no RNG dependency needed).
fn new_store_id() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
    );
    h.write_u32(std::process::id());
    h.finish()
}

/// Opens the index of the store in `dir` (whose files are `names`; its
/// pack files `pack_ids`), creating it if there is none.
pub(super) fn open_index(
    storage: &dyn Storage,
    dir: &Path,
    names: &[String],
    pack_ids: &[u32],
    report: &mut OpenReport,
) -> Result<OpenedIndex> {
    let ms = |since: Instant| since.elapsed().as_millis() as u64;
    let journal_path = dir.join(journal::INDEX_FILE);
    let mut index = DedupIndex::new(PARTITIONS, u64::MAX);
    let mut bits: BTreeMap<u32, Bits> = BTreeMap::new();
    let mut next_pack_floor = 1u32;
    let root = Root::read(storage, dir)?;
    let (root, journal) = match root {
        Some(root) => {
            remove_unnamed(storage, dir, names, &root)?;
            if root.slots_id != 0 {
                bits = slots::read(storage, dir, root.slots_id, root.store_id)?;
            }
            let runs_started = Instant::now();
            index = DedupIndex::new(root.summary_limit as usize, u64::MAX);
            for &id in &root.runs {
                let run = Run::open(storage, dir, id, root.store_id)?;
                report.run_entries += run.entries;
                index.add_opened(run)?;
            }
            report.runs = root.runs.len() as u64;
            report.runs_ms = ms(runs_started);
            next_pack_floor = root.next_pack_id;
            let thread_started = ThreadTime::now();
            if !storage.exists(&journal_path) {
                return Err(corrupt(&journal_path, 0, "the index root exists but its journal is missing"));
            }
            let (version, generation) = Journal::header(storage, dir)?;
            let journal = if version == journal::INDEX_VERSION && generation == root.journal_generation {
                Journal::open(storage, dir, |op| {
                    replay(op, &mut index.mem, &mut bits, &mut next_pack_floor, report, false)
                })?
            } else {
                // Left from before the flush that wrote this root (of
                // any version): its records are all in the root's files.
                Journal::create(storage, dir, root.store_id, root.journal_generation)?
            };
            report.journal_time = thread_started.split();
            (root, journal)
        }
        None if storage.exists(&journal_path) => {
            // Before the on-disk index (or a store created but never
            // flushed): the journal is the whole index. Files of a
            // migration a crash cut short go first (their names would
            // be given out again).
            let no_root = Root {
                store_id: 0,
                generation: 0,
                next_file_id: 1,
                next_pack_id: 0,
                journal_generation: 0,
                slots_id: 0,
                runs: Vec::new(),
                summary_limit: PARTITIONS as u32,
            };
            remove_unnamed(storage, dir, names, &no_root)?;
            let thread_started = ThreadTime::now();
            let journal = Journal::open(storage, dir, |op| {
                replay(op, &mut index.mem, &mut bits, &mut next_pack_floor, report, true)
            })?;
            report.journal_time = thread_started.split();
            report.migrated = journal.version < journal::INDEX_VERSION || journal.batches() > 0;
            // Not yet written: the flush at the end of the open writes
            // it (generation 1, and journal generation 1).
            (Root { store_id: journal.store_id, ..no_root }, journal)
        }
        None => {
            if !pack_ids.is_empty() {
                return Err(corrupt(dir, 0, "pack files exist but the chunk index is missing"));
            }
            let store_id = new_store_id();
            let journal = Journal::create(storage, dir, store_id, 1)?;
            let root = Root {
                store_id,
                generation: 1,
                next_file_id: 1,
                next_pack_id: 1,
                journal_generation: 1,
                slots_id: 0,
                runs: Vec::new(),
                summary_limit: PARTITIONS as u32,
            };
            root.write(storage, dir)?;
            (root, journal)
        }
    };
    if journal.store_id != root.store_id {
        return Err(corrupt(&journal_path, 0, "the index journal belongs to another store"));
    }
    Ok(OpenedIndex { index, bits, next_pack_floor, root, journal })
}

/// Applies one journal record at open: puts to the memtable and the live
/// bits, frees to the bits, removes (only in journals from before the
/// on-disk index, `whole`) to the memtable.
fn replay(
    op: JournalOp,
    mem: &mut MemTable,
    bits: &mut BTreeMap<u32, Bits>,
    next_pack_floor: &mut u32,
    report: &mut OpenReport,
    whole: bool,
) -> Result<()> {
    match op {
        JournalOp::Put { hash, pack, slot, crc } => {
            report.journal_puts += 1;
            if whole {
                // A put replaces the chunk's earlier place (GC moved it).
                if let Some(old) = mem.insert(Key(hash), ChunkLoc { pack, slot, crc }) {
                    if let Some(b) = bits.get_mut(&old.pack) {
                        b.clear(old.slot);
                    }
                }
            } else {
                mem.insert(Key(hash), ChunkLoc { pack, slot, crc });
            }
            bits.entry(pack).or_default().set(slot);
        }
        JournalOp::Remove { hash } if whole => {
            report.journal_removes += 1;
            if let Some(old) = mem.remove(&Key(hash)) {
                if let Some(b) = bits.get_mut(&old.pack) {
                    b.clear(old.slot);
                }
            }
        }
        JournalOp::Remove { .. } => {
            return Err(Error::Corruption {
                path: Default::default(),
                offset: 0,
                detail: "a remove record in an index journal of version 3".into(),
            })
        }
        JournalOp::Free { pack, slot } => {
            report.journal_frees += 1;
            if let Some(b) = bits.get_mut(&pack) {
                b.clear(slot);
            }
        }
        JournalOp::NextPack { id } => *next_pack_floor = (*next_pack_floor).max(id),
    }
    Ok(())
}

/// Deletes index files in `dir` that `root` does not name: runs and slots
/// files of a flush that never reached its root, or that a flush replaced
/// before a crash let it delete them.
fn remove_unnamed(storage: &dyn Storage, dir: &Path, names: &[String], root: &Root) -> Result<()> {
    for name in names {
        let stale = match (run::parse_run_file_name(name), slots::parse_slots_file_name(name)) {
            (Some(id), _) => !root.runs.contains(&id),
            (_, Some(id)) => id != root.slots_id,
            _ => run::is_keys_spill_name(name),
        };
        if stale {
            storage.remove_file(&dir.join(name))?;
        }
    }
    Ok(())
}
