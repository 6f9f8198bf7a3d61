//! Compaction work counters: cumulative per image ([`CompactStats`], in
//! `ImageStats::compaction`) and per pass ([`CompactReport`]).
//!
//! They are the seed's per-input-MiB table made countable: divide by
//! `input_bytes / 2^20` to get bytes initialised, background reads,
//! manifest pages written and syncs per MiB of compacted log.

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
    /// Compaction work, all counters (no state; see [`CompactReport`] and
    /// `ImageStats` for positions).
    #[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
    pub struct CompactStats {
        /// Passes run (each drains the durable log in batches).
        pub passes,
        /// Batches committed: one manifest commit each.
        pub batches,
        /// Log records compacted (PAD included).
        pub records,
        /// WRITE payload bytes compacted: the "input" of the per-MiB ratios.
        pub input_bytes,
        /// WRITE_ZEROES / DISCARD bytes compacted.
        pub zeroed_bytes,
        /// Blocks mapped to a chunk.
        pub blocks_mapped,
        /// Blocks made holes (zero data, WRITE_ZEROES, DISCARD).
        pub blocks_holes,
        /// Blocks only partly rewritten in a batch, merged with their older
        /// content (chunk or hole).
        pub blocks_merged,
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
        /// Time (ns) reading and scanning the log, hashing, inserting chunks,
        /// and committing (chunk sync, manifest commit, reclamation).
        pub read_ns,
        pub hash_ns,
        pub insert_ns,
        pub commit_ns,
    }
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CompactReport {
    /// The manifest's covered seq before and after the pass.
    pub covered_before: u64,
    pub covered_after: u64,
    /// The durable seq the pass drained towards.
    pub durable_seq: u64,
    pub work: CompactStats,
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
