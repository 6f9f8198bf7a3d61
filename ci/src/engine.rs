//! The engine `ci/bench sched` and `ci/bench path` drive: a real
//! `cas::Store` on `FsStorage` in a scratch directory under `target/bench`
//! (removed when the `Engine` drops), with background compaction on and
//! images as the caller names them. The request path (`serve`) attaches
//! them as the daemon does. `seed` fills an image and `settle` waits until
//! compaction has moved its log into chunks, so reads then go overlay
//! (empty) -> manifest -> chunk cache or pack file; `mark`/`delta` tell
//! what the engine did in between.
//!
//! ```text
//!  target/bench/scratch-NAME-PID/store   one store per Engine
//!    images: (id, name, bytes) as created; each with its own log
//! ```

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::Scratch;
use cas::image::Image;
use cas::{ImageStats, Store, StoreOptions};
use sched::ImageId;

const MIB: u64 = 1 << 20;
/// The most a settle (flush, then compaction catching up) may take.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(120);

/// The store and its two images. Fields drop in order: the store (and its
/// compactor) before the scratch directory it lives in.
pub struct Engine {
    images: HashMap<ImageId, Arc<Image>>,
    store: Arc<Store>,
    _scratch: Scratch,
}

impl Engine {
    /// Creates a store with `opts` in scratch directory `scratch_name` and
    /// one image per `(id, name, bytes)`.
    pub fn create(scratch_name: &str, opts: StoreOptions, images: &[(ImageId, &str, u64)]) -> Engine {
        let scratch = Scratch::new(scratch_name);
        let storage: Arc<dyn cas::storage::Storage> = Arc::new(cas::storage::FsStorage::new());
        let store = Store::create(storage, &scratch.0.join("store"), opts).expect("create the store");
        let images = images
            .iter()
            .map(|&(id, name, bytes)| {
                store.create_image(name, bytes).expect("create an image");
                (id, store.open_image(name).expect("open an image"))
            })
            .collect();
        Engine { images, store, _scratch: scratch }
    }

    pub fn image(&self, id: ImageId) -> &Arc<Image> {
        &self.images[&id]
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Lends `bytes` of the store's memory budget for a device's tag
    /// buffers, as the daemon does when it attaches an image.
    pub fn lend(&self, bytes: u64) -> cas::store::MemoryLoan {
        self.store.lend_memory(bytes, "the benchmark's tag buffers").expect("tag buffers within the budget")
    }

    /// Writes `fill(offset, block)` over the first `bytes` of image `id` in
    /// 1 MiB writes (waiting for log capacity like any writer), then
    /// settles it.
    pub fn seed(&self, id: ImageId, bytes: u64, fill: impl Fn(u64, &mut [u8])) {
        let image = self.image(id);
        filled_mib(bytes, fill, |offset, data| image.write(offset, data, false).expect("seed an image"));
        self.settle(id);
    }

    /// Flushes image `id` and waits until the compactor has moved all of
    /// its log into chunks and reclaimed it: afterwards every read of the
    /// image goes to the manifest and the chunk store.
    pub fn settle(&self, id: ImageId) {
        let image = self.image(id);
        image.flush().expect("flush an image");
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            let s = self.store.image_stats(image);
            if s.overlay_extents == 0 && s.covered_seq >= s.durable_seq {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "image {id}: compaction did not catch up within {SETTLE_TIMEOUT:?} \
                 (covered seq {}, durable seq {}, {} overlay extents)",
                s.covered_seq,
                s.durable_seq,
                s.overlay_extents
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Calls `write(offset, data)` for the first `bytes` of a device in 1 MiB
/// pieces (the last one shorter), each 4 KiB block of `data` holding
/// `fill(its offset, block)`.
pub fn filled_mib(bytes: u64, fill: impl Fn(u64, &mut [u8]), mut write: impl FnMut(u64, &[u8])) {
    let mut chunk = vec![0u8; MIB as usize];
    for offset in (0..bytes).step_by(MIB as usize) {
        let n = MIB.min(bytes - offset) as usize;
        for (i, block) in chunk[..n].chunks_mut(4096).enumerate() {
            fill(offset + i as u64 * 4096, block);
        }
        write(offset, &chunk[..n]);
    }
}

/// What the engine did during one arm: differences of its counters.
#[derive(Clone, Debug, Default)]
pub struct EngineDelta {
    pub read_bytes: u64,
    pub read_log_bytes: u64,
    pub read_chunk_bytes: u64,
    pub read_hole_bytes: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub payload_bytes_written: u64,
    pub compacted_bytes: u64,
    pub segments_reclaimed: u64,
    pub forced_log_syncs: u64,
}

/// Counters of the whole engine at one moment.
pub struct EngineMark {
    images: Vec<ImageStats>,
    chunks: cas::chunk::ChunkStats,
}

impl Engine {
    pub fn mark(&self) -> EngineMark {
        let mut ids: Vec<_> = self.images.keys().copied().collect();
        ids.sort();
        EngineMark {
            images: ids.iter().map(|id| self.store.image_stats(&self.images[id])).collect(),
            chunks: self.store.chunk_stats(),
        }
    }
}

impl EngineMark {
    /// What happened between `self` (earlier) and `later`, summed over images.
    pub fn delta(&self, later: &EngineMark) -> EngineDelta {
        let mut d = EngineDelta {
            cache_hits: later.chunks.cache_hits - self.chunks.cache_hits,
            cache_misses: later.chunks.cache_misses - self.chunks.cache_misses,
            ..EngineDelta::default()
        };
        for (a, b) in self.images.iter().zip(&later.images) {
            d.read_bytes += b.read_bytes - a.read_bytes;
            d.read_log_bytes += b.read_log_bytes - a.read_log_bytes;
            d.read_chunk_bytes += b.read_chunk_bytes - a.read_chunk_bytes;
            d.read_hole_bytes += b.read_hole_bytes - a.read_hole_bytes;
            d.payload_bytes_written += b.payload_bytes_written - a.payload_bytes_written;
            d.compacted_bytes += b.compaction.input_bytes - a.compaction.input_bytes;
            d.segments_reclaimed += b.segments_reclaimed - a.segments_reclaimed;
            d.forced_log_syncs += b.compaction.forced_log_syncs - a.compaction.forced_log_syncs;
        }
        d
    }
}
