//! Publication of manifests to the bucket and images fetched from it
//! (issue 18, stage 4): another store reads every flushed, compacted and
//! published write; the log is kept until its records are published; a
//! crash anywhere on the publishing store, or a bucket that stops
//! answering at any request, loses nothing and leaves a bucket from which
//! a consistent image is fetched.

mod chunk_support;
mod common;

use cas::objects::{MemObjects, ObjectFault};
use cas::storage::{CrashMode, MemStorage, Storage};
use cas::store::{FetchAs, ImageKind};
use cas::{Image, Store, StoreOptions};
use chunk_support::{crash_at_every_op, crashing, Cuts};
use common::*;
use std::sync::Arc;
use std::time::Duration;

const IMAGE_BYTES: u64 = 4 << 20;
const WAIT: Duration = Duration::from_secs(5);

fn opts(objects: &MemObjects) -> StoreOptions {
    remote_opts(Some(Arc::new(objects.clone())))
}

/// `opts` with a lease on each image written (the holder's first round
/// sweeps what earlier opens left only with leases on).
fn leased(objects: &MemObjects) -> StoreOptions {
    let mut o = opts(objects);
    o.remote.0.as_mut().expect("a remote").lease = Some(cas::objects::lease::LeaseConfig {
        lease: Duration::from_millis(2000),
        claim_bound: Duration::from_millis(30),
        margin: Duration::from_millis(200),
    });
    o
}

/// A second store (host B) on its own disk, on the same bucket.
fn host_b(objects: &MemObjects) -> Arc<Store> {
    host_b_on(&MemStorage::new(), objects)
}

fn host_b_on(mem: &MemStorage, objects: &MemObjects) -> Arc<Store> {
    Store::create(Arc::new(mem.clone()), &store_dir(), opts(objects)).unwrap()
}

/// Round `r` of writes: 24 writes of 64 KiB over the image, tokens
/// `r * 1000 + i + 1`.
fn write_round(image: &Image, r: u64) -> cas::Result<()> {
    for i in 0..24u64 {
        let offset = ((i * 7 + r * 3) % 64) * (64 << 10);
        image.write(offset, &payload(r * 1000 + i + 1, offset / SECTOR as u64, 128), false)?;
    }
    Ok(())
}

fn fetched_tokens(b: &Store, name: &str) -> Vec<u64> {
    let image = b.open_image(name).unwrap();
    read_tokens(&image).unwrap()
}

#[test]
fn another_store_reads_what_one_published_and_nothing_it_did_not() {
    let objects = MemObjects::new();
    let (mem, a) = mem_store(opts(&objects));
    a.create_image("vm", IMAGE_BYTES).unwrap();
    let image = a.open_image("vm").unwrap();
    compacted_round(&a, &image, 1);
    let g1 = a.publish_wait("vm", WAIT).unwrap();
    let want1 = read_tokens(&image).unwrap();
    // Flushed and compacted, not published: host B must not see it yet.
    compacted_round(&a, &image, 2);

    let mem_b = MemStorage::new();
    let b = host_b_on(&mem_b, &objects);
    let r = b.fetch_image("vm", FetchAs::Replica).unwrap();
    assert_eq!(r.generation, g1);
    assert!(r.foreign_packs > 0, "{r:?}");
    let info = b.list_images().unwrap();
    assert_eq!(info[0].kind, ImageKind::Replica);
    same_tokens(&fetched_tokens(&b, "vm"), &want1, "host B, first publication");
    let replica = b.open_image("vm").unwrap();
    assert!(replica.write(0, &payload(9, 0, 8), false).is_err(), "a replica is read-only");
    assert!(b.tier().unwrap().stats().gets > 0, "B read A's chunks from the bucket");
    drop(replica);
    let gc = b.gc().unwrap();
    assert_eq!(gc.missing_references, 0, "{gc:?}");
    drop(b);
    let fsck = cas::fsck::check(Arc::new(mem_b.clone()), &store_dir(), &Default::default()).unwrap();
    assert!(fsck.problems.is_empty(), "{:?}", fsck.problems);
    assert!(fsck.counts.foreign_references > 0, "{:?}", fsck.counts);
    let b = reopen(&mem_b, opts(&objects)).unwrap();
    same_tokens(&fetched_tokens(&b, "vm"), &want1, "host B reopened");

    // The second round, once published, reaches a fresh fetch.
    let g2 = a.publish_wait("vm", WAIT).unwrap();
    assert!(g2 > g1);
    let want2 = read_tokens(&image).unwrap();
    assert_ne!(want1, want2);
    b.remove_image("vm").unwrap();
    b.fetch_image("vm", FetchAs::Replica).unwrap();
    same_tokens(&fetched_tokens(&b, "vm"), &want2, "host B, second publication");

    // A reopened publishes a new series (its manifest file is new to it).
    drop((image, a));
    let a = reopen(&mem, opts(&objects)).unwrap();
    let image = a.open_image("vm").unwrap();
    compacted_round(&a, &image, 3);
    a.publish_wait("vm", WAIT).unwrap();
    let want3 = read_tokens(&image).unwrap();
    let b2 = host_b(&objects);
    b2.fetch_image("vm", FetchAs::Replica).unwrap();
    same_tokens(&fetched_tokens(&b2, "vm"), &want3, "after A reopened");
    let st = a.publish_stats("vm").unwrap();
    assert_eq!(st.counters.published_generation, st.counters.manifest_generation, "{st:?}");
    let counters = a.image_stats(&image).remote;
    assert_eq!(counters.published_generation, st.counters.published_generation, "{counters:?}");
    assert!(st.refused.is_none() && st.counters.ranges >= 1, "{st:?}");
}

#[test]
fn the_log_is_kept_until_the_manifest_covering_it_is_published() {
    let objects = MemObjects::new();
    let (_mem, a) = mem_store(opts(&objects));
    a.create_image("vm", IMAGE_BYTES).unwrap();
    let image = a.open_image("vm").unwrap();
    write_round(&image, 1).unwrap();
    image.flush().unwrap();
    objects.set_fault(ObjectFault::Unreachable);
    a.compact_once(&image).unwrap_or_else(|e| panic!("compaction does not need the bucket: {e}"));
    let used = image.log_used_bytes();
    assert!(used >= 24 * (64 << 10), "compacted but not published: the log is kept ({used} bytes)");
    let err = a.publish_wait("vm", Duration::from_millis(300)).unwrap_err();
    assert!(err.to_string().contains("cannot connect"), "{err}");
    let st = a.publish_stats("vm").unwrap();
    assert!(
        st.counters.errors > 0 && st.counters.unpublished_ms > 0 && st.counters.published_generation == 0,
        "{st:?}"
    );
    assert_eq!(image.log_used_bytes(), used);

    objects.clear_fault();
    a.publish_wait("vm", WAIT).unwrap();
    // All but the segment being written to goes.
    assert!(image.log_used_bytes() <= 1 << 20, "published: reclaimed ({} bytes)", image.log_used_bytes());
    assert_eq!(image.reclaim_gate(), Some(a.publish_stats("vm").unwrap().counters.published_covered_seq));
    assert_eq!(a.publish_stats("vm").unwrap().counters.unpublished_ms, 0);
}

/// Keys of image `vm`'s objects of `kind` (`roots`, `pages`).
fn image_keys(objects: &MemObjects, kind: &str) -> Vec<String> {
    objects.keys().into_iter().filter(|k| k.starts_with(&format!("images/vm/{kind}/"))).collect()
}

/// Round `r` of writes, flushed and compacted.
fn compacted_round(a: &Store, image: &Image, r: u64) {
    write_round(image, r).unwrap();
    image.flush().unwrap();
    a.compact_once(image).unwrap();
}

fn publish_round(a: &Store, image: &Image, r: u64) {
    compacted_round(a, image, r);
    a.publish_wait("vm", WAIT).unwrap();
}

#[test]
fn superseded_roots_and_ranges_leave_the_bucket_after_their_grace() {
    let objects = MemObjects::new();
    let (mem, a) = mem_store(leased(&objects));
    a.create_image("vm", IMAGE_BYTES).unwrap();
    let image = a.open_image("vm").unwrap();
    let mut sent = 0;
    for r in 1..=8 {
        publish_round(&a, &image, r);
        let st = a.publish_stats("vm").unwrap().counters;
        assert_eq!(image_keys(&objects, "roots").len(), 1, "round {r}: only the newest root stays");
        assert_eq!(image_keys(&objects, "pages").len() as u64, st.ranges, "round {r}: only its ranges stay");
        assert_eq!(st.superseded_pending, 0, "round {r}: {st:?}");
        sent = st.pages_sent;
    }
    let st = a.publish_stats("vm").unwrap().counters;
    assert!(st.superseded_deleted > 7, "7 roots and some merged ranges: {st:?}");
    assert!(sent > st.ranges, "ranges merged and were replaced: {st:?}");

    // A reopened publishes a new series; the old one goes.
    drop((image, a));
    let a = reopen(&mem, leased(&objects)).unwrap();
    let image = a.open_image("vm").unwrap();
    publish_round(&a, &image, 9);
    let roots = image_keys(&objects, "roots");
    let pages = image_keys(&objects, "pages");
    assert_eq!(roots.len(), 1, "{roots:?}");
    let series: std::collections::BTreeSet<&str> =
        pages.iter().map(|k| k.rsplit('/').nth(1).unwrap()).collect();
    assert_eq!(series.len(), 1, "one series left: {pages:?}");
    assert_eq!(pages.len() as u64, a.publish_stats("vm").unwrap().counters.ranges);
    let want = read_tokens(&image).unwrap();
    let b = host_b(&objects);
    b.fetch_image("vm", FetchAs::Replica).unwrap();
    same_tokens(&fetched_tokens(&b, "vm"), &want, "fetched after the sweep");

    // Within the grace period, what was superseded stays readable.
    drop((image, a));
    let mut slow = leased(&objects);
    slow.remote.0.as_mut().unwrap().superseded_grace = Duration::from_secs(3600);
    let a = reopen(&mem, slow).unwrap();
    let image = a.open_image("vm").unwrap();
    publish_round(&a, &image, 10);
    publish_round(&a, &image, 11);
    let st = a.publish_stats("vm").unwrap().counters;
    assert_eq!(st.superseded_deleted, 0, "{st:?}");
    assert!(st.superseded_pending > st.ranges, "the old series, a root, merged ranges: {st:?}");
    assert_eq!(image_keys(&objects, "roots").len(), 3, "two roots of this open and the one before");
}

#[test]
fn without_leases_a_store_never_deletes_another_stores_series() {
    // Two stores writing one image is a misconfiguration without leases,
    // but neither may destroy what the other published.
    let objects = MemObjects::new();
    let (_mem_a, a) = mem_store(opts(&objects));
    a.create_image("vm", IMAGE_BYTES).unwrap();
    let image_a = a.open_image("vm").unwrap();
    publish_round(&a, &image_a, 1);
    let pages_a = image_keys(&objects, "pages");
    let b = host_b(&objects);
    b.fetch_image("vm", FetchAs::Owner).unwrap();
    let image_b = b.open_image("vm").unwrap();
    publish_round(&b, &image_b, 2);
    publish_round(&b, &image_b, 3);
    let left = image_keys(&objects, "pages");
    assert!(pages_a.iter().all(|k| left.contains(k)), "B deleted A's ranges: {pages_a:?} {left:?}");
    // A goes past B's generation, so A's root (ranges from before B's
    // first round) becomes the newest; then B again.
    let rounds =
        [(4, &a, &image_a), (5, &a, &image_a), (6, &a, &image_a), (7, &a, &image_a), (8, &b, &image_b)];
    for (r, store, image) in rounds {
        publish_round(store, image, r);
        let states = [read_tokens(&image_a).unwrap(), read_tokens(&image_b).unwrap()];
        let c = host_b(&objects);
        c.fetch_image("vm", FetchAs::Replica).unwrap_or_else(|e| panic!("round {r}: {e}"));
        let got = fetched_tokens(&c, "vm");
        assert!(states.contains(&got), "round {r}: the newest root shows neither store's state");
    }
}

#[test]
fn a_fetch_whose_ranges_are_deleted_meanwhile_starts_again_from_the_newest_root() {
    let objects = MemObjects::new();
    let (mem, a) = mem_store(leased(&objects));
    a.create_image("vm", IMAGE_BYTES).unwrap();
    let image = a.open_image("vm").unwrap();
    publish_round(&a, &image, 1);
    drop((image, a));
    // A reopened writes a round; host B starts fetching the old root, and
    // before its first range arrives A publishes and deletes the old series.
    let a = reopen(&mem, leased(&objects)).unwrap();
    let image = a.open_image("vm").unwrap();
    compacted_round(&a, &image, 2);
    let want = read_tokens(&image).unwrap();
    let publisher = a.clone();
    objects.before_get("images/vm/pages/", move || {
        publisher.publish_wait("vm", WAIT).unwrap();
    });
    let b = host_b(&objects);
    let r = b.fetch_image("vm", FetchAs::Replica).unwrap();
    assert_eq!(r.generation, a.publish_stats("vm").unwrap().counters.published_generation, "{r:?}");
    assert!(a.publish_stats("vm").unwrap().counters.superseded_deleted > 0, "the old series went");
    same_tokens(&fetched_tokens(&b, "vm"), &want, "fetched again from the newest root");
}

#[test]
fn stats_never_wait_for_a_round_under_way() {
    let objects = MemObjects::new();
    let (_mem, a) = mem_store(opts(&objects));
    a.create_image("vm", IMAGE_BYTES).unwrap();
    let image = a.open_image("vm").unwrap();
    compacted_round(&a, &image, 1);
    // Each request of the round takes a second; stats meanwhile do not.
    objects.set_latency(Duration::from_secs(1));
    std::thread::scope(|s| {
        let round = s.spawn(|| a.publish_wait("vm", Duration::from_secs(60)));
        std::thread::sleep(Duration::from_millis(1500));
        let t = std::time::Instant::now();
        let st = a.publish_stats("vm").unwrap().counters;
        assert!(t.elapsed() < Duration::from_millis(500), "stats took {:?}", t.elapsed());
        assert_eq!(st.published_generation, 0, "{st:?}");
        assert!(st.unpublished_ms >= 1000, "behind since the round began: {st:?}");
        objects.set_latency(Duration::ZERO);
        round.join().unwrap().unwrap();
    });
    let st = a.publish_stats("vm").unwrap().counters;
    assert!(st.published_generation > 0 && st.unpublished_ms == 0, "{st:?}");
}

/// A's state at each flush: what a fetch may show.
struct Run {
    states: Vec<Vec<u64>>,
    /// Index in `states` of the newest publication that returned.
    published: Option<usize>,
}

fn workload(a: &Store, run: &mut Run, wait: Duration) -> cas::Result<()> {
    a.create_image("vm", IMAGE_BYTES)?;
    let image = a.open_image("vm")?;
    for r in 1..=3 {
        write_round(&image, r)?;
        image.flush()?;
        run.states.push(read_tokens(&image).map_err(cas::Error::InvalidArgument)?);
        a.compact_once(&image)?;
        a.publish_wait("vm", wait)?;
        run.published = Some(run.states.len() - 1);
    }
    Ok(())
}

/// After a cut: the bucket's newest root is whole and shows one of A's
/// flushed states no older than the last publication that returned; A
/// reopens with every flushed write and publishes it all.
fn check_after_cut(mem: &MemStorage, objects: &MemObjects, run: &Run, what: &str) {
    if let Some(p) = run.published {
        let b = host_b(objects);
        b.fetch_image("vm", FetchAs::Replica).unwrap_or_else(|e| panic!("{what}: fetch: {e}"));
        let got = fetched_tokens(&b, "vm");
        assert!(run.states[p..].contains(&got), "{what}: host B sees a state A never flushed or an old one");
    }
    let a = match reopen(mem, opts(objects)) {
        Err(cas::Error::NotFound(_)) if run.states.is_empty() => return, // cut before the store existed
        r => r.unwrap_or_else(|e| panic!("{what}: reopen: {e}")),
    };
    let Ok(image) = a.open_image("vm") else {
        assert!(run.states.is_empty(), "{what}: the image is gone");
        return;
    };
    let now = read_tokens(&image).unwrap();
    if let Some(last) = run.states.last() {
        // Acknowledged by a flush: never lost (a later unflushed round may show too).
        for (i, (&n, &l)) in now.iter().zip(last).enumerate() {
            assert!(n >= l, "{what}: sector {i} went back from {l} to {n}");
        }
    }
    a.compact_once(&image).unwrap();
    let g = a.publish_wait("vm", WAIT).unwrap_or_else(|e| panic!("{what}: publish after reopen: {e}"));
    if g == 0 {
        assert!(now.iter().all(|&t| t == 0), "{what}: data but no manifest");
        return;
    }
    let b = host_b(objects);
    b.fetch_image("vm", FetchAs::Replica).unwrap();
    same_tokens(&fetched_tokens(&b, "vm"), &now, what);
}

#[test]
fn a_crash_at_every_storage_operation_of_the_publishing_store_loses_nothing() {
    let stride = std::env::var("CAS_CRASH_STRIDE").ok().and_then(|v| v.parse().ok()).unwrap_or(3u64);
    // Every operation of the store's creation, then every `stride`-th
    // (CAS_CRASH_STRIDE=1 for all of them: minutes).
    let cuts = Cuts { torn: true, dense: 60, stride, max: 20_000 };
    let budget = crash_at_every_op(cuts, |budget, mode| {
        let mem = MemStorage::new();
        let objects = MemObjects::new();
        let (storage, ctl) = crashing(&mem, budget);
        let mut run = Run { states: Vec::new(), published: None };
        let result =
            Store::create(storage, &store_dir(), opts(&objects)).and_then(|a| workload(&a, &mut run, WAIT));
        if !ctl.died() {
            result.unwrap();
            return true;
        }
        mem.crash(mode);
        check_after_cut(&mem, &objects, &run, &format!("crash after {budget} ops ({mode:?})"));
        false
    });
    eprintln!("the workload took {budget} storage operations");
    assert!(budget > 300, "the workload took only {budget} operations");
}

#[test]
fn a_bucket_failing_at_every_request_loses_nothing() {
    let mut after = 0;
    loop {
        let mem = MemStorage::new();
        let objects = MemObjects::new();
        let mut run = Run { states: Vec::new(), published: None };
        objects.fault_after(after, ObjectFault::Unreachable);
        let storage: Arc<dyn Storage> = Arc::new(mem.clone());
        // Short: the bucket stays down, so a publication waits it out.
        let wait = Duration::from_millis(20);
        let result =
            Store::create(storage, &store_dir(), opts(&objects)).and_then(|a| workload(&a, &mut run, wait));
        objects.clear_fault();
        match result {
            Ok(()) => break,
            // The bucket's error, or (a loaded machine) the short wait ran out.
            Err(e) => assert!(["cannot connect", "within"].iter().any(|m| e.to_string().contains(m)), "{e}"),
        }
        mem.crash(CrashMode::LoseUnsynced);
        check_after_cut(&mem, &objects, &run, &format!("bucket down after {after} requests"));
        after += 1;
        assert!(after < 2000);
    }
    eprintln!("the workload made {after} requests");
    assert!(after > 20, "the workload made only {after} requests");
}

/// A grow with no write after it reaches the bucket: the publisher
/// republishes the generation's root with the new size, and a fresh
/// fetch gets an image of that size with the same data.
#[test]
fn a_grow_with_no_write_after_it_is_published() {
    let objects = MemObjects::new();
    let (_mem, a) = mem_store(opts(&objects));
    a.create_image("vm", IMAGE_BYTES).unwrap();
    let image = a.open_image("vm").unwrap();
    compacted_round(&a, &image, 1);
    let g1 = a.publish_wait("vm", WAIT).unwrap();
    let want = read_tokens(&image).unwrap();
    a.resize_image("vm", 2 * IMAGE_BYTES).unwrap();
    assert_eq!(a.publish_wait("vm", WAIT).unwrap(), g1, "the same generation, republished");
    let b = host_b(&objects);
    b.fetch_image("vm", FetchAs::Replica).unwrap();
    let got = fetched_tokens(&b, "vm");
    assert_eq!(got.len() as u64 * SECTOR as u64, 2 * IMAGE_BYTES, "the fetched image has the new size");
    same_tokens(&got[..want.len()], &want, "the fetched image's data");
    assert!(got[want.len()..].iter().all(|&t| t == 0));
}
