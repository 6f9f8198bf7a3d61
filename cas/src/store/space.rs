//! The store's space reserve (cas::space): built from the options and the
//! filesystem the store is on, handed to every image, GC and the stats.

use super::{Store, StoreOptions};
use crate::space::{default_reserve_bytes, SpaceReserve};
use crate::storage::Storage;
use std::path::Path;
use std::sync::Arc;

impl Store {
    /// The store's space reserve, for stats and tests.
    pub fn space_reserve(&self) -> &Arc<SpaceReserve> {
        &self.space
    }
}

/// The reserve `opts` asks for over the filesystem holding `dir`: none
/// where its space is unknown (storage in memory without a figure, a
/// statvfs that fails).
pub(super) fn reserve(storage: &Arc<dyn Storage>, dir: &Path, opts: &StoreOptions) -> SpaceReserve {
    let roll_bytes = opts.log_segment_bytes;
    let Some(fs) = storage.space(dir).ok().flatten() else {
        return SpaceReserve::new(0, roll_bytes, opts.space_wait_ms, Box::new(|| None));
    };
    let reserve_bytes = opts.space_reserve_bytes.unwrap_or_else(|| default_reserve_bytes(fs.size_bytes));
    if reserve_bytes > 0 {
        tracing::info!(
            dir = %dir.display(),
            reserve_mib = reserve_bytes >> 20,
            fs_mib = fs.size_bytes >> 20,
            "space reserve for compaction and GC"
        );
    }
    let (storage, dir) = (storage.clone(), dir.to_path_buf());
    // A failed statvfs counts as unknown: the reserve grants.
    let probe = move || storage.space(&dir).ok().flatten().map(|s| s.avail_bytes);
    SpaceReserve::new(reserve_bytes, roll_bytes, opts.space_wait_ms, Box::new(probe))
}
