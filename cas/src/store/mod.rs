//! The store directory: its version file, its lock, and the images in it.
//!
//! ```text
//!  DIR/
//!    STORE                  version file (see store/files.rs), checked on open
//!    LOCK                   flock'ed by the one process that has the store open
//!    chunks/                the shared chunk store (cas::chunk)
//!    images/<name>/IMAGE    image header: size, log id
//!    images/<name>/wal/     the image's write-ahead log segments
//!    images/<name>/manifest the image's manifest (cas::manifest), once compacted
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
//!
//! The store owns the shared chunk store, one `Manifest` per image (the
//! same object for the image's reads, its compaction and GC, never two on
//! one file), the compactor's state for each open image (store/open.rs:
//! images know nothing of compaction; the store hands the state to every
//! pass and adds its counters to `image_stats`), and the background
//! compactor (cas::compact::service).
//! Opening an image replays only the log its manifest does not cover.
//! `gc` and image creation/removal exclude each other, so GC marks from
//! every image's manifest.
//!
//! Files by concept: the store itself and its images (this file),
//! options.rs (StoreOptions and their checks; the bucket's settings are
//! assembled there and handed down at `start`), stats.rs (what the store
//! reports across its parts), gc.rs (its GC passes), open.rs (open images
//! and their compaction state), and one file per operation on images
//! (import, export, snapshots, remote images, info).

mod export;
pub(crate) mod files;
mod fuzz;
mod gc;
mod import;
mod info;
mod memory;
mod names;
mod open;
mod options;
mod remote_images;
mod resize;
mod scrub;
mod shutdown;
mod snapshot;
mod space;
mod stats;

pub use export::ExportReport;
pub use files::{ImageHeader, ImageKind, IMAGE_VERSION, STORE_VERSION, STORE_VERSION_LOCAL};
pub use fuzz::{fuzz_decode_store_files, fuzz_reseal, fuzz_samples};
pub use import::ImportReport;
pub use info::ImageDetail;
pub use memory::MemoryLoan;
pub use names::{check_image_dir_name, validate_image_name, IMAGE_NAME_BYTES_MAX, IMAGE_NAME_CHARS};
pub use options::{StoreOptions, StoreRemote, IMAGE_BYTES_MAX};
pub use remote_images::{FetchAs, FetchReport};
pub use resize::{Resized, ShrinkStop, Shrunk};
pub use scrub::{
    DamagedBlock, ScrubFinding, ScrubOptions, ScrubProgress, ScrubReport, SCRUB_BLOCKS_PER_FINDING_MAX,
    SCRUB_FINDINGS_MAX,
};
pub use snapshot::{snapshot_name, SNAPSHOT_SEPARATOR};
pub use stats::SpaceStats;

use crate::bucket::manifests::Publisher;
use crate::bucket::packs::{open_chunks, PackTier};
use crate::chunk::{ChunkStore, ChunkStoreOptions};
use crate::compact::service::Service;
use crate::compact::{Budget, CompactReport, Compactor, ImageCompaction, PassControl, UploadRoom};
use crate::error::{Error, Result};
use crate::gc::{AutoGcTask, GcHistory, GcShared};
use crate::image::{Image, ImageConfig, ManifestView};
use crate::manifest::{CompactedView, Manifest, ManifestOptions, PageCache};
use crate::space::SpaceReserve;
use crate::storage::{Storage, StorageLock};
use crate::tasks::TaskHandle;
use crate::units::BLOCK_BYTES;
use open::{Begun, OpenImage, OpenImages};
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock, Weak};

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ImageInfo {
    pub name: String,
    pub size_bytes: u64,
    /// Open in this process right now.
    pub open: bool,
    pub kind: ImageKind,
    /// A snapshot's image, a clone's snapshot.
    pub origin: Option<String>,
}

/// An open store. See the module docs.
pub struct Store {
    /// Dropped first: stops the compactor thread before anything else goes.
    service: Mutex<Option<Service>>,
    /// With a remote: publishes open images' manifests (stopped on drop).
    publisher: Option<remote_images::PublisherThread>,
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    opts: StoreOptions,
    chunks: Arc<ChunkStore>,
    /// Where the chunk store's sealed packs go, with a remote.
    tier: Option<Arc<PackTier>>,
    compactor: Arc<Compactor>,
    open: Arc<OpenImages>,
    manifests: Mutex<HashMap<String, Weak<Manifest>>>,
    /// The page cache every manifest above looks pages up through.
    manifest_pages: Arc<PageCache>,
    /// Held by `gc`, `create_image` and `remove_image`.
    maint: Mutex<()>,
    /// The GC passes so far, for automatic GC and the counters.
    gc: Arc<GcShared>,
    /// The space guest writes may not take (cas::space).
    space: Arc<SpaceReserve>,
    /// Automatic GC (cas::gc::auto), if on; woken when an image is removed.
    _auto_gc: Option<TaskHandle>,
    _lock: StorageLock,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("dir", &self.dir).field("opts", &self.opts).finish()
    }
}

pub(crate) const STORE_FILE: &str = "STORE";
pub(crate) const LOCK_FILE: &str = "LOCK";
pub(crate) const IMAGE_FILE: &str = "IMAGE";
pub(crate) const MANIFEST_FILE: &str = "manifest";

use crate::sync::lock;

impl Store {
    /// Creates a new store in `dir` (made if missing); fails if one exists.
    pub fn create(storage: Arc<dyn Storage>, dir: &Path, opts: StoreOptions) -> Result<Arc<Store>> {
        opts.validate()?;
        storage.create_dir_all(dir)?;
        // The directory itself must survive a crash, not only what is in it.
        storage.sync_dir(dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")))?;
        let held = storage.lock_exclusive(&dir.join(LOCK_FILE))?;
        if storage.exists(&dir.join(STORE_FILE)) {
            return Err(Error::AlreadyExists(format!("store at {}", dir.display())));
        }
        storage.create_dir_all(&dir.join("images"))?;
        storage.create_dir_all(&dir.join("chunks"))?;
        storage.sync_dir(dir)?;
        files::write_atomic(&*storage, dir, STORE_FILE, &files::encode_store(opts.store_version()))?;
        Store::start(storage, dir, opts, held)
    }

    /// Opens the store in `dir`; refuses a newer store version.
    pub fn open(storage: Arc<dyn Storage>, dir: &Path, opts: StoreOptions) -> Result<Arc<Store>> {
        opts.validate()?;
        if !storage.exists(&dir.join(STORE_FILE)) {
            return Err(Error::NotFound(format!("casblk store at {} (no {STORE_FILE} file)", dir.display())));
        }
        let held = storage.lock_exclusive(&dir.join(LOCK_FILE))?;
        if files::read_store(&*storage, &dir.join(STORE_FILE))? < opts.store_version() {
            // Before anything of the newer format is written (see files.rs).
            let bytes = files::encode_store(opts.store_version());
            files::write_atomic(&*storage, dir, STORE_FILE, &bytes)?;
        }
        Store::start(storage, dir, opts, held)
    }

    /// Opens the chunk store and starts the compactor.
    fn start(
        storage: Arc<dyn Storage>,
        dir: &Path,
        opts: StoreOptions,
        held: StorageLock,
    ) -> Result<Arc<Store>> {
        let chunk_opts = ChunkStoreOptions {
            pack_bytes: opts.pack_bytes,
            cache_bytes: opts.chunk_cache_bytes,
            index_memory_budget_bytes: opts.memory_budget_bytes - opts.compaction_memory_bytes,
            index_checkpoint_min_bytes: opts.index_flush_bytes,
            tasks: opts.tasks.clone(),
            ..ChunkStoreOptions::default()
        };
        let remote = opts.remote_options();
        let (chunks, tier) = open_chunks(storage.clone(), &dir.join("chunks"), chunk_opts, remote.as_ref())?;
        let chunks = Arc::new(chunks);
        let refs_dropped = Arc::new(AtomicU64::new(0));
        let upload_room = tier.clone().map(|tier| {
            let chunks = chunks.clone();
            Arc::new(move || tier.wait_upload_room(&chunks)) as UploadRoom
        });
        let compactor = Arc::new(Compactor {
            chunks: chunks.clone(),
            upload_room,
            budget: Budget::new(opts.compaction_memory_bytes),
            cfg: opts.compact_config(),
            tasks: opts.tasks.clone(),
            refs_dropped: refs_dropped.clone(),
        });
        let space = Arc::new(space::reserve(&storage, dir, &opts));
        let open: Arc<OpenImages> = Arc::default();
        // The interval counts from the open: no automatic pass races the
        // first minute's manual maintenance.
        let gc = Arc::new(GcShared {
            history: Mutex::new(GcHistory {
                chunks_after_last: chunks.len(),
                last_at: Some(opts.tasks.now()),
                ..GcHistory::default()
            }),
            wake: OnceLock::new(),
            refs_dropped,
            space: space.clone(),
        });
        let waker = Arc::downgrade(&gc);
        space.set_low_listener(Arc::new(move || {
            if let Some(gc) = waker.upgrade() {
                gc.space_low();
            }
        }));
        let service = opts.background_compaction.then(|| {
            let (open, gc) = (open.clone(), gc.clone());
            Service::start(
                compactor.clone(),
                Box::new(move || open.compactable()),
                Box::new(move || gc.no_space()),
                &opts.tasks,
                opts.background_cpu,
            )
        });
        let publisher = match (&tier, remote.as_ref()) {
            (Some(tier), Some(r)) => {
                let p = Publisher::new(&chunks, tier, r);
                if p.needs_thread() {
                    p.start()?;
                }
                Some(remote_images::PublisherThread(p))
            }
            _ => None,
        };
        Ok(Arc::new_cyclic(|store: &Weak<Store>| {
            let auto_gc = opts.gc_auto.enabled.then(|| {
                let store = store.clone();
                let task = AutoGcTask {
                    // Not upgradable: the store is being dropped (its handle
                    // stops this task) or not built yet (a wake-up during
                    // its construction).
                    pass: Box::new(move |why| {
                        let store = store.upgrade()?;
                        tracing::info!(dir = %store.dir().display(), why = %why, "automatic GC pass starting");
                        Some(store.gc_auto_pass())
                    }),
                    shared: gc.clone(),
                    chunks: chunks.clone(),
                    opts: opts.gc_auto,
                };
                let handle = opts.tasks.spawn("cas-gc", opts.background_cpu, Box::new(task));
                let _ = gc.wake.set(handle.waker());
                handle
            });
            Store {
                service: Mutex::new(service),
                publisher,
                storage,
                dir: dir.to_path_buf(),
                manifest_pages: PageCache::new(opts.manifest_cache_bytes),
                opts,
                chunks,
                tier,
                compactor,
                open,
                manifests: Mutex::default(),
                maint: Mutex::default(),
                gc,
                space,
                _auto_gc: auto_gc,
                _lock: held,
            }
        }))
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

    /// The shared chunk store.
    pub fn chunks(&self) -> &Arc<ChunkStore> {
        &self.chunks
    }

    /// Where the chunk store's sealed packs go (with a remote).
    pub fn tier(&self) -> Option<&Arc<PackTier>> {
        self.tier.as_ref()
    }

    /// The manifest of image `name`: the one this store has open, or opened
    /// now (absent file: the empty manifest).
    fn manifest(&self, name: &str) -> Result<Arc<Manifest>> {
        let dir = self.image_dir(name)?;
        let path = dir.join(MANIFEST_FILE);
        let mut map = lock(&self.manifests);
        if !self.storage.exists(&dir.join(IMAGE_FILE)) {
            // Removed meanwhile (or never made): not an empty manifest.
            return Err(Error::NotFound(format!("image {name}")));
        }
        if let Some(m) = map.get(name).and_then(Weak::upgrade) {
            return Ok(m);
        }
        let m = Arc::new(Manifest::open(self.storage.clone(), &path, self.manifest_options())?);
        map.retain(|_, w| w.strong_count() > 0);
        map.insert(name.to_string(), Arc::downgrade(&m));
        Ok(m)
    }

    /// The decoded manifest pages every open image looks up through
    /// (`StoreOptions::manifest_cache_bytes`).
    pub fn manifest_cache(&self) -> &PageCache {
        &self.manifest_pages
    }

    /// Options for the manifests of this store's images: its shared page
    /// cache.
    pub(crate) fn manifest_options(&self) -> ManifestOptions {
        ManifestOptions { page_cache: self.manifest_pages.clone(), ..ManifestOptions::default() }
    }

    /// Lends `bytes` of the store's memory budget for `what` (a device's
    /// request buffers), or refuses naming every figure; see `store/memory.rs`.
    pub fn lend_memory(&self, bytes: u64, what: &str) -> Result<MemoryLoan> {
        memory::lend(
            &self.chunks,
            bytes,
            what,
            self.opts.memory_budget_bytes,
            self.opts.compaction_memory_bytes,
        )
    }

    /// The directory of image `name` (checked to be one entry of `images/`;
    /// names of older stores are accepted, see [`check_image_dir_name`]).
    pub fn image_dir(&self, name: &str) -> Result<PathBuf> {
        check_image_dir_name(name)?;
        Ok(self.dir.join("images").join(name))
    }

    /// The directory of image `name`'s log segments.
    pub fn log_dir(&self, name: &str) -> Result<PathBuf> {
        Ok(self.image_dir(name)?.join(crate::image::WAL_DIR))
    }

    /// Creates an empty image of `size_bytes` (a multiple of 4096, > 0).
    pub fn create_image(&self, name: &str, size_bytes: u64) -> Result<()> {
        if self.publisher.is_some() {
            // Publishing it would shadow another store's image of the name.
            self.refuse_published_name(name)?;
        }
        let _maint = lock(&self.maint);
        let _open = self.open.lock();
        let (dir, header) = self.prepare_image(name, size_bytes)?;
        self.install_image(&dir, header)
    }

    /// The first half of creating an image: checks the name and size, and
    /// makes its directory and empty log, but not its `IMAGE` file, so the
    /// image does not exist yet (a crash leaves a directory that listing
    /// ignores and the next create clears). The caller holds `maint`.
    fn prepare_image(&self, name: &str, size_bytes: u64) -> Result<(PathBuf, ImageHeader)> {
        validate_image_name(name)?;
        self.prepare_dir(name, size_bytes)
    }

    /// `prepare_image` without the rule for new names (a snapshot's
    /// `IMAGE@SNAP` is made of two checked names).
    fn prepare_dir(&self, name: &str, size_bytes: u64) -> Result<(PathBuf, ImageHeader)> {
        let dir = self.image_dir(name)?;
        check_image_size(size_bytes)?;
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
        Ok((dir, ImageHeader::image(size_bytes, log_id)))
    }

    /// The second half: the `IMAGE` file, written atomically; from here on
    /// the image exists. Also rewrites an existing image's header (a new
    /// size: store/resize.rs, a rollback).
    fn install_image(&self, dir: &Path, header: ImageHeader) -> Result<()> {
        files::write_atomic(&*self.storage, dir, IMAGE_FILE, &header.encode())
    }

    /// Opens image `name`, replaying the part of its log its manifest does
    /// not cover, or returns it if already open. Reads see the log overlay,
    /// then the manifest's chunks, then holes; the compactor takes it on.
    ///
    /// The log's replay runs without the store's map of open images locked:
    /// other images open, compact and report meanwhile; a second opener of
    /// `name` waits for the first and gets the same image.
    pub fn open_image(&self, name: &str) -> Result<Arc<Image>> {
        let dir = self.image_dir(name)?;
        let opening = match self.open.begin(name) {
            Begun::Open(image) => return Ok(image),
            Begun::Opening(opening) => opening,
        };
        let manifest = self.manifest(name)?;
        let cfg = self.image_config(name, manifest.covered())?;
        // With a remote, a writable image is written under its lease only.
        let lease = match &self.publisher {
            Some(p) if !cfg.read_only => {
                let c = manifest.committed();
                p.0.acquire(name, c.file_id().map(|_| (c.root(), cfg.size_bytes)))?
            }
            _ => None,
        };
        let view = Arc::new(CompactedView { manifest: manifest.clone(), chunks: self.chunks.clone() });
        let image = match Image::open(self.storage.clone(), &dir, cfg, view) {
            Ok(image) => Arc::new(image),
            Err(e) => {
                if let Some(l) = lease {
                    let _ = l.release();
                }
                return Err(e);
            }
        };
        if let Some(p) = &self.publisher {
            if !image.is_read_only() {
                // Before the compactor sees it: its log is held from here on.
                p.0.register(name, &image, &manifest, lease);
            }
        }
        let compaction = Arc::new(ImageCompaction::new(manifest, image.start_cursor()));
        if let Some(service) = &*lock(&self.service) {
            let threshold = u128::from(self.opts.log_quota_bytes)
                * u128::from(self.opts.compaction_trigger_percent)
                / 100;
            image.set_pressure_listener(threshold as u64, service.waker());
        }
        opening.finish(&image, Some(compaction));
        Ok(image)
    }

    /// Image `name` if it is open now.
    pub fn opened(&self, name: &str) -> Option<Arc<Image>> {
        self.open.lock().get(name).and_then(OpenImage::image)
    }

    /// The compactor's state for `image` (its manifest, cursor and work
    /// counters); None for an image this store does not compact (opened
    /// with `open_image_with`).
    pub fn compaction(&self, image: &Image) -> Option<Arc<ImageCompaction>> {
        self.open.compaction(image)
    }

    /// Like `open_image`, with the image's compacted data behind `manifest`
    /// instead of its manifest (a test seam: the image must never have been
    /// compacted, is not compacted, and its log is replayed whole).
    pub fn open_image_with(&self, name: &str, manifest: Arc<dyn ManifestView>) -> Result<Arc<Image>> {
        let dir = self.image_dir(name)?;
        let opening = match self.open.begin(name) {
            Begun::Open(image) => return Ok(image),
            Begun::Opening(opening) => opening,
        };
        let cfg = self.image_config(name, 0)?;
        let image = Arc::new(Image::open(self.storage.clone(), &dir, cfg, manifest)?);
        opening.finish(&image, None);
        Ok(image)
    }

    fn image_config(&self, name: &str, replay_after_seq: u64) -> Result<ImageConfig> {
        let header = self.header(name)?;
        Ok(ImageConfig {
            name: name.to_string(),
            size_bytes: header.size_bytes,
            log_id: header.log_id,
            segment_bytes: self.opts.log_segment_bytes,
            quota_bytes: self.opts.log_quota_bytes,
            replay_after_seq,
            background_cpu: self.opts.background_cpu,
            tasks: self.opts.tasks.clone(),
            read_only: header.kind != ImageKind::Image,
            space: self.space.clone(),
        })
    }

    /// Runs one compaction pass over `image` now, on this thread (and one
    /// helper): every record durable when it starts is moved into chunks
    /// and the manifest, and the covered log is reclaimed. Deterministic
    /// (tests); the background compactor does the same on its own.
    pub fn compact_once(&self, image: &Image) -> Result<CompactReport> {
        self.compact_with(image, &PassControl::default())
    }

    /// `compact_once` with explicit control (crash tests, forced durability).
    #[doc(hidden)]
    pub fn compact_with(&self, image: &Image, ctl: &PassControl) -> Result<CompactReport> {
        let state = self.compaction(image).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "image {} was not opened for compaction by its store",
                image.name()
            ))
        })?;
        self.compactor.run_pass(image, &state, ctl)
    }

    /// Every image with a readable header, by name.
    pub fn list_images(&self) -> Result<Vec<ImageInfo>> {
        let open = self.open.lock();
        let mut out = Vec::new();
        for name in self.storage.list_dir(&self.dir.join("images"))? {
            if check_image_dir_name(&name).is_err() {
                continue;
            }
            let path = self.dir.join("images").join(&name).join(IMAGE_FILE);
            if !self.storage.exists(&path) {
                continue;
            }
            let header = ImageHeader::read(&*self.storage, &path)?;
            let is_open = open.get(&name).is_some_and(OpenImage::is_open);
            out.push(ImageInfo {
                name,
                size_bytes: header.size_bytes,
                open: is_open,
                kind: header.kind,
                origin: header.origin,
            });
        }
        Ok(out)
    }

    /// Removes image `name` and its log; refused while it is open, while
    /// it has snapshots, and for a snapshot while clones of it exist.
    pub fn remove_image(&self, name: &str) -> Result<()> {
        let dir = self.image_dir(name)?;
        let _maint = lock(&self.maint);
        self.check_removable(name)?;
        let mut open = self.open.lock();
        if open.get(name).is_some_and(OpenImage::is_open) {
            return Err(Error::Unavailable(format!("image {name}"), "it is open; close it first".into()));
        }
        open.remove(name);
        lock(&self.manifests).remove(name);
        let header_path = dir.join(IMAGE_FILE);
        if !self.storage.exists(&header_path) {
            return Err(Error::NotFound(format!("image {name}")));
        }
        self.storage.remove_file(&header_path)?;
        self.storage.sync_dir(&dir)?;
        // Its chunks may now be garbage: automatic GC looks at once.
        self.gc.nudge();
        self.storage.remove_dir_all(&dir)?;
        self.storage.sync_dir(&self.dir.join("images"))
    }
}

/// Refuses an image size that is zero, not whole blocks, or over the limit.
fn check_image_size(size_bytes: u64) -> Result<()> {
    if size_bytes == 0 || !size_bytes.is_multiple_of(BLOCK_BYTES) || size_bytes > IMAGE_BYTES_MAX {
        return Err(Error::InvalidArgument(format!(
            "image size {size_bytes} must be a non-zero multiple of {BLOCK_BYTES} up to {IMAGE_BYTES_MAX}"
        )));
    }
    Ok(())
}
