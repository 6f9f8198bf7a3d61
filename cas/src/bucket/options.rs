//! How a store uses its bucket: the settings of the pack tier (uploads,
//! reads of remote packs) and of publication and leases, which the store
//! assembles (`StoreOptions::remote`) and hands to each.

use crate::objects::Objects;
use crate::tasks::Tasks;
use std::sync::Arc;
use std::time::Duration;

/// How a chunk store uses an object store.
#[derive(Clone)]
pub struct RemoteOptions {
    pub objects: Arc<dyn Objects>,
    /// Bytes sealed and not yet uploaded (plus the active pack) past which
    /// compaction waits (default 512 MiB).
    pub pending_max_bytes: u64,
    /// Threads uploading packs, each with one pack in flight (default 2).
    /// 0 uploads only in [`PackTier::upload_sealed`](super::packs::PackTier::upload_sealed) (for tests that
    /// need every step in a fixed order).
    pub upload_threads: usize,
    /// The bound on a host slot claim's LIST-then-PUT (default 2 s).
    pub claim_bound: Duration,
    /// Bytes of uploaded packs kept as local files (default 1 GiB); past
    /// it the oldest uploaded packs are deleted locally and read from the
    /// bucket.
    pub local_keep_bytes: u64,
    /// Bytes of the cache of remote pack extents (`chunks/remote-cache`,
    /// default 256 MiB).
    pub cache_bytes: u64,
    /// How long a read retries a bucket that does not answer before it
    /// fails (default 30 s).
    pub read_retry: Duration,
    /// How often open images' manifests are published (default 2 s; see
    /// `cas::bucket::manifests`). Zero: only when `Store::publish_wait` asks (tests).
    pub publish_interval: Duration,
    /// The lease a store takes on each image it writes (`cas::objects::lease`;
    /// default 10 s, claim bound 2 s, margin 1 s). None: no lease (tests of
    /// one store alone).
    pub lease: Option<crate::objects::lease::LeaseConfig>,
    /// How long an image's superseded roots and page ranges stay in the
    /// bucket before the lease holder deletes them (default 120 s: a
    /// store fetching the image meanwhile can still read them; see
    /// `cas::bucket::manifests::superseded`).
    pub superseded_grace: Duration,
    /// Who runs the tier's background work (the uploaders, the publisher,
    /// the lease renewal): a thread each, or a test's stepper. The store
    /// sets its own (`StoreOptions::tasks`).
    pub tasks: Tasks,
}

impl RemoteOptions {
    pub fn new(objects: Arc<dyn Objects>) -> RemoteOptions {
        RemoteOptions {
            objects,
            pending_max_bytes: 512 << 20,
            upload_threads: 2,
            claim_bound: Duration::from_secs(2),
            local_keep_bytes: 1 << 30,
            cache_bytes: 256 << 20,
            read_retry: Duration::from_secs(30),
            publish_interval: Duration::from_secs(2),
            lease: Some(crate::objects::lease::LeaseConfig::default()),
            superseded_grace: Duration::from_secs(120),
            tasks: Tasks::Threads,
        }
    }
}

impl std::fmt::Debug for RemoteOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteOptions")
            .field("objects", &self.objects.describe())
            .field("pending_max_bytes", &self.pending_max_bytes)
            .field("upload_threads", &self.upload_threads)
            .field("claim_bound", &self.claim_bound)
            .field("local_keep_bytes", &self.local_keep_bytes)
            .field("cache_bytes", &self.cache_bytes)
            .field("read_retry", &self.read_retry)
            .field("publish_interval", &self.publish_interval)
            .field("superseded_grace", &self.superseded_grace)
            .field("lease", &self.lease)
            .field("tasks", &self.tasks)
            .finish()
    }
}
