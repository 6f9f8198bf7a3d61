//! Sealed packs uploaded to an object store (cas::bucket::packs): pack ids in
//! the store's host slot, sealing only after a sync, uploads that match
//! the local bytes and survive a crash at every storage operation or an
//! object store failure at every request, a sealed pack never appended to
//! again, and writers that wait on the bound of bytes not yet uploaded.

mod chunk_support;

use cas::bucket::packs::packidx::PackIndex;
use cas::bucket::packs::{open_chunks, PackTier, RemoteStats};
use cas::bucket::packs::{pack_key, packidx_key, Catalog, PackPhase, PART_BYTES};
use cas::bucket::RemoteOptions;
use cas::chunk::{ChunkHash, ChunkRef, ChunkStore, ChunkStoreOptions, CHUNK_BYTES, PACK_HEADER_BYTES};
use cas::io::IoCx;
use cas::objects::{MemObjects, ObjectFault, Objects};
use cas::storage::{CrashMode, MemStorage, OpenMode, Storage};
use chunk_support::{block, block_hash, crash_at_every_op, crashing, Cuts};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const DIR: &str = "/s/chunks";
const SLOTS: u64 = 8;

/// Uploaded packs keep no local copy past the newest `KEEP_PACKS` (so
/// reads from the bucket and local deletions are in every test), and the
/// extent cache holds 2 extents (32 slots).
const KEEP_PACKS: u64 = 1;

fn remote(objects: &MemObjects, threads: usize) -> RemoteOptions {
    RemoteOptions {
        upload_threads: threads,
        claim_bound: Duration::from_millis(5),
        local_keep_bytes: KEEP_PACKS * (PACK_HEADER_BYTES + SLOTS * CHUNK_BYTES as u64),
        cache_bytes: 128 << 10,
        read_retry: Duration::from_millis(300),
        ..RemoteOptions::new(Arc::new(objects.clone()))
    }
}

fn options() -> ChunkStoreOptions {
    ChunkStoreOptions {
        pack_bytes: PACK_HEADER_BYTES + SLOTS * CHUNK_BYTES as u64,
        index_checkpoint_min_bytes: 2048,
        index_merge_in_background: false,
        cache_bytes: 0,
        ..Default::default()
    }
}

/// A chunk store opened with its pack tier (`remote`: its bucket).
struct Chunks {
    c: ChunkStore,
    tier: Option<Arc<PackTier>>,
}

impl std::ops::Deref for Chunks {
    type Target = ChunkStore;
    fn deref(&self) -> &ChunkStore {
        &self.c
    }
}

impl Chunks {
    fn open(
        storage: Arc<dyn Storage>,
        opts: ChunkStoreOptions,
        remote: Option<RemoteOptions>,
    ) -> cas::Result<Chunks> {
        let (c, tier) = open_chunks(storage, Path::new(DIR), opts, remote.as_ref())?;
        Ok(Chunks { c, tier })
    }

    fn remote_stats(&self) -> Option<RemoteStats> {
        self.tier.as_ref().map(|t| t.stats())
    }

    fn upload_sealed(&self) -> cas::Result<u64> {
        self.tier.as_ref().map_or(Ok(0), |t| t.upload_sealed())
    }

    fn wait_upload_room(&self) -> cas::Result<()> {
        self.tier.as_ref().map_or(Ok(()), |t| t.wait_upload_room(&self.c))
    }
}

fn open(storage: Arc<dyn Storage>, objects: &MemObjects, threads: usize) -> cas::Result<Chunks> {
    Chunks::open(storage, options(), Some(remote(objects, threads)))
}

fn insert(c: &ChunkStore, ids: std::ops::Range<u64>) -> cas::Result<()> {
    let blocks: Vec<Vec<u8>> = ids.clone().map(block).collect();
    let items: Vec<(ChunkHash, &[u8])> = ids.zip(&blocks).map(|(id, b)| (block_hash(id), &b[..])).collect();
    c.insert_missing(&c.pin(), &items).map(|_| ())
}

/// Reads chunks `ids` and checks their bytes; `what` says when.
fn read_ids(c: &ChunkStore, ids: impl IntoIterator<Item = u64>, what: &str) {
    let mut out = vec![0u8; CHUNK_BYTES];
    for id in ids {
        c.read(&block_hash(id), &mut out).unwrap_or_else(|e| panic!("{what}: chunk {id}: {e}"));
        assert_eq!(out, block(id), "{what}: chunk {id}");
    }
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
        let len = PACK_HEADER_BYTES + u64::from(p.slots) * CHUNK_BYTES as u64;
        let mut object = Vec::new();
        for part in 0..len.div_ceil(PART_BYTES) {
            let bytes =
                objects.get(&pack_key(id, part)).unwrap_or_else(|e| panic!("{what}: pack {id:#x}: {e}"));
            object.extend_from_slice(&bytes);
        }
        assert_eq!(
            object.len() as u64,
            PACK_HEADER_BYTES + u64::from(p.slots) * CHUNK_BYTES as u64,
            "{what}"
        );
        // Deleted locally once uploaded (past KEEP_PACKS), or still here and the same.
        let path = Path::new(DIR).join(format!("pack-{id:08x}.pack"));
        if let Ok(f) = storage.open(&path, OpenMode::Existing) {
            let mut local = vec![0u8; object.len()];
            let have = (f.len().unwrap() as usize).min(local.len());
            f.read_exact_at(&mut local[..have], 0).unwrap();
            assert!(object == local, "{what}: pack {id:#x} differs from its upload");
        }
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
    read_all(&c, 0..33);
}

/// The workload: inserts and syncs across several packs, uploads, and an
/// explicit seal; returns the ids acknowledged durable before the cut.
fn workload(c: &Chunks, acked: &mut Vec<u64>) -> cas::Result<()> {
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
    read_ids(&c, acked.iter().copied(), what);
    c.upload_sealed().unwrap_or_else(|e| panic!("{what}: upload after reopen: {e}"));
    let st = c.remote_stats().unwrap();
    assert_eq!(st.sealed_packs, 0, "{what}: {st:?}");
    let cat = catalog(mem);
    for u in c.pack_usage() {
        if u.sealed {
            assert!(cat.packs.contains_key(&u.id), "{what}: closed pack {:#x} never sealed", u.id);
        }
        if u.active {
            assert!(!cat.packs.contains_key(&u.id), "{what}: appending to sealed pack {:#x}", u.id);
        }
    }
    // Nothing was written to a catalogued pack past what was uploaded.
    for (&id, p) in &cat.packs {
        let path = Path::new(DIR).join(format!("pack-{id:08x}.pack"));
        if let Ok(f) = mem.open(&path, OpenMode::Existing) {
            let len = f.len().unwrap();
            assert!(
                len <= PACK_HEADER_BYTES + u64::from(p.slots) * CHUNK_BYTES as u64,
                "{what}: pack {id:#x} grew"
            );
        }
    }
    check_uploads(mem, objects, what);
    assert_eq!(c.verify(true).unwrap_or_else(|e| panic!("{what}: {e}")), c.len(), "{what}");
}

#[test]
fn a_crash_at_every_storage_operation_loses_nothing_and_every_sealed_pack_uploads() {
    let budget = crash_at_every_op(Cuts::every(5000), |budget, mode| {
        let mem = MemStorage::new();
        let objects = MemObjects::new();
        let (storage, ctl) = crashing(&mem, budget);
        let mut acked = Vec::new();
        let result = open(storage, &objects, 0).and_then(|c| workload(&c, &mut acked));
        if !ctl.died() {
            result.unwrap();
            return true;
        }
        mem.crash(mode);
        check_after_cut(&mem, &objects, &acked, &format!("crash after {budget} ops ({mode:?})"));
        false
    });
    assert!(budget > 40, "the workload took only {budget} operations");
}

#[test]
fn an_object_store_failure_at_every_request_loses_nothing() {
    let mut after = 0;
    loop {
        let mem = MemStorage::new();
        let objects = MemObjects::new();
        let mut acked = Vec::new();
        // From the open on: the host slot claim's requests fail too.
        objects.fault_after(after, ObjectFault::Unreachable);
        let result = open(Arc::new(mem.clone()), &objects, 0).and_then(|c| workload(&c, &mut acked));
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
    let remote = RemoteOptions { pending_max_bytes: 2 * pack, ..remote(&objects, 1) };
    let c = Chunks::open(Arc::new(mem.clone()), options(), Some(remote)).unwrap();
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
        assert!(stalled >= 2, "stopped after {stalled} packs: before the bound of 2");
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

fn local_pack_files(storage: &dyn Storage) -> usize {
    storage.list_dir(Path::new(DIR)).unwrap().iter().filter(|n| n.ends_with(".pack")).count()
}

fn read_all(c: &ChunkStore, ids: std::ops::Range<u64>) {
    read_ids(c, ids, "");
}

#[test]
fn uploaded_packs_leave_the_disk_and_are_read_from_the_bucket_through_the_cache() {
    let mem = MemStorage::new();
    let objects = MemObjects::new();
    let c = open(Arc::new(mem.clone()), &objects, 0).unwrap();
    insert(&c, 0..30).unwrap();
    c.sync().unwrap();
    c.upload_sealed().unwrap();
    c.seal_active().unwrap();
    c.upload_sealed().unwrap();
    let st = c.remote_stats().unwrap();
    assert_eq!((st.uploaded_packs, st.local_uploaded_packs, st.evicted_packs), (4, 1, 3), "{st:?}");
    assert_eq!(local_pack_files(&mem), 1);

    // Cold: every read of an evicted pack misses; a read on a queue thread
    // (no blocking) is handed back, with no GET. A blocking read right after
    // on the same thread is not affected: it GETs.
    let gets = c.remote_stats().unwrap().gets;
    let mut out = vec![0u8; CHUNK_BYTES];
    let nowait = IoCx::default().nowait();
    let err = c.read_ref_in(&ChunkRef::unlocated(&block_hash(0)), &mut out, nowait).unwrap_err();
    assert!(matches!(err, cas::Error::WouldBlock), "{err}");
    assert_eq!(c.remote_stats().unwrap().gets, gets, "a read that must not wait made a GET");
    c.read(&block_hash(0), &mut out).unwrap();
    assert!(c.remote_stats().unwrap().gets > gets);
    read_all(&c, 0..30);
    let cold = c.remote_stats().unwrap();
    assert!(cold.gets >= 3, "{cold:?}");
    // The extents just read are cached: the same reads make no GET.
    read_all(&c, 16..24);
    let warm = c.remote_stats().unwrap();
    assert_eq!(warm.gets, cold.gets, "{warm:?}");
    assert!(warm.cache_hits >= 8, "{warm:?}");
    assert_eq!(c.verify(true).unwrap(), 30);
    drop(c);

    // Reopened: the packs only in the bucket are read from there.
    let c = open(Arc::new(mem.clone()), &objects, 0).unwrap();
    read_all(&c, 0..30);
    insert(&c, 30..40).unwrap();
    c.sync().unwrap();
    read_all(&c, 0..40);
    drop(c);
    // Without its remote the store cannot serve them, and says so.
    let Err(err) = Chunks::open(Arc::new(mem.clone()), options(), None) else {
        panic!("opened without its remote")
    };
    assert!(err.to_string().contains("only in the bucket"), "{err}");
}

#[test]
fn reads_ride_out_a_short_outage_and_fail_within_their_bound_on_a_long_one() {
    let mem = MemStorage::new();
    let objects = MemObjects::new();
    let c = open(Arc::new(mem.clone()), &objects, 0).unwrap();
    insert(&c, 0..24).unwrap();
    c.sync().unwrap();
    c.upload_sealed().unwrap();
    assert_eq!(local_pack_files(&mem), 2, "the newest uploaded pack and the active one");

    // Longer than the read bound (300 ms): an error, in about that time.
    objects.set_fault(ObjectFault::Unreachable);
    let started = Instant::now();
    let err = c.read(&block_hash(0), &mut vec![0u8; CHUNK_BYTES]).unwrap_err();
    let took = started.elapsed();
    assert!(err.to_string().contains("cannot connect"), "{err}");
    assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(3), "failed after {took:?}");
    assert!(c.remote_stats().unwrap().get_retries >= 1);

    // Shorter than the bound: the read waits it out.
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(120));
            objects.clear_fault();
        });
        read_all(&c, 0..8);
    });
    // A setup error (refused credentials) fails at once (reopened: the
    // cache is empty).
    drop(c);
    let c = open(Arc::new(mem.clone()), &objects, 0).unwrap();
    objects.set_fault(ObjectFault::Denied);
    let started = Instant::now();
    let err = c.read(&block_hash(0), &mut vec![0u8; CHUNK_BYTES]).unwrap_err();
    assert!(err.to_string().contains("access denied"), "{err}");
    assert!(started.elapsed() < Duration::from_millis(200));
    objects.clear_fault();
    read_all(&c, 0..24);
}

#[test]
fn a_pack_larger_than_one_part_uploads_in_parts_and_reads_back_across_them() {
    let mem = MemStorage::new();
    let objects = MemObjects::new();
    let slots = PART_BYTES / CHUNK_BYTES as u64 + 200; // two parts
    let opts = ChunkStoreOptions { pack_bytes: PACK_HEADER_BYTES + slots * CHUNK_BYTES as u64, ..options() };
    let remote = RemoteOptions { local_keep_bytes: 0, ..remote(&objects, 0) };
    let c = Chunks::open(Arc::new(mem.clone()), opts, Some(remote)).unwrap();
    for first in (0..slots).step_by(1024) {
        insert(&c, first..(first + 1024).min(slots)).unwrap();
    }
    c.sync().unwrap();
    c.seal_active().unwrap();
    c.upload_sealed().unwrap();
    assert_eq!(local_pack_files(&mem), 0);
    let parts = objects.keys().iter().filter(|k| k.starts_with("packs/")).count();
    assert_eq!(parts, 2);
    assert_eq!(check_uploads(&mem, &objects, "two parts"), 1);
    // Around the part boundary, and everything.
    let boundary = (PART_BYTES - PACK_HEADER_BYTES) / CHUNK_BYTES as u64;
    read_all(&c, boundary - 20..boundary + 20);
    read_all(&c, 0..slots);
}

#[test]
fn a_store_reopened_on_another_bucket_is_refused_and_one_that_is_down_is_not() {
    let mem = MemStorage::new();
    let objects = MemObjects::new();
    let c = open(Arc::new(mem.clone()), &objects, 0).unwrap();
    insert(&c, 0..4).unwrap();
    c.sync().unwrap();
    drop(c);
    let Err(err) = open(Arc::new(mem.clone()), &MemObjects::new(), 0) else {
        panic!("opened on another bucket")
    };
    assert!(err.to_string().contains("not the bucket the store uploads to"), "{err}");
    objects.set_fault(ObjectFault::Unreachable);
    let c = open(Arc::new(mem.clone()), &objects, 0).unwrap();
    read_all(&c, 0..4);
}
