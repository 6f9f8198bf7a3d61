//! Deduplication through the whole path: four images written with the same
//! 64 MiB plus some blocks of their own, compacted; the chunk store's bytes
//! must hold the shared content once.

mod common;

use cas::storage::MemStorage;
use cas::{Store, StoreOptions};
use common::*;
use std::sync::Arc;

const SHARED_BYTES: u64 = 64 << 20;
const UNIQUE_BLOCKS: u64 = 256;
const IMAGES: u64 = 4;
const MIB: u64 = 1 << 20;

/// Block `i` of the shared content: distinct from every other block.
fn shared_block(i: u64, out: &mut [u8]) {
    fill_sector(out, 1 + i, i);
    out[512..].iter_mut().enumerate().for_each(|(j, b)| *b = (i as u8) ^ (j as u8) ^ 0x5a);
}

#[test]
fn four_images_store_their_shared_content_once() {
    let mem = MemStorage::new();
    let opts = StoreOptions {
        log_segment_bytes: 8 << 20,
        log_quota_bytes: 160 << 20,
        background_compaction: false,
        ..StoreOptions::default()
    };
    let store = Store::create(Arc::new(mem.clone()), &store_dir(), opts).unwrap();
    let size = SHARED_BYTES + UNIQUE_BLOCKS * 4096;
    let mut buf = vec![0u8; MIB as usize];
    for img in 0..IMAGES {
        let name = format!("vm{img}");
        store.create_image(&name, size).unwrap();
        let image = store.open_image(&name).unwrap();
        for m in 0..SHARED_BYTES / MIB {
            for (k, block) in buf.chunks_mut(4096).enumerate() {
                shared_block(m * 256 + k as u64, block);
            }
            image.write(m * MIB, &buf, false).unwrap();
        }
        // Blocks of its own, written 4 KiB at a time.
        for u in 0..UNIQUE_BLOCKS {
            let sector = (SHARED_BYTES / 512) + u * 8;
            image.write(sector * 512, &payload(1_000_000 * (img + 1) + u, sector, 8), false).unwrap();
        }
        image.flush().unwrap();
        let r = store.compact_once(&image).unwrap();
        assert_eq!(r.covered_after, image.durable_seq());
        assert_eq!(r.work.input_bytes, size);
        assert_eq!(r.work.budget_waits, 0, "default budget fits the default batches");
        if img > 0 {
            assert_eq!(
                r.work.chunks_dup,
                SHARED_BYTES / 4096,
                "image {img}: the shared content deduplicated"
            );
        }
        assert_eq!(image.stats().log_segments, 1, "the log was reclaimed");
    }
    let unique_bytes = SHARED_BYTES + IMAGES * UNIQUE_BLOCKS * 4096;
    let st = store.chunk_stats();
    assert_eq!(st.chunks * 4096, unique_bytes);
    let ratio = st.stored_bytes as f64 / unique_bytes as f64;
    println!("stored {} bytes for {unique_bytes} unique bytes: {ratio:.4}", st.stored_bytes);
    assert!(ratio <= 1.02, "stored/unique = {ratio}");

    // Every image reads back its content from the shared chunks.
    let mut want = vec![0u8; 4096];
    let mut got = vec![0u8; 4096];
    for img in 0..IMAGES {
        let image = store.open_image(&format!("vm{img}")).unwrap();
        for i in (0..SHARED_BYTES / 4096).step_by(97) {
            shared_block(i, &mut want);
            image.read(i * 4096, &mut got).unwrap();
            assert_eq!(got, want, "image {img} block {i}");
        }
        let u = UNIQUE_BLOCKS - 1;
        let sector = SHARED_BYTES / 512 + u * 8;
        image.read(sector * 512, &mut got).unwrap();
        assert_eq!(decode_sector(&got[..512], sector).unwrap(), 1_000_000 * (img + 1) + u);
        assert_eq!(image.stats().read_log_bytes, 0, "everything came from chunks");
    }
    // Every chunk is referenced: GC sweeps nothing.
    let gc = store.gc().unwrap();
    assert_eq!(gc.chunks_dead, 0, "{gc:?}");
    assert_eq!(gc.missing_references, 0, "{gc:?}");
}
