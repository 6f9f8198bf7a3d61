//! Chunk GC: reclaims chunks no image's manifest references, separately
//! from compaction and while IO continues.
//!
//! One pass, [`run`], over the chunk store and the set of every image's
//! manifest:
//!
//! ```text
//!  1. epoch    bump the GC epoch to E; wait (bounded) for compaction pins
//!              of epoch E-1: their manifest commits are then done or dropped
//!  2. mark     read every manifest's committed tree (a snapshot taken now),
//!              set the keep bit of the slot each leaf leads to; delete
//!              the forward tables that existed before the mark and that no
//!              leaf's location goes through
//!  3. sweep    free the live slots not kept (not referenced, and not
//!              touched by a compaction batch since the epoch bump); sync
//!  4. repack   for each pack (except the active one) whose dead fraction is
//!              at least the threshold: copy its live chunks to the active
//!              pack, sync (copies, then the index moves), write the pack's
//!              forward table, delete the pack, sync the directory; an
//!              emptied pack is just deleted
//!  5. manifests  rewrite manifest files whose garbage is above their limit
//! ```
//!
//! Guarantees:
//! - a chunk referenced by a manifest commit that completed before the pass
//!   started marking, or inserted / found as a duplicate under a pin that
//!   was live at any point after the epoch bump, is never swept;
//! - any error while marking aborts the pass before anything is swept;
//! - crash at any step: no live chunk is lost and no live slot is in
//!   a deleted pack (see crate::chunk::maintenance for the per-step rules);
//!   a crash may leave dead chunks or an unreferenced pack, which the next
//!   open or pass removes;
//! - one pass at a time (a lock); compaction, reads and syncs continue
//!   throughout, pausing only for bounded lock holds (sweep batches of
//!   4096 entries, repack runs of up to 256 chunks).
//!
//! Why a forward table no leaf used at the mark is never needed again: a
//! leaf names a deleted pack P only if its batch got P's location before
//! the pass that repacked P deleted it, so under a pin of that pass's epoch
//! or older; this pass's epoch bump waited for those pins, so every such
//! leaf is committed and the mark saw it. Later batches get locations from
//! the index, which no longer points into P. A reader holding an older
//! snapshot whose table is gone asks the index.
//!
//! Contract for callers that edit manifests: every chunk ref a commit sets
//! must come from `ChunkStore::insert_located` (or name a chunk stored by
//! `insert_missing`) under a [`ChunkPin`] held until that commit returns.
//!
//! [`ChunkPin`]: crate::chunk::ChunkPin

mod auto;

pub use auto::AutoGcOptions;
pub(crate) use auto::{AutoGcTask, GcHistory, GcShared};

use crate::chunk::{lock, ChunkRef, ChunkStore};
use crate::error::Result;
use crate::manifest::Manifest;
use std::collections::HashSet;
use std::time::Duration;

/// Tunables of a GC pass.
#[derive(Clone, Debug)]
pub struct GcOptions {
    /// Repack a pack once at least this fraction of its slots is dead
    /// (default 0.25).
    pub repack_dead_fraction: f64,
    /// How long to wait for compaction pins of the previous epoch (default
    /// 30 s); past it the pass fails with `Error::Unavailable`.
    pub pin_wait: Duration,
    /// References marked per writer lock hold (default 4096).
    pub mark_batch: usize,
    /// Also rewrite manifests whose garbage is above their limit.
    pub compact_manifests: bool,
}

impl Default for GcOptions {
    fn default() -> Self {
        GcOptions {
            repack_dead_fraction: 0.25,
            pin_wait: Duration::from_secs(30),
            mark_batch: 4096,
            compact_manifests: true,
        }
    }
}

/// What a pass found and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct GcReport {
    pub epoch: u32,
    pub manifests: u64,
    /// Mapped blocks read from the manifests.
    pub references: u64,
    /// References to chunks the store does not have (damage; logged).
    pub missing_references: u64,
    /// Index entries examined by the sweep.
    pub chunks_scanned: u64,
    /// Index entries swept.
    pub chunks_dead: u64,
    pub packs_rewritten: u64,
    pub packs_deleted: u64,
    pub chunks_moved: u64,
    /// Of those, chunks no index entry named, moved by their content (a
    /// second copy whose entry a merge dropped; see ChunkStore::gc_repack).
    pub chunks_adopted: u64,
    pub bytes_moved: u64,
    /// Pack bytes deleted minus bytes written to move live chunks.
    pub bytes_reclaimed: i64,
    pub manifests_compacted: u64,
    pub manifest_pages_reclaimed: u64,
    /// Forward tables deleted: no manifest named their packs any more.
    pub forward_tables_retired: u64,
    /// The active pack was closed to be repacked (enough of it was dead).
    pub active_pack_retired: bool,
}

/// Runs one GC pass over `chunks`, treating `manifests` as every image's
/// manifest (see the module docs).
pub fn run(chunks: &ChunkStore, manifests: &[&Manifest], opts: &GcOptions) -> Result<GcReport> {
    let _one_pass = lock(&chunks.gc_lock);
    let epoch = chunks.gc_advance_epoch(opts.pin_wait)?;
    let mut report = GcReport { epoch, manifests: manifests.len() as u64, ..GcReport::default() };

    // Mark. Any error returns before the sweep. Also note which forward
    // tables the leaves' locations go through.
    let tables = chunks.forward_ids();
    let mut routed = HashSet::new();
    let mut batch: Vec<ChunkRef> = Vec::with_capacity(opts.mark_batch.clamp(1, 1 << 16));
    for m in manifests {
        for item in m.iter() {
            let (_, r) = item?;
            batch.push(r);
            if let Some(at) = r.at.filter(|_| !tables.is_empty()) {
                chunks.note_forward_route(at, &tables, &mut routed);
            }
            if batch.len() == batch.capacity() {
                report.missing_references += chunks.gc_mark(epoch, &batch)?;
                report.references += batch.len() as u64;
                batch.clear();
            }
        }
    }
    report.missing_references += chunks.gc_mark(epoch, &batch)?;
    report.references += batch.len() as u64;
    if report.missing_references > 0 {
        tracing::error!(
            missing = report.missing_references,
            "manifests reference chunks the chunk store does not have"
        );
    }

    // Tables no leaf goes through: no leaf can come to (see the module docs).
    report.forward_tables_retired = chunks.retire_forwards(tables.difference(&routed).copied())?;

    // Sweep, durably.
    let swept = chunks.gc_sweep(epoch)?;
    report.chunks_scanned = swept.scanned;
    report.chunks_dead = swept.removed;
    chunks.sync()?;

    // Repack; the active pack too, once enough of it is dead.
    report.active_pack_retired = chunks.gc_retire_active(opts.repack_dead_fraction);
    for usage in chunks.pack_usage() {
        if usage.active || usage.sealed || usage.slots == 0 {
            continue;
        }
        if usage.live == 0 {
            report.bytes_reclaimed += chunks.gc_delete_pack(usage.id, Vec::new())? as i64;
            report.packs_deleted += 1;
        } else if usage.dead_fraction() >= opts.repack_dead_fraction {
            let moved = chunks.gc_repack(usage.id)?;
            report.chunks_moved += moved.moved;
            report.chunks_adopted += moved.adopted;
            report.bytes_moved += moved.bytes_written;
            let freed = chunks.gc_delete_pack(usage.id, moved.moves)?;
            report.bytes_reclaimed += freed as i64 - moved.bytes_written as i64;
            report.packs_rewritten += 1;
            report.packs_deleted += 1;
        }
    }

    if opts.compact_manifests {
        for m in manifests {
            if let Some(r) = m.compact_if_needed()? {
                report.manifests_compacted += 1;
                report.manifest_pages_reclaimed += r.pages_before - r.pages_after;
            }
        }
    }
    tracing::info!(?report, "chunk GC pass done");
    Ok(report)
}
