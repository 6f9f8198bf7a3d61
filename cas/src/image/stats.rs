//! Per-image counters, and the plain structs that report them: what
//! `casblk stats` shows for an image under `cas` ([`ImageStats`]), the
//! compaction work in it ([`CompactStats`]: counted by `cas::compact`, kept
//! per image by the store, which fills it in: `Store::image_stats`), and
//! its publication to the bucket ([`PublishCounters`]: counted by
//! `cas::bucket::manifests`, filled in the same way); and `Image::stats`,
//! which assembles an image's own part.

use super::{read_lock, Image};
use crate::wal::RecoveryReport;
use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters; every field only grows.
#[derive(Default, Debug)]
pub struct Counters {
    pub write_records: AtomicU64,
    pub zero_records: AtomicU64,
    pub discard_records: AtomicU64,
    pub pad_records: AtomicU64,
    pub log_bytes_written: AtomicU64,
    pub payload_bytes_written: AtomicU64,
    pub writes: AtomicU64,
    pub write_errors: AtomicU64,
    pub fua_writes: AtomicU64,
    pub flushes: AtomicU64,
    pub sync_rounds: AtomicU64,
    pub syncs: AtomicU64,
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub read_log_bytes: AtomicU64,
    pub read_zero_bytes: AtomicU64,
    pub read_hole_bytes: AtomicU64,
    pub read_chunk_bytes: AtomicU64,
    pub capacity_waits: AtomicU64,
    pub segments_reclaimed: AtomicU64,
    pub reclaim_deferred: AtomicU64,
}

pub(crate) fn bump(c: &AtomicU64, by: u64) {
    c.fetch_add(by, Ordering::Relaxed);
}

impl Image {
    /// The image's own counters and state, as a plain struct. The
    /// compactor's part (`compaction`, `covered_seq`) is the store's to add:
    /// `Store::image_stats`.
    pub fn stats(&self) -> ImageStats {
        let mut s = ImageStats::default();
        self.counters.fill(&mut s);
        s.log_used_bytes = self.capacity.consumed_bytes();
        s.log_reserved_bytes = self.capacity.reserved_bytes();
        s.log_quota_bytes = self.capacity.quota_bytes();
        s.log_segments = self.log.segment_count() as u64;
        s.overlay_extents = read_lock(&self.overlay).extent_count() as u64;
        s.next_seq = self.log.next_seq();
        s.durable_seq = self.durability.durable_seq();
        s.writeback_syncs = self.writeback.syncs.load(Ordering::Relaxed);
        s.recovery = self.recovery.clone();
        s.size_bytes = self.size_bytes();
        s
    }
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// A snapshot of one image's counters and state.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ImageStats {
    /// Records appended, by kind (PAD: slots voided after a failed write).
    pub write_records: u64,
    pub zero_records: u64,
    pub discard_records: u64,
    pub pad_records: u64,
    /// Log bytes appended (headers + payload) and payload bytes alone.
    pub log_bytes_written: u64,
    pub payload_bytes_written: u64,
    /// WRITE requests served, failed, and with FUA.
    pub writes: u64,
    pub write_errors: u64,
    pub fua_writes: u64,
    /// FLUSH requests served.
    pub flushes: u64,
    /// Group-commit rounds, and the file syncs they issued.
    pub sync_rounds: u64,
    pub syncs: u64,
    /// Closed segments synced early by the writeback thread.
    pub writeback_syncs: u64,
    /// READ requests, their bytes, and where the bytes came from.
    pub reads: u64,
    pub read_bytes: u64,
    pub read_log_bytes: u64,
    pub read_zero_bytes: u64,
    pub read_hole_bytes: u64,
    pub read_chunk_bytes: u64,
    /// Writes that had to wait for log capacity, each counted once however
    /// long it waited: blocking writes, and the daemon's scheduled writes
    /// that waited at its `log_capacity` gate (so the two counts agree).
    pub capacity_waits: u64,
    pub segments_reclaimed: u64,
    /// Covered segments whose deletion waited for a later reclamation
    /// because a read or scan still pinned them.
    pub reclaim_deferred: u64,
    /// State now: the image's size (it changes on resize), the log's use.
    pub size_bytes: u64,
    pub log_used_bytes: u64,
    pub log_reserved_bytes: u64,
    pub log_quota_bytes: u64,
    pub log_segments: u64,
    pub overlay_extents: u64,
    pub next_seq: u64,
    pub durable_seq: u64,
    /// The seq the manifest covers: records at or below it are compacted
    /// (filled in by the store, like `compaction`).
    pub covered_seq: u64,
    /// What the last open recovered.
    pub recovery: RecoveryReport,
    /// Compaction work: filled in by the store (`Store::image_stats`) from
    /// the state it keeps per image; zeros from `Image::stats` alone and
    /// for an image the store does not compact.
    pub compaction: CompactStats,
    /// Publication to the store's bucket: filled in by the store
    /// (`Store::image_stats`); zeros without a bucket.
    pub remote: PublishCounters,
}

impl Counters {
    /// Fills the counter fields of `s`.
    pub fn fill(&self, s: &mut ImageStats) {
        s.write_records = get(&self.write_records);
        s.zero_records = get(&self.zero_records);
        s.discard_records = get(&self.discard_records);
        s.pad_records = get(&self.pad_records);
        s.log_bytes_written = get(&self.log_bytes_written);
        s.payload_bytes_written = get(&self.payload_bytes_written);
        s.writes = get(&self.writes);
        s.write_errors = get(&self.write_errors);
        s.fua_writes = get(&self.fua_writes);
        s.flushes = get(&self.flushes);
        s.sync_rounds = get(&self.sync_rounds);
        s.syncs = get(&self.syncs);
        s.reads = get(&self.reads);
        s.read_bytes = get(&self.read_bytes);
        s.read_log_bytes = get(&self.read_log_bytes);
        s.read_zero_bytes = get(&self.read_zero_bytes);
        s.read_hole_bytes = get(&self.read_hole_bytes);
        s.read_chunk_bytes = get(&self.read_chunk_bytes);
        s.capacity_waits = get(&self.capacity_waits);
        s.segments_reclaimed = get(&self.segments_reclaimed);
        s.reclaim_deferred = get(&self.reclaim_deferred);
    }
}

/// Declares the counter struct and a field-wise `add`.
macro_rules! counters {
    ($(#[$meta:meta])* pub struct $name:ident { $($(#[$fmeta:meta])* pub $field:ident,)* }) => {
        $(#[$meta])*
        pub struct $name { $($(#[$fmeta])* pub $field: u64,)* }

        impl $name {
            /// Adds every counter of `other` to `self`.
            pub fn add(&mut self, other: &$name) {
                $(self.$field += other.$field;)*
            }
        }
    };
}

counters! {
    /// Compaction work, all counters (no state; see
    /// `cas::compact::CompactReport` and [`ImageStats`] for positions).
    /// They are the seed's per-input-MiB table made countable: divide by
    /// `input_bytes / 2^20` to get bytes initialised, background reads,
    /// manifest pages written and syncs per MiB of compacted log.
    #[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
    pub struct CompactStats {
        /// Passes run (each drains the durable log in batches).
        pub passes,
        /// Batches committed, and those of them that joined an earlier
        /// batch's commit (the commit thread groups the batches queued
        /// while it was busy): `batches - grouped_batches` manifest commits.
        pub batches,
        pub grouped_batches,
        /// Log records compacted (PAD included).
        pub records,
        /// WRITE payload bytes compacted: the "input" of the per-MiB ratios.
        pub input_bytes,
        /// WRITE_ZEROES / DISCARD bytes compacted.
        pub zeroed_bytes,
        /// Blocks mapped to a chunk, and those whole blocks of them whose
        /// hash the inserting thread computed because its queue was short
        /// (`cas::compact::blocks`).
        pub blocks_mapped,
        pub blocks_hashed_by_inserter,
        /// Blocks made holes (zero data, WRITE_ZEROES, DISCARD).
        pub blocks_holes,
        /// Blocks only partly rewritten in a batch, merged with their older
        /// content (chunk or hole).
        pub blocks_merged,
        /// Blocks whose chunk a commit unmapped or replaced (each may have
        /// left a chunk for GC: cas::gc::auto counts them).
        pub refs_dropped,
        /// Chunks stored new, and chunks found already stored.
        pub chunks_new,
        pub chunks_dup,
        /// Bytes written to pack files.
        pub chunk_bytes_written,
        /// Bytes of buffers filled before use: buffer growth (zeroed once,
        /// then reused), merge scratch, and the manifest commit's own.
        pub bytes_initialized,
        /// Read calls the compactor issued (log scans, merge bases), and bytes.
        pub background_reads,
        pub background_read_bytes,
        /// Manifest pages written, and distinct leaves the batches edited
        /// (summed per commit).
        pub manifest_pages_written,
        pub manifest_leaf_pages_touched,
        /// fdatasync / directory syncs: chunk store, manifest, log forced
        /// durable by the compactor, reclamation.
        pub syncs,
        /// Times the compactor made the log durable itself (pressure and no
        /// FLUSH from the guest).
        pub forced_log_syncs,
        /// Passes whose cursor did not validate and fell back to a scan.
        pub cursor_fallbacks,
        /// Log bytes returned to the quota, segments deleted.
        pub log_bytes_reclaimed,
        pub segments_reclaimed,
        /// Covered current segments closed so that they could be reclaimed.
        pub segment_rolls,
        /// Batches cut short, or passes deferred, by the memory budget.
        pub budget_waits,
        /// Passes that failed.
        pub errors,
        /// Time (ns) reading and scanning the log, hashing (on either
        /// thread), inserting chunks (its hashing not included), and
        /// committing (chunk sync, manifest commit, reclamation).
        pub read_ns,
        pub hash_ns,
        pub insert_ns,
        pub commit_ns,
    }
}

/// Publication's figures for one image, numbers only (the stats socket's
/// counters, `images[].counters.cas.remote.*`; all zero without a
/// bucket): counted by `cas::bucket::manifests`, filled in by the store, defined
/// here beside [`CompactStats`] so that an image names nothing above it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PublishCounters {
    /// The newest root in the bucket: its generation and the log seq it
    /// covers (0: none published since open).
    pub published_generation: u64,
    pub published_covered_seq: u64,
    /// The local manifest's generation.
    pub manifest_generation: u64,
    /// Age of the oldest commit not yet in the bucket (0: none): the
    /// window's age.
    pub unpublished_ms: u64,
    /// Page ranges the newest root lists.
    pub ranges: u64,
    pub publications: u64,
    pub pages_sent: u64,
    /// Rounds that failed (each is retried).
    pub errors: u64,
    /// The epoch of the store's lease on the image (0: no lease).
    pub lease_epoch: u64,
    pub lease_lost: bool,
    pub refused: bool,
    /// Superseded roots and page ranges deleted from the bucket, and those
    /// waiting for their grace period (`cas::bucket::manifests::superseded`).
    pub superseded_deleted: u64,
    pub superseded_pending: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_is_field_wise() {
        let mut a = CompactStats { records: 2, syncs: 1, ..CompactStats::default() };
        let b = CompactStats { records: 3, hash_ns: 7, ..CompactStats::default() };
        a.add(&b);
        assert_eq!((a.records, a.syncs, a.hash_ns), (5, 1, 7));
    }
}
