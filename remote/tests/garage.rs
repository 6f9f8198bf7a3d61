//! `S3Objects` against a real Garage cluster on loopback (`ci/garage`):
//! objects round-trip, a bad setup is a one-line error naming the problem,
//! and a three-node cluster with one node killed keeps serving through
//! endpoint failover.
//!
//! Needs the Garage binary `ci/setup --garage` builds ($CASBLK_GARAGE_BIN,
//! or the one in $CASBLK_VM_CACHE). Without it they fail, unless
//! CASBLK_SKIP_GARAGE=1 says to skip them (each skip is printed and
//! counted in target/test-skips.txt).

use cas::objects::{ObjectErrorKind, Objects};
use casblk_remote::testing::GarageCluster as Cluster;
use casblk_remote::{RemoteConfig, S3Objects};
use std::path::Path;
use std::time::{Duration, Instant};

/// A cluster for this test file's `name`.
fn cluster(name: &str, nodes: u32) -> Option<Cluster> {
    Cluster::start(&Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("garage-{name}")), nodes)
}

fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn objects_round_trip_on_one_node() {
    let Some(cluster) = cluster("round-trip", 1) else { return };
    let mut cfg = cluster.config();
    cfg.prefix = "store-a/".into();
    let o = S3Objects::open(cfg).unwrap();
    // Garage 2.5 ignores If-None-Match on PUT: the lease cannot rely on it.
    assert!(!o.enforces_put_new(), "Garage now enforces conditional creates: the lease can use them");
    assert_eq!(o.put_new("x", b"1").unwrap_err().kind, ObjectErrorKind::Unsupported);
    let pack = data(1, 3 << 20);
    o.put("packs/00000002", &pack).unwrap();
    o.put("packs/00000001", b"one").unwrap();
    o.put("roots/0001", b"root").unwrap();
    assert_eq!(o.get("packs/00000002").unwrap(), pack);
    assert_eq!(o.get_range("packs/00000002", 4096..8192).unwrap(), pack[4096..8192]);
    assert_eq!(o.head("packs/00000001").unwrap(), Some(3));
    assert_eq!(o.head("packs/missing").unwrap(), None);
    assert_eq!(o.get("packs/missing").unwrap_err().kind, ObjectErrorKind::NotFound);
    let keys = |v: Vec<cas::objects::ObjectInfo>| v.into_iter().map(|i| i.key).collect::<Vec<_>>();
    assert_eq!(keys(o.list("packs/", None, 100).unwrap()), ["packs/00000001", "packs/00000002"]);
    assert_eq!(keys(o.list("packs/", Some("packs/00000001"), 100).unwrap()), ["packs/00000002"]);
    assert_eq!(keys(o.list("packs/", None, 1).unwrap()), ["packs/00000001"]);
    assert_eq!(o.list("packs/", None, 100).unwrap()[1].size, 3 << 20);
    assert_eq!(keys(o.list("", None, 100).unwrap()).len(), 3, "the probe key is gone");
    o.delete("packs/00000001").unwrap();
    o.delete("packs/00000001").unwrap();
    assert_eq!(keys(o.list("packs/", None, 100).unwrap()), ["packs/00000002"]);
}

/// Each bad setup fails at open with one line naming the problem, within
/// the request bounds.
#[test]
fn bad_setups_are_one_line_errors() {
    let Some(cluster) = cluster("bad-setups", 1) else { return };
    let check = |cfg: RemoteConfig, kind: ObjectErrorKind, words: &str| {
        let started = Instant::now();
        let e = S3Objects::open(cfg).err().expect("open should fail");
        assert_eq!(e.kind, kind, "{e}");
        let msg = e.to_string();
        assert!(msg.contains(words) && !msg.contains('\n'), "{msg}");
        assert!(started.elapsed() < Duration::from_secs(20), "took {:?}: {msg}", started.elapsed());
        eprintln!("{msg}");
    };
    let mut cfg = cluster.config();
    cfg.secret = "0".repeat(64);
    check(cfg, ObjectErrorKind::Denied, "access denied");
    let mut cfg = cluster.config();
    cfg.bucket = "no-such-bucket".into();
    check(cfg, ObjectErrorKind::NoBucket, "bucket does not exist");
    let mut cfg = cluster.config();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    cfg.endpoints = vec![format!("http://127.0.0.1:{port}")];
    check(cfg, ObjectErrorKind::Unreachable, "cannot connect");
}

/// Three nodes, replication factor 3: with the node behind the current
/// endpoint killed, reads and writes go on through the next endpoint,
/// and everything written is read back after it returns.
#[test]
fn three_nodes_serve_through_a_killed_node() {
    let Some(cluster) = cluster("three-nodes", 3) else { return };
    let o = S3Objects::open(cluster.config()).unwrap();
    let first = o.current_endpoint().to_string();
    let started = Instant::now();
    let count = 32u64;
    for i in 0..count {
        o.put(&format!("packs/{i:08x}"), &data(i, 1 << 20)).unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!("PUT of {count} x 1 MiB to 3 nodes: {:.1} MiB/s", count as f64 / secs);
    cluster.node("kill", 1);
    for i in 0..count {
        assert_eq!(
            o.get_range(&format!("packs/{i:08x}"), 0..4096).unwrap(),
            data(i, 1 << 20)[..4096],
            "pack {i}"
        );
    }
    assert_ne!(o.current_endpoint(), first, "requests did not fail over");
    for i in count..count + 8 {
        o.put(&format!("packs/{i:08x}"), &data(i, 1 << 20)).unwrap();
    }
    cluster.node("restart", 1);
    cluster.node("kill", 2);
    for i in 0..count + 8 {
        assert_eq!(o.get(&format!("packs/{i:08x}")).unwrap(), data(i, 1 << 20), "pack {i}");
    }
    assert_eq!(o.list("packs/", None, 1000).unwrap().len(), (count + 8) as usize);
    cluster.node("restart", 2);
}

/// The lease (cas::objects::lease) between two stores on a 3-node Garage:
/// refused while the holder renews, taken once it released, fenced after
/// it went silent.
#[test]
fn the_lease_works_between_two_stores_on_three_nodes() {
    use cas::objects::lease::{Lease, LeaseConfig, LeaseError};
    let Some(cluster) = cluster("lease", 3) else { return };
    use std::sync::Arc;
    let a_store: Arc<dyn Objects> = Arc::new(S3Objects::open(cluster.config()).unwrap());
    let b_store: Arc<dyn Objects> = Arc::new(S3Objects::open(cluster.config()).unwrap());
    let cfg = LeaseConfig {
        lease: Duration::from_secs(2),
        claim_bound: Duration::from_millis(500),
        margin: Duration::from_millis(300),
    };
    let prefix = "images/vm1/lease/";
    let mut a = Lease::acquire(a_store.clone(), prefix, 0xa, cfg, 3).unwrap();
    let renewing = std::sync::atomic::AtomicBool::new(true);
    std::thread::scope(|s| {
        s.spawn(|| {
            while renewing.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(a.renew_every());
                a.renew().unwrap();
            }
        });
        let r = Lease::acquire(b_store.clone(), prefix, 0xb, cfg, 3).map(|l| l.epoch());
        renewing.store(false, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(r.err(), Some(LeaseError::Held { store: 0xa, epoch: 1 }), "taken from a renewing holder");
    });
    a.release().unwrap();
    let b = Lease::acquire(b_store.clone(), prefix, 0xb, cfg, 3).unwrap();
    assert_eq!(b.epoch(), 2);
    // B goes silent; A takes over after its lease, and B is fenced.
    let mut b = b;
    let a = Lease::acquire(a_store.clone(), prefix, 0xa, cfg, 3).unwrap();
    assert_eq!(a.epoch(), 3);
    assert!(matches!(b.renew(), Err(LeaseError::Lost { by_store: 0xa, epoch: 3 })));
}

/// The chunk store's uploads and remote reads (cas::bucket::packs) on a
/// 3-node Garage with one node killed midway through the writes, then
/// another one during the reads after a reopen: no request fails, and
/// every chunk reads back from the bucket (no local copy is kept).
#[test]
fn a_chunk_store_uploads_and_reads_through_killed_nodes() {
    use cas::bucket::packs::open_chunks;
    use cas::bucket::RemoteOptions;
    use cas::chunk::{ChunkHash, ChunkStoreOptions};
    use std::sync::Arc;
    let Some(cluster) = cluster("chunk-store", 3) else { return };
    let objects = Arc::new(S3Objects::open(cluster.config()).unwrap());
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("garage-chunk-store-data");
    let _ = std::fs::remove_dir_all(&dir);
    let opts = || ChunkStoreOptions { pack_bytes: 1 << 20, cache_bytes: 0, ..ChunkStoreOptions::default() };
    let remote = RemoteOptions {
        upload_threads: 2,
        local_keep_bytes: 0,
        cache_bytes: 1 << 20,
        claim_bound: Duration::from_millis(500),
        ..RemoteOptions::new(objects.clone())
    };
    let storage = Arc::new(cas::storage::FsStorage::new());
    let (c, tier) = open_chunks(storage.clone(), &dir, opts(), Some(&remote)).unwrap();
    let tier = tier.unwrap();
    let blocks = 4096u64; // 16 MiB
    for batch in 0..blocks / 256 {
        if batch == blocks / 512 {
            cluster.node("kill", 1);
        }
        let data: Vec<Vec<u8>> = (batch * 256..(batch + 1) * 256).map(|i| data(i + 1, 4096)).collect();
        let items: Vec<(ChunkHash, &[u8])> = data.iter().map(|d| (ChunkHash::of(d), &d[..])).collect();
        tier.wait_upload_room(&c).unwrap();
        c.insert_missing(&c.pin(), &items).unwrap();
        c.sync().unwrap();
    }
    c.seal_active().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    // Uploaded, and their local copies deleted (after the catalog records
    // them). A pack counts as uploaded once its catalog entry changes, a
    // moment before it joins the local-uploaded queue: wait for the
    // eviction count too, or that moment reads as "done".
    let busy = |s: &cas::bucket::packs::RemoteStats| {
        s.sealed_packs > 0 || s.local_uploaded_packs > 0 || s.evicted_packs < s.uploaded_packs
    };
    while busy(&tier.stats()) {
        assert!(Instant::now() < deadline, "uploads did not finish: {:?}", tier.stats());
        std::thread::sleep(Duration::from_millis(50));
    }
    let st = tier.stats();
    eprintln!("uploads with node 1 killed midway: {st:?}");
    assert!(st.uploaded_packs >= 16 && st.evicted_packs == st.uploaded_packs, "{st:?}");
    drop((c, tier));
    cluster.node("restart", 1);

    let (c, tier) = open_chunks(storage, &dir, opts(), Some(&remote)).unwrap();
    let tier = tier.unwrap();
    let mut out = vec![0u8; 4096];
    for i in 0..blocks {
        if i == blocks / 2 {
            cluster.node("kill", 2);
        }
        let want = data(i + 1, 4096);
        c.read(&ChunkHash::of(&want), &mut out).unwrap_or_else(|e| panic!("chunk {i}: {e}"));
        assert!(out == want, "chunk {i}");
    }
    assert!(tier.stats().gets > 0);
    drop((c, tier));
    cluster.node("restart", 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn another_host_takes_over_an_image_published_through_killed_nodes() {
    use cas::bucket::RemoteOptions;
    use cas::store::StoreRemote;
    use cas::{Store, StoreOptions};
    use std::sync::Arc;
    let Some(cluster) = cluster("two-hosts", 3) else { return };
    let objects = Arc::new(S3Objects::open(cluster.config()).unwrap());
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("garage-two-hosts-data");
    let _ = std::fs::remove_dir_all(&base);
    let opts = || StoreOptions {
        pack_bytes: 1 << 20,
        remote: StoreRemote(Some(RemoteOptions {
            local_keep_bytes: 0,
            cache_bytes: 1 << 20,
            claim_bound: Duration::from_millis(500),
            publish_interval: Duration::from_millis(200),
            // The default lease: renewals must ride out a killed node.
            lease: Some(cas::objects::lease::LeaseConfig {
                claim_bound: Duration::from_millis(500),
                ..Default::default()
            }),
            ..RemoteOptions::new(objects.clone())
        })),
        ..StoreOptions::default()
    };
    let storage = Arc::new(cas::storage::FsStorage::new());
    // Host A: 8 MiB in 64 KiB writes, flushed, compacted and published by
    // its publisher thread, with node 1 killed halfway.
    let a = Store::create(storage.clone(), &base.join("a"), opts()).unwrap();
    a.create_image("vm", 32 << 20).unwrap();
    let image = a.open_image("vm").unwrap();
    let writes = 128u64;
    for i in 0..writes {
        if i == writes / 2 {
            cluster.node("kill", 1);
        }
        image.write(i * (256 << 10), &data(i + 1, 64 << 10), false).unwrap();
        if i % 16 == 15 {
            image.flush().unwrap();
            a.compact_once(&image).unwrap();
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while a
        .publish_stats("vm")
        .is_none_or(|s| s.counters.published_generation < s.counters.manifest_generation)
    {
        assert!(Instant::now() < deadline, "not published: {:?}", a.publish_stats("vm"));
        std::thread::sleep(Duration::from_millis(50));
    }
    let st = a.publish_stats("vm").unwrap();
    eprintln!("host A published: {st:?}");
    assert!(st.counters.publications >= 1 && st.refused.is_none(), "{st:?}");
    drop((image, a));
    cluster.node("restart", 1);

    // Host B, its own store on the same bucket, takes the image over (A
    // stopped: its lease is released) and reads it with node 2 killed
    // midway.
    let b = Store::create(storage.clone(), &base.join("b"), opts()).unwrap();
    let r = b.fetch_image("vm", cas::store::FetchAs::Owner).unwrap();
    assert!(r.foreign_packs >= 8, "{r:?}");
    let image = b.open_image("vm").unwrap();
    let mut buf = vec![0u8; 64 << 10];
    for i in 0..writes {
        if i == writes / 2 {
            cluster.node("kill", 2);
        }
        image.read(i * (256 << 10), &mut buf).unwrap_or_else(|e| panic!("write {i}: {e}"));
        assert!(buf == data(i + 1, 64 << 10), "write {i} differs on host B");
    }
    // B writes; A, reopened meanwhile, is refused the image.
    image.write(0, &data(999, 64 << 10), false).unwrap();
    image.flush().unwrap();
    let a = Store::open(storage.clone(), &base.join("a"), opts()).unwrap();
    let Err(e) = a.open_image("vm") else { panic!("host A opened the image host B holds") };
    eprintln!("host A refused: {e}");
    assert!(e.to_string().contains("held by store"), "{e}");
    drop(a);
    let gets = b.tier().unwrap().stats().gets;
    assert!(gets > 0);
    drop((image, b));
    cluster.node("restart", 2);
    let _ = std::fs::remove_dir_all(&base);
}
