//! Randomized model test of the chunk store, manifests and GC together:
//! compaction-like batches, image deletion, GC passes and journal
//! checkpoints, with a simulated crash after a random number of storage
//! operations in any of them. After every crash all images must read
//! their committed content (old or new for the interrupted commit, told
//! apart by `covered`), every stored chunk must check out, and a clean GC
//! pass must leave exactly the referenced chunks. CAS_TEST_SEEDS scales it.

mod chunk_support;

use cas::chunk::{ChunkHash, ChunkStore, ChunkStoreOptions, CHUNK_BYTES, PACK_HEADER_BYTES};
use cas::gc::{self, GcOptions};
use cas::manifest::{Manifest, ManifestOptions};
use cas::storage::{CrashMode, MemStorage, Storage};
use chunk_support::{block, block_hash, crashing, seeds, with_seed};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const IMAGES: usize = 4;

struct Img {
    content: BTreeMap<u64, u64>,
    covered: u64,
    alive: bool,
}

fn path(i: usize) -> PathBuf {
    PathBuf::from(format!("/s/img{i}/manifest"))
}

fn open(storage: &Arc<dyn Storage>) -> cas::Result<(ChunkStore, Vec<Manifest>)> {
    let opts = ChunkStoreOptions {
        pack_bytes: PACK_HEADER_BYTES + 24 * CHUNK_BYTES as u64,
        index_checkpoint_min_bytes: 8 << 10,
        cache_bytes: 16 * CHUNK_BYTES as u64,
        ..Default::default()
    };
    let c = ChunkStore::open(storage.clone(), Path::new("/s/chunks"), opts)?;
    let mopts = ManifestOptions { rewrite_min_garbage_pages: 4, ..Default::default() };
    let ms = (0..IMAGES)
        .map(|i| Manifest::open(storage.clone(), &path(i), mopts.clone()))
        .collect::<cas::Result<_>>()?;
    Ok((c, ms))
}

fn write_batch(c: &ChunkStore, m: &Manifest, edits: &[(u64, u64)], covered: u64) -> cas::Result<()> {
    let pin = c.pin();
    let blocks: Vec<Vec<u8>> = edits.iter().map(|e| block(e.1)).collect();
    let items: Vec<(ChunkHash, &[u8])> =
        edits.iter().zip(&blocks).map(|(e, b)| (block_hash(e.1), &b[..])).collect();
    let mut refs = Vec::new();
    c.insert_located(&pin, &items, &mut refs)?;
    c.sync()?;
    let mut e = m.begin();
    for (&(b, _), r) in edits.iter().zip(&refs) {
        e.set(b, Some(*r));
    }
    e.commit(covered).map(|_| ())
}

fn check(c: &ChunkStore, ms: &[Manifest], imgs: &[Img], what: &str) {
    c.verify(true).unwrap_or_else(|e| panic!("{what}: verify: {e}"));
    let mut out = vec![0u8; CHUNK_BYTES];
    for (i, (m, img)) in ms.iter().zip(imgs).enumerate().filter(|(_, (_, img))| img.alive) {
        assert_eq!(m.covered(), img.covered, "{what}: image {i} covered");
        for (&b, &id) in &img.content {
            let h = m.lookup(b).unwrap().unwrap_or_else(|| panic!("{what}: image {i} block {b} unmapped"));
            assert_eq!(h.tag, block_hash(id).tag(), "{what}: image {i} block {b}");
            c.read_ref(&h, &mut out).unwrap_or_else(|e| panic!("{what}: image {i} block {b}: {e}"));
            assert_eq!(out, block(id), "{what}: image {i} block {b}");
        }
    }
}

fn run(seed: u64) -> u64 {
    let mut rng = StdRng::seed_from_u64(seed);
    let mem = MemStorage::new();
    for i in 0..IMAGES {
        mem.create_dir_all(path(i).parent().unwrap()).unwrap();
    }
    mem.sync_dir(Path::new("/")).unwrap();
    mem.sync_dir(Path::new("/s")).unwrap();
    let (mut storage, mut ctl) = crashing(&mem, u64::MAX);
    let (mut c, mut ms) = open(&storage).unwrap();
    let mut imgs: Vec<Img> =
        (0..IMAGES).map(|_| Img { content: BTreeMap::new(), covered: 0, alive: true }).collect();
    let mut crashes = 0;
    for step in 0..80 {
        let what = format!("seed {seed} step {step}");
        if rng.gen_range(0..5) == 0 {
            ctl.arm(rng.gen_range(0..40));
        }
        let op = rng.gen_range(0..10);
        let mut pending: Option<(usize, Vec<(u64, u64)>)> = None;
        let result = match op {
            0..=6 => {
                let i = rng.gen_range(0..IMAGES);
                let edits: Vec<(u64, u64)> = (0..rng.gen_range(1..30))
                    .map(|_| (rng.gen_range(0..200), rng.gen_range(0..150)))
                    .collect();
                if !imgs[i].alive {
                    // Recreate a deleted image (its old manifest is gone).
                    imgs[i] = Img { content: BTreeMap::new(), covered: 0, alive: true };
                }
                pending = Some((i, edits.clone()));
                write_batch(&c, &ms[i], &edits, imgs[i].covered + 1)
            }
            7 => {
                // Delete an image: later passes no longer count its references.
                let i = rng.gen_range(0..IMAGES);
                imgs[i].alive = false;
                Ok(())
            }
            _ => {
                let live: Vec<&Manifest> =
                    ms.iter().zip(&imgs).filter(|(_, i)| i.alive).map(|(m, _)| m).collect();
                let opts = GcOptions { repack_dead_fraction: rng.gen_range(0.05..0.6), ..Default::default() };
                gc::run(&c, &live, &opts).map(|_| ())
            }
        };
        if ctl.died() {
            crashes += 1;
            drop((c, ms));
            let mode = if rng.gen_bool(0.5) {
                CrashMode::LoseUnsynced
            } else {
                CrashMode::Torn { seed: seed ^ step }
            };
            mem.crash(mode);
            (storage, ctl) = crashing(&mem, u64::MAX);
            (c, ms) = open(&storage).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
            if let Some((i, edits)) = pending {
                if ms[i].covered() == imgs[i].covered + 1 {
                    imgs[i].content.extend(edits);
                    imgs[i].covered += 1;
                }
            }
        } else {
            ctl.disarm();
            result.unwrap_or_else(|e| panic!("{what}: {e}"));
            if let Some((i, edits)) = pending {
                imgs[i].content.extend(edits);
                imgs[i].covered += 1;
            }
        }
        // A deleted image's manifest file is removed like an image store would.
        for (i, img) in imgs.iter_mut().enumerate() {
            if !img.alive && ms[i].covered() > 0 {
                storage.remove_file(&path(i)).unwrap();
                storage.sync_dir(path(i).parent().unwrap()).unwrap();
                ms[i] = Manifest::open(storage.clone(), &path(i), ManifestOptions::default()).unwrap();
                img.content.clear();
                img.covered = 0;
            }
        }
        check(&c, &ms, &imgs, &what);
    }
    let live: Vec<&Manifest> = ms.iter().zip(&imgs).filter(|(_, i)| i.alive).map(|(m, _)| m).collect();
    gc::run(&c, &live, &GcOptions::default()).unwrap();
    let referenced: HashSet<ChunkHash> =
        imgs.iter().filter(|i| i.alive).flat_map(|i| i.content.values().map(|&id| block_hash(id))).collect();
    assert_eq!(c.len(), referenced.len() as u64, "seed {seed}: exactly the referenced chunks remain");
    check(&c, &ms, &imgs, &format!("seed {seed} end"));
    crashes
}

#[test]
fn chunks_manifests_and_gc_survive_random_crashes() {
    let mut crashes = 0;
    for seed in seeds(12) {
        with_seed(seed, |seed| crashes += run(seed));
    }
    assert!(crashes > 0, "no run crashed");
}
