//! Images and the store's bucket: publication of open images (the
//! publisher thread, see `cas::bucket::manifests`), and fetching an image another
//! store published as a read-only replica.
//!
//! A fetched image is built from the newest root in the bucket, as a
//! writable image under this store's lease ([`FetchAs::Owner`]: taken
//! before the root is read, so the previous writer is fenced or gone and
//! no newer root can appear under an older epoch's writer that counts) or
//! as a read-only replica ([`FetchAs::Replica`], `ImageKind::Replica`, no
//! lease): its manifest is the published pages, its log is empty, and the
//! packs its leaves name are recorded as foreign in the chunk store's
//! catalog, read from the bucket through the extent cache. It holds every
//! write the publishing store had flushed and compacted when that root was
//! published (see `cas::bucket::manifests` on the window). It does not follow later
//! publications: remove it and fetch again to see them.

use super::files::{ImageHeader, ImageKind};
use super::{Store, IMAGE_FILE, MANIFEST_FILE};
use crate::bucket::manifests::unpublish::{self, Unpublished};
use crate::bucket::manifests::{fetch, PublishStats, Publisher};
use crate::error::{Error, Result};
use crate::manifest::{Manifest, FIRST_TREE_PAGE};
use crate::sync::lock;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// The store's publisher; stops its thread when dropped.
pub(crate) struct PublisherThread(pub Arc<Publisher>);

impl Drop for PublisherThread {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// How `fetch_image` makes the image here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FetchAs {
    /// Read-only, no lease: as of the newest root; does not follow later
    /// publications.
    Replica,
    /// Writable, under this store's lease (taken first): the store that
    /// wrote it before must have stopped or let its lease run out.
    Owner,
}

/// What `fetch_image` built.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FetchReport {
    /// The root object it was built from.
    pub root_key: String,
    pub generation: u64,
    pub size_bytes: u64,
    pub mapped_blocks: u64,
    pub manifest_pages: u64,
    /// Other stores' packs it names (read from the bucket), whether this
    /// fetch adopted them or an import had already.
    pub foreign_packs: u64,
}

impl Store {
    /// The store's bucket, for work on image `name` (a valid name).
    fn bucket(&self, name: &str) -> Result<Arc<dyn crate::objects::Objects>> {
        let objects = self
            .tier
            .as_ref()
            .map(|t| t.objects().clone())
            .ok_or_else(|| Error::InvalidArgument("the store has no remote".into()))?;
        crate::store::names::validate_image_name(name)?;
        Ok(objects)
    }

    fn publisher(&self) -> Result<&Arc<Publisher>> {
        self.publisher
            .as_ref()
            .map(|p| &p.0)
            .ok_or_else(|| Error::InvalidArgument("the store has no remote".into()))
    }

    /// Publishes open image `name`'s newest commit now (and waits for the
    /// uploads of the chunks it names), within `timeout`; returns the
    /// generation published. See `cas::bucket::manifests`.
    pub fn publish_wait(&self, name: &str, timeout: Duration) -> Result<u64> {
        self.publisher()?.publish_wait(name, timeout)
    }

    /// Hands open image `image` over to the bucket, for a clean stop: makes
    /// every completed write durable, compacts all of it and publishes,
    /// within `timeout`. After this (and closing the image), another store
    /// that takes it over sees every write: the window is 0. Returns the
    /// generation published.
    pub fn drain_to_bucket(&self, image: &crate::Image, timeout: Duration) -> Result<u64> {
        let started = std::time::Instant::now();
        image.flush()?;
        let durable = image.durable_seq();
        loop {
            let report = self.compact_once(image)?;
            if report.covered_after >= durable {
                break;
            }
            if started.elapsed() >= timeout {
                return Err(Error::Unavailable(
                    format!("draining image {}", image.name()),
                    format!(
                        "compaction reached seq {} of {durable} within {timeout:?}",
                        report.covered_after
                    ),
                ));
            }
        }
        self.publish_wait(image.name(), timeout.saturating_sub(started.elapsed()))
    }

    /// What publication has done for open image `name` (None: the store
    /// has no remote, or the image is not open or not published).
    pub fn publish_stats(&self, name: &str) -> Option<PublishStats> {
        self.publisher.as_ref()?.0.stats(name)
    }

    /// Fails if the bucket holds a published image `name` (a store must
    /// fetch it, not make a new one of that name).
    pub(crate) fn refuse_published_name(&self, name: &str) -> Result<()> {
        let Some(objects) = self.tier.as_ref().map(|t| t.objects()) else { return Ok(()) };
        match fetch::newest_root(objects.as_ref(), name)? {
            Some((key, root)) => Err(Error::AlreadyExists(format!(
                "image {name} in {} (store {:#018x} published it as {key}): fetch it instead",
                objects.describe(),
                root.store_id
            ))),
            None => Ok(()),
        }
    }

    /// Makes image `name` here from its newest root in the bucket (see the
    /// module docs). Fails if an image of that name exists, the bucket
    /// holds no root of it, or (`Owner`) another store holds its lease.
    pub fn fetch_image(&self, name: &str, how: FetchAs) -> Result<FetchReport> {
        let objects = self.bucket(name)?;
        if self.storage.exists(&self.image_dir(name)?.join(IMAGE_FILE)) {
            return Err(Error::AlreadyExists(format!("image {name}")));
        }
        // Renewed while the fetch runs, and until the image is opened
        // (open_image takes it from there).
        let leased = match how {
            FetchAs::Owner => self.publisher()?.acquire_held(name)?,
            FetchAs::Replica => false,
        };
        let r = self.fetch_under(name, how, objects.as_ref());
        if leased {
            let publisher = self.publisher()?;
            match &r {
                Ok((_, root)) => publisher.fence(name, root),
                Err(_) => publisher.release_held(name),
            }
        }
        r.map(|(report, _)| report)
    }

    /// Removes image `name` from the bucket (bucket/manifests/unpublish.rs), under
    /// its lease, renewed meanwhile and checked before each DELETE:
    /// refused while another store holds it, or while the image is open
    /// here (no open starts meanwhile). Fails if the bucket holds no root
    /// of it. A local copy stays, and opening it would publish it again:
    /// remove it too (`casblk image rm --bucket` does).
    pub fn unpublish_image(&self, name: &str) -> Result<Unpublished> {
        let objects = self.bucket(name)?;
        let open = self.open.lock();
        if open.get(name).is_some_and(super::open::OpenImage::is_open) {
            return Err(Error::Unavailable(format!("image {name}"), "it is open; close it first".into()));
        }
        let publisher = self.publisher()?;
        let leased = publisher.acquire_held(name)?;
        let held = || !leased || publisher.holds(name);
        let r = match fetch::newest_root(objects.as_ref(), name) {
            Ok(Some(_)) => unpublish::delete_published(objects.as_ref(), name, &held),
            Ok(None) => Err(Error::NotFound(format!("a published image {name} in {}", objects.describe()))),
            Err(e) => Err(e),
        };
        publisher.release_held(name);
        drop(open);
        r
    }

    fn fetch_under(
        &self,
        name: &str,
        how: FetchAs,
        objects: &dyn crate::objects::Objects,
    ) -> Result<(FetchReport, fetch::RootObject)> {
        let mut attempt = 1;
        loop {
            let (root_key, root) = fetch::newest_root(objects, name)?.ok_or_else(|| {
                Error::NotFound(format!("a published root of image {name} in {}", objects.describe()))
            })?;
            match self.fetch_root(name, how, objects, root_key, root) {
                // A range it lists is gone: a newer root superseded it
                // longer than the grace period ago (bucket::manifests::superseded).
                Err(Error::NotFound(what)) if attempt < fetch::ATTEMPTS => {
                    tracing::info!(image = name, missing = %what, "the root fetched was superseded; fetching the newest");
                    attempt += 1;
                }
                r => return r,
            }
        }
    }

    fn fetch_root(
        &self,
        name: &str,
        how: FetchAs,
        objects: &dyn crate::objects::Objects,
        root_key: String,
        root: fetch::RootObject,
    ) -> Result<(FetchReport, fetch::RootObject)> {
        let _maint = lock(&self.maint);
        let _open = self.open.lock();
        let (dir, header) = self.prepare_dir(name, root.size_bytes)?;
        let path = dir.join(MANIFEST_FILE);
        fetch::build_manifest(objects, self.storage.as_ref(), &path, name, &root)?;
        let m = Manifest::open(self.storage.clone(), &path, self.manifest_options())?;
        let mut packs = BTreeSet::new();
        let mut unlocated = 0u64;
        m.committed().refs_since(FIRST_TREE_PAGE, &mut |r| match r.at {
            Some(at) => {
                packs.insert(at.pack);
            }
            None => unlocated += 1,
        })?;
        if unlocated > 0 {
            return Err(Error::Corruption {
                path: path.clone(),
                offset: 0,
                detail: format!("{unlocated} published blocks have no chunk location"),
            });
        }
        // Packs of other stores (adopt_foreign skips own and known ones).
        let named: Vec<u32> = packs.iter().copied().collect();
        let tier =
            self.tier.as_ref().ok_or_else(|| Error::InvalidArgument("the store has no remote".into()))?;
        tier.adopt_foreign(&self.chunks, &named)?;
        // Their index entries (cross-host dedup), durable before the image.
        self.chunks.sync()?;
        let known = self.chunks.foreign_packs();
        let foreign = packs.iter().filter(|p| known.contains(p)).count();
        let header = match how {
            FetchAs::Replica => {
                let origin = format!("{}/{root_key}", objects.describe());
                ImageHeader { kind: ImageKind::Replica, origin: Some(origin), ..header }
            }
            FetchAs::Owner => header,
        };
        self.install_image(&dir, header)?;
        let report = FetchReport {
            root_key,
            generation: root.root.generation,
            size_bytes: root.size_bytes,
            mapped_blocks: root.root.mapped_blocks,
            manifest_pages: root.root.live_pages,
            foreign_packs: foreign as u64,
        };
        Ok((report, root))
    }
}
