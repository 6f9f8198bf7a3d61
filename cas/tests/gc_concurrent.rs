//! GC while IO continues: chunks a compaction batch inserts or finds as
//! duplicates under a pin are never swept, whether the pin was taken
//! before the GC epoch started or after; and a randomized run of writers,
//! readers and GC passes never loses a referenced chunk.

mod chunk_support;

use cas::chunk::{ChunkHash, ChunkRef, ChunkStore, ChunkStoreOptions, CHUNK_BYTES, PACK_HEADER_BYTES};
use cas::gc::{self, GcOptions};
use cas::manifest::{Manifest, ManifestOptions};
use cas::storage::{MemStorage, Storage};
use chunk_support::{block, block_hash, seeds, with_seed};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn setup(images: usize) -> (Arc<ChunkStore>, Vec<Arc<Manifest>>) {
    let mem = MemStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(mem);
    let opts =
        ChunkStoreOptions { pack_bytes: PACK_HEADER_BYTES + 32 * CHUNK_BYTES as u64, ..Default::default() };
    let c = Arc::new(ChunkStore::open(storage.clone(), Path::new("/s/chunks"), opts).unwrap());
    let ms = (0..images)
        .map(|i| {
            let p = PathBuf::from(format!("/s/img{i}/manifest"));
            storage.create_dir_all(p.parent().unwrap()).unwrap();
            Arc::new(Manifest::open(storage.clone(), &p, ManifestOptions::default()).unwrap())
        })
        .collect();
    (c, ms)
}

/// Inserts chunks `ids`; returns where each is, as the leaves will say.
fn insert(c: &ChunkStore, pin: &cas::chunk::ChunkPin<'_>, ids: &[u64]) -> Vec<ChunkRef> {
    let blocks: Vec<Vec<u8>> = ids.iter().map(|&id| block(id)).collect();
    let items: Vec<(ChunkHash, &[u8])> =
        ids.iter().zip(&blocks).map(|(&id, b)| (block_hash(id), &b[..])).collect();
    let mut refs = Vec::new();
    c.insert_located(pin, &items, &mut refs).unwrap();
    refs
}

/// Commits `edits` (block, content id) as unlocated refs (reads find them
/// through the index).
fn commit(m: &Manifest, edits: &[(u64, u64)], covered: u64) {
    let mut e = m.begin();
    for &(b, id) in edits {
        e.set(b, Some(block_hash(id).into()));
    }
    e.commit(covered).unwrap();
}

/// Commits `edits` with the refs `insert` returned for them.
fn commit_located(m: &Manifest, edits: &[(u64, u64)], refs: &[ChunkRef], covered: u64) {
    let mut e = m.begin();
    for (&(b, _), r) in edits.iter().zip(refs) {
        e.set(b, Some(*r));
    }
    e.commit(covered).unwrap();
}

/// Chunk 7 becomes unreferenced, then a batch finds it as a duplicate
/// under a pin taken *before* GC starts and commits after GC's epoch bump:
/// GC waits for the pin, so its mark sees the commit.
#[test]
fn a_pin_from_before_the_epoch_delays_the_mark() {
    let (c, ms) = setup(1);
    let m = &ms[0];
    {
        let pin = c.pin();
        let _ = insert(&c, &pin, &[7]);
        c.sync().unwrap();
        commit(m, &[(0, 7)], 1);
    }
    {
        let pin = c.pin();
        let _ = insert(&c, &pin, &[8]);
        commit(m, &[(0, 8)], 2); // chunk 7 is now unreferenced
    }
    let pin = c.pin();
    let _ = insert(&c, &pin, &[7]); // duplicate hit, will be referenced again
    let gc_thread = {
        let (c, m) = (c.clone(), m.clone());
        std::thread::spawn(move || gc::run(&c, &[&m], &GcOptions::default()).unwrap())
    };
    // Let GC bump the epoch and start waiting for our pin.
    while c.pin().epoch() == pin.epoch() {
        std::thread::sleep(Duration::from_millis(1));
    }
    c.sync().unwrap();
    commit(m, &[(1, 7)], 3);
    drop(pin);
    let report = gc_thread.join().unwrap();
    assert_eq!(report.chunks_dead, 0, "{report:?}");
    let mut out = vec![0u8; CHUNK_BYTES];
    c.read(&block_hash(7), &mut out).unwrap();
}

/// A pin taken after GC's epoch bump stamps the duplicate it finds, so the
/// sweep skips it even though the commit lands after the mark.
#[test]
fn a_pin_from_the_new_epoch_protects_what_it_touches() {
    let (c, ms) = setup(1);
    let m = &ms[0];
    {
        let pin = c.pin();
        let _ = insert(&c, &pin, &[7, 8]);
        c.sync().unwrap();
        commit(m, &[(0, 7)], 1);
        commit(m, &[(0, 8)], 2); // chunk 7 unreferenced
    }
    // An unrelated old pin holds GC between its epoch bump and its mark.
    let old = c.pin();
    let gc_thread = {
        let (c, m) = (c.clone(), m.clone());
        std::thread::spawn(move || gc::run(&c, &[&m], &GcOptions::default()).unwrap())
    };
    let new = loop {
        let p = c.pin();
        if p.epoch() > old.epoch() {
            break p;
        }
        drop(p);
        std::thread::sleep(Duration::from_millis(1));
    };
    let _ = insert(&c, &new, &[7]); // duplicate hit in the new epoch
    drop(old); // GC marks (chunk 7 not referenced yet) and sweeps
    let report = gc_thread.join().unwrap();
    c.sync().unwrap();
    commit(m, &[(1, 7)], 3);
    drop(new);
    assert_eq!(report.chunks_dead, 0, "chunk 7 was swept although a live pin touched it: {report:?}");
    let mut out = vec![0u8; CHUNK_BYTES];
    c.read(&block_hash(7), &mut out).unwrap();
    // Once nothing references or pins it, the next pass sweeps it.
    commit(m, &[(1, 8)], 4);
    assert_eq!(gc::run(&c, &[m], &GcOptions::default()).unwrap().chunks_dead, 1);
}

#[test]
fn gc_times_out_on_a_pin_that_is_never_released() {
    let (c, ms) = setup(1);
    let _stuck = c.pin();
    let opts = GcOptions { pin_wait: Duration::from_millis(20), ..Default::default() };
    let e = gc::run(&c, &[&ms[0]], &opts).unwrap_err();
    assert!(matches!(e, cas::Error::Unavailable(..)), "{e}");
}

/// Writers (compaction-like batches), readers and GC passes at once.
fn random_run(seed: u64) {
    let (c, ms) = setup(3);
    // image -> block -> content id, committed.
    let model: Arc<Mutex<Vec<BTreeMap<u64, u64>>>> = Arc::new(Mutex::new(vec![BTreeMap::new(); 3]));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (c, ms, model) = (c.clone(), ms.clone(), model.clone());
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed * 10 + w);
                for round in 0..60u64 {
                    let img = (w as usize + round as usize) % 3;
                    // Writer w owns images w and w+2 (mod 3) for this round.
                    let m = &ms[img];
                    let pin = c.pin();
                    let edits: Vec<(u64, u64)> = (0..rng.gen_range(1..40))
                        .map(|_| (rng.gen_range(0..64), rng.gen_range(0..120)))
                        .collect();
                    let ids: Vec<u64> = edits.iter().map(|e| e.1).collect();
                    let refs = insert(&c, &pin, &ids);
                    c.sync().unwrap();
                    let mut guard = model.lock().unwrap();
                    let covered = m.covered() + 1;
                    commit_located(m, &edits, &refs, covered);
                    guard[img].extend(edits.iter().copied());
                    drop(guard);
                    drop(pin);
                }
            })
        })
        .collect();
    let reader = {
        let (c, ms, model, stop) = (c.clone(), ms.clone(), model.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut out = vec![0u8; CHUNK_BYTES];
            while !stop.load(Ordering::Relaxed) {
                let guard = model.lock().unwrap();
                for (m, content) in ms.iter().zip(guard.iter()) {
                    for (&b, &id) in content.iter().take(8) {
                        let h = m.lookup(b).unwrap().expect("committed block is mapped");
                        c.read_ref(&h, &mut out).unwrap();
                        assert_eq!(out, block(id));
                    }
                }
                drop(guard);
                std::thread::yield_now();
            }
        })
    };
    let opts = GcOptions { repack_dead_fraction: 0.2, ..Default::default() };
    let mut passes = 0;
    while writers.iter().any(|w| !w.is_finished()) {
        let refs: Vec<&Manifest> = ms.iter().map(|m| m.as_ref()).collect();
        gc::run(&c, &refs, &opts).unwrap();
        passes += 1;
    }
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    let refs: Vec<&Manifest> = ms.iter().map(|m| m.as_ref()).collect();
    gc::run(&c, &refs, &opts).unwrap();
    c.verify(true).unwrap();
    let model = model.lock().unwrap();
    let mut out = vec![0u8; CHUNK_BYTES];
    let mut live = std::collections::HashSet::new();
    for (m, content) in ms.iter().zip(model.iter()) {
        for (&b, &id) in content {
            let h = m.lookup(b).unwrap().unwrap();
            c.read_ref(&h, &mut out).unwrap();
            assert_eq!(out, block(id), "image block {b}");
            live.insert(h.tag);
        }
    }
    assert_eq!(c.len(), live.len() as u64, "exactly the referenced chunks remain");
    assert!(passes > 0);
}

#[test]
fn writers_readers_and_gc_at_once() {
    for seed in seeds(4) {
        with_seed(seed, random_run);
    }
}
