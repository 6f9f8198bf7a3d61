//! Opening the chunk store: reading the dedup index's root, its slots
//! file and its runs' fences and summary keys (never the runs' entries),
//! replaying the journal since the last flush, checking every pack with a
//! live slot (header, store id, length), deleting packs with none (crash
//! leftovers, packs GC emptied) and index files the root does not name,
//! and finding where appends resume.
//!
//! A store whose journal predates the on-disk index (journal version 1 or
//! 2, no root) has its journal replayed whole, as before, and flushed as
//! the index's first run before the open returns.

use super::journal::{self, Journal, JournalOp};
use super::pack::{self, PACK_HEADER_BYTES};
use super::pack_id::{self, PackPhase};
use super::{
    corrupt, pin, ActivePack, ChunkLoc, ChunkStore, ChunkStoreOptions, ClockCache, OpenReport, PackFiles,
    PackState, SyncState, Writer, CACHE_SHARDS, CHUNK_BYTES,
};
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
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

/// A store id that differs between stores (no RNG dependency needed).
fn new_store_id() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos(),
    );
    h.write_u32(std::process::id());
    h.finish()
}

impl ChunkStore {
    /// Opens the chunk store in `dir`, creating it if absent (see the
    /// module docs for what it reads and checks).
    pub fn open(storage: Arc<dyn Storage>, dir: &Path, opts: ChunkStoreOptions) -> Result<ChunkStore> {
        let slots = opts.pack_bytes.saturating_sub(PACK_HEADER_BYTES) / CHUNK_BYTES as u64;
        if slots == 0 || opts.pack_bytes > pack::MAX_PACK_BYTES {
            return Err(Error::InvalidArgument(format!(
                "pack_bytes {} must leave room for a chunk after the {PACK_HEADER_BYTES}-byte header and be at most {}",
                opts.pack_bytes,
                pack::MAX_PACK_BYTES
            )));
        }
        let slots_per_pack = u32::try_from(slots).unwrap_or(u32::MAX);
        let started = Instant::now();
        let ms = |since: Instant| since.elapsed().as_millis() as u64;
        let mut report = OpenReport::default();
        if !storage.exists(dir) {
            storage.create_dir_all(dir)?;
            storage.sync_dir(dir.parent().unwrap_or(Path::new("/")))?;
        }
        let names = storage.list_dir(dir)?;
        let pack_ids: Vec<u32> = names.iter().filter_map(|n| pack::parse_pack_file_name(n)).collect();
        let journal_path = dir.join(journal::INDEX_FILE);
        let mut index = DedupIndex::new(PARTITIONS, u64::MAX);
        let mut bits: BTreeMap<u32, Bits> = BTreeMap::new();
        let mut next_pack_floor = 1u32;
        let root = Root::read(storage.as_ref(), dir)?;
        let (root, journal) = match root {
            Some(root) => {
                remove_unnamed(storage.as_ref(), dir, &names, &root)?;
                if root.slots_id != 0 {
                    bits = slots::read(storage.as_ref(), dir, root.slots_id, root.store_id)?;
                }
                let runs_started = Instant::now();
                index = DedupIndex::new(root.summary_limit as usize, u64::MAX);
                for &id in &root.runs {
                    let run = Run::open(storage.as_ref(), dir, id, root.store_id)?;
                    report.run_entries += run.entries;
                    index.add_opened(run)?;
                }
                report.runs = root.runs.len() as u64;
                report.runs_ms = ms(runs_started);
                next_pack_floor = root.next_pack_id;
                let thread_started = ThreadTime::now();
                if !storage.exists(&journal_path) {
                    return Err(corrupt(
                        &journal_path,
                        0,
                        "the index root exists but its journal is missing",
                    ));
                }
                let (version, generation) = Journal::header(storage.as_ref(), dir)?;
                let journal = if version == journal::INDEX_VERSION && generation == root.journal_generation {
                    Journal::open(storage.as_ref(), dir, |op| {
                        replay(op, &mut index.mem, &mut bits, &mut next_pack_floor, &mut report, false)
                    })?
                } else {
                    // Left from before the flush that wrote this root (of
                    // any version): its records are all in the root's files.
                    Journal::create(storage.as_ref(), dir, root.store_id, root.journal_generation)?
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
                remove_unnamed(storage.as_ref(), dir, &names, &no_root)?;
                let thread_started = ThreadTime::now();
                let journal = Journal::open(storage.as_ref(), dir, |op| {
                    replay(op, &mut index.mem, &mut bits, &mut next_pack_floor, &mut report, true)
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
                let journal = Journal::create(storage.as_ref(), dir, store_id, 1)?;
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
                root.write(storage.as_ref(), dir)?;
                (root, journal)
            }
        };
        let store_id = journal.store_id;
        if store_id != root.store_id {
            return Err(corrupt(&journal_path, 0, "the index journal belongs to another store"));
        }
        let forwards = super::forward::load_forwards(storage.as_ref(), dir, &names, store_id)?;
        report.journal_batches = journal.batches();
        report.journal_bytes = journal.len_bytes();
        report.journal_ms = report.journal_time.wall_ms;
        report.journal_read_ms = journal.read_time.as_millis() as u64;
        let packs_started = Instant::now();

        bits.retain(|_, b| b.count() > 0);
        let catalog = super::remote::attach(storage.as_ref(), dir, store_id, opts.remote.as_ref(), |id| {
            pack_ids.contains(&id) && bits.contains_key(&id)
        })?;
        // Uploaded packs whose local copy was deleted: read from the bucket.
        let remote_only: Vec<(u32, u32)> = catalog.as_ref().map_or(Vec::new(), |c| {
            c.packs
                .iter()
                .filter(|(id, p)| {
                    matches!(p.phase, PackPhase::Uploaded | PackPhase::Foreign)
                        && !pack_ids.contains(id)
                        && bits.contains_key(id)
                })
                .map(|(&id, p)| (id, p.slots))
                .collect()
        });
        let in_bucket = |id: &u32| remote_only.iter().any(|r| r.0 == *id);
        if let Some(missing) = bits.keys().find(|id| !pack_ids.contains(id) && !in_bucket(id)) {
            return Err(corrupt(
                dir,
                0,
                format!("the index has live chunks in pack {missing}, which does not exist"),
            ));
        }
        let mut packs = BTreeMap::new();
        let mut files = PackFiles::new();
        for &id in &pack_ids {
            let path = dir.join(pack::pack_file_name(id));
            let Some(live) = bits.remove(&id) else {
                // Crash leftover or emptied by GC: no live slot in it.
                storage.remove_file(&path)?;
                report.packs_removed += 1;
                continue;
            };
            let max_slot = live.max().expect("live packs have a live slot");
            let (file, header, slots) = pack::open_checked(storage.as_ref(), &path, store_id, id, max_slot)?;
            report.packs_checked += 1;
            packs.insert(id, PackState::new(slots, header.capacity_slots, live));
            files.insert(id, file);
        }
        let reads = match &opts.remote {
            Some(r) => Some(super::remote::attach::remote_reads(storage.as_ref(), dir, r)?),
            None => None,
        };
        for &(id, slots) in &remote_only {
            let Some(reads) = &reads else {
                return Err(Error::Unavailable(
                    format!("pack {id:#010x}"),
                    "it is only in the bucket: open the store with its remote".into(),
                ));
            };
            let live = bits.remove(&id).expect("remote-only packs have live slots");
            if live.max().is_some_and(|m| m >= slots) {
                return Err(corrupt(
                    dir,
                    0,
                    format!(
                        "the index has live slot {:?} in pack {id:#010x}, which was uploaded with {slots}",
                        live.max()
                    ),
                ));
            }
            packs.insert(id, PackState::new(slots, slots, live));
            files.insert(
                id,
                Arc::new(super::remote::RemotePackFile::new(id, pack::slot_offset(slots), reads.clone())),
            );
        }
        // Other stores' packs that fetched images name: no live slot here.
        let foreign: Vec<(u32, u32)> = catalog.as_ref().map_or(Vec::new(), |c| {
            c.packs
                .iter()
                .filter(|(_, p)| p.phase == PackPhase::Foreign)
                .map(|(&id, p)| (id, p.slots))
                .collect()
        });
        for &(id, slots) in &foreign {
            let Some(reads) = &reads else {
                return Err(Error::Unavailable(
                    format!("pack {id:#010x}"),
                    "a fetched image reads it from the bucket: open the store with its remote".into(),
                ));
            };
            files.entry(id).or_insert_with(|| {
                Arc::new(super::remote::RemotePackFile::new(id, pack::slot_offset(slots), reads.clone()))
            });
        }
        let host_slot = catalog.as_ref().map(|c| c.host_slot);
        // Never an id given out before, even if its file is gone (journal.rs).
        let mut next_pack_id = pack_ids.iter().max().map_or(1, |m| m + 1).max(next_pack_floor);
        if let Some(c) = &catalog {
            // Catalogued ids too: their objects in the bucket are never written again.
            let own = |id: &&u32| pack_id::owns(c.host_slot, **id);
            let after_catalog = c.packs.keys().rfind(own).map_or(0, |&id| id + 1);
            next_pack_id = next_pack_id.max(pack_id::first_pack_id(c.host_slot)).max(after_catalog);
        }
        // Keep appending to the newest pack if it has room (with a remote:
        // the newest of this store's host slot, if it is not sealed).
        let resumable = |id: &u32| match &catalog {
            Some(c) => pack_id::owns(c.host_slot, *id) && !c.packs.contains_key(id),
            None => true,
        };
        let active = packs.iter().rfind(|(id, _)| resumable(id)).and_then(|(&id, p)| {
            (p.slots < p.capacity).then(|| ActivePack {
                id,
                file: files[&id].clone(),
                next_slot: p.slots,
                capacity: p.capacity,
            })
        });
        // Packs of the host slot closed before a crash let them be sealed:
        // every live slot is durable already.
        let to_seal: Vec<(u32, u64)> = packs
            .keys()
            .filter(|id| resumable(id) && active.as_ref().is_none_or(|a| a.id != **id))
            .map(|&id| (id, 0))
            .collect();
        report.packs_ms = ms(packs_started);
        report.entries = packs.values().map(|p| u64::from(p.live)).sum();
        report.total_ms = ms(started);
        let cache_entries = (opts.cache_bytes / CHUNK_BYTES as u64) as usize;
        let migrate = report.migrated || root.generation == 0;
        let mut store = ChunkStore {
            storage,
            dir: dir.to_path_buf(),
            store_id,
            slots_per_pack,
            budget_bytes: opts.index_memory_budget_bytes,
            lent_bytes: std::sync::atomic::AtomicU64::new(0),
            checkpoint_min_bytes: opts.index_checkpoint_min_bytes,
            merge_in_background: opts.index_merge_in_background,
            index: RwLock::new(index),
            files: Arc::new(RwLock::new(files)),
            forwards: RwLock::new(forwards),
            writer: Mutex::new(Writer {
                active,
                packs,
                next_pack_id,
                buf: Vec::new(),
                pending: Vec::new(),
                seq: 0,
                dirty: BTreeMap::new(),
                dir_dirty: false,
                host_slot,
                to_seal: if opts.remote.is_some() { to_seal } else { Vec::new() },
            }),
            sync_state: Mutex::new(SyncState { journal, durable_seq: 0, root, merge: None }),
            pins: pin::Pins::new(),
            gc_lock: Mutex::new(()),
            cache: ClockCache::new(cache_entries, CACHE_SHARDS),
            admission: super::admission::Doorkeeper::new(cache_entries),
            cache_admits_deferred: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            read_index_lookups: AtomicU64::new(0),
            reads_forwarded: AtomicU64::new(0),
            index_page_reads: AtomicU64::new(0),
            index_merges: AtomicU64::new(0),
            index_merge_ms_max: AtomicU64::new(0),
            index_merge_waits: AtomicU64::new(0),
            poisoned: AtomicBool::new(false),
            poison_reason: Mutex::new(String::new()),
            opened: report,
            remote: None,
        };
        {
            let mut w = super::lock(&store.writer);
            let budget = store.summary_budget(&w);
            store.write_index(&mut w).set_summary_budget(budget);
            store.write_index(&mut w).fit_summary();
        }
        if migrate {
            // The whole old journal becomes the first run (with the next
            // pack id in the root) before any pack is created.
            store.flush(&mut super::lock(&store.sync_state))?;
        }
        if let (Some(ropts), Some(catalog), Some(reads)) = (&opts.remote, catalog, reads) {
            let mut local = pack_ids.clone();
            local.sort_unstable();
            store.start_remote(ropts, catalog, reads, &local)?;
        }
        Ok(store)
    }
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
