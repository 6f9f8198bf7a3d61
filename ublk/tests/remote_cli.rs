//! `casblk remote set|show` and `casblk image fetch` against a one-node
//! Garage (`ci/garage`), as a user runs them: a wrong key, endpoint or
//! bucket is one line and nothing is recorded; store B fetches the image
//! store A published, read-only or to write it (A stopped), and fsck finds
//! it clean.
//!
//! Needs the Garage binary (see `casblk_remote::testing`).

mod common;

use cas::store::StoreRemote;
use cas::{Store, StoreOptions};
use casblk_remote::testing::GarageCluster;
use casblk_remote::{RemoteSettings, S3Objects};
use common::casblk;
use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

fn ok(out: &Output) -> String {
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Fails with one line on stderr that contains `words`.
fn fails(out: &Output, words: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "succeeded: {}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(err.trim().lines().count(), 1, "not one line: {err}");
    assert!(err.contains(words), "{err}");
}

/// The store in `dir` opened in this process with its recorded bucket.
fn open_with_remote(dir: &Path) -> Arc<Store> {
    let settings = RemoteSettings::read(dir).unwrap().expect("remote settings");
    let objects = S3Objects::open(settings.config().unwrap()).unwrap();
    let mut remote = cas::bucket::RemoteOptions::new(Arc::new(objects));
    remote.lease = Some(cas::objects::lease::LeaseConfig {
        lease: Duration::from_secs(4),
        claim_bound: Duration::from_millis(200),
        margin: Duration::from_millis(400),
    });
    let opts = StoreOptions {
        background_compaction: false,
        remote: StoreRemote(Some(remote)),
        ..Default::default()
    };
    Store::open(Arc::new(cas::storage::FsStorage::new()), dir, opts).unwrap()
}

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i / 4096) as u8 ^ seed ^ (i % 251) as u8).collect()
}

#[test]
fn a_store_fetches_the_image_another_published_from_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(cluster) = GarageCluster::start(&tmp.path().join("garage"), 1) else { return };
    let cfg = cluster.config();
    let key = tmp.path().join("key");
    std::fs::write(&key, format!("{}\n{}\n", cfg.key_id, cfg.secret)).unwrap();
    let bad_key = tmp.path().join("bad-key");
    std::fs::write(&bad_key, format!("{}\nnot-the-secret-at-all\n", cfg.key_id)).unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    let endpoint = cfg.endpoints.join(",");
    let set = |dir: &Path, endpoint: &str, bucket: &str, key: &Path| {
        let key = key.to_str().unwrap();
        casblk(dir, &["remote", "set", "--endpoint", endpoint, "--bucket", bucket, "--key-file", key])
    };
    for dir in [&a, &b] {
        ok(&casblk(dir, &["image", "create", "scratch", "--size", "1M"]));
    }

    // Each bad setup: one line naming the problem, nothing recorded.
    fails(&set(&a, &endpoint, &cfg.bucket, &bad_key), "denied");
    fails(&set(&a, "http://127.0.0.1:9", &cfg.bucket, &key), "cannot connect");
    fails(&set(&a, &endpoint, "no-such-bucket", &key), "no-such-bucket");
    fails(&set(&a, "127.0.0.1:3900", &cfg.bucket, &key), "http://");
    assert!(ok(&casblk(&a, &["remote", "show"])).contains("has no remote"));

    ok(&set(&a, &endpoint, &cfg.bucket, &key));
    ok(&set(&b, &endpoint, &cfg.bucket, &key));
    assert!(ok(&casblk(&b, &["remote", "show"])).contains(&format!("s3://{}/", cfg.bucket)));

    // Store A writes an image and stops cleanly (everything published).
    let want = data(2 << 20, 7);
    {
        let store = open_with_remote(&a);
        store.create_image("vm", 8 << 20).unwrap();
        let image = store.open_image("vm").unwrap();
        image.write(1 << 20, &want, false).unwrap();
        store.drain_to_bucket(&image, Duration::from_secs(60)).unwrap();
    }

    // Store B: a replica, then (after removing it) the image to write.
    let out = ok(&casblk(&b, &["image", "fetch", "vm", "--read-only"]));
    assert!(out.contains("vm: generation"), "{out}");
    assert!(ok(&casblk(&b, &["image", "list"])).contains("vm"));
    ok(&casblk(&b, &["image", "rm", "vm"]));
    ok(&casblk(&b, &["image", "fetch", "vm"]));
    let fsck = ok(&casblk(&b, &["fsck"]));
    assert!(fsck.contains(": clean;"), "{fsck}");
    {
        let store = open_with_remote(&b);
        let image = store.open_image("vm").unwrap();
        let mut got = vec![0u8; want.len()];
        image.read(1 << 20, &mut got).unwrap();
        assert!(got == want, "store B reads what store A wrote");
    }
    // A name the bucket holds cannot be fetched over a local image.
    fails(&casblk(&b, &["image", "fetch", "vm"]), "exists");
    // Removed from the bucket and from B; the name is free for a new image.
    let out = ok(&casblk(&b, &["image", "rm", "vm", "--bucket"]));
    assert!(out.contains("removed from the bucket") && out.contains("from this store"), "{out}");
    assert!(!ok(&casblk(&b, &["image", "list"])).contains("vm"));
    fails(&casblk(&a, &["image", "rm", "vm", "--bucket"]), "published image vm");
    ok(&casblk(&b, &["image", "create", "vm", "--size", "1M"]));
}
