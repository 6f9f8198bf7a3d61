//! A read looks a block up in the manifest, then reads its chunk. In
//! between, compaction may remap the block (a partial write merged into a
//! new chunk) and GC may sweep the old chunk. The read must then follow the
//! block to its new chunk, not fail: compact_concurrent hit this as
//! `NotFound("chunk ...")` on about one run in ten under load; here a view
//! that runs compaction and GC right after the lookup makes it happen every
//! time.

mod common;

use cas::image::{ChunkRef, ManifestView};
use cas::io::{IoCx, Wait};
use cas::Result;
use common::*;
use std::sync::{Arc, Mutex};

type Hook = Box<dyn FnOnce() + Send>;

/// The image's own view, with a hook run once right after a range lookup.
struct AfterLookup {
    inner: Arc<dyn ManifestView>,
    hook: Mutex<Option<Hook>>,
}

impl ManifestView for AfterLookup {
    fn lookup(&self, block: u64, wait: Wait) -> Result<Option<ChunkRef>> {
        self.inner.lookup(block, wait)
    }

    fn lookup_range(&self, first_block: u64, out: &mut [Option<ChunkRef>], wait: Wait) -> Result<()> {
        self.inner.lookup_range(first_block, out, wait)?;
        if let Some(hook) = self.hook.lock().unwrap().take() {
            hook();
        }
        Ok(())
    }

    fn read_chunk(&self, r: &ChunkRef, out: &mut [u8], cx: IoCx<'_>) -> Result<()> {
        self.inner.read_chunk(r, out, cx)
    }
}

#[test]
fn a_read_follows_a_block_whose_chunk_was_swept_after_its_lookup() {
    let (_mem, store) = mem_store(small_opts());
    store.create_image("a", 1 << 20).unwrap();
    let image = store.open_image("a").unwrap();
    // Block 0 compacted whole from write 1 ...
    image.write(0, &payload(1, 0, 8), false).unwrap();
    image.flush().unwrap();
    store.compact_once(&image).unwrap();
    // ... then half of it rewritten: the log holds sectors 0-3, the
    // manifest's chunk is still the only source of sectors 4-7.
    image.write(0, &payload(2, 0, 4), false).unwrap();
    image.flush().unwrap();

    let swept = Arc::new(Mutex::new(None));
    let hook: Hook = {
        let (store, image, swept) = (store.clone(), image.clone(), swept.clone());
        Box::new(move || {
            // Merges the half write into a new chunk for block 0 and
            // sweeps the chunk the read just looked up.
            store.compact_once(&image).unwrap();
            *swept.lock().unwrap() = Some(store.gc().unwrap().chunks_dead);
        })
    };
    image.set_manifest(Arc::new(AfterLookup { inner: image.manifest_view(), hook: Mutex::new(Some(hook)) }));

    let mut buf = vec![0u8; 4096];
    image.read(0, &mut buf).unwrap();
    assert_eq!(*swept.lock().unwrap(), Some(1), "the hook did not sweep the looked-up chunk");
    for (i, sector) in buf.chunks(SECTOR).enumerate() {
        let want = if i < 4 { 2 } else { 1 };
        assert_eq!(decode_sector(sector, i as u64), Ok(want), "sector {i}");
    }
    let st = image.stats();
    assert_eq!((st.read_chunk_bytes, st.read_log_bytes), (2048, 2048));
}
