//! What the chunk store reports: its counters ([`ChunkStats`]), what one
//! insert did ([`InsertStats`]) and where an open's time went
//! ([`OpenReport`]).

use super::{lock, pack, ChunkStore};
use crate::dedup;
use std::sync::atomic::Ordering;

/// What one `insert_missing` call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InsertStats {
    /// Chunks written now.
    pub new_chunks: u64,
    /// Chunks already stored (or repeated within the call).
    pub dup_chunks: u64,
    /// Bytes written to pack files (chunks plus headers of new packs).
    pub bytes_written: u64,
}

/// A snapshot of the store's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ChunkStats {
    pub chunks: u64,
    pub packs: u64,
    /// Bytes the pack files span (headers, live and dead slots).
    pub stored_bytes: u64,
    /// Slots that hold no live chunk (swept, or crash garbage).
    pub dead_slots: u64,
    pub index_memory_bytes: u64,
    pub index_journal_bytes: u64,
    /// Runs of the on-disk dedup index, and the entries they hold (stale
    /// ones included, until a merge drops them).
    pub index_runs: u64,
    pub index_run_entries: u64,
    /// Fraction of hash space the summary covers, in millionths (1,000,000:
    /// exact dedup; less once the index outgrew its memory budget), and
    /// the run entries it summarizes.
    pub index_summary_fraction_ppm: u64,
    pub index_summary_entries: u64,
    /// Run pages read by dedup lookups.
    pub index_page_reads: u64,
    /// Merges of index runs installed, the longest one's time, and the
    /// syncs that waited for a merge because the runs had piled up.
    pub index_merges: u64,
    pub index_merge_ms_max: u64,
    pub index_merge_waits: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_entries: u64,
    /// Misses not admitted to the cache: a chunk enters it on its second
    /// miss within a window, not its first (admission.rs).
    pub cache_admits_deferred: u64,
    /// fdatasync and directory syncs the store has issued.
    pub syncs: u64,
    /// Chunk reads that had to find their chunk in the index: reads by
    /// hash, of unlocated refs (leaves written before locations), and of
    /// refs whose pack GC deleted with no forward table leading on. Reads
    /// of located refs, forwarded or not, do not count.
    pub read_index_lookups: u64,
    /// Chunk reads that found their chunk through forward tables (its pack
    /// was repacked and deleted), without the index.
    pub reads_forwarded: u64,
    /// Forward tables kept for leaves that still name deleted packs.
    pub forward_tables: u64,
}

/// What opening the chunk store read and where its time went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct OpenReport {
    /// Live chunks after the journal's replay.
    pub entries: u64,
    /// Runs opened (header, fences, summary keys) and their entries.
    pub runs: u64,
    pub run_entries: u64,
    pub runs_ms: u64,
    /// The journal predates the on-disk index and was written out as its
    /// first run.
    pub migrated: bool,
    pub journal_batches: u64,
    pub journal_bytes: u64,
    /// Replaying the journal into the index.
    pub journal_ms: u64,
    /// How the replay's wall time divided: on a CPU, waiting for one,
    /// asleep (I/O, faults).
    pub journal_time: crate::thread_time::TimeSplit,
    /// Of `journal_ms`, reading and checking batches (the rest applied
    /// their records to the tables); and the records applied.
    pub journal_read_ms: u64,
    pub journal_puts: u64,
    pub journal_removes: u64,
    pub journal_frees: u64,
    /// Checking the referenced packs and deleting unreferenced ones.
    pub packs_checked: u64,
    pub packs_removed: u64,
    pub packs_ms: u64,
    pub total_ms: u64,
}

impl ChunkStore {
    /// What opening this chunk store read, and where its time went.
    pub fn open_report(&self) -> OpenReport {
        self.opened
    }

    pub fn stats(&self) -> ChunkStats {
        let journal_bytes = lock(&self.sync_state).journal.len_bytes();
        let chunks = self.len();
        let w = lock(&self.writer);
        let (runs, run_entries, fraction, summarized) = {
            let idx = self.read_index();
            let limit = idx.summary_limit() as u64;
            let fraction = limit * 1_000_000 / dedup::summary::PARTITIONS as u64;
            (idx.runs().count() as u64, idx.runs().map(|r| r.entries).sum(), fraction, idx.summarized())
        };
        ChunkStats {
            chunks,
            packs: w.packs.len() as u64,
            stored_bytes: w.packs.values().map(|p| pack::slot_offset(p.slots)).sum(),
            dead_slots: w.packs.values().map(|p| u64::from(p.slots - p.live)).sum(),
            index_memory_bytes: self.memory_bytes(&w),
            index_journal_bytes: journal_bytes,
            index_runs: runs,
            index_run_entries: run_entries,
            index_summary_fraction_ppm: fraction,
            index_summary_entries: summarized,
            index_page_reads: self.index_page_reads.load(Ordering::Relaxed),
            index_merges: self.index_merges.load(Ordering::Relaxed),
            index_merge_ms_max: self.index_merge_ms_max.load(Ordering::Relaxed),
            index_merge_waits: self.index_merge_waits.load(Ordering::Relaxed),
            cache_hits: self.cache.hits(),
            cache_misses: self.cache.misses(),
            cache_entries: self.cache.len() as u64,
            cache_admits_deferred: self.cache_admits_deferred.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            read_index_lookups: self.read_index_lookups.load(Ordering::Relaxed),
            reads_forwarded: self.reads_forwarded.load(Ordering::Relaxed),
            forward_tables: self.forwards.read().unwrap_or_else(|p| p.into_inner()).len() as u64,
        }
    }
}
