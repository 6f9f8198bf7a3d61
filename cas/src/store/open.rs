//! The store's open images and the compactor's state for each: the map
//! `open_image` fills, `list_images`, `remove_image` and the snapshot
//! operations consult, and the background compactor reads every round.
//!
//! The store, not the image, owns an image's `ImageCompaction` (its
//! manifest, cursor and work counters): an entry holds the image weakly
//! and its compaction state strongly, and goes, state and all, with the
//! first lock of the map after the image was closed (its last `Arc`
//! dropped).

use crate::compact::ImageCompaction;
use crate::image::Image;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// One open image, and the compactor's state for it (None: opened with a
/// custom view, never compacted).
pub(crate) struct OpenImage {
    pub image: Weak<Image>,
    pub compaction: Option<Arc<ImageCompaction>>,
}

impl OpenImage {
    /// The image, while it is open.
    pub fn image(&self) -> Option<Arc<Image>> {
        self.image.upgrade()
    }

    pub fn is_open(&self) -> bool {
        self.image.strong_count() > 0
    }
}

/// The open images, by name (in name order: the compactor visits them in
/// the same order every run).
#[derive(Default)]
pub(crate) struct OpenImages(Mutex<BTreeMap<String, OpenImage>>);

impl OpenImages {
    /// The map, locked, without the entries of images closed since.
    pub fn lock(&self) -> MutexGuard<'_, BTreeMap<String, OpenImage>> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, o| o.is_open());
        map
    }

    /// The compaction state of `image`, if it is the open image of its name
    /// and the store compacts it.
    pub fn compaction(&self, image: &Image) -> Option<Arc<ImageCompaction>> {
        let map = self.lock();
        let entry = map.get(image.name()).filter(|o| std::ptr::eq(o.image.as_ptr(), image))?;
        entry.compaction.clone()
    }

    /// What the background compactor looks at: every open image it compacts.
    pub fn compactable(&self) -> Vec<(Weak<Image>, Weak<ImageCompaction>)> {
        let map = self.lock();
        map.values().filter_map(|o| Some((o.image.clone(), Arc::downgrade(o.compaction.as_ref()?)))).collect()
    }
}
