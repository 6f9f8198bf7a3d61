//! The store directory: its version file, its lock, and the images in it.
//!
//! ```text
//!  DIR/
//!    STORE                  version file (see store/files.rs), checked on open
//!    LOCK                   flock'ed by the one process that has the store open
//!    chunks/                the shared chunk store (cas::chunk)
//!    images/<name>/IMAGE    image header: size, log id
//!    images/<name>/wal/     the image's write-ahead log segments
//! ```
//!
//! An image exists once its `IMAGE` file does. Creation makes the
//! directory, the log and then `IMAGE` (atomically, by rename); a crash
//! before that leaves a directory without `IMAGE`, which listing ignores
//! and the next create of that name clears. Removal deletes `IMAGE`
//! first (durably), then the rest.
//!
//! Only one process may open a store: `open`/`create` take an exclusive
//! lock on `DIR/LOCK` (flock) and fail at once if another holder has it.
//! Within the process, one `Store` serves every image, and opening an
//! image that is already open returns the same `Arc<Image>`.

mod files;
mod names;

pub use files::{ImageHeader, IMAGE_VERSION, STORE_VERSION};
pub use names::{validate_image_name, IMAGE_NAME_BYTES_MAX};

use crate::error::{Error, Result};
use crate::image::{EmptyManifest, Image, ImageConfig, ManifestView, BLOCK_BYTES};
use crate::storage::{Storage, StorageLock};
use crate::wal::segment::{SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN};
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// Largest image size accepted (1 PiB).
pub const IMAGE_BYTES_MAX: u64 = 1 << 50;

/// Tunables of a store; every field has a default.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StoreOptions {
    /// Size of each WAL segment file (1 MiB ..= 1 GiB, a multiple of 4096).
    pub log_segment_bytes: u64,
    /// Per-image log quota; at least two segments.
    pub log_quota_bytes: u64,
    /// Clean chunk cache (cas::chunk).
    pub chunk_cache_bytes: u64,
    /// Chunk index plus compaction preparation (cas::chunk, cas::compact).
    pub memory_budget_bytes: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            log_segment_bytes: 8 << 20,
            log_quota_bytes: 256 << 20,
            chunk_cache_bytes: 16 << 20,
            memory_budget_bytes: 256 << 20,
        }
    }
}

impl StoreOptions {
    pub fn validate(&self) -> Result<()> {
        let seg = self.log_segment_bytes;
        if !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&seg) || !seg.is_multiple_of(4096) {
            return Err(Error::InvalidArgument(format!(
                "log_segment_bytes {seg} must be a multiple of 4096 in {SEGMENT_BYTES_MIN}..={SEGMENT_BYTES_MAX}"
            )));
        }
        if self.log_quota_bytes < 2 * seg {
            return Err(Error::InvalidArgument(format!(
                "log_quota_bytes {} must hold at least two segments of {seg}",
                self.log_quota_bytes
            )));
        }
        Ok(())
    }
}

/// What `list_images` says about one image.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ImageInfo {
    pub name: String,
    pub size_bytes: u64,
    /// Open in this process right now.
    pub open: bool,
}

/// An open store. See the module docs.
pub struct Store {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    opts: StoreOptions,
    open: Mutex<HashMap<String, Weak<Image>>>,
    _lock: StorageLock,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("dir", &self.dir).field("opts", &self.opts).finish()
    }
}

const STORE_FILE: &str = "STORE";
const LOCK_FILE: &str = "LOCK";
const IMAGE_FILE: &str = "IMAGE";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Store {
    /// Creates a new store in `dir` (made if missing); fails if one exists.
    pub fn create(storage: Arc<dyn Storage>, dir: &Path, opts: StoreOptions) -> Result<Arc<Store>> {
        opts.validate()?;
        storage.create_dir_all(dir)?;
        let held = storage.lock_exclusive(&dir.join(LOCK_FILE))?;
        if storage.exists(&dir.join(STORE_FILE)) {
            return Err(Error::AlreadyExists(format!("store at {}", dir.display())));
        }
        storage.create_dir_all(&dir.join("images"))?;
        storage.create_dir_all(&dir.join("chunks"))?;
        storage.sync_dir(dir)?;
        files::write_atomic(&*storage, dir, STORE_FILE, &files::encode_store())?;
        Ok(Arc::new(Store { storage, dir: dir.to_path_buf(), opts, open: Mutex::default(), _lock: held }))
    }

    /// Opens the store in `dir`; refuses a newer store version.
    pub fn open(storage: Arc<dyn Storage>, dir: &Path, opts: StoreOptions) -> Result<Arc<Store>> {
        opts.validate()?;
        if !storage.exists(&dir.join(STORE_FILE)) {
            return Err(Error::NotFound(format!("casblk store at {} (no {STORE_FILE} file)", dir.display())));
        }
        let held = storage.lock_exclusive(&dir.join(LOCK_FILE))?;
        files::read_store(&*storage, &dir.join(STORE_FILE))?;
        Ok(Arc::new(Store { storage, dir: dir.to_path_buf(), opts, open: Mutex::default(), _lock: held }))
    }

    /// Opens the store in `dir`, creating it if there is none.
    pub fn open_or_create(storage: Arc<dyn Storage>, dir: &Path, opts: StoreOptions) -> Result<Arc<Store>> {
        if storage.exists(&dir.join(STORE_FILE)) {
            Store::open(storage, dir, opts)
        } else {
            Store::create(storage, dir, opts)
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn options(&self) -> &StoreOptions {
        &self.opts
    }

    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// The directory of image `name` (validated).
    pub fn image_dir(&self, name: &str) -> Result<PathBuf> {
        validate_image_name(name)?;
        Ok(self.dir.join("images").join(name))
    }

    /// Creates an empty image of `size_bytes` (a multiple of 4096, > 0).
    pub fn create_image(&self, name: &str, size_bytes: u64) -> Result<()> {
        let dir = self.image_dir(name)?;
        if size_bytes == 0 || !size_bytes.is_multiple_of(BLOCK_BYTES) || size_bytes > IMAGE_BYTES_MAX {
            return Err(Error::InvalidArgument(format!(
                "image size {size_bytes} must be a non-zero multiple of {BLOCK_BYTES} up to {IMAGE_BYTES_MAX}"
            )));
        }
        let _open = lock(&self.open);
        let s = &*self.storage;
        if s.exists(&dir.join(IMAGE_FILE)) {
            return Err(Error::AlreadyExists(format!("image {name}")));
        }
        if s.exists(&dir) {
            // Left by a create that crashed before its IMAGE file existed.
            s.remove_dir_all(&dir)?;
        }
        let images = self.dir.join("images");
        s.create_dir_all(&dir)?;
        s.sync_dir(&images)?;
        let log_id = std::hash::RandomState::new().hash_one((name, std::time::SystemTime::now()));
        Image::create_log(s, &dir, self.opts.log_segment_bytes, log_id)?;
        let header = ImageHeader { size_bytes, log_id };
        files::write_atomic(s, &dir, IMAGE_FILE, &header.encode())
    }

    /// Opens image `name`, replaying its log, or returns it if already open.
    pub fn open_image(&self, name: &str) -> Result<Arc<Image>> {
        self.open_image_with(name, Arc::new(EmptyManifest))
    }

    /// Like `open_image`, with the image's compacted data behind `manifest`
    /// (ignored if the image is already open).
    pub fn open_image_with(&self, name: &str, manifest: Arc<dyn ManifestView>) -> Result<Arc<Image>> {
        let dir = self.image_dir(name)?;
        let mut open = lock(&self.open);
        if let Some(image) = open.get(name).and_then(Weak::upgrade) {
            return Ok(image);
        }
        let header_path = dir.join(IMAGE_FILE);
        if !self.storage.exists(&header_path) {
            return Err(Error::NotFound(format!("image {name}")));
        }
        let header = ImageHeader::read(&*self.storage, &header_path)?;
        let cfg = ImageConfig {
            name: name.to_string(),
            size_bytes: header.size_bytes,
            log_id: header.log_id,
            segment_bytes: self.opts.log_segment_bytes,
            quota_bytes: self.opts.log_quota_bytes,
            replay_after_seq: 0,
        };
        let image = Arc::new(Image::open(self.storage.clone(), &dir, cfg, manifest)?);
        open.insert(name.to_string(), Arc::downgrade(&image));
        Ok(image)
    }

    /// Every image with a readable header, by name.
    pub fn list_images(&self) -> Result<Vec<ImageInfo>> {
        let open = lock(&self.open);
        let mut out = Vec::new();
        for name in self.storage.list_dir(&self.dir.join("images"))? {
            if validate_image_name(&name).is_err() {
                continue;
            }
            let path = self.dir.join("images").join(&name).join(IMAGE_FILE);
            if !self.storage.exists(&path) {
                continue;
            }
            let header = ImageHeader::read(&*self.storage, &path)?;
            let is_open = open.get(&name).is_some_and(|w| w.strong_count() > 0);
            out.push(ImageInfo { name, size_bytes: header.size_bytes, open: is_open });
        }
        Ok(out)
    }

    /// Removes image `name` and its log; refused while it is open.
    pub fn remove_image(&self, name: &str) -> Result<()> {
        let dir = self.image_dir(name)?;
        let mut open = lock(&self.open);
        if open.get(name).is_some_and(|w| w.strong_count() > 0) {
            return Err(Error::Unavailable(format!("image {name}"), "it is open; close it first".into()));
        }
        open.remove(name);
        let header_path = dir.join(IMAGE_FILE);
        if !self.storage.exists(&header_path) {
            return Err(Error::NotFound(format!("image {name}")));
        }
        self.storage.remove_file(&header_path)?;
        self.storage.sync_dir(&dir)?;
        self.storage.remove_dir_all(&dir)?;
        self.storage.sync_dir(&self.dir.join("images"))
    }
}
