//! Growing an image, open or not (`resize_image`).
//!
//! The size lives in one place on disk, the image's `IMAGE` file (offset
//! 16; no manifest, log record or chunk records it), so a grow is one
//! atomic rewrite of that file, then the open image's size in memory.
//! That order keeps the rule recovery relies on: the size in memory is
//! never larger than any size a crash could leave on disk, so every log
//! record (which `Image` accepts only inside its size in memory) replays
//! into an image that reaches it. A crash leaves the old size or the new
//! one; rerunning the same grow finishes it (at the size it already has,
//! it only brings the open image up to it).
//!
//! No format changes: an older casblk reads a grown `IMAGE` as it reads
//! any. Snapshots keep their size (a snapshot of a grown image has the
//! new one; a clone of an older snapshot may be grown on its own).
//!
//! Shrinking (`shrink_image`) is for an image nobody has open: the bytes
//! past the new end are discarded through the image's own log (one
//! DISCARD record), made durable and compacted, so the manifest maps
//! nothing past the new end and GC frees what only they held; then the
//! `IMAGE` rewrite (the commit point) sets the new size. Every log record
//! past the new end is then covered by the manifest and never replays,
//! and a later grow reads zeros there. A crash before the rewrite leaves
//! the old size with the bytes past the new end read as zeros (the
//! discard asked for); rerunning the shrink finishes it. (A rollback
//! returns an image to its snapshot's size: store/snapshot.rs.)
//!
//! With a remote, the open image's lease covers the rewrite, and the
//! publisher publishes a root with the new size even when no write
//! follows (bucket::manifests::round).

use super::files::{ImageHeader, ImageKind};
use super::{check_image_size, lock, Store};
use crate::error::{Error, Result};
use crate::image::Image;
use std::sync::Arc;

/// What `resize_image` did.
pub struct Resized {
    pub old_bytes: u64,
    pub new_bytes: u64,
    /// The image, open (the caller publishes it before closing, with a
    /// remote: `Store::drain_to_bucket`).
    pub image: Arc<Image>,
}

impl Store {
    /// Grows image `name` to `size_bytes`, whether it is open or not. At
    /// its present size it succeeds and changes nothing on disk.
    pub fn resize_image(&self, name: &str, size_bytes: u64) -> Result<Resized> {
        let old = self.check_resize(name, size_bytes)?;
        // Open (and, with a remote, leased) before the rewrite.
        let image = self.open_image(name)?;
        // `maint` orders the rewrite with snapshots, which read the size
        // under it, so a snapshot's tree never reaches past its size;
        // `open` with openers, which read `IMAGE` under it.
        let _maint = lock(&self.maint);
        let _open = self.open.lock();
        let header = self.header(name)?;
        check_growable(name, &header, size_bytes)?;
        let dir = self.image_dir(name)?;
        if header.size_bytes != size_bytes {
            if let Err(e) = self.install_image(&dir, ImageHeader { size_bytes, ..header }) {
                // If the rename happened, make it durable, so that a later
                // open that reads the new size can trust it.
                let _ = self.storage.sync_dir(&dir);
                return Err(e);
            }
        } else {
            // A rerun: the rename of a grow that failed at its directory
            // sync is visible but may not be durable. Durable first.
            self.storage.sync_dir(&dir)?;
        }
        image.grow_to(size_bytes);
        Ok(Resized { old_bytes: old, new_bytes: size_bytes, image })
    }

    /// Shrinks image `name` to `size_bytes`: the bytes past the new end
    /// are discarded and compacted away, then the new size is written (see
    /// the module doc). The image must not be open (attached); at its
    /// present size it succeeds and changes nothing. `stop`: a test seam,
    /// returning early after the given step.
    pub fn shrink_image(&self, name: &str, size_bytes: u64, stop: Option<ShrinkStop>) -> Result<Shrunk> {
        check_image_size(size_bytes)?;
        let old = check_kind(name, &self.header(name)?)?.size_bytes;
        if size_bytes > old {
            return Err(Error::InvalidArgument(format!(
                "image {name} is {old} bytes; {size_bytes} is larger: grow it without --shrink"
            )));
        }
        if self.open.lock().get(name).is_some_and(|o| o.is_open()) {
            return Err(Error::Unavailable(
                format!("image {name}"),
                "it is open (attached to a device?): shrink a detached image".into(),
            ));
        }
        let dir = self.image_dir(name)?;
        if size_bytes == old {
            // A rerun: the rename of a shrink that failed at its directory
            // sync is visible but may not be durable. Durable first.
            self.storage.sync_dir(&dir)?;
            return Ok(Shrunk { old_bytes: old, new_bytes: size_bytes });
        }
        let image = self.open_image(name)?;
        image.discard(size_bytes, old - size_bytes)?;
        if stop == Some(ShrinkStop::AfterDiscard) {
            image.flush()?;
            return Ok(Shrunk { old_bytes: old, new_bytes: old });
        }
        let manifest = self.compact_all(&image, "shrink")?;
        if stop == Some(ShrinkStop::AfterCompaction) {
            return Ok(Shrunk { old_bytes: old, new_bytes: old });
        }
        let _maint = lock(&self.maint);
        // Nobody else may hold the image when its size drops under it: an
        // opener that came during the discard could write past the end.
        // Background tasks (compactor, publisher, leases) hold it for
        // moments: they get a short while to let go.
        let deadline = std::time::Instant::now() + SHRINK_HOLDERS_WAIT;
        let _open = loop {
            let open = self.open.lock();
            if Arc::strong_count(&image) == 1 {
                break open;
            }
            drop(open);
            if std::time::Instant::now() > deadline {
                return Err(Error::Unavailable(
                    format!("image {name}"),
                    "it was opened during the shrink; the bytes past the new end read as zeros now: \
                     detach it and rerun the shrink"
                        .into(),
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let header = self.header(name)?;
        if manifest.covered() < image.durable_seq() || header.size_bytes != old {
            return Err(Error::Unavailable(
                format!("image {name}"),
                "it changed during the shrink; rerun it".into(),
            ));
        }
        if let Err(e) = self.install_image(&dir, ImageHeader { size_bytes, ..header }) {
            let _ = self.storage.sync_dir(&dir);
            return Err(e);
        }
        // Under the open lock: an opener after it gets the new size, even
        // from a background task's hold on this image.
        image.shrink_to(size_bytes);
        drop(image);
        drop(_open);
        drop(_maint);
        // What only the dropped blocks held is garbage now.
        self.gc.nudge();
        Ok(Shrunk { old_bytes: old, new_bytes: size_bytes })
    }

    /// Whether image `name` may grow to `size_bytes` (what `resize_image`
    /// refuses, checked without changing anything); its present size.
    pub fn check_resize(&self, name: &str, size_bytes: u64) -> Result<u64> {
        check_image_size(size_bytes)?;
        check_growable(name, &self.header(name)?, size_bytes)
    }
}

/// How long a shrink waits for background tasks to let go of the image
/// before it rewrites the size.
const SHRINK_HOLDERS_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// What `shrink_image` did.
#[derive(Debug, PartialEq, Eq)]
pub struct Shrunk {
    pub old_bytes: u64,
    pub new_bytes: u64,
}

/// Where a test stops `shrink_image` (a crash follows).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShrinkStop {
    /// The discard is durable; nothing compacted.
    AfterDiscard,
    /// The discard is compacted; `IMAGE` still has the old size.
    AfterCompaction,
}

/// `header`, if its image may change size: not a snapshot or replica.
fn check_kind<'h>(name: &str, header: &'h ImageHeader) -> Result<&'h ImageHeader> {
    match header.kind {
        ImageKind::Image => {}
        ImageKind::Snapshot => {
            return Err(Error::InvalidArgument(format!(
                "{name} is a snapshot, and snapshots keep their size: clone it and resize the clone"
            )))
        }
        ImageKind::Replica => {
            return Err(Error::InvalidArgument(format!(
                "{name} is a read-only replica and keeps the size it was published with"
            )))
        }
    }
    Ok(header)
}

/// The image's present size, if `header` may grow to `size_bytes`.
fn check_growable(name: &str, header: &ImageHeader, size_bytes: u64) -> Result<u64> {
    check_kind(name, header)?;
    if size_bytes < header.size_bytes {
        return Err(Error::InvalidArgument(format!(
            "image {name} is {} bytes; shrinking it to {size_bytes} drops data: detach it and resize with --shrink",
            header.size_bytes
        )));
    }
    Ok(header.size_bytes)
}
