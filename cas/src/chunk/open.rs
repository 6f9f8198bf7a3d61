//! Opening the chunk store: replaying the index journal into the sharded
//! index, checking every pack the index references (header, store id,
//! length), deleting packs nothing references (crash leftovers, packs GC
//! emptied), and finding where appends resume.

use super::index::{self, Index, IndexMap, Key, Loc, PrefixBuild, SHARDS};
use super::journal::{self, Journal, JournalOp};
use super::pack::{self, PACK_HEADER_BYTES};
use super::{
    corrupt, pin, ActivePack, ChunkStore, ChunkStoreOptions, ClockCache, OpenReport, PackFiles, PackState,
    SyncState, Writer, CACHE_SHARDS, CHUNK_BYTES,
};
use crate::error::{Error, Result};
use crate::storage::{OpenMode, Storage};
use crate::thread_time::ThreadTime;
use std::collections::{BTreeMap, HashMap};
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
    /// Opens the chunk store in `dir`, creating it if absent. Replays the
    /// index journal, checks every pack the index references (header, store
    /// id, length), and deletes pack files nothing references (crash
    /// leftovers or packs GC emptied).
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
        let thread_started = ThreadTime::now();
        let ms = |since: Instant| since.elapsed().as_millis() as u64;
        let mut report = OpenReport::default();
        if !storage.exists(dir) {
            storage.create_dir_all(dir)?;
            storage.sync_dir(dir.parent().unwrap_or(Path::new("/")))?;
        }
        let names = storage.list_dir(dir)?;
        let pack_ids: Vec<u32> = names.iter().filter_map(|n| pack::parse_pack_file_name(n)).collect();
        let journal_path = dir.join(journal::INDEX_FILE);
        // Sized up front for every record the journal can hold, so the
        // replay never rehashes a growing table (the rebuild below trims
        // a shard that ends up smaller); never beyond what the memory
        // budget holds (past it the tables grow as the replay needs).
        let records = storage
            .open(&journal_path, OpenMode::Existing)
            .and_then(|f| f.len())
            .map_or(0, |len| len / journal::RECORD_BYTES as u64)
            .min(opts.index_memory_budget_bytes / index::BUCKET_BYTES);
        let mut maps: Vec<IndexMap> = (0..SHARDS)
            .map(|_| IndexMap::with_capacity_and_hasher(shard_capacity(records), PrefixBuild::default()))
            .collect();
        let mut removed = [false; SHARDS];
        let (mut puts, mut removes) = (0u64, 0u64);
        let mut next_pack_floor = 1u32;
        let journal = if storage.exists(&journal_path) {
            Journal::open(storage.as_ref(), dir, |op| {
                match op {
                    JournalOp::Put { hash, pack, slot, crc } => {
                        puts += 1;
                        let key = Key(hash);
                        maps[index::shard_of(&key)].insert(key, Loc { pack, slot, crc, epoch: 0 });
                    }
                    JournalOp::Remove { hash } => {
                        removes += 1;
                        let key = Key(hash);
                        let shard = index::shard_of(&key);
                        maps[shard].remove(&key);
                        removed[shard] = true;
                    }
                    JournalOp::NextPack { id } => next_pack_floor = next_pack_floor.max(id),
                }
                Ok(())
            })?
        } else {
            if !pack_ids.is_empty() {
                return Err(corrupt(dir, 0, "pack files exist but the chunk index is missing"));
            }
            Journal::create(storage.as_ref(), dir, new_store_id())?
        };
        let store_id = journal.store_id;
        let forwards = super::forward::load_forwards(storage.as_ref(), dir, &names, store_id)?;
        report.journal_batches = journal.batches();
        report.journal_bytes = journal.len_bytes();
        report.journal_time = thread_started.split();
        report.journal_ms = report.journal_time.wall_ms;
        report.journal_read_ms = journal.read_time.as_millis() as u64;
        (report.journal_puts, report.journal_removes) = (puts, removes);
        let packs_started = Instant::now();

        // Live entries and the highest referenced slot, per pack.
        let mut refs: HashMap<u32, (u32, u32)> = HashMap::new();
        for loc in maps.iter().flat_map(|m| m.values()) {
            let r = refs.entry(loc.pack).or_insert((0, 0));
            r.0 += 1;
            r.1 = r.1.max(loc.slot);
        }
        if let Some(missing) = refs.keys().find(|id| !pack_ids.contains(id)) {
            return Err(corrupt(
                dir,
                0,
                format!("the index references pack {missing}, which does not exist"),
            ));
        }
        let mut packs = BTreeMap::new();
        let mut files = PackFiles::new();
        for &id in &pack_ids {
            let path = dir.join(pack::pack_file_name(id));
            let Some(&(live, max_slot)) = refs.get(&id) else {
                // Crash leftover or emptied by GC: nothing points into it.
                storage.remove_file(&path)?;
                report.packs_removed += 1;
                continue;
            };
            let (file, header, slots) = pack::open_checked(storage.as_ref(), &path, store_id, id, max_slot)?;
            report.packs_checked += 1;
            packs.insert(id, PackState { slots, capacity: header.capacity_slots, live });
            files.insert(id, file);
        }
        // Never an id given out before, even if its file is gone (journal.rs).
        let next_pack_id = pack_ids.iter().max().map_or(1, |m| m + 1).max(next_pack_floor);
        // Keep appending to the newest pack if it has room.
        let active = packs.iter().next_back().and_then(|(&id, p)| {
            (p.slots < p.capacity).then(|| ActivePack {
                id,
                file: files[&id].clone(),
                next_slot: p.slots,
                capacity: p.capacity,
            })
        });
        report.packs_ms = ms(packs_started);
        // Fresh tables where a shard's table is bigger than its entries
        // need or replayed removes left tombstones, so each shard's size is
        // what its capacity says.
        let tables_started = Instant::now();
        let maps: Vec<IndexMap> = maps
            .into_iter()
            .zip(removed)
            .map(|(m, removed)| {
                if !removed && index::table_bytes(m.capacity()) == index::table_bytes(m.len()) {
                    return m;
                }
                report.tables_rebuilt += 1;
                let mut fresh = IndexMap::with_capacity_and_hasher(m.len(), PrefixBuild::default());
                fresh.extend(m);
                fresh
            })
            .collect();
        report.tables_ms = ms(tables_started);
        report.entries = maps.iter().map(|m| m.len() as u64).sum();
        report.total_ms = ms(started);
        let table_bytes: Vec<u64> = maps.iter().map(|m| index::table_bytes(m.capacity())).collect();
        let index_bytes: u64 = table_bytes.iter().sum();
        if index_bytes > opts.index_memory_budget_bytes {
            tracing::warn!(
                index_bytes,
                budget = opts.index_memory_budget_bytes,
                "chunk index loaded above its memory budget: inserts of new chunks will be refused"
            );
        }
        let cache_entries = (opts.cache_bytes / CHUNK_BYTES as u64) as usize;
        let old_journal = journal.version < journal::INDEX_VERSION;
        let store = ChunkStore {
            storage,
            dir: dir.to_path_buf(),
            store_id,
            slots_per_pack,
            budget_bytes: opts.index_memory_budget_bytes,
            lent_bytes: std::sync::atomic::AtomicU64::new(0),
            checkpoint_min_bytes: opts.index_checkpoint_min_bytes,
            index: Index::from_maps(maps),
            files: RwLock::new(files),
            forwards: RwLock::new(forwards),
            writer: Mutex::new(Writer {
                active,
                packs,
                table_bytes,
                table_bytes_total: index_bytes,
                next_pack_id,
                buf: Vec::new(),
                pending: Vec::new(),
                seq: 0,
                dirty: BTreeMap::new(),
                dir_dirty: false,
            }),
            sync_state: Mutex::new(SyncState { journal, durable_seq: 0 }),
            pins: pin::Pins::new(),
            gc_lock: Mutex::new(()),
            cache: ClockCache::new(cache_entries, CACHE_SHARDS),
            syncs: AtomicU64::new(0),
            read_index_lookups: AtomicU64::new(0),
            reads_forwarded: AtomicU64::new(0),
            poisoned: AtomicBool::new(false),
            poison_reason: Mutex::new(String::new()),
            opened: report,
            #[cfg(test)]
            growth_hook: Mutex::new(None),
        };
        if old_journal {
            // Rewritten as the current version, with the next pack id,
            // before any pack is created. If the rewrite is skipped (memory
            // budget) or fails, the floor is appended to the old file.
            let mut s = super::lock(&store.sync_state);
            if !store.checkpoint(&mut s)? {
                let id = super::lock(&store.writer).next_pack_id;
                s.journal.append(&[JournalOp::NextPack { id }])?;
            }
        }
        Ok(store)
    }
}

/// The capacity to give each shard before replaying a journal of `records`
/// records: the mean share plus four standard deviations (keys are
/// uniform), so almost no shard grows during the replay.
fn shard_capacity(records: u64) -> usize {
    let mean = records as f64 / SHARDS as f64;
    (mean + 4.0 * mean.sqrt() + 8.0) as usize
}
