//! Opening the chunk store: the index (index.rs: its root, slots file and
//! runs' fences and summary keys, never the runs' entries, and the
//! journal since the last flush replayed), then the packs (packs.rs:
//! every pack with a live slot checked, those with none deleted, with a
//! tier the packs it holds in the bucket), index files the root does not
//! name deleted, and where appends resume.
//!
//! A store whose journal predates the on-disk index (journal version 1 or
//! 2, no root) has its journal replayed whole, as before, and flushed as
//! the index's first run before the open returns.

mod index;
mod packs;

use super::forward::Forwards;
use super::tier::TierOpen;
use super::{lock, pin, ChunkStore, ChunkStoreOptions, ClockCache, OpenReport, PackFiles, SyncState, Writer};
use super::{CACHE_SHARDS, CHUNK_BYTES};
use crate::dedup::DedupIndex;
use crate::error::Result;
use crate::storage::Storage;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

impl ChunkStore {
    /// Opens the chunk store in `dir`, creating it if absent, with no tier
    /// (see the module docs for what it reads and checks).
    pub fn open(storage: Arc<dyn Storage>, dir: &Path, opts: ChunkStoreOptions) -> Result<ChunkStore> {
        ChunkStore::open_with_tier(storage, dir, opts, None)
    }

    /// Opens the chunk store in `dir`, creating it if absent, with `tier`
    /// attached (tier.rs): the tier is started once the store is built.
    pub fn open_with_tier(
        storage: Arc<dyn Storage>,
        dir: &Path,
        opts: ChunkStoreOptions,
        tier: Option<&dyn TierOpen>,
    ) -> Result<ChunkStore> {
        let slots_per_pack = packs::slots_per_pack(&opts)?;
        let started = Instant::now();
        let mut report = OpenReport::default();
        if !storage.exists(dir) {
            storage.create_dir_all(dir)?;
            storage.sync_dir(dir.parent().unwrap_or(Path::new("/")))?;
        }
        let names = storage.list_dir(dir)?;
        let pack_ids: Vec<u32> = names.iter().filter_map(|n| super::pack::parse_pack_file_name(n)).collect();
        let idx = index::open_index(storage.as_ref(), dir, &names, &pack_ids, &mut report)?;
        let store_id = idx.journal.store_id;
        let forwards = super::forward::load_forwards(storage.as_ref(), dir, &names, store_id)?;
        report.journal_batches = idx.journal.batches();
        report.journal_bytes = idx.journal.len_bytes();
        report.journal_ms = report.journal_time.wall_ms;
        report.journal_read_ms = idx.journal.read_time.as_millis() as u64;
        let packs_started = Instant::now();
        let (opened, attached) =
            packs::open_packs(&storage, dir, store_id, idx.bits, &pack_ids, tier, &mut report)?;
        report.entries = opened.packs.values().map(|p| u64::from(p.live)).sum();
        let (writer, files, listed) = packs::resume(opened, &pack_ids, idx.next_pack_floor);
        report.packs_ms = packs_started.elapsed().as_millis() as u64;
        report.total_ms = started.elapsed().as_millis() as u64;
        let migrate = report.migrated || idx.root.generation == 0;
        let sync = SyncState { journal: idx.journal, durable_seq: 0, root: idx.root, merge: None };
        let parts = Parts { index: idx.index, files, forwards, writer, sync, report };
        let mut store = ChunkStore::assemble(storage, dir, &opts, slots_per_pack, parts);
        {
            let mut w = lock(&store.writer);
            let budget = store.summary_budget(&w);
            store.write_index(&mut w).set_summary_budget(budget);
            store.write_index(&mut w).fit_summary();
        }
        if migrate {
            // The whole old journal becomes the first run (with the next
            // pack id in the root) before any pack is created.
            store.flush(&mut lock(&store.sync_state))?;
        }
        match attached {
            Some(a) => store.start_tier(a, &listed, &pack_ids).map(|()| store),
            None => Ok(store),
        }
    }

    /// The store built from what an open read (no tier yet).
    fn assemble(
        storage: Arc<dyn Storage>,
        dir: &Path,
        opts: &ChunkStoreOptions,
        slots_per_pack: u32,
        parts: Parts,
    ) -> ChunkStore {
        let cache_entries = (opts.cache_bytes / CHUNK_BYTES as u64) as usize;
        ChunkStore {
            storage,
            dir: dir.to_path_buf(),
            store_id: parts.sync.journal.store_id,
            slots_per_pack,
            budget_bytes: opts.index_memory_budget_bytes,
            lent_bytes: AtomicU64::new(0),
            checkpoint_min_bytes: opts.index_checkpoint_min_bytes,
            merge_tasks: opts.index_merge_in_background.then(|| opts.tasks.clone()),
            index: RwLock::new(parts.index),
            files: Arc::new(RwLock::new(parts.files)),
            forwards: RwLock::new(parts.forwards),
            writer: Mutex::new(parts.writer),
            sync_state: Mutex::new(parts.sync),
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
            opened: parts.report,
            tier: None,
        }
    }
}

/// What an open read, before the store is built.
struct Parts {
    index: DedupIndex,
    files: PackFiles,
    forwards: Forwards,
    writer: Writer,
    sync: SyncState,
    report: OpenReport,
}
