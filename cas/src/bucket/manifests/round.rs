//! A publication round (see the module docs): one image's newest commit
//! put in the bucket once every chunk it names is there, and the rounds
//! the publisher thread and `publish_wait` run.

use super::ranges::Ranges;
use super::root_object::{pages_key, root_key, RootObject};
use super::superseded::Published;
use super::{new_series, ImageState, LeaseSlot, Outcome, Publisher};
use crate::error::{Error, Result};
use crate::image::Image;
use crate::manifest::{Manifest, FIRST_TREE_PAGE};
use crate::sync::lock;
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Publish-thread rounds between imports of other stores' packs (with the
/// default 2 s interval: every 10 s).
const IMPORT_EVERY: u64 = 5;

/// True for an error of the object store (see `From<ObjectError>`).
fn from_bucket(e: &Error) -> bool {
    matches!(e, Error::Unavailable(what, _) if what == crate::objects::OBJECT_STORE)
}

impl Publisher {
    /// A round for every registered image; every `IMPORT_EVERY`th call
    /// also imports other stores' new packs into the dedup index.
    pub(super) fn publish_all(&self) {
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
    pub(super) fn note_error(&self, name: &str, e: &Error) {
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
        if st.file_id == Some(file_id)
            && root.generation == st.stats.counters.published_generation
            && st.published_size_bytes == image.size_bytes()
        {
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
        st.published_size_bytes = obj.size_bytes;
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
