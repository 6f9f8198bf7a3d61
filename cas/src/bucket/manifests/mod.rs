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
pub mod ranges;
pub mod root_object;
pub mod superseded;
pub mod unpublish;

use crate::bucket::packs::PackTier;
use crate::bucket::RemoteOptions;
use crate::chunk::ChunkStore;
use crate::error::{Error, Result};
use crate::image::Image;
use crate::manifest::RootRecord;
use crate::manifest::{Manifest, FIRST_TREE_PAGE};
use crate::objects::lease::{Lease, LeaseConfig};
use crate::objects::Objects;
use ranges::Ranges;
use root_object::{pages_key, root_key, RootObject};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use superseded::{Published, Superseded};

pub use crate::image::stats::PublishCounters;

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

impl Entry {
    /// Gives the lease up (the image closed or the store stops).
    fn release(&self, name: &str) {
        // After a renewal under way (its PUT would mark the claim held
        // again after the release's).
        let _renewal = lock(&self.renewing);
        let lease = lock(&self.lease).lease.take();
        if let Some(l) = lease {
            release(name, l);
        }
    }
}

/// Gives `lease` up; a failure only makes the next store wait it out.
fn release(name: &str, lease: Lease) {
    if let Err(e) = lease.release() {
        tracing::warn!(image = name, error = %e, "releasing the lease failed; the next store waits it out");
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
    wake: Condvar,
    thread: Mutex<Vec<JoinHandle<()>>>,
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
            wake: Condvar::new(),
            thread: Mutex::new(Vec::new()),
        })
    }

    /// True when the store needs the thread: it publishes on its own
    /// (a non-zero interval), or renews leases.
    pub fn needs_thread(&self) -> bool {
        !self.interval.is_zero() || self.lease_cfg.is_some()
    }

    /// Starts the threads: one runs a round per image every interval, one
    /// renews leases (looking every lease/16), so a long round never
    /// delays a renewal.
    pub fn start(self: &Arc<Publisher>) -> Result<()> {
        let mut threads = lock(&self.thread);
        if !self.interval.is_zero() {
            let me = Arc::downgrade(self);
            let interval = self.interval;
            threads.push(
                std::thread::Builder::new()
                    .name("casblk-publish".into())
                    .spawn(move || run(me, interval, |p| p.publish_all()))
                    .map_err(|e| Error::io("publisher thread", e))?,
            );
        }
        if let Some(cfg) = self.lease_cfg {
            let me = Arc::downgrade(self);
            threads.push(
                std::thread::Builder::new()
                    .name("casblk-lease".into())
                    .spawn(move || run(me, cfg.lease / 16, |p| p.renew_leases()))
                    .map_err(|e| Error::io("lease thread", e))?,
            );
        }
        Ok(())
    }

    /// Stops the thread (a round under way finishes first), then
    /// releases every lease, so the next store takes them at once.
    pub fn stop(&self) {
        *lock(&self.stop) = true;
        self.wake.notify_all();
        for t in std::mem::take(&mut *lock(&self.thread)) {
            let _ = t.join();
        }
        for (name, l) in std::mem::take(&mut *lock(&self.held)) {
            release(&name, l);
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

    /// Takes the lease on `name` for writing it (None without leases).
    /// `local` is the root of the copy here (None: none yet); refused if
    /// the bucket's newest root of `name` was published by another store
    /// from a different tree: this copy is stale.
    pub fn acquire(&self, name: &str, local: Option<RootRecord>) -> Result<Option<Lease>> {
        let Some(cfg) = self.lease_cfg else { return Ok(None) };
        if let Some(l) = lock(&self.held).remove(name) {
            if l.is_valid() {
                return Ok(Some(l));
            }
        }
        let what = || format!("image {name} in {}", self.objects.describe());
        let lease = Lease::acquire(self.objects.clone(), &lease_prefix(name), self.store_id, cfg, 3)
            .map_err(|e| Error::Unavailable(what(), format!("its lease is {e}")))?;
        if let Some(local) = local {
            if let Some((_, newest)) = fetch::newest_root(self.objects.as_ref(), name)? {
                if newest.store_id != self.store_id && newest.root != local {
                    let _ = lease.release();
                    return Err(Error::Unavailable(
                        what(),
                        format!(
                            "store {:#018x} wrote it since this copy (epoch {}, generation {}): remove it here and fetch it again",
                            newest.store_id, newest.epoch, newest.root.generation
                        ),
                    ));
                }
            }
        }
        Ok(Some(lease))
    }

    /// A take-over's fence: `root` (the newest root, just fetched) again
    /// under this holder's epoch, so that from now on no root of an
    /// earlier holder is the newest, even one whose PUT lands late (a
    /// replica never sees writes the new holder does not have). Its
    /// ranges are the earlier holder's; the first round after the open
    /// publishes a series of this store's and the sweep takes both.
    /// Best effort: without it, the first round's root fences.
    /// Under the lease `acquire_held` keeps for `name`.
    pub fn fence(&self, name: &str, root: &RootObject) {
        let epoch = lock(&self.held).get(name).filter(|l| l.is_valid()).map(Lease::epoch);
        let put = match epoch {
            Some(epoch) => {
                let fence = RootObject { store_id: self.store_id, epoch, ..root.clone() };
                let key = root_key(name, epoch, fence.root.generation);
                self.objects.put(&key, &fence.encode()).map_err(Error::from)
            }
            None => {
                Err(Error::Unavailable(format!("image {name}"), "the lease ran out before the fence".into()))
            }
        };
        if let Err(e) = put {
            tracing::warn!(image = name, error = %e, "publishing the take-over's fence root failed; the first publication fences");
        }
    }

    /// Takes the lease on `name` (see `acquire`, with no local copy) and
    /// keeps it, renewed, until the image is opened or `release_held`;
    /// false without leases.
    pub fn acquire_held(&self, name: &str) -> Result<bool> {
        let Some(lease) = self.acquire(name, None)? else { return Ok(false) };
        lock(&self.held).insert(name.to_string(), lease);
        Ok(true)
    }

    /// True while the lease `acquire_held` keeps for `name` holds (the lease
    /// thread renews it meanwhile).
    pub fn holds(&self, name: &str) -> bool {
        lock(&self.held).get(name).is_some_and(Lease::is_valid)
    }

    /// Gives up the lease `acquire_held` keeps for `name`, if any.
    pub fn release_held(&self, name: &str) {
        let lease = lock(&self.held).remove(name);
        if let Some(l) = lease {
            release(name, l);
        }
    }

    /// Renews every lease due (see `Lease::renewal_due`), failing images
    /// whose lease is lost or ran out, and releases the leases of images
    /// closed since.
    /// An open image's renewal runs its requests with no lock held, so
    /// neither a round nor `stats` waits behind the bucket. A fetched
    /// image's renews under the `held` lock: an open taking the lease
    /// meanwhile waits for it, so the renewal counted is never lost (a
    /// claim rewritten with the same bytes would look dead to a rival).
    pub fn renew_leases(&self) {
        for (name, l) in lock(&self.held).iter_mut() {
            if l.renewal_due() {
                if let Err(e) = l.renew() {
                    tracing::warn!(image = %name, error = %e, "renewing the lease of a fetched image failed");
                }
            }
        }
        let entries: Vec<(String, Arc<Entry>)> =
            lock(&self.images).iter().map(|(n, e)| (n.clone(), e.clone())).collect();
        for (name, e) in entries {
            let Some(image) = e.image.upgrade() else {
                self.forget(&name, &e);
                continue;
            };
            let _renewal = lock(&e.renewing);
            let renewal = match lock(&e.lease).lease.as_ref() {
                Some(l) if l.renewal_due() => l.renewal(),
                _ => continue,
            };
            // Only this thread renews: the slot's lease is this one, or was
            // released meanwhile (the image closed).
            let done = renewal.run();
            let mut slot = lock(&e.lease);
            let Some(l) = slot.lease.as_mut() else { continue };
            let lost = match l.finish(done) {
                Ok(()) => None,
                Err(crate::objects::lease::LeaseError::Store(err)) if l.is_valid() => {
                    tracing::warn!(image = %name, error = %err, "renewing the lease failed; retried");
                    None
                }
                Err(err) => Some(format!("the lease on image {name} is {err}")),
            };
            if let Some(why) = lost {
                slot.lease = None;
                slot.lost = Some(why.clone());
                drop(slot);
                image.fail(why);
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

    /// A round for every registered image; every `IMPORT_EVERY`th call
    /// also imports other stores' new packs into the dedup index.
    fn publish_all(&self) {
        let n = self.rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if n.is_multiple_of(IMPORT_EVERY) {
            if let Err(e) = self.tier.import_foreign(&self.chunks) {
                tracing::debug!(error = %e, "importing other stores' packs failed; retried");
            }
        }
        let names: Vec<String> = lock(&self.images).keys().cloned().collect();
        for name in names {
            if *lock(&self.stop) {
                return;
            }
            match self.publish(&name) {
                Ok(_) | Err(Error::NotFound(_)) => {}
                Err(e) => tracing::debug!(image = %name, error = %e, "publication round failed; retried"),
            }
        }
    }

    /// Publishes `image` from now on. Its log is kept from what its
    /// manifest covers now until a root covering it is in the bucket.
    /// `lease`: the one `acquire` gave, if leases are on.
    pub fn register(&self, name: &str, image: &Arc<Image>, manifest: &Arc<Manifest>, lease: Option<Lease>) {
        image.gate_reclaim(manifest.covered());
        let lease_epoch = lease.as_ref().map_or(0, Lease::epoch);
        let state = ImageState {
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
        self.wake.notify_all();
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

    /// One round for `name` (see the module docs).
    pub fn publish(&self, name: &str) -> Result<Outcome> {
        let e = lock(&self.images)
            .get(name)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("image {name} among the published ones")))?;
        let (Some(image), Some(manifest)) = (e.image.upgrade(), e.manifest.upgrade()) else {
            // Closed: the next store takes its lease without waiting.
            self.forget(name, &e);
            return Err(Error::NotFound(format!("image {name} open")));
        };
        let mut st = lock(&e.state);
        lock(&e.shown).round_started.get_or_insert_with(Instant::now);
        let r = self.round(name, &image, &manifest, &mut st, &e.lease);
        match &r {
            Ok(Outcome::UpToDate(_)) => {
                st.behind_since = None;
                // After the log is reclaimed: DELETEs never hold up writers.
                let held = || self.check_lease(name, &e.lease).is_ok();
                st.superseded.delete_due(self.objects.as_ref(), self.grace, &held);
            }
            Ok(_) => {
                st.behind_since.get_or_insert_with(Instant::now);
            }
            Err(err) => {
                st.behind_since.get_or_insert_with(Instant::now);
                st.stats.counters.errors += 1;
                st.stats.last_error = Some(err.to_string());
            }
        }
        e.show(&st);
        r
    }

    /// Counts a failure on `name`'s behalf that no round saw (an upload
    /// the round waits for).
    fn note_error(&self, name: &str, e: &Error) {
        let entry = lock(&self.images).get(name).cloned();
        if let Some(entry) = entry {
            let mut st = lock(&entry.state);
            st.stats.counters.errors += 1;
            st.stats.last_error = Some(e.to_string());
            entry.show(&st);
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
                    if let Err(e) = self.tier.wait_uploads(Duration::from_millis(100)) {
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

    /// Fails unless the image is written under a lease that holds (or
    /// leases are off).
    fn check_lease(&self, name: &str, slot: &Mutex<LeaseSlot>) -> Result<()> {
        let slot = lock(slot);
        match (&self.lease_cfg, &slot.lease) {
            (None, _) => Ok(()),
            (Some(_), Some(l)) if l.is_valid() => Ok(()),
            (Some(_), _) => Err(Error::Unavailable(
                format!("publishing image {name}"),
                slot.lost.clone().unwrap_or_else(|| "this store's lease on it ran out".into()),
            )),
        }
    }

    fn round(
        &self,
        name: &str,
        image: &Image,
        manifest: &Manifest,
        st: &mut ImageState,
        lease: &Mutex<LeaseSlot>,
    ) -> Result<Outcome> {
        self.check_lease(name, lease)?;
        let c = manifest.committed();
        let root = c.root();
        let Some(file_id) = c.file_id() else {
            // Never committed: nothing to publish, nothing held.
            return Ok(Outcome::UpToDate(0));
        };
        if st.file_id == Some(file_id) && root.generation == st.stats.counters.published_generation {
            return Ok(Outcome::UpToDate(root.generation));
        }
        if st.stats.refused.is_some() && root.generation == st.stats.counters.manifest_generation {
            return Ok(Outcome::Refused);
        }
        st.stats.counters.manifest_generation = root.generation;
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
            match self.tier.packs_in_bucket(&self.chunks, &packs) {
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
            st.stats.counters.pages_sent += end - first;
        }
        let obj = RootObject {
            store_id: self.store_id,
            epoch: st.stats.counters.lease_epoch,
            size_bytes: image.size_bytes(),
            series,
            root,
            ranges: grown.list.clone(),
        };
        // Not after the lease ran out (the page PUTs may have been slow).
        self.check_lease(name, lease)?;
        let key = root_key(name, st.stats.counters.lease_epoch, root.generation);
        self.objects.put(&key, &obj.encode())?;
        // A root that landed after the lease ran out may be behind a new
        // holder's: not counted (its epoch sorts it below theirs).
        self.check_lease(name, lease)?;
        let old = st.file_id.is_some().then_some((st.series, &st.ranges));
        st.superseded.published(
            self.objects.as_ref(),
            name,
            old,
            Published { series, ranges: &grown, root_key: &key },
            self.lease_cfg.is_some(),
        );
        st.file_id = Some(file_id);
        st.series = series;
        st.ranges = grown;
        st.stats.refused = None;
        st.stats.counters.published_generation = root.generation;
        st.stats.counters.published_covered_seq = root.covered;
        st.stats.counters.ranges = st.ranges.list.len() as u64;
        st.stats.counters.publications += 1;
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

/// Publish-thread rounds between imports of other stores' packs (with the
/// default 2 s interval: every 10 s).
const IMPORT_EVERY: u64 = 5;

/// Where image `name`'s lease claims live.
pub fn lease_prefix(name: &str) -> String {
    format!("{}lease/", root_object::image_prefix(name))
}

/// A publisher thread: `work` every `period`, until stopped or the
/// publisher is gone.
fn run(me: Weak<Publisher>, period: Duration, work: fn(&Publisher)) {
    loop {
        let Some(p) = me.upgrade() else { return };
        work(&p);
        let stop = lock(&p.stop);
        if *stop {
            return;
        }
        let _ = p.wake.wait_timeout(stop, period);
    }
}
