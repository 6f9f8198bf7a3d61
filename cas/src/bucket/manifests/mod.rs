//! Publication of images' manifests to the store's bucket (issue 18, stage
//! 4), so that another store can open an image at a consistent point
//! (fetch.rs), and the gate that keeps the log until a manifest is
//! published.
//!
//! A round for one image (the publish task runs one per image every
//! `publish_interval`; [`Publisher::publish_wait`] runs them on demand):
//! 1. take the committed tree of this moment (`Manifest::committed`);
//!    nothing to do if its generation is the one published at the
//!    image's present size (a grow republishes the generation's root);
//! 2. every chunk the pages not yet sent name must be whole in the bucket
//!    (`PackTier::packs_in_bucket`: the active pack is sealed if it is
//!    one of them); if some are on their way, the round ends and the next
//!    one looks again;
//! 3. PUT the new page ranges of the manifest file (ranges.rs), then the
//!    root object `roots/<epoch>-<generation>` that lists them
//!    (root_object.rs);
//! 4. move the image's reclaim gate to the root's `covered` and reclaim
//!    the log through it.
//!
//! A crash anywhere leaves roots that are whole (each names only objects
//! PUT before it, and a key is written once, or again with only the
//! image's size larger), and a log that still holds
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
//! **Ownership.** With `RemoteOptions::lease`, a store writes an image
//! only under its lease (`cas::objects::lease`), taken when the image is
//! opened (or fetched to be written) and renewed by a thread of its own
//! (never behind a round's PUTs) once a quarter of it has passed. Its roots are keyed by the lease's epoch, so a newer
//! holder's roots always sort after every older holder's. A root PUT that
//! returns after the lease's deadline does not count as published. A
//! lease found lost (a newer epoch) or run out fails the image: writes and
//! flushes get EIO, reads go on. A store refuses to take the lease of an
//! image whose newest root another store published from a tree it does not
//! have (the image was written elsewhere since: fetch it again). Leases are
//! released when the store closes, so the next store takes them at once.
//!
//! **Superseded objects.** The holder deletes the roots and page ranges
//! its newer roots replaced, once they have been superseded for
//! `RemoteOptions::superseded_grace` (superseded.rs).
//!
//! **Cross-host dedup.** Every fifth round the thread also imports other
//! stores' new packs into the dedup index (`PackTier::import_foreign`).
//!
//! **Refusals.** A tree naming chunks that can never be in the bucket
//! (packs from before the store had a remote, leaves without locations)
//! is not published: the gate is lifted, so the image works as without a
//! remote, and the reason is in its stats; the next commit tries again.
//! A bucket that fails keeps the gate: the log fills and writers wait.

pub mod fetch;
mod leases;
pub mod ranges;
pub mod root_object;
mod round;
pub mod superseded;
pub mod unpublish;

use crate::background::BackgroundCpu;
use crate::bucket::packs::PackTier;
use crate::bucket::RemoteOptions;
use crate::chunk::ChunkStore;
use crate::error::Result;
use crate::image::Image;
use crate::manifest::Manifest;
use crate::objects::lease::{Lease, LeaseConfig};
use crate::objects::Objects;
use crate::tasks::{Context, Step, Task, TaskHandle, Tasks, Wake};
use ranges::Ranges;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use superseded::Superseded;

pub use crate::image::stats::PublishCounters;
pub use leases::lease_prefix;

/// What publication has done for one image (`Store::publish_stats`): the
/// figures, and the messages behind the flags.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PublishStats {
    #[serde(flatten)]
    pub counters: PublishCounters,
    /// The last failed round's message.
    pub last_error: Option<String>,
    /// Why the image is not published at all (then its log is not held).
    pub refused: Option<String>,
    /// Why the lease was lost (the image then fails its writes).
    pub lease_lost: Option<String>,
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
    /// The image size the last root carried: a grow is published even
    /// with no commit after it (the root's key stays that generation's).
    published_size_bytes: u64,
    /// When a commit was first seen unpublished.
    behind_since: Option<Instant>,
    /// What this holder published that newer roots replaced.
    superseded: Superseded,
}

/// An image's lease, apart from its publication state: renewals never
/// wait for a round's PUTs.
#[derive(Default)]
struct LeaseSlot {
    lease: Option<Lease>,
    /// Why it was lost.
    lost: Option<String>,
}

struct Entry {
    image: Weak<Image>,
    manifest: Weak<Manifest>,
    /// Held for a whole round, requests included.
    state: Mutex<ImageState>,
    lease: Mutex<LeaseSlot>,
    /// What `stats` shows: copied from `state` after each round, so it
    /// never waits behind the bucket.
    shown: Mutex<Shown>,
    /// Held by the lease thread through a renewal's requests, and by a
    /// release before it takes the lease.
    renewing: Mutex<()>,
}

#[derive(Default)]
struct Shown {
    stats: PublishStats,
    behind_since: Option<Instant>,
    /// When the round under way began.
    round_started: Option<Instant>,
}

impl Entry {
    /// Copies the state's figures to what `stats` shows.
    fn show(&self, st: &ImageState) {
        let mut shown = lock(&self.shown);
        shown.stats = st.stats.clone();
        shown.stats.counters.superseded_deleted = st.superseded.deleted;
        shown.stats.counters.superseded_pending = st.superseded.pending();
        shown.behind_since = st.behind_since;
        shown.round_started = None;
    }
}

/// Publishes the manifests of a store's open images (see the module docs).
pub struct Publisher {
    chunks: Arc<ChunkStore>,
    /// Where `chunks`' sealed packs go.
    tier: Arc<PackTier>,
    objects: Arc<dyn Objects>,
    store_id: u64,
    interval: Duration,
    lease_cfg: Option<LeaseConfig>,
    /// How long superseded objects stay (`RemoteOptions::superseded_grace`).
    grace: Duration,
    images: Mutex<BTreeMap<String, Arc<Entry>>>,
    /// Leases taken by `fetch_image` for images not opened yet.
    held: Mutex<BTreeMap<String, Lease>>,
    /// Rounds of the publish thread so far.
    rounds: std::sync::atomic::AtomicU64,
    stop: Mutex<bool>,
    /// Who runs the publish and lease tasks.
    tasks: Tasks,
    /// The publish and lease tasks (see `start`), woken when an image is
    /// registered.
    running: Mutex<Vec<(TaskHandle, Wake)>>,
}

use crate::sync::lock;

fn new_series() -> u64 {
    use std::hash::BuildHasher;
    std::hash::RandomState::new().hash_one(std::time::SystemTime::now())
}

impl Publisher {
    /// A publisher for the bucket `tier` uploads `chunks`' packs to.
    pub fn new(chunks: &Arc<ChunkStore>, tier: &Arc<PackTier>, opts: &RemoteOptions) -> Arc<Publisher> {
        let objects = tier.objects().clone();
        Arc::new(Publisher {
            chunks: chunks.clone(),
            tier: tier.clone(),
            objects,
            store_id: chunks.store_id(),
            interval: opts.publish_interval,
            lease_cfg: opts.lease,
            grace: opts.superseded_grace,
            images: Mutex::default(),
            held: Mutex::default(),
            rounds: Default::default(),
            stop: Mutex::new(false),
            tasks: opts.tasks.clone(),
            running: Mutex::new(Vec::new()),
        })
    }

    /// True when the store needs the thread: it publishes on its own
    /// (a non-zero interval), or renews leases.
    pub fn needs_thread(&self) -> bool {
        !self.interval.is_zero() || self.lease_cfg.is_some()
    }

    /// Starts the tasks (`crate::tasks`): one runs a round per image every
    /// interval (off: `publish_interval` 0), one renews leases, looking
    /// every lease/16 (off: no `lease`), so a long round never delays a
    /// renewal.
    pub fn start(self: &Arc<Publisher>) -> Result<()> {
        let mut running = lock(&self.running);
        let mut spawn = |name: &str, period: Duration, work: fn(&Publisher)| -> Result<()> {
            let task = Periodic { me: Arc::downgrade(self), period, work };
            let handle = self.tasks.try_spawn(name, BackgroundCpu::Normal, Box::new(task))?;
            let wake = handle.waker();
            running.push((handle, wake));
            Ok(())
        };
        if !self.interval.is_zero() {
            spawn("casblk-publish", self.interval, |p| p.publish_all())?;
        }
        if let Some(cfg) = self.lease_cfg {
            spawn("casblk-lease", cfg.lease / 16, |p| p.renew_leases())?;
        }
        Ok(())
    }

    /// Wakes the tasks: their next step runs now.
    fn wake_tasks(&self) {
        for (_, wake) in lock(&self.running).iter() {
            wake.wake();
        }
    }

    /// Stops the tasks (a round under way finishes first), then
    /// releases every lease, so the next store takes them at once.
    pub fn stop(&self) {
        *lock(&self.stop) = true;
        // Out of the lock first: a stopping task may wake the others.
        let running = std::mem::take(&mut *lock(&self.running));
        drop(running);
        for (name, l) in std::mem::take(&mut *lock(&self.held)) {
            leases::release(&name, l);
        }
        let images = std::mem::take(&mut *lock(&self.images));
        for (name, e) in images {
            let had = lock(&e.lease).lease.is_some();
            e.release(&name);
            if let (true, Some(image)) = (had, e.image.upgrade()) {
                // Still open elsewhere: its writes could never be published.
                image.fail(format!("the store closed and released its lease on image {name}"));
            }
        }
    }

    /// Drops the entry of a closed image (if it is still `e`: a reopen
    /// registers a new one) and releases its lease.
    fn forget(&self, name: &str, e: &Arc<Entry>) {
        {
            let mut images = lock(&self.images);
            if images.get(name).is_some_and(|cur| Arc::ptr_eq(cur, e)) {
                images.remove(name);
            }
        }
        e.release(name);
    }

    /// Publishes `image` from now on. Its log is kept from what its
    /// manifest covers now until a root covering it is in the bucket.
    /// `lease`: the one `acquire` gave, if leases are on.
    pub fn register(&self, name: &str, image: &Arc<Image>, manifest: &Arc<Manifest>, lease: Option<Lease>) {
        image.gate_reclaim(manifest.covered());
        let lease_epoch = lease.as_ref().map_or(0, Lease::epoch);
        let state = ImageState {
            published_size_bytes: 0,
            file_id: None,
            series: 0,
            ranges: Ranges::default(),
            stats: PublishStats {
                counters: PublishCounters { lease_epoch, ..Default::default() },
                ..Default::default()
            },
            behind_since: None,
            superseded: Superseded::default(),
        };
        let e = Entry {
            image: Arc::downgrade(image),
            manifest: Arc::downgrade(manifest),
            shown: Mutex::default(),
            renewing: Mutex::new(()),
            state: Mutex::new(state),
            lease: Mutex::new(LeaseSlot { lease, lost: None }),
        };
        e.show(&lock(&e.state));
        lock(&self.images).insert(name.to_string(), Arc::new(e));
        self.wake_tasks();
    }

    /// What publication has done for `name`, if it is published: as of
    /// the last round's end (never waiting for a round under way), with
    /// the manifest's generation of now. A commit not yet published counts
    /// as behind since the round under way began, if that was earlier.
    pub fn stats(&self, name: &str) -> Option<PublishStats> {
        let e = lock(&self.images).get(name).cloned()?;
        let (mut s, behind_since) = {
            let shown = lock(&e.shown);
            (shown.stats.clone(), shown.behind_since.or(shown.round_started))
        };
        s.lease_lost = lock(&e.lease).lost.clone();
        if let Some(m) = e.manifest.upgrade() {
            s.counters.manifest_generation = m.generation();
        }
        let behind = s.counters.manifest_generation != s.counters.published_generation;
        s.counters.unpublished_ms =
            behind_since.filter(|_| behind).map_or(0, |t| t.elapsed().as_millis() as u64);
        s.counters.lease_lost = s.lease_lost.is_some();
        s.counters.refused = s.refused.is_some();
        Some(s)
    }
}

/// A publisher task: `work` every `period` (sooner when woken), until
/// stopped or the publisher is gone.
struct Periodic {
    me: Weak<Publisher>,
    period: Duration,
    work: fn(&Publisher),
}

impl Task for Periodic {
    fn step(&mut self, _cx: &Context<'_>) -> Step {
        let Some(p) = self.me.upgrade() else { return Step::Done };
        (self.work)(&p);
        if *lock(&p.stop) {
            return Step::Done;
        }
        Step::Wait(Some(self.period))
    }
}
