//! Snapshots, clones and rollback: new images whose manifest starts as a
//! frozen tree of another (manifest/base.rs), so none copies data or
//! manifest pages, whatever the image's size.
//!
//! - `snapshot_image(IMAGE, SNAP)` makes the read-only image `IMAGE@SNAP`.
//!   Allowed while IMAGE is open and written: every write completed when
//!   it is called is first flushed and compacted into IMAGE's manifest (a
//!   cost bounded by the log quota, not by the image), then the tree the
//!   manifest holds at that moment is frozen. The snapshot holds every
//!   write completed before the call and none begun after it returns.
//! - `clone_image(IMAGE@SNAP, NEW)`: a writable image on the snapshot's tree.
//! - `rollback_image(IMAGE, SNAP)`: IMAGE (closed) returns to the snapshot,
//!   its size included (an image grown since shrinks back); its log is
//!   covered whole, so nothing written after the snapshot replays.
//!
//! Each writes its `IMAGE` file last (a crash leaves nothing, or the
//! whole new image); `STORE` is at version 3 (which covers snapshots) from
//! the store's open. Removal refuses
//! an image with snapshots and a snapshot with clones, naming them.

use super::files::{ImageHeader, ImageKind};
use super::{lock, validate_image_name, OpenImage, Store, IMAGE_FILE, MANIFEST_FILE};
use crate::error::{Error, Result};
use crate::image::Image;
use crate::manifest::Manifest;
use crate::wal::Log;
use std::sync::Arc;

/// Compaction passes a snapshot may run before it gives up: each pass
/// drains the whole durable log, so more than one is needed only while a
/// pass fails for lack of memory.
const SNAPSHOT_COMPACTION_PASSES_MAX: u32 = 8;
/// Pause after a pass refused for memory, times the passes so far
/// (at most 3.6 s in all).
const SNAPSHOT_BUDGET_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// Separates an image's name from its snapshot's.
pub const SNAPSHOT_SEPARATOR: char = '@';

/// `IMAGE@SNAP`.
pub fn snapshot_name(image: &str, snap: &str) -> String {
    format!("{image}{SNAPSHOT_SEPARATOR}{snap}")
}

impl Store {
    /// Makes every completed write of `open` durable and compacted into
    /// its manifest (bounded passes; memory-budget back-pressure waits),
    /// and returns that manifest. `what` names the operation that needs it,
    /// for the retry message.
    pub(super) fn compact_all(&self, open: &Image, what: &str) -> Result<Arc<Manifest>> {
        let image = open.name();
        open.flush()?;
        let target = open.durable_seq();
        let manifest = self
            .compaction(open)
            .map(|c| c.manifest.clone())
            .ok_or_else(|| Error::InvalidArgument(format!("image {image} is not compacted by its store")))?;
        let mut passes = 0;
        while manifest.covered() < target {
            if passes == SNAPSHOT_COMPACTION_PASSES_MAX {
                return Err(Error::Unavailable(
                    format!("image {image}"),
                    format!(
                        "{passes} compaction passes left its log covered to seq {} of {target}; retry the {what}",
                        manifest.covered()
                    ),
                ));
            }
            passes += 1;
            match self.compact_once(open) {
                Ok(_) => {}
                // Back-pressure: give the budget's holders a moment.
                Err(Error::MemoryBudget(_)) => std::thread::sleep(SNAPSHOT_BUDGET_PAUSE * passes),
                Err(e) => return Err(e),
            }
        }
        Ok(manifest)
    }

    pub(crate) fn header(&self, name: &str) -> Result<ImageHeader> {
        let path = self.image_dir(name)?.join(IMAGE_FILE);
        if !self.storage.exists(&path) {
            return Err(Error::NotFound(format!("image {name}")));
        }
        ImageHeader::read(&*self.storage, &path)
    }

    /// Makes the read-only snapshot `IMAGE@SNAP` of `image`; returns its name.
    pub fn snapshot_image(&self, image: &str, snap: &str) -> Result<String> {
        validate_image_name(snap)?;
        let name = snapshot_name(image, snap);
        let header = self.header(image)?;
        if header.kind == ImageKind::Snapshot {
            return Err(Error::InvalidArgument(format!(
                "{image} is a snapshot; clone it to snapshot the clone"
            )));
        }
        if self.storage.exists(&self.image_dir(&name)?.join(IMAGE_FILE)) {
            return Err(Error::AlreadyExists(format!("snapshot {name}")));
        }
        // Every completed write into the manifest: flushed, then compacted.
        let open = self.open_image(image)?;
        let manifest = self.compact_all(&open, "snapshot")?;
        let _maint = lock(&self.maint);
        let _open = self.open.lock();
        // Read again under `maint`: a grow since the check above may have
        // let the frozen tree reach past the size read then.
        let size_bytes = self.header(image)?.size_bytes;
        let (dir, fresh) = self.prepare_dir(&name, size_bytes)?;
        manifest.freeze_into(&dir.join(MANIFEST_FILE), 0)?;
        let h = ImageHeader { kind: ImageKind::Snapshot, origin: Some(image.to_string()), ..fresh };
        self.install_image(&dir, h)?;
        Ok(name)
    }

    /// Makes `new`, a writable image sharing every chunk of the snapshot `snap`.
    pub fn clone_image(&self, snap: &str, new: &str) -> Result<()> {
        validate_image_name(new)?;
        let _maint = lock(&self.maint);
        // Under `maint`: a removal of the snapshot cannot slip in between.
        let header = self.header(snap)?;
        if header.kind != ImageKind::Snapshot {
            return Err(Error::InvalidArgument(format!(
                "{snap} is not a snapshot: take one with `casblk image snapshot` and clone that"
            )));
        }
        let _open = self.open.lock();
        let source = self.manifest(snap)?;
        let (dir, fresh) = self.prepare_dir(new, header.size_bytes)?;
        source.freeze_into(&dir.join(MANIFEST_FILE), 0)?;
        let h = ImageHeader { origin: Some(snap.to_string()), ..fresh };
        self.install_image(&dir, h)
    }

    /// Returns the closed image `image` to its snapshot `IMAGE@SNAP`:
    /// everything written since is gone.
    pub fn rollback_image(&self, image: &str, snap: &str) -> Result<()> {
        let name = snapshot_name(image, snap);
        let _maint = lock(&self.maint);
        // Under `maint`: neither header can change or go until we are done.
        let header = self.header(image)?;
        let snap_header = self.header(&name)?;
        if snap_header.kind != ImageKind::Snapshot || snap_header.origin.as_deref() != Some(image) {
            return Err(Error::InvalidArgument(format!("{name} is not a snapshot of {image}")));
        }
        let open = self.open.lock();
        if open.get(image).is_some_and(OpenImage::is_open) {
            return Err(Error::Unavailable(format!("image {image}"), "it is open; detach it first".into()));
        }
        let dir = self.image_dir(image)?;
        let source = self.manifest(&name)?;
        let own = self.manifest(image)?;
        // Cover the whole log: no record written after the snapshot replays.
        let (log, _) = Log::open(
            self.storage.clone(),
            &dir.join(crate::image::WAL_DIR),
            self.opts.log_segment_bytes,
            header.log_id,
            own.covered(),
            false,
            &mut |_, _, _| {},
        )?;
        let covered = (log.next_seq() - 1).max(own.covered());
        drop(log);
        drop(own);
        // The snapshot's size too, on the side of the switch where a crash
        // leaves the larger size with the tree it has: a larger snapshot's
        // size before (the image's tree and log lie inside either size), a
        // smaller one's after, when the log is covered and no mapping lies
        // past its end. Either way the same rollback finishes it.
        let sized = || ImageHeader { size_bytes: snap_header.size_bytes, ..header.clone() };
        if snap_header.size_bytes > header.size_bytes {
            self.install_image(&dir, sized())?;
        }
        // The map stays locked through the switch: no `manifest(image)`
        // (stats, info) opens the directory half switched, or keeps an
        // object of the old tree for the next open.
        let mut manifests = lock(&self.manifests);
        manifests.remove(image);
        source.freeze_into(&dir.join(MANIFEST_FILE), covered)?;
        if snap_header.size_bytes < header.size_bytes {
            self.install_image(&dir, sized())?;
        }
        // The replaced tree's chunks written since the snapshot may be
        // garbage now, and no commit counted them (cas::gc::auto).
        self.gc.nudge();
        Ok(())
    }

    /// Refuses to remove `name` while snapshots of it or clones of it exist.
    pub(crate) fn check_removable(&self, name: &str) -> Result<()> {
        let (snapshots, clones) = dependents(&self.list_images()?, name);
        if !snapshots.is_empty() {
            return Err(Error::Unavailable(
                format!("image {name}"),
                format!("it has snapshots ({}): remove them first", snapshots.join(", ")),
            ));
        }
        if !clones.is_empty() {
            return Err(Error::Unavailable(
                format!("snapshot {name}"),
                format!("clones depend on it ({}): remove them first", clones.join(", ")),
            ));
        }
        Ok(())
    }
}

/// The snapshots of `name` and the clones made from it, among `images`.
pub(crate) fn dependents(images: &[super::ImageInfo], name: &str) -> (Vec<String>, Vec<String>) {
    let (mut snapshots, mut clones) = (Vec::new(), Vec::new());
    for info in images.iter().filter(|i| i.origin.as_deref() == Some(name)) {
        match info.kind {
            ImageKind::Snapshot => snapshots.push(info.name.clone()),
            ImageKind::Image => clones.push(info.name.clone()),
            ImageKind::Replica => {}
        }
    }
    (snapshots, clones)
}
