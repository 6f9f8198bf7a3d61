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

mod export;
pub(crate) mod files;
mod fuzz;
mod import;
mod info;
mod memory;
mod names;
mod open;
mod remote_images;
mod snapshot;

pub use export::ExportReport;
pub use files::{ImageHeader, ImageKind, IMAGE_VERSION, STORE_VERSION, STORE_VERSION_LOCAL};
pub use fuzz::{fuzz_decode_store_files, fuzz_reseal, fuzz_samples};
pub use import::ImportReport;
pub use info::ImageDetail;
pub use memory::MemoryLoan;
pub use names::{check_image_dir_name, validate_image_name, IMAGE_NAME_BYTES_MAX, IMAGE_NAME_CHARS};
pub use remote_images::{FetchAs, FetchReport};
pub use snapshot::{snapshot_name, SNAPSHOT_SEPARATOR};

use crate::background::BackgroundCpu;
use crate::bucket::manifests::Publisher;
use crate::bucket::packs::{open_chunks, PackTier};
use crate::chunk::{ChunkStats, ChunkStore, ChunkStoreOptions};
use crate::compact::service::Service;
use crate::compact::{
    Budget, CompactConfig, CompactReport, Compactor, ImageCompaction, PassControl, UploadRoom,
};
use crate::error::{Error, Result};
use crate::gc::{AutoGcOptions, AutoGcTask, GcHistory, GcOptions, GcReport, GcShared};
use crate::image::{Image, ImageConfig, ImageStats, ManifestView, MAX_WRITE_BYTES};
use crate::manifest::{CompactedView, Manifest, ManifestOptions, PageCache};
use crate::storage::{Storage, StorageLock};
use crate::tasks::{TaskHandle, Tasks};
use crate::units::BLOCK_BYTES;
use crate::wal::segment::{SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN};
use open::{Begun, OpenImage, OpenImages};
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

/// Largest image size accepted (1 PiB).
pub const IMAGE_BYTES_MAX: u64 = 1 << 50;

/// Tunables of a store; every field has a default.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StoreOptions {
    /// Size of each WAL segment file (1 MiB ..= 1 GiB, a multiple of 4096).
    pub log_segment_bytes: u64,
    /// Per-image log quota; at least two segments.
    pub log_quota_bytes: u64,
    /// Clean chunk cache on the read path (cas::chunk), shared by all images.
    pub chunk_cache_bytes: u64,
    /// Decoded manifest pages kept for lookups, shared by all images
    /// (cas::manifest::PageCache): one bound however many are open.
    pub manifest_cache_bytes: u64,
    /// Chunk index plus compaction preparation: the index may take
    /// `memory_budget_bytes - compaction_memory_bytes`, beyond which its
    /// summary samples the hashes (fewer duplicates are found; writes
    /// never fail on it).
    pub memory_budget_bytes: u64,
    /// The part of the memory budget compaction passes may lease for their
    /// buffers (see cas::compact::budget). Must hold two of the largest log
    /// records plus read-ahead.
    pub compaction_memory_bytes: u64,
    /// Run the background compactor (one thread, plus one per pass).
    /// Without it, compaction happens only through `Store::compact_once`.
    pub background_compaction: bool,
    /// Threads one compaction pass uses: 1; 2 (read+hash / insert+commit
    /// pipeline); 3 (also the commit protocol's syncs and deletions on
    /// their own thread).
    pub compaction_threads: u64,
    /// Log record bytes per compaction batch (one manifest commit each).
    /// A pass holds two batch buffers (one read while the other is
    /// inserted), so this sets most of compaction's resident memory: at
    /// 16 MiB the daemon's peak in a one-repetition cas run of
    /// `ci/bench device` was 154 MiB instead of 177 at 32. At 8 MiB (with
    /// user copy) the device bench's cas phases peaked at 97 MiB in the VM
    /// against 107 at 16, while natively `ci/bench compaction` drained at
    /// 0.64x blake3 against 0.65x, with 1.07x the manifest pages the
    /// commits touched and 0.38 syncs per MiB (0.27 at 16). 4 MiB peaked at
    /// 86 but drained at 0.56x, wrote 1.11x the pages (over the bench's
    /// 1.1x target) and synced 0.66 times per MiB: too many commits for a
    /// slow disk.
    pub compaction_batch_bytes: u64,
    /// When the store runs GC by itself (cas::gc::auto); on by default.
    pub gc_auto: AutoGcOptions,
    /// Compact at once (making the log durable if needed) when an image's
    /// log uses this percentage of its quota (1 ..= 100).
    pub compaction_trigger_percent: u64,
    /// Otherwise compact durable data this long after the last pass.
    pub compaction_interval_ms: u64,
    /// Largest chunk pack file.
    pub pack_bytes: u64,
    /// The chunk index is flushed to a run on disk once its journal is
    /// past this (or 1/32 of the chunks stored, if more; see
    /// cas::dedup).
    pub index_flush_bytes: u64,
    /// Scheduling class of the compactor and the log writeback threads
    /// (cas::background): by default they never preempt the request path
    /// on wakeup. Not among the numeric settings counters (a name, not a
    /// number: `/proc/<pid>/task/<tid>/stat` shows the policy).
    #[serde(skip)]
    pub background_cpu: BackgroundCpu,
    /// What runs the background tasks (the compactor, each image's log
    /// writeback): threads, or a test's stepper (`cas::tasks`).
    #[serde(skip)]
    pub tasks: Tasks,
    /// Upload sealed packs to an object store and read them back from it
    /// (cas::bucket::packs); none by default.
    #[serde(skip)]
    pub remote: StoreRemote,
}

/// [`StoreOptions::remote`]: compared by the bucket it names and its
/// settings.
#[derive(Clone, Debug, Default)]
pub struct StoreRemote(pub Option<crate::bucket::RemoteOptions>);

impl PartialEq for StoreRemote {
    fn eq(&self, other: &StoreRemote) -> bool {
        format!("{:?}", self.0) == format!("{:?}", other.0)
    }
}

impl Eq for StoreRemote {}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            log_segment_bytes: 8 << 20,
            log_quota_bytes: 256 << 20,
            chunk_cache_bytes: 16 << 20,
            manifest_cache_bytes: 8 << 20,
            memory_budget_bytes: 1 << 30,
            compaction_memory_bytes: 128 << 20,
            background_compaction: true,
            compaction_threads: 3,
            compaction_batch_bytes: 8 << 20,
            gc_auto: AutoGcOptions::default(),
            compaction_trigger_percent: 50,
            compaction_interval_ms: 1000,
            pack_bytes: 64 << 20,
            index_flush_bytes: 4 << 20,
            background_cpu: BackgroundCpu::default(),
            tasks: Tasks::default(),
            remote: StoreRemote::default(),
        }
    }
}

/// Read-ahead of the compactor's log reader plus slack for its block
/// buffers, per batch buffer (see `compaction_memory_min`).
const COMPACTION_SLACK_BYTES: u64 = 2 << 20;

impl StoreOptions {
    /// The store version these options write (see files.rs).
    fn store_version(&self) -> u32 {
        if self.remote.0.is_some() {
            files::STORE_VERSION
        } else {
            files::STORE_VERSION_LOCAL
        }
    }

    pub fn validate(&self) -> Result<()> {
        let seg = self.log_segment_bytes;
        if !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&seg) || !seg.is_multiple_of(BLOCK_BYTES) {
            return Err(Error::InvalidArgument(format!(
                "log_segment_bytes {seg} must be a multiple of {BLOCK_BYTES} in {SEGMENT_BYTES_MIN}..={SEGMENT_BYTES_MAX}"
            )));
        }
        if self.log_quota_bytes < 2 * seg {
            return Err(Error::InvalidArgument(format!(
                "log_quota_bytes {} must hold at least two segments of {seg}",
                self.log_quota_bytes
            )));
        }
        let min = self.compaction_memory_min();
        if self.compaction_memory_bytes < min || self.compaction_memory_bytes >= self.memory_budget_bytes {
            return Err(Error::InvalidArgument(format!(
                "compaction_memory_bytes {} must be at least {min} (two of the largest log records plus \
                 read-ahead) and below memory_budget_bytes {}",
                self.compaction_memory_bytes, self.memory_budget_bytes
            )));
        }
        if !(1..=3).contains(&self.compaction_threads)
            || !(1..=100).contains(&self.compaction_trigger_percent)
            || self.compaction_batch_bytes == 0
        {
            return Err(Error::InvalidArgument(format!(
                "compaction_threads {} must be 1, 2 or 3, compaction_trigger_percent {} in 1..=100, \
                 compaction_batch_bytes {} above 0",
                self.compaction_threads, self.compaction_trigger_percent, self.compaction_batch_bytes
            )));
        }
        Ok(())
    }

    /// The least compaction memory that always fits a batch of one record
    /// while the other batch buffer holds one too.
    pub fn compaction_memory_min(&self) -> u64 {
        let record_max = self.log_segment_bytes.min(MAX_WRITE_BYTES + 4096);
        2 * (record_max + COMPACTION_SLACK_BYTES) + 4 * COMPACTION_SLACK_BYTES
    }

    fn compact_config(&self) -> CompactConfig {
        CompactConfig {
            threads: self.compaction_threads as usize,
            batch_bytes: self.compaction_batch_bytes,
            // The edit of a batch costs about 40 bytes per block.
            batch_blocks: (self.compaction_memory_bytes / 256).clamp(1 << 16, 1 << 20),
            trigger_percent: self.compaction_trigger_percent,
            interval: Duration::from_millis(self.compaction_interval_ms),
            service_batches: 8,
        }
    }
}

/// What `list_images` says about one image.
/// See [`Store::space_stats`].
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct SpaceStats {
    pub images: u64,
    /// Blocks the manifests map to chunks, summed over images.
    pub mapped_blocks: u64,
    pub mapped_bytes: u64,
    /// Distinct chunks stored, and their bytes.
    pub chunks: u64,
    pub unique_bytes: u64,
    /// Pack file bytes (headers and dead slots included).
    pub stored_bytes: u64,
    /// mapped_blocks / chunks: how many mapped blocks each stored chunk serves.
    pub dedup_ratio: f64,
    /// GC passes this process finished (manual and automatic), the
    /// automatic ones, automatic passes that failed, and the pack bytes
    /// the finished ones gave back.
    pub gc_passes: u64,
    pub gc_auto_passes: u64,
    pub gc_auto_failures: u64,
    pub gc_reclaimed_bytes: u64,
}

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
    service: Option<Service>,
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
            ..ChunkStoreOptions::default()
        };
        let (chunks, tier) =
            open_chunks(storage.clone(), &dir.join("chunks"), chunk_opts, opts.remote.0.as_ref())?;
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
        });
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
        let publisher = match (&tier, opts.remote.0.as_ref()) {
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
                service,
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

    pub fn chunk_stats(&self) -> ChunkStats {
        self.chunks.stats()
    }

    /// Space across the whole store: what the images' manifests map, what
    /// the chunk store holds, and the dedup ratio between them (compacted
    /// data only; the logs' overlays are not counted).
    pub fn space_stats(&self) -> Result<SpaceStats> {
        let chunks = self.chunks.stats();
        let mut s =
            SpaceStats { chunks: chunks.chunks, stored_bytes: chunks.stored_bytes, ..SpaceStats::default() };
        for info in self.list_images()? {
            s.images += 1;
            s.mapped_blocks += self.manifest(&info.name)?.stats().mapped_blocks;
        }
        s.mapped_bytes = s.mapped_blocks * BLOCK_BYTES;
        s.unique_bytes = s.chunks * BLOCK_BYTES;
        s.dedup_ratio = if s.chunks == 0 { 1.0 } else { s.mapped_blocks as f64 / s.chunks as f64 };
        let gc = *lock(&self.gc.history);
        (s.gc_passes, s.gc_auto_passes, s.gc_auto_failures, s.gc_reclaimed_bytes) =
            (gc.passes, gc.auto_passes, gc.auto_failures, gc.reclaimed_bytes);
        Ok(s)
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
        self.publish_image(&dir, header)
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
        if size_bytes == 0 || !size_bytes.is_multiple_of(BLOCK_BYTES) || size_bytes > IMAGE_BYTES_MAX {
            return Err(Error::InvalidArgument(format!(
                "image size {size_bytes} must be a non-zero multiple of {BLOCK_BYTES} up to {IMAGE_BYTES_MAX}"
            )));
        }
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
    /// the image exists.
    fn publish_image(&self, dir: &Path, header: ImageHeader) -> Result<()> {
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
                p.0.acquire(name, c.file_id().map(|_| c.root()))?
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
        if let Some(service) = &self.service {
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

    /// `image`'s counters and state ([`Image::stats`]) with the compactor's
    /// part filled in: its work counters and the seq its manifest covers.
    pub fn image_stats(&self, image: &Image) -> ImageStats {
        let mut s = image.stats();
        if let Some(c) = self.compaction(image) {
            s.compaction = c.stats();
            s.covered_seq = c.manifest().covered();
        }
        if let Some(p) = self.publish_stats(image.name()) {
            s.remote = p.counters;
        }
        s
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

    /// Runs one chunk GC pass over the manifests of every image, open or
    /// not (cas::gc), while IO and compaction go on: compaction batches pin
    /// the chunks they insert until their commit, and image creation and
    /// removal wait for the pass.
    pub fn gc(&self) -> Result<GcReport> {
        self.gc_with(&GcOptions::default())
    }

    /// `gc` with explicit options.
    pub fn gc_with(&self, opts: &GcOptions) -> Result<GcReport> {
        self.gc_run(opts, false)
    }

    /// An automatic pass (cas::gc::auto), with the default options.
    pub(crate) fn gc_auto_pass(&self) -> Result<GcReport> {
        self.gc_run(&GcOptions::default(), true)
    }

    /// One pass, recorded in the GC history (the tasks' clock dates it)
    /// before `maint` is released: a removal waiting for the pass nudges
    /// the next one after this record, so its nudge is not lost.
    fn gc_run(&self, opts: &GcOptions, auto: bool) -> Result<GcReport> {
        let _maint = lock(&self.maint);
        // Read before the mark: mappings dropped during the pass may hold
        // chunks it does not sweep, so they count toward the next one.
        let dropped = self.gc.refs_dropped.load(Ordering::Relaxed);
        let result = self.gc_marked_and_swept(opts);
        let (now, chunks) = (self.opts.tasks.now(), self.chunks.len());
        // The pass's mark sets are freed: hand their pages back.
        crate::heap::PROCESS.release_free(now);
        let mut history = lock(&self.gc.history);
        match &result {
            Ok(report) => history.finished(report, chunks, dropped, now, auto),
            Err(_) if auto => history.failed(now),
            Err(_) => {}
        }
        result
    }

    /// The pass itself; the caller holds `maint`.
    fn gc_marked_and_swept(&self, opts: &GcOptions) -> Result<GcReport> {
        let mut manifests = Vec::new();
        for info in self.list_images()? {
            manifests.push(self.manifest(&info.name)?);
        }
        let refs: Vec<&Manifest> = manifests.iter().map(|m| &**m).collect();
        crate::gc::run(&self.chunks, &refs, opts)
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
