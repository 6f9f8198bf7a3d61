//! Stable smoke test for the chunk store's decoders (the cargo-fuzz
//! targets live in fuzz/): seeded random and mutated pack headers, and
//! whole damaged index journals and pack files opened as a store, must
//! give a value or an error, never a panic. Scale with CAS_FUZZ_ITERS.

mod chunk_support;

use cas::chunk::{
    fuzz_decode_forward, fuzz_decode_pack_header, fuzz_sample_forward, ChunkHash, ChunkStore,
    ChunkStoreOptions, PACK_HEADER_BYTES,
};
use cas::storage::{MemStorage, OpenMode, Storage};
use chunk_support::{block, block_hash};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::sync::Arc;

fn iters(default: u64) -> u64 {
    std::env::var("CAS_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn flip(rng: &mut StdRng, b: &mut [u8], n: usize) {
    for _ in 0..n {
        if b.is_empty() {
            return;
        }
        let i = rng.gen_range(0..b.len());
        b[i] = if rng.gen_bool(0.5) { rng.gen() } else { b[i] ^ (1 << rng.gen_range(0..8)) };
    }
}

/// A small store on disk, returned as its files' bytes.
fn sample_store() -> Vec<(String, Vec<u8>)> {
    let s = MemStorage::new();
    let opts = ChunkStoreOptions { pack_bytes: PACK_HEADER_BYTES + 4 * 4096, ..Default::default() };
    let c = ChunkStore::open(Arc::new(s.clone()), Path::new("/c"), opts).unwrap();
    for round in 0..3u64 {
        let blocks: Vec<Vec<u8>> = (round * 3..round * 3 + 3).map(block).collect();
        let items: Vec<(ChunkHash, &[u8])> =
            (round * 3..).zip(&blocks).map(|(id, b)| (block_hash(id), &b[..])).collect();
        c.insert_missing(&c.pin(), &items).unwrap();
        c.sync().unwrap();
    }
    s.list_dir(Path::new("/c"))
        .unwrap()
        .into_iter()
        .map(|name| {
            let f = s.open(&Path::new("/c").join(&name), OpenMode::Existing).unwrap();
            let mut b = vec![0u8; f.len().unwrap() as usize];
            f.read_exact_at(&mut b, 0).unwrap();
            (name, b)
        })
        .collect()
}

#[test]
fn pack_header_decoder_never_panics() {
    let files = sample_store();
    let header =
        files.iter().find(|(n, _)| n.starts_with("pack-")).unwrap().1[..PACK_HEADER_BYTES as usize].to_vec();
    assert!(fuzz_decode_pack_header(&header).is_ok());
    let mut rng = StdRng::seed_from_u64(0xbead);
    let mut accepted = 0u64;
    let n = iters(300_000);
    for i in 0..n {
        let mut input = if i % 8 == 0 {
            (0..rng.gen_range(0..128)).map(|_| rng.gen()).collect()
        } else {
            let mut b = header[..rng.gen_range(0..=64)].to_vec();
            let n = rng.gen_range(1..4);
            flip(&mut rng, &mut b, n);
            b
        };
        if rng.gen_bool(0.75) && input.len() >= 44 {
            let crc = crc32c::crc32c(&input[..40]);
            input[40..44].copy_from_slice(&crc.to_le_bytes());
        }
        accepted += u64::from(fuzz_decode_pack_header(&input).is_ok());
    }
    assert!(accepted > 0 || n < 10_000, "no input decoded: the mutations never pass the checks");
}

#[test]
fn forward_table_decoder_never_panics_and_round_trips() {
    let table = fuzz_sample_forward();
    let mut rng = StdRng::seed_from_u64(0xf0d);
    let mut accepted = 0u64;
    let n = iters(200_000);
    for i in 0..n {
        let mut input = if i % 8 == 0 {
            (0..rng.gen_range(0..96)).map(|_| rng.gen()).collect()
        } else {
            let mut b = table[..rng.gen_range(0..=table.len())].to_vec();
            let n = rng.gen_range(1..4);
            flip(&mut rng, &mut b, n);
            b
        };
        if rng.gen_bool(0.75) && input.len() >= 36 {
            let crc = crc32c::crc32c(&input[..28]);
            input[28..32].copy_from_slice(&crc.to_le_bytes());
            let end = input.len() - 4;
            let crc = crc32c::crc32c(&input[32..end]);
            input[end..].copy_from_slice(&crc.to_le_bytes());
        }
        if let Ok(t) = fuzz_decode_forward(&input) {
            assert_eq!(t.encode(), input, "decode/encode round trip");
            accepted += 1;
        }
    }
    assert!(accepted > 0 || n < 10_000, "no input decoded: the mutations never pass the checks");
}

#[test]
fn damaged_store_files_open_or_fail_cleanly() {
    let files = sample_store();
    let mut rng = StdRng::seed_from_u64(0xf00d);
    let mut opened = 0u64;
    let n = iters(300_000) / 100;
    for _ in 0..n {
        let s = MemStorage::new();
        s.create_dir_all(Path::new("/c")).unwrap();
        for (name, bytes) in &files {
            let mut b = bytes.clone();
            if rng.gen_range(0..3) == 0 {
                let n = rng.gen_range(1..6);
                flip(&mut rng, &mut b, n);
            }
            if rng.gen_range(0..6) == 0 {
                b.truncate(rng.gen_range(0..=b.len()));
            }
            let f = s.open(&Path::new("/c").join(name), OpenMode::CreateNew).unwrap();
            f.write_all_at(&b, 0).unwrap();
        }
        if let Ok(c) = ChunkStore::open(Arc::new(s), Path::new("/c"), ChunkStoreOptions::default()) {
            opened += 1;
            // Whatever opened must read back correctly or report errors.
            let _ = c.verify(true);
            let mut out = vec![0u8; 4096];
            for id in 0..9 {
                if c.read(&block_hash(id), &mut out).is_ok() {
                    assert_eq!(out, block(id), "a damaged store returned wrong bytes");
                }
            }
        }
    }
    assert!(opened > 0 || n < 100, "no damaged store opened");
}
