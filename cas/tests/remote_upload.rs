//! Sealed packs uploaded to an object store (chunk/remote/): pack ids in
//! the store's host slot, sealing only after a sync, uploads that match
//! the local bytes and survive a crash at every storage operation or an
//! object store failure at every request, a sealed pack never appended to
//! again, and writers that wait on the bound of bytes not yet uploaded.

mod chunk_support;

use cas::chunk::remote::packidx::PackIndex;
use cas::chunk::remote::{pack_key, packidx_key, Catalog, PackPhase, RemoteOptions};
use cas::chunk::{ChunkHash, ChunkStore, ChunkStoreOptions, CHUNK_BYTES, PACK_HEADER_BYTES};
use cas::objects::{MemObjects, ObjectFault, Objects};
use cas::storage::{CrashMode, MemStorage, OpenMode, Storage};
use chunk_support::{block, block_hash, crashing};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const DIR: &str = "/s/chunks";
const SLOTS: u64 = 8;

fn remote(objects: &MemObjects, threads: usize) -> RemoteOptions {
    RemoteOptions {
        upload_threads: threads,
        claim_bound: Duration::from_millis(5),
        ..RemoteOptions::new(Arc::new(objects.clone()))
    }
}

fn open(storage: Arc<dyn Storage>, objects: &MemObjects, threads: usize) -> cas::Result<ChunkStore> {
    let opts = ChunkStoreOptions {
        pack_bytes: PACK_HEADER_BYTES + SLOTS * CHUNK_BYTES as u64,
        index_checkpoint_min_bytes: 2048,
        index_merge_in_background: false,
        remote: Some(remote(objects, threads)),
        ..Default::default()
    };
    ChunkStore::open(storage, Path::new(DIR), opts)
}

fn insert(c: &ChunkStore, ids: std::ops::Range<u64>) -> cas::Result<()> {
    let blocks: Vec<Vec<u8>> = ids.clone().map(block).collect();
    let items: Vec<(ChunkHash, &[u8])> = ids.zip(&blocks).map(|(id, b)| (block_hash(id), &b[..])).collect();
    c.insert_missing(&c.pin(), &items).map(|_| ())
}

fn catalog(storage: &dyn Storage) -> Catalog {
    Catalog::read(storage, Path::new(DIR)).unwrap().expect("a remote catalog")
}

/// Every uploaded pack's object is the local file's bytes, and its slot
/// index names each live slot by the hash of those bytes.
fn check_uploads(storage: &dyn Storage, objects: &MemObjects, what: &str) -> u64 {
    let cat = catalog(storage);
    let mut uploaded = 0;
    for (&id, p) in &cat.packs {
        assert!(
            id >> 24 == u32::from(cat.host_slot),
            "{what}: pack {id:#x} outside host slot {}",
            cat.host_slot
        );
        if p.phase != PackPhase::Uploaded {
            continue;
        }
        uploaded += 1;
        let object = objects.get(&pack_key(id)).unwrap_or_else(|e| panic!("{what}: pack {id:#x}: {e}"));
        let f =
            storage.open(&Path::new(DIR).join(format!("pack-{id:08x}.pack")), OpenMode::Existing).unwrap();
        let mut local = vec![0u8; object.len()];
        let have = (f.len().unwrap() as usize).min(local.len());
        f.read_exact_at(&mut local[..have], 0).unwrap();
        assert_eq!(
            object.len() as u64,
            PACK_HEADER_BYTES + u64::from(p.slots) * CHUNK_BYTES as u64,
            "{what}"
        );
        assert!(object == local, "{what}: pack {id:#x} differs from its upload");
        let idx = PackIndex::decode(&objects.get(&packidx_key(id)).unwrap(), Path::new("packidx")).unwrap();
        assert_eq!((idx.pack, idx.slots.len()), (id, p.slots as usize), "{what}");
        for (slot, e) in idx.slots.iter().enumerate() {
            if let Some((hash, _)) = e {
                let at = PACK_HEADER_BYTES as usize + slot * CHUNK_BYTES;
                assert_eq!(
                    *hash,
                    ChunkHash::of(&object[at..at + CHUNK_BYTES]),
                    "{what}: pack {id:#x} slot {slot}"
                );
            }
        }
    }
    uploaded
}

#[test]
fn packs_are_sealed_after_a_sync_uploaded_whole_and_never_appended_again() {
    let mem = MemStorage::new();
    let objects = MemObjects::new();
    let c = open(Arc::new(mem.clone()), &objects, 0).unwrap();
    insert(&c, 0..30).unwrap();
    assert_eq!(c.remote_stats().unwrap().sealed_packs, 0, "sealed before a sync made the packs durable");
    c.sync().unwrap();
    let st = c.remote_stats().unwrap();
    assert_eq!((st.sealed_packs, st.uploaded_packs), (3, 0), "{st:?}");
    assert!(st.host_slot >= 1);
    assert_eq!(c.upload_sealed().unwrap(), 3);
    let sealed = c.seal_active().unwrap().expect("the active pack held chunks");
    assert_eq!(c.upload_sealed().unwrap(), 1);
    let st = c.remote_stats().unwrap();
    assert_eq!((st.sealed_packs, st.uploaded_packs, st.pending_upload_bytes), (0, 4, 0), "{st:?}");
    assert_eq!(check_uploads(&mem, &objects, "first run"), 4);
    assert!(c.pack_usage().iter().all(|u| u.sealed), "{:?}", c.pack_usage());
    drop(c);

    // Reopened: the sealed pack is not resumed; new chunks go to a new pack.
    let c = open(Arc::new(mem.clone()), &objects, 0).unwrap();
    insert(&c, 30..33).unwrap();
    c.sync().unwrap();
    let active: Vec<u32> = c.pack_usage().iter().filter(|u| u.active).map(|u| u.id).collect();
    assert_eq!(active.len(), 1);
    assert!(active[0] > sealed, "appending to sealed pack {sealed:#x} again");
    assert_eq!(check_uploads(&mem, &objects, "reopened"), 4);
    let mut out = vec![0u8; CHUNK_BYTES];
    for id in 0..33 {
        c.read(&block_hash(id), &mut out).unwrap();
        assert_eq!(out, block(id));
    }
}

/// The workload: inserts and syncs across several packs, uploads, and an
/// explicit seal; returns the ids acknowledged durable before the cut.
fn workload(c: &ChunkStore, acked: &mut Vec<u64>) -> cas::Result<()> {
    for ids in [0..5, 5..20, 20..21, 21..30] {
        insert(c, ids.clone())?;
        c.sync()?;
        acked.extend(ids);
        c.upload_sealed()?;
    }
    c.seal_active()?;
    insert(c, 30..34)?;
    c.sync()?;
    acked.extend(30..34);
    c.upload_sealed()?;
    insert(c, 34..40) // never synced
}

/// After a cut anywhere: every acknowledged chunk reads back, the uploads
/// finish, and every upload matches its pack.
fn check_after_cut(mem: &MemStorage, objects: &MemObjects, acked: &[u64], what: &str) {
    let c = open(Arc::new(mem.clone()), objects, 0).unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
    let mut out = vec![0u8; CHUNK_BYTES];
    for &id in acked {
        c.read(&block_hash(id), &mut out).unwrap_or_else(|e| panic!("{what}: acked chunk {id}: {e}"));
        assert_eq!(out, block(id), "{what}");
    }
    c.upload_sealed().unwrap_or_else(|e| panic!("{what}: upload after reopen: {e}"));
    let st = c.remote_stats().unwrap();
    assert_eq!(st.sealed_packs, 0, "{what}: {st:?}");
    let cat = catalog(mem);
    for u in c.pack_usage() {
        if u.sealed {
            assert!(cat.packs.contains_key(&u.id), "{what}: closed pack {:#x} never sealed", u.id);
        }
    }
    check_uploads(mem, objects, what);
    assert_eq!(c.verify(true).unwrap_or_else(|e| panic!("{what}: {e}")), c.len(), "{what}");
}

#[test]
fn a_crash_at_every_storage_operation_loses_nothing_and_every_sealed_pack_uploads() {
    let mut budget = 0;
    loop {
        let mut done = false;
        for mode in [CrashMode::LoseUnsynced, CrashMode::Torn { seed: budget }] {
            let mem = MemStorage::new();
            let objects = MemObjects::new();
            let (storage, ctl) = crashing(&mem, budget);
            let mut acked = Vec::new();
            let result = open(storage, &objects, 0).and_then(|c| workload(&c, &mut acked));
            if !ctl.died() {
                result.unwrap();
                done = true;
                break;
            }
            mem.crash(mode);
            check_after_cut(&mem, &objects, &acked, &format!("crash after {budget} ops ({mode:?})"));
        }
        if done {
            break;
        }
        budget += 1;
        assert!(budget < 5000);
    }
    assert!(budget > 40, "the workload took only {budget} operations");
}

#[test]
fn an_object_store_failure_at_every_request_loses_nothing() {
    let mut after = 0;
    loop {
        let mem = MemStorage::new();
        let objects = MemObjects::new();
        let mut acked = Vec::new();
        let c = open(Arc::new(mem.clone()), &objects, 0).unwrap();
        objects.fault_after(after, ObjectFault::Unreachable);
        let result = workload(&c, &mut acked);
        drop(c);
        objects.clear_fault();
        match result {
            Ok(()) => break,
            Err(e) => assert!(e.to_string().contains("cannot connect"), "{e}"),
        }
        mem.crash(CrashMode::LoseUnsynced);
        check_after_cut(&mem, &objects, &acked, &format!("object store down after {after} requests"));
        after += 1;
        assert!(after < 500);
    }
    assert!(after > 10, "the workload made only {after} requests");
}

#[test]
fn writers_wait_on_the_upload_bound_while_the_store_is_down_then_go_on() {
    let mem = MemStorage::new();
    let objects = MemObjects::new();
    let pack = PACK_HEADER_BYTES + SLOTS * CHUNK_BYTES as u64;
    let opts = ChunkStoreOptions {
        pack_bytes: pack,
        remote: Some(RemoteOptions { pending_max_bytes: 2 * pack, ..remote(&objects, 1) }),
        ..Default::default()
    };
    let c = ChunkStore::open(Arc::new(mem.clone()), Path::new(DIR), opts).unwrap();
    objects.set_fault(ObjectFault::Unreachable);
    let written = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            for i in 0..8u64 {
                c.wait_upload_room().unwrap();
                insert(&c, i * SLOTS..(i + 1) * SLOTS).unwrap();
                c.sync().unwrap();
                written.store(i + 1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        std::thread::sleep(Duration::from_millis(600));
        let st = c.remote_stats().unwrap();
        let stalled = written.load(std::sync::atomic::Ordering::SeqCst);
        objects.clear_fault();
        writer.join().unwrap();
        // The bound is checked before each insert: one insert (here a
        // pack) may go past it.
        assert!(stalled <= 3, "wrote {stalled} packs past a bound of 2 with the store down");
        assert!(st.pending_upload_bytes <= 3 * pack, "{st:?}");
        assert!(st.upload_errors >= 1, "{st:?}");
        assert!(st.last_error.as_deref().is_some_and(|e| e.contains("cannot connect")), "{st:?}");
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.remote_stats().unwrap().sealed_packs > 0 {
        assert!(Instant::now() < deadline, "uploads never finished: {:?}", c.remote_stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = c.remote_stats().unwrap();
    assert!(st.upload_waits >= 1 && st.uploaded_packs >= 7, "{st:?}");
    drop(c);
    assert!(check_uploads(&mem, &objects, "after the outage") >= 7);
}
