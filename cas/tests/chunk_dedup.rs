//! Dedup across images, measured on a real filesystem: four images hold the
//! same 64 MiB of content plus some blocks of their own (and some zero
//! blocks, which are holes). The chunk store's bytes on disk (the sum of
//! its pack file sizes) must be the unique bytes, stored once, plus pack
//! headers, within 2 %.

mod chunk_support;

use cas::chunk::{is_zero_block, ChunkHash, ChunkStore, ChunkStoreOptions, CHUNK_BYTES, PACK_HEADER_BYTES};
use cas::manifest::{Manifest, ManifestOptions};
use cas::storage::{FsStorage, Storage};
use chunk_support::block;
use std::collections::HashSet;
use std::sync::Arc;

const SHARED_BLOCKS: u64 = (64 << 20) / CHUNK_BYTES as u64;
const UNIQUE_BLOCKS: u64 = 300;
const BATCH_BLOCKS: usize = 256;

/// Content of `block` in image `img`: the shared 64 MiB, then unique
/// blocks; every 97th shared block is zero (a hole).
fn content(img: u64, block_no: u64) -> Vec<u8> {
    if block_no < SHARED_BLOCKS {
        if block_no % 97 == 5 {
            vec![0; CHUNK_BYTES]
        } else {
            block(block_no)
        }
    } else {
        block(1_000_000 * (img + 1) + block_no)
    }
}

#[test]
fn four_images_of_the_same_content_are_stored_once() {
    let tmp = tempfile::tempdir().unwrap();
    let storage: Arc<dyn Storage> = Arc::new(FsStorage::new());
    let chunks_dir = tmp.path().join("chunks");
    let opts = ChunkStoreOptions { pack_bytes: 16 << 20, ..Default::default() };
    let c = ChunkStore::open(storage.clone(), &chunks_dir, opts).unwrap();
    let mut unique: HashSet<ChunkHash> = HashSet::new();
    let mut new_total = 0;
    let mut manifests = Vec::new();
    for img in 0..4u64 {
        let dir = tmp.path().join(format!("img{img}"));
        storage.create_dir_all(&dir).unwrap();
        let m = Manifest::open(storage.clone(), &dir.join("manifest"), ManifestOptions::default()).unwrap();
        let pin = c.pin();
        let mut edit = m.begin();
        let total = SHARED_BLOCKS + UNIQUE_BLOCKS;
        let mut first = 0;
        while first < total {
            let n = (BATCH_BLOCKS as u64).min(total - first);
            let blocks: Vec<Vec<u8>> = (first..first + n).map(|b| content(img, b)).collect();
            let mut items: Vec<(ChunkHash, &[u8])> = Vec::with_capacity(blocks.len());
            for b in &blocks {
                if !is_zero_block(b) {
                    let h = ChunkHash::of(b);
                    unique.insert(h);
                    items.push((h, &b[..]));
                }
            }
            let mut refs = Vec::new();
            new_total += c.insert_located(&pin, &items, &mut refs).unwrap().new_chunks;
            let mut located = refs.into_iter();
            let entries: Vec<_> =
                blocks.iter().map(|b| if is_zero_block(b) { None } else { located.next() }).collect();
            edit.set_range(first, &entries).unwrap();
            first += n;
        }
        c.sync().unwrap();
        edit.commit(1).unwrap();
        drop(pin);
        manifests.push(m);
    }
    assert_eq!(new_total, unique.len() as u64);

    // Bytes on storage, from the files themselves.
    let mut pack_bytes = 0;
    let mut packs = 0;
    for name in storage.list_dir(&chunks_dir).unwrap() {
        if name.starts_with("pack-") {
            pack_bytes += std::fs::metadata(chunks_dir.join(&name)).unwrap().len();
            packs += 1;
        }
    }
    let unique_bytes = unique.len() as u64 * CHUNK_BYTES as u64;
    let ratio = pack_bytes as f64 / unique_bytes as f64;
    eprintln!(
        "dedup: 4 images x {} MiB, unique {} bytes, packs {packs} holding {pack_bytes} bytes, stored/unique {ratio:.4}",
        ((SHARED_BLOCKS + UNIQUE_BLOCKS) * CHUNK_BYTES as u64) >> 20,
        unique_bytes
    );
    assert!(
        pack_bytes as f64 <= 1.02 * unique_bytes as f64 + (packs * PACK_HEADER_BYTES) as f64,
        "stored {pack_bytes} bytes for {unique_bytes} unique bytes"
    );
    assert_eq!(c.stored_bytes(), pack_bytes);

    // Every image reads back, after reopening everything.
    drop(c);
    let c = ChunkStore::open(storage.clone(), &chunks_dir, ChunkStoreOptions::default()).unwrap();
    let mut out = vec![0u8; CHUNK_BYTES];
    for (img, m) in manifests.iter().enumerate() {
        let m = Manifest::open(storage.clone(), m.path(), ManifestOptions::default()).unwrap();
        let mut hashes = vec![None; (SHARED_BLOCKS + UNIQUE_BLOCKS) as usize];
        m.lookup_range(0, &mut hashes).unwrap();
        for (b, h) in hashes.iter().enumerate() {
            let want = content(img as u64, b as u64);
            match h {
                None => assert!(is_zero_block(&want), "image {img} block {b} lost"),
                Some(h) => {
                    c.read_ref(h, &mut out).unwrap();
                    assert!(out == want, "image {img} block {b} differs");
                }
            }
        }
    }
}
