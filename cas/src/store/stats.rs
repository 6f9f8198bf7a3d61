//! What the store reports across its parts: the chunk store's counters,
//! space and dedup over every image ([`SpaceStats`]), and an image's own
//! counters with what the compactor and the publisher count for it.

use super::Store;
use crate::chunk::ChunkStats;
use crate::error::Result;
use crate::image::{Image, ImageStats};
use crate::sync::lock;
use crate::units::BLOCK_BYTES;

/// What `list_images` says about one image.
/// See [`Store::space_stats`].
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct SpaceStats {
    pub images: u64,
    /// Blocks the manifests map to chunks, summed over images.
    pub mapped_blocks: u64,
    pub mapped_bytes: u64,
    /// Distinct chunks stored, and their bytes.
    pub chunks: u64,
    pub unique_bytes: u64,
    /// Pack file bytes (headers and dead slots included).
    pub stored_bytes: u64,
    /// mapped_blocks / chunks: how many mapped blocks each stored chunk serves.
    pub dedup_ratio: f64,
    /// GC passes this process finished (manual and automatic), the
    /// automatic ones, automatic passes that failed, and the pack bytes
    /// the finished ones gave back.
    pub gc_passes: u64,
    pub gc_auto_passes: u64,
    pub gc_auto_failures: u64,
    pub gc_reclaimed_bytes: u64,
    /// Physical space: the size of the filesystem the store is on and what
    /// is left of it (0 where the storage cannot tell), the sum of the
    /// writable images' sizes (what the guests were promised; snapshots
    /// and replicas add nothing they can write), and that sum over the
    /// filesystem's size (above 1: thin provisioning overcommits).
    pub fs_size_bytes: u64,
    pub fs_avail_bytes: u64,
    pub provisioned_bytes: u64,
    pub overcommit_ratio: f64,
    /// The space reserve (cas::space; 0: none), its state (0 ok, 1 low:
    /// writes that need new space wait, 2 exhausted: they fail with
    /// ENOSPC), and its counters: asks told to wait (a held write asks
    /// again every 100 ms), asks refused, and times the store went below
    /// it.
    pub space_reserve_bytes: u64,
    pub space_state: u8,
    pub space_waits: u64,
    pub space_refusals: u64,
    pub space_low_episodes: u64,
    /// Grace rolls granted: one WRITE per image per episode may roll
    /// while half the reserve is left.
    pub space_graces: u64,
}

impl Store {
    pub fn chunk_stats(&self) -> ChunkStats {
        self.chunks.stats()
    }

    /// Space across the whole store: what the images' manifests map, what
    /// the chunk store holds, and the dedup ratio between them (compacted
    /// data only; the logs' overlays are not counted).
    pub fn space_stats(&self) -> Result<SpaceStats> {
        let chunks = self.chunks.stats();
        let mut s =
            SpaceStats { chunks: chunks.chunks, stored_bytes: chunks.stored_bytes, ..SpaceStats::default() };
        for info in self.list_images()? {
            s.images += 1;
            s.mapped_blocks += self.manifest(&info.name)?.stats().mapped_blocks;
            if info.kind == super::ImageKind::Image {
                s.provisioned_bytes += info.size_bytes;
            }
        }
        if let Some(fs) = self.storage.space(&self.dir)? {
            (s.fs_size_bytes, s.fs_avail_bytes) = (fs.size_bytes, fs.avail_bytes);
            if fs.size_bytes > 0 {
                s.overcommit_ratio = s.provisioned_bytes as f64 / fs.size_bytes as f64;
            }
        }
        s.mapped_bytes = s.mapped_blocks * BLOCK_BYTES;
        s.unique_bytes = s.chunks * BLOCK_BYTES;
        s.dedup_ratio = if s.chunks == 0 { 1.0 } else { s.mapped_blocks as f64 / s.chunks as f64 };
        let c = self.space.counters();
        (s.space_reserve_bytes, s.space_state) = (self.space.reserve_bytes(), self.space.phase().code());
        (s.space_waits, s.space_refusals, s.space_low_episodes, s.space_graces) =
            (c.waits, c.refusals, c.low_episodes, c.graces);
        let gc = *lock(&self.gc.history);
        (s.gc_passes, s.gc_auto_passes, s.gc_auto_failures, s.gc_reclaimed_bytes) =
            (gc.passes, gc.auto_passes, gc.auto_failures, gc.reclaimed_bytes);
        Ok(s)
    }

    /// `image`'s counters and state ([`Image::stats`]) with the compactor's
    /// part filled in: its work counters and the seq its manifest covers.
    pub fn image_stats(&self, image: &Image) -> ImageStats {
        let mut s = image.stats();
        if let Some(c) = self.compaction(image) {
            s.compaction = c.stats();
            s.covered_seq = c.manifest().covered();
        }
        if let Some(p) = self.publish_stats(image.name()) {
            s.remote = p.counters;
        }
        s
    }
}
