//! One writer per image across stores (issue 18, stage 5): a store writes
//! an image only under its lease; another store takes it over once the
//! first stopped (at once) or went silent (after its lease ran out), sees
//! every published write, and fences the first, whose writes then fail
//! and whose reopen is refused.

mod common;

use cas::bucket::manifests::fetch::newest_root;
use cas::bucket::manifests::root_object::{root_key, RootObject};
use cas::manifest::RootRecord;
use cas::objects::lease::LeaseConfig;
use cas::objects::{MemObjects, ObjectError, ObjectErrorKind, ObjectInfo, ObjectResult, Objects};
use cas::storage::MemStorage;
use cas::store::FetchAs;
use cas::{Image, Store, StoreOptions};
use common::*;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const IMAGE_BYTES: u64 = 4 << 20;
const WAIT: Duration = Duration::from_secs(5);
const LEASE: LeaseConfig = LeaseConfig {
    lease: Duration::from_millis(2000),
    claim_bound: Duration::from_millis(30),
    margin: Duration::from_millis(200),
};

/// A store's view of the bucket that a test can cut off (the store goes
/// silent without closing).
struct Switch {
    inner: MemObjects,
    off: AtomicBool,
}

impl Switch {
    fn check(&self) -> ObjectResult<()> {
        if self.off.load(Ordering::SeqCst) {
            return Err(ObjectError::new(
                ObjectErrorKind::Unreachable,
                "mem://bucket: cannot connect (cut off)",
            ));
        }
        Ok(())
    }
}

impl Objects for Switch {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn put(&self, key: &str, data: &[u8]) -> ObjectResult<()> {
        self.check()?;
        self.inner.put(key, data)
    }
    fn put_new(&self, key: &str, data: &[u8]) -> ObjectResult<()> {
        self.check()?;
        self.inner.put_new(key, data)
    }
    fn enforces_put_new(&self) -> bool {
        self.inner.enforces_put_new()
    }
    fn get(&self, key: &str) -> ObjectResult<Vec<u8>> {
        self.check()?;
        self.inner.get(key)
    }
    fn get_range(&self, key: &str, range: Range<u64>) -> ObjectResult<Vec<u8>> {
        self.check()?;
        self.inner.get_range(key, range)
    }
    fn head(&self, key: &str) -> ObjectResult<Option<u64>> {
        self.check()?;
        self.inner.head(key)
    }
    fn list(&self, prefix: &str, start_after: Option<&str>, limit: usize) -> ObjectResult<Vec<ObjectInfo>> {
        self.check()?;
        self.inner.list(prefix, start_after, limit)
    }
    fn delete(&self, key: &str) -> ObjectResult<()> {
        self.check()?;
        self.inner.delete(key)
    }
}

fn opts(objects: Arc<dyn Objects>) -> StoreOptions {
    let mut o = remote_opts(Some(objects));
    o.remote.0.as_mut().expect("a remote").lease = Some(LEASE);
    o
}

fn new_store(objects: Arc<dyn Objects>) -> (MemStorage, Arc<Store>) {
    mem_store(opts(objects))
}

fn write_round(image: &Image, r: u64) -> cas::Result<()> {
    for i in 0..16u64 {
        let offset = ((i * 5 + r) % 64) * (64 << 10);
        image.write(offset, &payload(r * 1000 + i + 1, offset / SECTOR as u64, 128), false)?;
    }
    Ok(())
}

/// Writes round `r`, flushes, compacts and publishes; returns the image's
/// contents.
fn write_and_publish(store: &Store, image: &Image, r: u64) -> Vec<u64> {
    write_round(image, r).unwrap();
    image.flush().unwrap();
    store.compact_once(image).unwrap();
    store.publish_wait(image.name(), WAIT).unwrap();
    read_tokens(image).unwrap()
}

#[test]
fn a_store_takes_over_an_image_another_stopped_and_the_first_is_then_refused() {
    let bucket = MemObjects::new();
    let shared: Arc<dyn Objects> = Arc::new(bucket.clone());
    let (mem_a, a) = new_store(shared.clone());
    a.create_image("vm", IMAGE_BYTES).unwrap();
    let image = a.open_image("vm").unwrap();
    assert_eq!(a.publish_stats("vm").unwrap().counters.lease_epoch, 1);
    write_and_publish(&a, &image, 1);
    // Flushed, not compacted: a clean stop drains it to the bucket.
    write_round(&image, 11).unwrap();
    image.flush().unwrap();
    let g = a.drain_to_bucket(&image, WAIT).unwrap();
    assert_eq!(a.publish_stats("vm").unwrap().counters.published_generation, g);
    let want_a = read_tokens(&image).unwrap();
    drop((image, a)); // closes: releases the lease

    let (_mem_b, b) = new_store(shared.clone());
    let started = Instant::now();
    let (_, root_a) = newest_root(&bucket, "vm").unwrap().unwrap();
    assert!(b.manifest_cache().is_empty());
    b.fetch_image("vm", FetchAs::Owner).unwrap();
    assert!(started.elapsed() < LEASE.lease, "released: taken without waiting it out");
    assert!(!b.manifest_cache().is_empty(), "the fetch read its manifest through a cache of its own");
    // The take-over fences: A's root again under B's epoch, so a root of
    // A's that lands late is never the newest.
    let (fence_key, fence) = newest_root(&bucket, "vm").unwrap().unwrap();
    assert!(fence.epoch > root_a.epoch && fence.root == root_a.root, "{fence:?}");
    let late =
        RootObject { root: RootRecord { generation: root_a.root.generation + 5, ..root_a.root }, ..root_a };
    bucket.put(&root_key("vm", late.epoch, late.root.generation), &late.encode()).unwrap();
    assert_eq!(newest_root(&bucket, "vm").unwrap().unwrap().0, fence_key);
    let image = b.open_image("vm").unwrap();
    assert_eq!(b.publish_stats("vm").unwrap().counters.lease_epoch, 2);
    same_tokens(
        &read_tokens(&image).unwrap(),
        &want_a,
        "host B sees every write A flushed before it stopped",
    );
    let want_b = write_and_publish(&b, &image, 2);
    assert_ne!(want_a, want_b);

    // A, reopened while B holds the lease (its thread renews it): refused.
    let a = reopen(&mem_a, opts(shared.clone())).unwrap();
    let Err(e) = a.open_image("vm") else { panic!("A opened an image B holds") };
    assert!(e.to_string().contains("held by store"), "{e}");
    drop(a);
    // After B stopped: A's copy is stale (B wrote since), still refused.
    drop((image, b));
    let a = reopen(&mem_a, opts(shared.clone())).unwrap();
    let Err(e) = a.open_image("vm") else { panic!("A opened a stale copy") };
    assert!(e.to_string().contains("fetch it again"), "{e}");
    // A third store takes it over and sees B's writes.
    let (_mem_c, c) = new_store(shared);
    c.fetch_image("vm", FetchAs::Owner).unwrap();
    let image = c.open_image("vm").unwrap();
    same_tokens(&read_tokens(&image).unwrap(), &want_b, "host C sees what B published");
    // (A's refused open claimed epoch 3 before it saw its copy was stale.)
    assert!(c.publish_stats("vm").unwrap().counters.lease_epoch > 2);
    // A new image of a published name would shadow it: refused.
    let (_mem_d, d) = new_store(Arc::new(bucket.clone()));
    let Err(e) = d.create_image("vm", IMAGE_BYTES) else { panic!("created over a published image") };
    assert!(e.to_string().contains("fetch it instead"), "{e}");

    // Removing it from the bucket: refused while C has it open, then
    // (from D, while C holds the lease) refused by the lease.
    let Err(e) = c.unpublish_image("vm") else { panic!("unpublished an open image") };
    assert!(e.to_string().contains("open"), "{e}");
    let Err(e) = d.unpublish_image("vm") else { panic!("unpublished an image another store holds") };
    assert!(e.to_string().contains("held by store"), "{e}");
    drop((image, c));
    let r = d.unpublish_image("vm").unwrap();
    assert!(r.roots >= 1 && r.page_ranges >= 1, "{r:?}");
    assert!(newest_root(&bucket, "vm").unwrap().is_none());
    let left: Vec<String> =
        bucket.keys().into_iter().filter(|k| k.starts_with("images/vm/") && !k.contains("/lease/")).collect();
    assert!(left.is_empty(), "{left:?}");
    let Err(e) = d.unpublish_image("vm") else { panic!("unpublished twice") };
    assert!(e.to_string().contains("published image vm"), "{e}");
    // The name is free again, and its lease's epochs go on.
    d.create_image("vm", IMAGE_BYTES).unwrap();
    let image = d.open_image("vm").unwrap();
    assert!(d.publish_stats("vm").unwrap().counters.lease_epoch > 3);
    write_and_publish(&d, &image, 5);
}

#[test]
fn a_silent_holder_is_waited_out_fenced_and_fails_its_writes() {
    let bucket = MemObjects::new();
    let shared: Arc<dyn Objects> = Arc::new(bucket.clone());
    let switch = Arc::new(Switch { inner: bucket.clone(), off: AtomicBool::new(false) });
    let (_mem_a, a) = new_store(switch.clone());
    a.create_image("vm", IMAGE_BYTES).unwrap();
    let image_a = a.open_image("vm").unwrap();
    let want = write_and_publish(&a, &image_a, 1);

    // A goes silent (a partition, or a hung host): it cannot renew.
    switch.off.store(true, Ordering::SeqCst);
    let (_mem_b, b) = new_store(shared.clone());
    let started = Instant::now();
    b.fetch_image("vm", FetchAs::Owner).unwrap();
    let waited = started.elapsed();
    assert!(waited >= LEASE.lease, "took A's lease after {waited:?}, before it ran out");
    let image_b = b.open_image("vm").unwrap();
    same_tokens(&read_tokens(&image_b).unwrap(), &want, "B sees what A published");

    // A's lease ran out before B took it: A's writes fail, never land.
    let deadline = Instant::now() + WAIT;
    while image_a.failure().is_none() {
        assert!(Instant::now() < deadline, "A still takes writes without its lease");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(image_a.write(0, &payload(77, 0, 8), false).is_err());
    assert!(image_a.flush().is_err());
    let st = a.publish_stats("vm").unwrap();
    assert!(st.lease_lost.is_some(), "{st:?}");
    // Back online, A still cannot publish over B.
    switch.off.store(false, Ordering::SeqCst);
    assert!(a.publish_wait("vm", Duration::from_millis(200)).is_err());
    let want_b = write_and_publish(&b, &image_b, 2);
    drop((image_b, b));
    let (_mem_c, c) = new_store(shared);
    c.fetch_image("vm", FetchAs::Replica).unwrap();
    same_tokens(&read_tokens(&c.open_image("vm").unwrap()).unwrap(), &want_b, "B's roots are the newest");
}
