//! Publication of images' manifests to the store's bucket (issue 18, stage
//! 4), so that another store can open an image at a consistent point
//! (fetch.rs), and the gate that keeps the log until a manifest is
//! published.
//!
//! A round for one image (the publisher thread runs one per image every
//! `publish_interval`; [`Publisher::publish_wait`] runs them on demand):
//! 1. take the committed tree of this moment (`Manifest::committed`);
//!    nothing to do if its generation is the one published;
//! 2. every chunk the pages not yet sent name must be whole in the bucket
//!    (`ChunkStore::packs_in_bucket`: the active pack is sealed if it is
//!    one of them); if some are on their way, the round ends and the next
//!    one looks again;
//! 3. PUT the new page ranges of the manifest file (ranges.rs), then the
//!    root object `roots/<epoch>-<generation>` that lists them
//!    (root_object.rs);
//! 4. move the image's reclaim gate to the root's `covered` and reclaim
//!    the log through it.
//!
//! A crash anywhere leaves roots that are whole (each names only objects
//! PUT before it, and keys are written once), and a log that still holds
//! every record the newest published root does not cover, except what
//! the local manifest already covers at open (the gate starts there: a
//! reopened image has its log replayed against its own manifest), which
//! the first round after the open publishes.
//!
//! **The window.** What another store sees of an image is its newest
//! published root. Writes flushed since are in the log, which compaction
//! may no longer empty past the gate: the log quota bounds them in bytes,
//! and writers wait for room (never fail) while publication is behind.
//! The age of the oldest commit not yet published is reported
//! (`unpublished_ms`).
//!
//! **Refusals.** A tree naming chunks that can never be in the bucket
//! (packs from before the store had a remote, leaves without locations)
//! is not published: the gate is lifted, so the image works as without a
//! remote, and the reason is in its stats; the next commit tries again.
//! A bucket that fails keeps the gate: the log fills and writers wait.

pub mod fetch;
pub mod ranges;
pub mod root_object;

use crate::chunk::ChunkStore;
use crate::error::{Error, Result};
use crate::image::Image;
use crate::manifest::{Manifest, FIRST_TREE_PAGE};
use crate::objects::Objects;
use ranges::Ranges;
use root_object::{pages_key, root_key, RootObject};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What publication has done for one image (`Store::publish_stats`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PublishStats {
    /// The newest root in the bucket: its generation and the log seq it
    /// covers (0: none published since open).
    pub published_generation: u64,
    pub published_covered_seq: u64,
    /// The local manifest's generation.
    pub manifest_generation: u64,
    /// How long the oldest commit not yet published has waited (0: none).
    pub unpublished_ms: u64,
    /// Page ranges the newest root lists.
    pub ranges: u64,
    pub publications: u64,
    pub pages_sent: u64,
    /// Rounds that failed (each is retried), and the last one's message.
    pub errors: u64,
    pub last_error: Option<String>,
    /// Why the image is not published at all (then its log is not held).
    pub refused: Option<String>,
}

/// How a round ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The newest commit is in the bucket (its generation).
    UpToDate(u64),
    /// Chunks it names are still being uploaded.
    Waiting,
    /// It cannot be published (see [`PublishStats::refused`]).
    Refused,
}

struct ImageState {
    /// The manifest file the ranges come from (a rewrite makes a new one).
    file_id: Option<u64>,
    series: u64,
    ranges: Ranges,
    stats: PublishStats,
    /// When a commit was first seen unpublished.
    behind_since: Option<Instant>,
}

struct Entry {
    image: Weak<Image>,
    manifest: Weak<Manifest>,
    state: Mutex<ImageState>,
}

/// Publishes the manifests of a store's open images (see the module docs).
pub struct Publisher {
    chunks: Arc<ChunkStore>,
    objects: Arc<dyn Objects>,
    store_id: u64,
    interval: Duration,
    images: Mutex<BTreeMap<String, Arc<Entry>>>,
    stop: Mutex<bool>,
    wake: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
}

use crate::sync::lock;

fn new_series() -> u64 {
    use std::hash::BuildHasher;
    std::hash::RandomState::new().hash_one(std::time::SystemTime::now())
}

impl Publisher {
    /// A publisher for `chunks`' bucket, or None if it has no remote.
    pub fn new(chunks: &Arc<ChunkStore>, interval: Duration) -> Option<Arc<Publisher>> {
        let objects = chunks.objects()?.clone();
        Some(Arc::new(Publisher {
            chunks: chunks.clone(),
            objects,
            store_id: chunks.store_id(),
            interval,
            images: Mutex::default(),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            thread: Mutex::new(None),
        }))
    }

    /// How often the thread runs its rounds (zero: no thread; rounds run
    /// only in `publish_wait`).
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Starts the thread that runs a round per image every interval.
    pub fn start(self: &Arc<Publisher>) -> Result<()> {
        let me = Arc::downgrade(self);
        let interval = self.interval;
        let t = std::thread::Builder::new()
            .name("casblk-publish".into())
            .spawn(move || run(me, interval))
            .map_err(|e| Error::io("publisher thread", e))?;
        *lock(&self.thread) = Some(t);
        Ok(())
    }

    /// Stops the thread (a round under way finishes first).
    pub fn stop(&self) {
        *lock(&self.stop) = true;
        self.wake.notify_all();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }

    /// Publishes `image` from now on. Its log is kept from what its
    /// manifest covers now until a root covering it is in the bucket.
    pub fn register(&self, name: &str, image: &Arc<Image>, manifest: &Arc<Manifest>) {
        image.gate_reclaim(manifest.covered());
        let state = ImageState {
            file_id: None,
            series: 0,
            ranges: Ranges::default(),
            stats: PublishStats::default(),
            behind_since: None,
        };
        let e = Entry {
            image: Arc::downgrade(image),
            manifest: Arc::downgrade(manifest),
            state: Mutex::new(state),
        };
        lock(&self.images).insert(name.to_string(), Arc::new(e));
        self.wake.notify_all();
    }

    /// What publication has done for `name`, if it is published.
    pub fn stats(&self, name: &str) -> Option<PublishStats> {
        let e = lock(&self.images).get(name).cloned()?;
        let st = lock(&e.state);
        let mut s = st.stats.clone();
        s.unpublished_ms = st.behind_since.map_or(0, |t| t.elapsed().as_millis() as u64);
        if let Some(m) = e.manifest.upgrade() {
            s.manifest_generation = m.generation();
        }
        Some(s)
    }

    /// One round for `name` (see the module docs).
    pub fn publish(&self, name: &str) -> Result<Outcome> {
        let e = lock(&self.images)
            .get(name)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("image {name} among the published ones")))?;
        let (Some(image), Some(manifest)) = (e.image.upgrade(), e.manifest.upgrade()) else {
            lock(&self.images).remove(name);
            return Err(Error::NotFound(format!("image {name} open")));
        };
        let mut st = lock(&e.state);
        let r = self.round(name, &image, &manifest, &mut st);
        match &r {
            Ok(Outcome::UpToDate(_)) => st.behind_since = None,
            Ok(_) => {
                st.behind_since.get_or_insert_with(Instant::now);
            }
            Err(err) => {
                st.behind_since.get_or_insert_with(Instant::now);
                st.stats.errors += 1;
                st.stats.last_error = Some(err.to_string());
            }
        }
        r
    }

    /// Counts a failure on `name`'s behalf that no round saw (an upload
    /// the round waits for).
    fn note_error(&self, name: &str, e: &Error) {
        if let Some(entry) = lock(&self.images).get(name).cloned() {
            let mut st = lock(&entry.state);
            st.stats.errors += 1;
            st.stats.last_error = Some(e.to_string());
        }
    }

    /// Rounds for `name` until its newest commit is published; fails if
    /// it is refused, or is not published within `timeout` (with the last
    /// error). Returns the generation published.
    pub fn publish_wait(&self, name: &str, timeout: Duration) -> Result<u64> {
        let started = Instant::now();
        let mut upload_error = None;
        loop {
            let r = self.publish(name);
            let late = started.elapsed() >= timeout;
            match r {
                Ok(Outcome::UpToDate(g)) => return Ok(g),
                Ok(Outcome::Refused) => {
                    let why = self.stats(name).and_then(|s| s.refused).unwrap_or_default();
                    return Err(Error::Unavailable(format!("publishing image {name}"), why));
                }
                // Only the bucket's failures are waited out; a local one
                // (the manifest, the chunk store) is the caller's to see.
                Err(e) if late || !from_bucket(&e) => return Err(e),
                Ok(Outcome::Waiting) if late => {
                    if let Some(e) = upload_error {
                        return Err(e);
                    }
                    return Err(Error::Unavailable(
                        format!("publishing image {name}"),
                        format!("its chunks were not uploaded within {timeout:?}"),
                    ));
                }
                Ok(Outcome::Waiting) => {
                    if let Err(e) = self.chunks.wait_uploads(Duration::from_millis(100)) {
                        if late || !from_bucket(&e) {
                            return Err(e);
                        }
                        self.note_error(name, &e);
                        upload_error = Some(e);
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    fn round(&self, name: &str, image: &Image, manifest: &Manifest, st: &mut ImageState) -> Result<Outcome> {
        let c = manifest.committed();
        let root = c.root();
        let Some(file_id) = c.file_id() else {
            // Never committed: nothing to publish, nothing held.
            return Ok(Outcome::UpToDate(0));
        };
        if st.file_id == Some(file_id) && root.generation == st.stats.published_generation {
            return Ok(Outcome::UpToDate(root.generation));
        }
        if st.stats.refused.is_some() && root.generation == st.stats.manifest_generation {
            return Ok(Outcome::Refused);
        }
        st.stats.manifest_generation = root.generation;
        let (series, ranges) = if st.file_id == Some(file_id) {
            (st.series, st.ranges.clone())
        } else {
            (new_series(), Ranges::default())
        };
        let from = ranges.end(FIRST_TREE_PAGE);
        let mut packs = BTreeSet::new();
        let mut unlocated = 0u64;
        c.refs_since(from, &mut |r| match r.at {
            Some(at) => {
                packs.insert(at.pack);
            }
            None => unlocated += 1,
        })?;
        let refused = if unlocated > 0 {
            Some(format!("{unlocated} blocks are mapped by hash only (leaves from before chunk locations)"))
        } else {
            match self.chunks.packs_in_bucket(&packs) {
                Ok(true) => None,
                Ok(false) => return Ok(Outcome::Waiting),
                Err(Error::InvalidArgument(why)) => Some(why),
                Err(e) => return Err(e),
            }
        };
        if let Some(why) = refused {
            if st.stats.refused.is_none() {
                tracing::warn!(image = name, reason = %why, "the image is not published; its log is reclaimed as without a remote");
            }
            st.stats.refused = Some(why);
            image.gate_reclaim(u64::MAX);
            return Ok(Outcome::Refused);
        }
        let (grown, send) = ranges.grow(FIRST_TREE_PAGE, root.file_pages);
        for &(first, end) in &send {
            let pages = c.read_pages(first, end)?;
            self.objects.put(&pages_key(name, series, first, end), &pages)?;
            st.stats.pages_sent += end - first;
        }
        let obj = RootObject {
            store_id: self.store_id,
            epoch: 0,
            size_bytes: image.size_bytes(),
            series,
            root,
            ranges: grown.list.clone(),
        };
        self.objects.put(&root_key(name, 0, root.generation), &obj.encode())?;
        st.file_id = Some(file_id);
        st.series = series;
        st.ranges = grown;
        st.stats.refused = None;
        st.stats.published_generation = root.generation;
        st.stats.published_covered_seq = root.covered;
        st.stats.ranges = st.ranges.list.len() as u64;
        st.stats.publications += 1;
        image.gate_reclaim(root.covered);
        if let Err(e) = image.reclaim_log(root.covered) {
            // Published all the same; the compactor's next reclaim retries.
            tracing::warn!(image = name, error = %e, "reclaiming the published log failed");
        }
        Ok(Outcome::UpToDate(root.generation))
    }
}

/// True for an error of the object store (see `From<ObjectError>`).
fn from_bucket(e: &Error) -> bool {
    matches!(e, Error::Unavailable(what, _) if what == crate::objects::OBJECT_STORE)
}

/// The publisher thread: a round per image every `interval`, until stopped
/// or the publisher is gone.
fn run(me: Weak<Publisher>, interval: Duration) {
    loop {
        let Some(p) = me.upgrade() else { return };
        let names: Vec<String> = lock(&p.images).keys().cloned().collect();
        for name in names {
            if *lock(&p.stop) {
                return;
            }
            match p.publish(&name) {
                Ok(_) => {}
                Err(Error::NotFound(_)) => {}
                Err(e) => tracing::debug!(image = %name, error = %e, "publication round failed; retried"),
            }
        }
        let stop = lock(&p.stop);
        if *stop {
            return;
        }
        let _ = p.wake.wait_timeout(stop, interval);
    }
}
