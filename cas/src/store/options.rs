//! What a store is opened with ([`StoreOptions`], every field with a
//! default) and the checks it must pass; the bucket's settings are
//! assembled here (`StoreOptions::remote`) and handed to the tier and the
//! publisher by `Store::start`.

use super::files;
use crate::background::BackgroundCpu;
use crate::bucket::RemoteOptions;
use crate::compact::CompactConfig;
use crate::error::{Error, Result};
use crate::gc::AutoGcOptions;
use crate::image::MAX_WRITE_BYTES;
use crate::tasks::Tasks;
use crate::units::BLOCK_BYTES;
use crate::wal::segment::{SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN};
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
    /// Free space of the store filesystem that guest writes may not take
    /// (cas::space): compaction, GC and manifest commits keep it to free
    /// space on a full store. `None`: 1% of the filesystem, at least
    /// 256 MiB, at most 4 GiB and never more than a tenth of it; 0: none.
    /// (Left out of the settings counters when `None`: they are numbers.)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub space_reserve_bytes: Option<u64>,
    /// How long writes wait below the reserve, at most, before they fail
    /// with ENOSPC (less when GC shows it cannot free space).
    pub space_wait_ms: u64,
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
            space_reserve_bytes: None,
            space_wait_ms: crate::space::DEFAULT_SPACE_WAIT_MS,
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
    pub(super) fn store_version(&self) -> u32 {
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

    /// The bucket's settings as the tier and the publisher get them: the
    /// remote's, run by the store's tasks.
    pub(super) fn remote_options(&self) -> Option<RemoteOptions> {
        self.remote.0.clone().map(|r| RemoteOptions { tasks: self.tasks.clone(), ..r })
    }

    pub(super) fn compact_config(&self) -> CompactConfig {
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
