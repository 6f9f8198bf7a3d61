//! The store's open images and the compactor's state for each: the map
//! `open_image` fills, `list_images`, `remove_image` and the snapshot
//! operations consult, and the background compactor reads every round.
//!
//! The store, not the image, owns an image's `ImageCompaction` (its
//! manifest, cursor and work counters): an entry holds the image weakly
//! and its compaction state strongly, and goes, state and all, with the
//! first lock of the map after the image was closed (its last `Arc`
//! dropped).
//!
//! Opening an image replays its log, which can take a while; the map is
//! not locked meanwhile, so the compactor, statistics and the opening of
//! other images go on. An entry marked *opening* stands for the image
//! until then: a second opener of the same name waits for it
//! ([`OpenImages::begin`]), and removal and rollback see it as open.

use crate::compact::ImageCompaction;
use crate::image::Image;
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};

/// One open image, and the compactor's state for it (None: opened with a
/// custom view, never compacted).
pub(crate) struct OpenImage {
    pub image: Weak<Image>,
    pub compaction: Option<Arc<ImageCompaction>>,
    /// Being opened (its log replayed): `image` is empty until then.
    pub opening: bool,
}

impl OpenImage {
    /// The image, while it is open.
    pub fn image(&self) -> Option<Arc<Image>> {
        self.image.upgrade()
    }

    /// Open, or being opened.
    pub fn is_open(&self) -> bool {
        self.opening || self.image.strong_count() > 0
    }
}

/// The open images, by name (in name order: the compactor visits them in
/// the same order every run).
#[derive(Default)]
pub(crate) struct OpenImages {
    map: Mutex<BTreeMap<String, OpenImage>>,
    /// Signalled when an opening ends, opened or not.
    settled: Condvar,
}

/// `map` without the entries of images closed since.
fn without_closed(
    mut map: MutexGuard<'_, BTreeMap<String, OpenImage>>,
) -> MutexGuard<'_, BTreeMap<String, OpenImage>> {
    map.retain(|_, o| o.is_open());
    map
}

/// What [`OpenImages::begin`] found.
pub(crate) enum Begun<'a> {
    /// Open already.
    Open(Arc<Image>),
    /// Marked opening for this caller, who finishes it or drops it.
    Opening(Opening<'a>),
}

/// The right to open one image: [`Opening::finish`] puts the image in the
/// map; dropped unfinished (the open failed), it takes the mark back out.
pub(crate) struct Opening<'a> {
    images: &'a OpenImages,
    name: String,
    done: bool,
}

impl Opening<'_> {
    pub fn finish(mut self, image: &Arc<Image>, compaction: Option<Arc<ImageCompaction>>) {
        let entry = OpenImage { image: Arc::downgrade(image), compaction, opening: false };
        self.images.lock().insert(self.name.clone(), entry);
        self.done = true;
        self.images.settled.notify_all();
    }
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.images.lock().remove(&self.name);
            self.images.settled.notify_all();
        }
    }
}

impl OpenImages {
    /// The map, locked, without the entries of images closed since.
    pub fn lock(&self) -> MutexGuard<'_, BTreeMap<String, OpenImage>> {
        without_closed(self.map.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Image `name` if it is open; else, once no one else is opening it,
    /// the mark that makes this caller its opener.
    pub fn begin(&self, name: &str) -> Begun<'_> {
        let mut map = self.lock();
        loop {
            match map.get(name) {
                Some(o) if o.opening => {
                    map = without_closed(self.settled.wait(map).unwrap_or_else(|p| p.into_inner()));
                }
                Some(o) => match o.image() {
                    Some(image) => return Begun::Open(image),
                    None => {
                        map.remove(name);
                    }
                },
                None => {
                    let entry = OpenImage { image: Weak::new(), compaction: None, opening: true };
                    map.insert(name.to_string(), entry);
                    return Begun::Opening(Opening { images: self, name: name.to_string(), done: false });
                }
            }
        }
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
