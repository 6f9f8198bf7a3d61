//! The image read path's view of compacted data: one image's manifest
//! plus the shared chunk store, as the [`ManifestView`] an `Image` reads
//! through for every block its log overlay does not hold.

use super::Manifest;
use crate::chunk::{ChunkRef, ChunkStore};
use crate::error::Result;
use crate::image::ManifestView;
use crate::io::{IoCx, Wait};
use std::sync::Arc;

/// An image's compacted data: block -> chunk through `manifest`, chunk
/// bytes (through the clean cache) from `chunks`.
pub struct CompactedView {
    pub manifest: Arc<Manifest>,
    pub chunks: Arc<ChunkStore>,
}

impl ManifestView for CompactedView {
    fn lookup(&self, block: u64, wait: Wait) -> Result<Option<ChunkRef>> {
        self.manifest.lookup_in(block, wait)
    }

    fn lookup_range(&self, first_block: u64, out: &mut [Option<ChunkRef>], wait: Wait) -> Result<()> {
        self.manifest.lookup_range_in(first_block, out, wait)
    }

    fn read_chunk(&self, r: &ChunkRef, out: &mut [u8], cx: IoCx<'_>) -> Result<()> {
        self.chunks.read_ref_in(r, out, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::{ChunkHash, ChunkStoreOptions};
    use crate::manifest::ManifestOptions;
    use crate::storage::{MemStorage, Storage};
    use crate::units::BLOCK_BYTES;
    use std::path::Path;

    #[test]
    fn reads_mapped_blocks_and_holes() {
        let s: Arc<dyn Storage> = Arc::new(MemStorage::new());
        s.create_dir_all(Path::new("/img")).unwrap();
        let chunks = Arc::new(
            ChunkStore::open(s.clone(), Path::new("/chunks"), ChunkStoreOptions::default()).unwrap(),
        );
        let manifest =
            Arc::new(Manifest::open(s, Path::new("/img/manifest"), ManifestOptions::default()).unwrap());
        let data = vec![0x5au8; BLOCK_BYTES as usize];
        let h = ChunkHash::of(&data);
        let pin = chunks.pin();
        chunks.insert_missing(&pin, &[(h, &data)]).unwrap();
        chunks.sync().unwrap();
        let mut e = manifest.begin();
        e.set(3, Some(h.into()));
        e.commit(1).unwrap();
        drop(pin);
        let view: Arc<dyn ManifestView> = Arc::new(CompactedView { manifest, chunks });
        assert_eq!(view.lookup(2, Wait::Block).unwrap(), None);
        let got = view.lookup(3, Wait::Block).unwrap().unwrap();
        let mut out = vec![0u8; BLOCK_BYTES as usize];
        view.read_chunk(&got, &mut out, IoCx::default()).unwrap();
        assert_eq!(out, data);
    }
}
