//! The shared chunk store: every distinct non-zero 4 KiB block of every
//! image, stored once, found by its blake3 hash.
//!
//! It owns the store's `chunks/` directory:
//!
//! ```text
//! chunks/
//!   index-root          which runs, slots file and journal are the index (crate::dedup::root)
//!   index-run-<16 hex>  sorted runs of index entries: hash -> (pack, slot, crc32c)
//!   index-slots-<16 hex> the live bit of every pack slot at the last flush
//!   index               the index journal (journal.rs): puts and freed slots since
//!                       the last flush, and the lowest pack id never given out
//!   pack-00000001.pack  append-only pack files (pack.rs): header + 4 KiB slots
//!   pack-00000002.pack
//!   ...
//!   pack-00000007.fwd   where the chunks of deleted pack 7 went (forward.rs)
//! ```
//!
//! In memory: the dedup index (`crate::dedup`, a peer of this module that
//! knows nothing of packs): its memtable, summary and fences (about 4.1
//! bytes per chunk, the summary sampled down past the memory budget so
//! dedup is lost, never writes); a live bit and a GC keep bit per pack
//! slot, the open pack files, and a bounded clean cache of chunk bytes
//! (`crate::cache`).
//!
//! Locks, in the order they nest (never the other way round):
//!
//! ```text
//!  sync_state   one sync (or index flush) at a time; held across journal
//!               and run I/O
//!  writer       every change to the index, the slot bits or the packs;
//!               held across pack writes, so readers never take it
//!  index        RwLock of the dedup index; lookups read run pages under
//!               its read lock, changes take the write lock briefly
//!  forwards     RwLock of the forward tables (forward.rs); never taken
//!               while `files` is held
//!  files        RwLock of the open pack files; written only when a pack is
//!               created or deleted
//!  cache shard
//! ```
//!
//! A read of a located [`ChunkRef`] (what manifest leaves hold) takes only
//! `files`, to clone its pack's handle (and, if the pack is gone, the
//! forward tables' lock, then `files` again inside it), never the index: pack ids are
//! never reused (the journal's next-pack record) and a slot's bytes never
//! change while its pack exists. A read through the index (by hash, of an
//! unlocated ref, or of a ref whose pack GC deleted) finds the newest entry
//! whose pack is open and reads it; if GC deletes that pack in between, it
//! asks again (the moved chunk's newer entry is in the index before its
//! pack is deleted).
//!
//! Writes: [`ChunkStore::insert_missing`] stores each chunk not yet present
//! exactly once (the dedup check and the append run under one writer lock,
//! so concurrent callers never store a hash twice), in runs of up to 4 MiB,
//! one pwrite per run, into the active pack. Nothing is durable until
//! [`ChunkStore::sync`]: it syncs the packs written since the last sync
//! (and the directory if a pack was created), then appends and syncs one
//! journal batch naming the new chunks. After a crash, a chunk whose
//! `sync` did not return may be gone, but no index entry ever points at
//! lost or garbage bytes: an entry reaches the journal only after its bytes
//! are synced, and every read checks the bytes against the entry's crc32c
//! ([`Error::ChecksumMismatch`] on a mismatch, never garbage data).
//!
//! A failed sync poisons the store: the page cache may have dropped the
//! unwritten data, so later syncs could not vouch for it. Inserts and syncs
//! then fail with [`Error::Unavailable`] until the store is reopened;
//! reads continue.
//!
//! All-zero blocks are holes, not chunks: [`is_zero_block`] tells them
//! apart and `insert_missing` refuses them.
//!
//! [`ChunkStore::open`] (open.rs) reads the index root, the slots file and
//! the runs' fences and summary keys (not their entries), replays the
//! journal since the last flush, and checks the packs with live slots. GC (crate::gc) drives the maintenance half
//! (maintenance.rs): epochs and pins (pin.rs) keep chunks a compaction
//! batch relies on from being swept.

mod admission;
#[doc(hidden)]
pub mod bench;
pub mod check;
mod foreign;
mod forward;
mod fuzz;
mod journal;
mod maintenance;
mod open;
pub(crate) mod pack;
pub mod pack_id;
mod pin;
mod read;
pub mod scrub;
mod seal;
mod stats;
pub mod tier;
mod writer;

pub(crate) use crate::cache::ClockCache;
pub use foreign::{ForeignImport, ForeignSlots};
pub use forward::{fuzz_decode_forward, fuzz_sample_forward, Forward, Move};
pub use fuzz::{fuzz_replay_index, fuzz_reseal_index, fuzz_sample_index};
pub use maintenance::PackUsage;
pub use pack::{fuzz_decode_pack_header, PackHeader, CHUNK_BYTES, PACK_HEADER_BYTES};
pub use pin::ChunkPin;
pub use seal::Closing;
pub use stats::{ChunkStats, InsertStats, OpenReport};

use crate::dedup::key::{Key, PrefixBuild};
use crate::dedup::slots::Bits;
use crate::dedup::{self, DedupIndex};
use crate::error::{Error, Result};
use crate::storage::{Storage, StorageFile};
use journal::{Journal, JournalOp};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Shards of the clean chunk cache: every read takes one shard's mutex
/// (twice on a miss), so a thread descheduled while holding one stalls
/// only the reads that hash to the same shard.
const CACHE_SHARDS: usize = 64;

use crate::tasks::Tasks;
pub use crate::units::{ChunkHash, ChunkLoc, ChunkRef, ChunkTag};

/// True when `data` is all zeros (a hole, never stored as a chunk).
pub fn is_zero_block(data: &[u8]) -> bool {
    let mut chunks = data.chunks_exact(64);
    let body = chunks.by_ref().all(|c| c.iter().fold(0u8, |acc, &b| acc | b) == 0);
    body && chunks.remainder().iter().all(|&b| b == 0)
}

/// Tunables of the chunk store.
#[derive(Clone, Debug)]
pub struct ChunkStoreOptions {
    /// Largest pack file, header included (default 64 MiB). A pack holds
    /// `(pack_bytes - 4096) / 4096` chunks.
    pub pack_bytes: u64,
    /// Bytes of chunk data the clean read cache may hold (default 16 MiB;
    /// 0 disables it).
    pub cache_bytes: u64,
    /// Heap bytes the dedup index (memtable, summary, fences, slot bits)
    /// may take (default 1 GiB, about 200 million chunks summarized). Past
    /// it the summary covers a shrinking sample of the hashes: dedup finds
    /// fewer duplicates, writes never fail.
    pub index_memory_budget_bytes: u64,
    /// The index is flushed (its memtable written as a run, the journal
    /// emptied) once the journal is larger than this and than what the
    /// memtable's size for the store calls for (default 4 MiB).
    pub index_checkpoint_min_bytes: u64,
    /// Merges of index runs run as a task of `tasks` (default), so a
    /// sync waits for one only when the runs outnumber `MERGE_WAIT_RUNS`;
    /// false runs them inside the flush that makes them due (tests that
    /// cut the storage at every operation want that order fixed).
    pub index_merge_in_background: bool,
    /// What runs the background merges (the store's tasks: a thread each,
    /// or a test's stepper).
    pub tasks: Tasks,
}

impl Default for ChunkStoreOptions {
    fn default() -> Self {
        ChunkStoreOptions {
            pack_bytes: 64 << 20,
            cache_bytes: 16 << 20,
            index_memory_budget_bytes: 1 << 30,
            index_checkpoint_min_bytes: 4 << 20,
            index_merge_in_background: true,
            tasks: Tasks::Threads,
        }
    }
}

/// One pack file's slot counts (the writer's bookkeeping; readers only
/// need its file, in `ChunkStore::files`).
pub(crate) struct PackState {
    /// Slots the file spans (written, live or dead).
    pub slots: u32,
    pub capacity: u32,
    /// Slots holding a live chunk: `live_bits`' count.
    pub live: u32,
    pub live_bits: Bits,
    /// Slots GC must keep in the current pass: marked, or written or
    /// found as duplicates since the pass's epoch began (pin.rs).
    pub keep_bits: Bits,
}

impl PackState {
    pub fn new(slots: u32, capacity: u32, live_bits: Bits) -> PackState {
        PackState { slots, capacity, live: live_bits.count(), live_bits, keep_bits: Bits::default() }
    }
}

/// The open pack files, by id.
pub(crate) type PackFiles = BTreeMap<u32, Arc<dyn StorageFile>>;

/// The pack being appended to.
pub(crate) struct ActivePack {
    pub id: u32,
    pub file: Arc<dyn StorageFile>,
    pub next_slot: u32,
    pub capacity: u32,
}

/// Append-side state, behind the writer lock: every change to the index
/// or the slot bits is made holding it.
pub(crate) struct Writer {
    pub active: Option<ActivePack>,
    pub packs: BTreeMap<u32, PackState>,
    pub next_pack_id: u32,
    /// Reused run buffer (grows to one run, 4 MiB at most).
    pub buf: Vec<u8>,
    /// Index changes not yet in the journal, in the order applied.
    pub pending: Vec<JournalOp>,
    /// Index changes made so far (`pending` holds the newest ones).
    pub seq: u64,
    /// Packs written since the last sync.
    pub dirty: BTreeMap<u32, Arc<dyn StorageFile>>,
    /// A pack file was created since the last sync.
    pub dir_dirty: bool,
    /// With a tier: this store's host slot (its packs' top 8 bits).
    pub host_slot: Option<u8>,
    /// Packs closed for good, with the change sequence a sync must reach
    /// before they are sealed (seal.rs): every write to them is before it.
    pub to_seal: Vec<(u32, u64)>,
}

/// Sync-side state, behind the sync lock (one sync at a time). Lock order:
/// see the module docs.
pub(crate) struct SyncState {
    pub journal: Journal,
    /// Every index change up to this sequence is durable.
    pub durable_seq: u64,
    /// The index root on disk, except that `next_file_id` is past the id
    /// a running merge reserved.
    pub root: dedup::root::Root,
    /// The merge of index runs under way, if any (crate::dedup::merge).
    pub merge: Option<dedup::merge::MergeJob>,
}

impl Writer {
    /// True when slot `at.slot` of `at.pack` holds a live chunk.
    pub fn is_live(&self, at: ChunkLoc) -> bool {
        self.packs.get(&at.pack).is_some_and(|p| p.live_bits.get(at.slot))
    }

    /// True for a pack of this store's host slot that is not the active
    /// one (sealed, or about to be: seal.rs) or another store's, so
    /// its bytes must not move.
    pub fn is_sealed(&self, id: u32) -> bool {
        // Own packs of the host slot but the active one, and other stores'
        // (foreign.rs); never a pack from before the tier (slot 0).
        self.host_slot.is_some()
            && !pack_id::before_tier(id)
            && self.active.as_ref().is_none_or(|a| a.id != id)
    }

    /// Closes the active pack for good (with a tier): it is sealed once a
    /// sync reaches a change sequence past its last write. Returns its id.
    pub fn close_active(&mut self) -> Option<u32> {
        let a = self.active.take()?;
        if let Some(p) = self.packs.get_mut(&a.id) {
            p.slots = p.slots.max(a.next_slot);
        }
        self.seq += 1;
        self.to_seal.push((a.id, self.seq));
        Some(a.id)
    }

    /// Marks slot `at` to be kept by the current GC pass.
    pub fn keep(&mut self, at: ChunkLoc) {
        if let Some(p) = self.packs.get_mut(&at.pack) {
            p.keep_bits.set(at.slot);
        }
    }

    /// Heap bytes of the slot bits.
    pub fn bits_bytes(&self) -> u64 {
        self.packs.values().map(|p| p.live_bits.memory_bytes() + p.keep_bits.memory_bytes()).sum()
    }
}

/// The chunk store. `Send + Sync`; every method takes `&self`.
pub struct ChunkStore {
    pub(crate) storage: Arc<dyn Storage>,
    pub(crate) dir: PathBuf,
    pub(crate) store_id: u64,
    pub(crate) slots_per_pack: u32,
    pub(crate) budget_bytes: u64,
    /// Part of `budget_bytes` lent to others (devices' request buffers, see
    /// [`ChunkStore::lend_memory`]); the index may use only the rest.
    pub(crate) lent_bytes: std::sync::atomic::AtomicU64,
    pub(crate) checkpoint_min_bytes: u64,
    /// Who runs index merges: None, the flush that makes one due.
    pub(crate) merge_tasks: Option<Tasks>,
    pub(crate) index: RwLock<DedupIndex>,
    pub(crate) files: Arc<RwLock<PackFiles>>,
    /// Forward tables of packs GC repacked and deleted (forward.rs).
    pub(crate) forwards: RwLock<forward::Forwards>,
    pub(crate) writer: Mutex<Writer>,
    pub(crate) sync_state: Mutex<SyncState>,
    pub(crate) pins: pin::Pins,
    pub(crate) gc_lock: Mutex<()>,
    pub(crate) cache: ClockCache<Key, Arc<[u8]>, PrefixBuild>,
    /// Which misses enter `cache`.
    pub(crate) admission: admission::Doorkeeper,
    pub(crate) cache_admits_deferred: AtomicU64,
    pub(crate) syncs: AtomicU64,
    /// See [`ChunkStats::read_index_lookups`].
    pub(crate) read_index_lookups: AtomicU64,
    /// See [`ChunkStats::reads_forwarded`].
    pub(crate) reads_forwarded: AtomicU64,
    /// See [`ChunkStats::index_page_reads`].
    pub(crate) index_page_reads: AtomicU64,
    /// See [`ChunkStats::index_merges`] and the two after it.
    pub(crate) index_merges: AtomicU64,
    pub(crate) index_merge_ms_max: AtomicU64,
    pub(crate) index_merge_waits: AtomicU64,
    poisoned: AtomicBool,
    poison_reason: Mutex<String>,
    /// Where the time of [`ChunkStore::open`] went.
    pub(crate) opened: OpenReport,
    /// Where sealed packs go (tier.rs), if anywhere.
    pub(crate) tier: Option<Arc<dyn tier::Tier>>,
}

pub(crate) use crate::sync::lock;

fn corrupt(path: &Path, offset: u64, detail: impl Into<String>) -> Error {
    Error::Corruption { path: path.to_path_buf(), offset, detail: detail.into() }
}

impl Drop for ChunkStore {
    /// Stops the tier's work, cancels a merge of index runs not started
    /// and waits for one running (the next open must not race its writes).
    /// Its run, which no root names yet, is deleted: a clean close leaves
    /// no file an fsck would report as a leftover (if this fails, the next
    /// open deletes it). Nothing is synced: a drop is what the model tests
    /// crash with, and chunks placed but never synced may be lost.
    fn drop(&mut self) {
        if let Some(t) = &self.tier {
            t.stop();
        }
        self.settle_merge();
    }
}

impl ChunkStore {
    /// A clean stop for a process that exits without dropping the store
    /// (the store daemon, whose threads hold it): syncs the chunks placed
    /// since the last sync, so a compaction that the last `del` stopped
    /// leaves them indexed (unreferenced, for GC) rather than a pack no
    /// index entry names, which fsck reports as an orphan; then settles a
    /// merge of index runs as drop does. Work still running after it may
    /// place more: the caller stops what it can first.
    pub fn close(&self) -> Result<()> {
        let synced = self.sync();
        self.settle_merge();
        synced
    }

    /// Cancels a merge of index runs not started, waits for one running,
    /// and deletes its run, which no root names yet.
    fn settle_merge(&self) {
        let job = lock(&self.sync_state).merge.take();
        if let Some(job) = job {
            let run_id = job.run_id;
            job.cancel();
            for name in [dedup::run::run_file_name(run_id), dedup::run::keys_spill_name(run_id)] {
                let path = self.dir.join(name);
                if self.storage.exists(&path) {
                    let _ = self.storage.remove_file(&path);
                }
            }
        }
    }
}

impl ChunkStore {
    /// The id every pack of this store carries (a random number chosen
    /// when the store was made).
    pub fn store_id(&self) -> u64 {
        self.store_id
    }

    pub(crate) fn read_files(&self) -> RwLockReadGuard<'_, PackFiles> {
        self.files.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn write_files(&self) -> RwLockWriteGuard<'_, PackFiles> {
        self.files.write().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn read_index(&self) -> RwLockReadGuard<'_, DedupIndex> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The index for changing; `_writer` proves the writer lock is held.
    pub(crate) fn write_index(&self, _writer: &mut Writer) -> RwLockWriteGuard<'_, DedupIndex> {
        self.index.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a pin of the current GC epoch (see [`ChunkPin`]).
    pub fn pin(&self) -> ChunkPin<'_> {
        ChunkPin { pins: &self.pins, epoch: self.pins.acquire() }
    }

    /// True when chunk `hash` is stored in a live slot (durable or not
    /// yet synced). An index read error counts as not stored.
    pub fn contains(&self, hash: &ChunkHash) -> bool {
        let w = lock(&self.writer);
        let found = self.read_index().find(&hash.tag(), &|at| w.is_live(at));
        found.ok().flatten().is_some_and(|e| e.hash == *hash)
    }

    /// Number of chunks stored (live slots).
    pub fn len(&self) -> u64 {
        lock(&self.writer).packs.values().map(|p| u64::from(p.live)).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the pack files span (headers, live and dead slots).
    pub fn stored_bytes(&self) -> u64 {
        lock(&self.writer).packs.values().map(|p| pack::slot_offset(p.slots)).sum()
    }

    /// Estimated heap bytes of the index (what the budget limits).
    pub fn index_memory_bytes(&self) -> u64 {
        self.memory_bytes(&lock(&self.writer))
    }

    /// What the index may use now: its budget less what is lent.
    pub(crate) fn index_budget_bytes(&self) -> u64 {
        self.budget_bytes.saturating_sub(self.lent_bytes.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Lends `bytes` of the index's budget to another user of the store's
    /// memory (a device's request buffers), if the index's use today leaves
    /// them free; the index then grows only into what is left. Returns
    /// (index bytes in use, bytes lent before) on refusal, for the message.
    pub fn lend_memory(&self, bytes: u64) -> std::result::Result<(), (u64, u64)> {
        use std::sync::atomic::Ordering;
        // The writer lock: no index growth between the check and the loan.
        let w = lock(&self.writer);
        let used = self.memory_bytes(&w);
        let lent = self.lent_bytes.load(Ordering::Acquire);
        if used + lent + bytes > self.budget_bytes {
            return Err((used, lent));
        }
        self.lent_bytes.store(lent + bytes, Ordering::Release);
        Ok(())
    }

    /// Returns what [`ChunkStore::lend_memory`] lent.
    pub fn return_memory(&self, bytes: u64) {
        let _w = lock(&self.writer);
        let lent = self.lent_bytes.load(std::sync::atomic::Ordering::Acquire);
        assert!(bytes <= lent, "returning {bytes} bytes of memory, {lent} were lent");
        self.lent_bytes.store(lent - bytes, std::sync::atomic::Ordering::Release);
    }

    /// The index's estimated heap bytes: the dedup index, the slot bits
    /// and the journal ops not yet synced.
    pub(crate) fn memory_bytes(&self, w: &Writer) -> u64 {
        let pending = (w.pending.len() * std::mem::size_of::<JournalOp>()) as u64;
        self.read_index().memory_bytes() + w.bits_bytes() + pending
    }

    /// Counts `n` syncs issued.
    pub(crate) fn count_syncs(&self, n: u64) {
        self.syncs.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn poison(&self, e: &Error) {
        *lock(&self.poison_reason) = e.to_string();
        self.poisoned.store(true, Ordering::Release);
    }

    pub(crate) fn check_poison(&self) -> Result<()> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Unavailable(
                format!("chunk store {}", self.dir.display()),
                format!("a sync failed earlier ({}); reopen the store", lock(&self.poison_reason)),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
