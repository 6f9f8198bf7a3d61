//! One image: its log, its overlay index, its capacity and durability
//! state, and the read/write/zero/discard/flush operations on it.
//!
//! ```text
//!  write(off, data) --reserve--> Capacity (quota)      never blocks in try_reserve
//!        |
//!        +--assign--> Log: seq + slot (roll if full)   short lock, rare I/O
//!        |            closed segment -> Writeback thread (early sync)
//!        +--pwrite--> segment file                     no lock held
//!        +--complete--> Durability (watermark)
//!        +--visible--> Overlay (seq-wins insert)       short write lock
//!        +--(FUA) make_durable(seq)                    group commit
//! ```
//!
//! The read path (overlay pieces, then manifest windows, then zeros, in
//! the request's `IoCx`) is read.rs. The compactor's hooks (reclamation,
//! forced durability, pressure) are in compaction.rs. The compactor's own
//! state for an image (its manifest, cursor and work counters) is the
//! store's, not the image's: nothing here depends on `cas::compact`.
//!
//! `Image` is `Send + Sync`; every method takes `&self` and may run on many
//! threads at once. No lock is held across I/O on record bytes. The
//! durability protocol is written out in docs/design.md.

pub mod capacity;
mod compaction;
pub mod durability;
pub mod manifest_view;
pub mod overlay;
mod read;
mod reserve;
pub mod stats;
pub mod writeback;

pub use capacity::{CapacityListener, LogReservation, CAPACITY_RETRY_MS};
pub use manifest_view::{ChunkHash, ChunkRef, EmptyManifest, ManifestView, BLOCK_BYTES};
pub use reserve::Held;
pub use stats::ImageStats;

use crate::background::BackgroundCpu;
use crate::error::{Error, Result};
use crate::io::IoCx;
use crate::space::{GraceToken, SpaceReserve};
use crate::storage::Storage;
use crate::tasks::Tasks;
use crate::units::SECTOR_BYTES;
use crate::wal::{Log, RecordHeader, RecordKind, RecoveryReport, Slot, RECORD_HEADER_BYTES};
use capacity::Capacity;
use durability::Durability;
use overlay::{Overlay, Source};
use stats::{bump, Counters};
use std::path::Path;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use trace::IoSource;
use writeback::Writeback;

/// Largest payload one write request may carry.
pub const MAX_WRITE_BYTES: u64 = 64 << 20;

/// How an image is opened.
#[derive(Clone)]
pub struct ImageConfig {
    pub name: String,
    pub size_bytes: u64,
    pub log_id: u64,
    pub segment_bytes: u64,
    pub quota_bytes: u64,
    /// Records with seq at or below this are covered by the manifest.
    pub replay_after_seq: u64,
    /// The log writeback thread's scheduling class.
    pub background_cpu: BackgroundCpu,
    /// What runs the log writeback task.
    pub tasks: Tasks,
    /// A snapshot: every write, zeroing and discard is refused.
    pub read_only: bool,
    /// The store's space reserve, asked before a write takes a new log
    /// segment.
    pub space: Arc<SpaceReserve>,
}

/// One open image. See the module docs.
pub struct Image {
    name: String,
    /// Grows while open (`Store::resize_image`), never shrinks: never
    /// larger than the size in the image's `IMAGE` file.
    size_bytes: std::sync::atomic::AtomicU64,
    read_only: bool,
    log: Arc<Log>,
    overlay: RwLock<Overlay>,
    capacity: Arc<Capacity>,
    durability: Arc<Durability>,
    writeback: Writeback,
    manifest: RwLock<Arc<dyn ManifestView>>,
    counters: Counters,
    recovery: RecoveryReport,
    /// Where the first record above the checkpoint was at open (segment
    /// index, file offset, seq): the compactor's first cursor.
    start_cursor: (u64, u64, u64),
    /// The highest seq whose log may be reclaimed whatever the manifest
    /// covers (u64::MAX: no limit): what a bucket holds of the image
    /// (cas::bucket::manifests), so the log quota bounds what is flushed and
    /// not yet published.
    reclaim_gate: std::sync::atomic::AtomicU64,
    space: Arc<SpaceReserve>,
    /// This image's grace roll below the space reserve (cas::space).
    space_grace: GraceToken,
}

/// How long reclamation waits for pins on a covered segment before it
/// leaves the segment for a later call.
pub const RECLAIM_PIN_WAIT_MS: u64 = 50;

fn read_lock<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write_lock<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

fn sectors(bytes: u64) -> u64 {
    bytes / SECTOR_BYTES
}

/// The directory of an image's log, inside the image's directory.
pub(crate) const WAL_DIR: &str = "wal";

impl Image {
    /// Creates the (empty) log of a new image in `image_dir`/wal.
    pub(crate) fn create_log(
        storage: &dyn Storage,
        image_dir: &Path,
        segment_bytes: u64,
        log_id: u64,
    ) -> Result<()> {
        let wal = image_dir.join(WAL_DIR);
        storage.create_dir_all(&wal)?;
        storage.sync_dir(image_dir)?;
        Log::create(storage, &wal, segment_bytes, log_id)
    }

    /// Opens an image whose directory is `image_dir`: replays its log
    /// (recovery) and rebuilds the overlay.
    pub(crate) fn open(
        storage: Arc<dyn Storage>,
        image_dir: &Path,
        cfg: ImageConfig,
        manifest: Arc<dyn ManifestView>,
    ) -> Result<Image> {
        let mut overlay = Overlay::new();
        let size_sectors = sectors(cfg.size_bytes);
        let mut beyond = None;
        let mut first = None;
        let (log, recovery) = Log::open(
            storage,
            &image_dir.join(WAL_DIR),
            cfg.segment_bytes,
            cfg.log_id,
            cfg.replay_after_seq,
            !cfg.read_only,
            &mut |seg, pos, h: &RecordHeader| {
                first.get_or_insert((seg.index(), pos, h.seq));
                let (start_sector, len_sectors) = (sectors(h.offset_bytes), sectors(h.len_bytes));
                let src = match h.kind {
                    RecordKind::Pad => return,
                    RecordKind::Write => {
                        Source::Log { segment: seg.clone(), position_bytes: pos + RECORD_HEADER_BYTES as u64 }
                    }
                    RecordKind::WriteZeroes | RecordKind::Discard => Source::Zero,
                };
                if start_sector + len_sectors > size_sectors {
                    beyond.get_or_insert((seg.path().to_path_buf(), pos, h.seq));
                    return;
                }
                overlay.insert(start_sector, len_sectors, h.seq, src);
            },
        )?;
        if let Some((path, offset, seq)) = beyond {
            return Err(Error::Corruption {
                path,
                offset,
                detail: format!("record seq {seq} reaches past the image's {} bytes", cfg.size_bytes),
            });
        }
        let durable = log.next_seq() - 1;
        let start_cursor = first.unwrap_or_else(|| log.end_position());
        let capacity = Capacity::new(cfg.quota_bytes, log.used_bytes());
        let log = Arc::new(log);
        let durability = Arc::new(Durability::new(format!("image {}", cfg.name), durable));
        Ok(Image {
            writeback: Writeback::start(
                &cfg.name,
                log.clone(),
                durability.clone(),
                &cfg.tasks,
                cfg.background_cpu,
            ),
            durability,
            name: cfg.name,
            size_bytes: std::sync::atomic::AtomicU64::new(cfg.size_bytes),
            read_only: cfg.read_only,
            log,
            overlay: RwLock::new(overlay),
            capacity,
            manifest: RwLock::new(manifest),
            counters: Counters::default(),
            recovery,
            start_cursor,
            reclaim_gate: std::sync::atomic::AtomicU64::new(u64::MAX),
            space: cfg.space,
            space_grace: GraceToken::default(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Grows the image to `size_bytes` (a smaller size is ignored): requests
    /// up to the new end are accepted from now on. The caller has made
    /// the size durable first (the `IMAGE` file), so a record written past
    /// the old end always replays into an image that reaches it.
    pub(crate) fn grow_to(&self, size_bytes: u64) {
        self.size_bytes.fetch_max(size_bytes, std::sync::atomic::Ordering::AcqRel);
    }

    /// Lowers the size to the one a shrink just made durable, so a later
    /// opener that gets this image (still held by a background task) sees
    /// it; only with no writer (store/resize.rs).
    pub(crate) fn shrink_to(&self, size_bytes: u64) {
        self.size_bytes.fetch_min(size_bytes, std::sync::atomic::Ordering::AcqRel);
    }

    /// What replaying the log found when this image was opened.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// The compacted-data view reads go through now.
    pub fn manifest_view(&self) -> Arc<dyn ManifestView> {
        read_lock(&self.manifest).clone()
    }

    /// Replaces the compacted-data view (the manifest side sets it).
    pub fn set_manifest(&self, manifest: Arc<dyn ManifestView>) {
        *write_lock(&self.manifest) = manifest;
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        if !offset.is_multiple_of(SECTOR_BYTES) || !len.is_multiple_of(SECTOR_BYTES) || len == 0 {
            return Err(Error::InvalidArgument(format!(
                "range {offset}+{len} is not a non-empty multiple of {SECTOR_BYTES} bytes"
            )));
        }
        let size_bytes = self.size_bytes();
        if offset.checked_add(len).is_none_or(|end| end > size_bytes) {
            return Err(Error::InvalidArgument(format!(
                "range {offset}+{len} is outside image {} of {size_bytes} bytes",
                self.name
            )));
        }
        Ok(())
    }

    /// Reserves `log_bytes` of log capacity if they fit now; never blocks.
    /// A caller that retries until it fits counts the wait once, with
    /// [`Image::note_capacity_wait`]. A failed image, whose log will never
    /// be reclaimed, and a closed log ([`Image::close_log`]) that is full
    /// hand out a refusal instead of `None`: the write then fails at once
    /// rather than waiting forever.
    pub fn try_reserve(&self, log_bytes: u64) -> Option<LogReservation> {
        if let Some(why) = self.durability.failed_because() {
            return Some(self.capacity.refusal(why.into()));
        }
        self.capacity.try_reserve(log_bytes)
    }

    /// Closes the log to waiting: reclamation keeps failing (the chunk store
    /// or the manifest cannot be written), so a write that does not fit in
    /// the log fails with `why` instead of waiting; writes that fit, flushes
    /// and reads go on. The compaction service calls this after a bounded
    /// run of failed passes, and [`Image::reopen_log`] after one succeeds.
    pub fn close_log(&self, why: &str) {
        if self.capacity.closed().is_none() {
            tracing::error!(image = %self.name, "{why}; writes that do not fit in the log now fail");
        }
        self.capacity.close(why);
    }

    pub fn reopen_log(&self) {
        if self.capacity.closed().is_some() {
            tracing::info!(image = %self.name, "compaction works again; writes wait for log space again");
            self.capacity.reopen();
        }
    }

    /// Why the image cannot take writes as it should: it failed (reads go
    /// on, writes and flushes fail), or its log is closed to waiting.
    pub fn failure(&self) -> Option<String> {
        self.durability
            .failed_because()
            .map(|why| format!("failed: {why}"))
            .or_else(|| self.capacity.closed().map(|why| format!("log closed: {why}")))
    }

    /// Counts one write that waited for log capacity before it got its
    /// reservation (`ImageStats::capacity_waits`): the daemon's scheduler
    /// holds such writes itself, and reports each one once at dispatch.
    pub fn note_capacity_wait(&self) {
        bump(&self.counters.capacity_waits, 1);
    }

    /// Called whenever log space is released after a reservation was refused.
    pub fn set_capacity_listener(&self, f: CapacityListener) {
        self.capacity.set_listener(f);
    }

    /// Log bytes in use (segments, including unused segment tails).
    pub fn log_used_bytes(&self) -> u64 {
        self.capacity.consumed_bytes()
    }

    pub fn log_quota_bytes(&self) -> u64 {
        self.capacity.quota_bytes()
    }

    /// The newest record written (complete, durable or not): it moves with
    /// every write, so the compactor can tell a busy image from a quiet one.
    pub fn completed_seq(&self) -> u64 {
        self.durability.max_completed()
    }

    /// The seq below which (inclusive) every record is durable. The manifest
    /// may cover at most this much of the log.
    pub fn durable_seq(&self) -> u64 {
        self.durability.durable_seq()
    }

    /// True for a snapshot: it refuses every change.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    fn check_writable(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::ReadOnly(format!("image {} is a snapshot", self.name)));
        }
        Ok(())
    }

    fn reserve_blocking(&self, kind: RecordKind, len: u64) -> Result<LogReservation> {
        self.check_writable()?;
        let needed = self.log_bytes_needed(kind, len);
        if needed > self.capacity.quota_bytes() {
            return Err(Error::InvalidArgument(format!(
                "a request of {len} bytes needs up to {needed} log bytes, more than image {}'s whole log quota of {}",
                self.name,
                self.capacity.quota_bytes()
            )));
        }
        self.wait_for_space(kind, needed)?;
        self.capacity.reserve_blocking(
            needed,
            || self.durability.check(),
            || bump(&self.counters.capacity_waits, 1),
        )
    }

    /// Writes `data` at `offset`, waiting for log capacity if needed (never
    /// failing for lack of it). With `fua`, durable when it returns.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.write_in(IoCx::default(), offset, data, fua)
    }

    /// [`Image::write`] in the context `cx`.
    pub fn write_in(&self, cx: IoCx<'_>, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.check_range(offset, data.len() as u64)?;
        if data.len() as u64 > MAX_WRITE_BYTES {
            return Err(Error::InvalidArgument(format!(
                "write of {} bytes (max {MAX_WRITE_BYTES})",
                data.len()
            )));
        }
        let r = self.reserve_blocking(RecordKind::Write, data.len() as u64)?;
        self.write_reserved(cx, r, offset, data, fua)
    }

    /// Makes `[offset, offset + len)` read as zeros, waiting for capacity.
    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        self.check_range(offset, len)?;
        let r = self.reserve_blocking(RecordKind::WriteZeroes, len)?;
        self.range_reserved(IoCx::default(), r, RecordKind::WriteZeroes, offset, len, fua)
    }

    /// Deallocates `[offset, offset + len)`; it reads as zeros afterwards.
    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.check_range(offset, len)?;
        let r = self.reserve_blocking(RecordKind::Discard, len)?;
        self.range_reserved(IoCx::default(), r, RecordKind::Discard, offset, len, false)
    }

    fn check_reservation(&self, r: &LogReservation, kind: RecordKind, len: u64) -> Result<()> {
        self.check_writable()?;
        self.durability.check()?;
        if let Some(why) = r.refusal() {
            if r.is_no_space() {
                return Err(Error::NoSpace(format!("image {}: {why}", self.name)));
            }
            return Err(Error::Unavailable(self.name.clone(), why.to_string()));
        }
        if !r.belongs_to(&self.capacity) {
            return Err(Error::InvalidArgument(format!(
                "log reservation of another image used on {}",
                self.name
            )));
        }
        let needed = self.log_bytes_needed(kind, len);
        if r.bytes() < needed {
            return Err(Error::InvalidArgument(format!(
                "reservation of {} log bytes for a {kind:?} of {len} bytes that needs {needed}",
                r.bytes()
            )));
        }
        Ok(())
    }

    /// Writes with capacity reserved beforehand (see `log_bytes_needed`).
    pub fn write_reserved(
        &self,
        cx: IoCx<'_>,
        mut r: LogReservation,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<()> {
        self.check_range(offset, data.len() as u64)?;
        self.check_reservation(&r, RecordKind::Write, data.len() as u64)?;
        bump(&self.counters.writes, 1);
        let mut done = 0usize;
        let mut last_seq = 0;
        while done < data.len() {
            let slot = self.assign(RecordKind::Write, (data.len() - done) as u64)?;
            r.consume(slot.consumed_bytes);
            let piece = &data[done..done + slot.payload_bytes as usize];
            let at = offset + done as u64;
            let header = RecordHeader::write(slot.seq, self.durability.durable_seq(), at, piece.len());
            self.append(cx, &slot, &header, piece)?;
            bump(&self.counters.write_records, 1);
            bump(&self.counters.payload_bytes_written, piece.len() as u64);
            let src = Source::Log { segment: slot.segment.clone(), position_bytes: slot.payload_position() };
            write_lock(&self.overlay).insert(sectors(at), sectors(piece.len() as u64), slot.seq, src);
            last_seq = slot.seq;
            done += piece.len();
        }
        drop(r);
        self.wait_visible(last_seq)?;
        if fua {
            bump(&self.counters.fua_writes, 1);
            self.make_durable(cx, last_seq)?;
        }
        Ok(())
    }

    /// WRITE_ZEROES with capacity reserved beforehand.
    pub fn write_zeroes_reserved(
        &self,
        cx: IoCx<'_>,
        r: LogReservation,
        offset: u64,
        len: u64,
        fua: bool,
    ) -> Result<()> {
        self.check_range(offset, len)?;
        self.range_reserved(cx, r, RecordKind::WriteZeroes, offset, len, fua)
    }

    /// DISCARD with capacity reserved beforehand.
    pub fn discard_reserved(&self, cx: IoCx<'_>, r: LogReservation, offset: u64, len: u64) -> Result<()> {
        self.check_range(offset, len)?;
        self.range_reserved(cx, r, RecordKind::Discard, offset, len, false)
    }

    fn range_reserved(
        &self,
        cx: IoCx<'_>,
        mut r: LogReservation,
        kind: RecordKind,
        offset: u64,
        len: u64,
        fua: bool,
    ) -> Result<()> {
        self.check_reservation(&r, kind, len)?;
        let slot = self.assign(kind, 0)?;
        r.consume(slot.consumed_bytes);
        drop(r);
        let header = RecordHeader::range(kind, slot.seq, self.durability.durable_seq(), offset, len);
        self.append(cx, &slot, &header, &[])?;
        let counter = if kind == RecordKind::Discard {
            &self.counters.discard_records
        } else {
            &self.counters.zero_records
        };
        bump(counter, 1);
        write_lock(&self.overlay).insert(sectors(offset), sectors(len), slot.seq, Source::Zero);
        self.wait_visible(slot.seq)?;
        if fua {
            bump(&self.counters.fua_writes, 1);
            self.make_durable(cx, slot.seq)?;
        }
        Ok(())
    }

    /// Returns once every record through `last_seq` is complete, so that a
    /// write is acknowledged only after every earlier record: the records a
    /// caller has seen completed are then always a prefix of the log. Log
    /// recovery keeps the prefix of whole records, so after the daemon dies
    /// (kill -9, then `casblk recover`) no acknowledged write is behind a
    /// hole left by one that was in flight; those in flight are reissued.
    /// Bounded by the writes in flight, none of which waits for capacity.
    fn wait_visible(&self, last_seq: u64) -> Result<()> {
        if self.durability.wait_complete(last_seq) {
            Ok(())
        } else {
            self.durability.check()
        }
    }

    /// Places one record; a segment closed by the roll goes to writeback.
    fn assign(&self, kind: RecordKind, payload_bytes: u64) -> Result<Slot> {
        let slot =
            self.log.assign(kind, payload_bytes).inspect_err(|_| bump(&self.counters.write_errors, 1))?;
        if let Some((segment, last_seq)) = &slot.closed {
            self.writeback.closed(segment.clone(), *last_seq);
        }
        Ok(slot)
    }

    /// Writes one record into its slot and marks it complete. If the write
    /// fails the slot is voided with PAD (the log stays whole and the image
    /// usable); if even that fails, the image fails.
    fn append(&self, cx: IoCx<'_>, slot: &Slot, header: &RecordHeader, payload: &[u8]) -> Result<()> {
        bump(&self.counters.log_bytes_written, u64::from(slot.record_bytes()));
        match cx.io(IoSource::Log, || self.log.write_record(slot, header, payload)) {
            Ok(()) => {
                self.durability.complete(slot.seq);
                Ok(())
            }
            Err(e) => {
                bump(&self.counters.write_errors, 1);
                match self.log.void(slot, self.durability.durable_seq()) {
                    Ok(()) => {
                        bump(&self.counters.pad_records, 1);
                        self.durability.complete(slot.seq);
                    }
                    Err(e2) => self.durability.fail(format!(
                        "writing log record seq {} failed ({e}) and voiding its slot failed too ({e2})",
                        slot.seq
                    )),
                }
                Err(e)
            }
        }
    }

    /// Makes the log durable through `target`: a sync, or the wait for
    /// another thread's (group commit). Either is log I/O of the request.
    fn make_durable(&self, cx: IoCx<'_>, target: u64) -> Result<()> {
        let work =
            cx.io(IoSource::Log, || self.durability.make_durable(target, &|upto| self.log.group_sync(upto)))?;
        bump(&self.counters.sync_rounds, work.rounds);
        bump(&self.counters.syncs, work.files);
        Ok(())
    }

    /// Makes every write visible before this call durable. Concurrent
    /// flushes share syncs (group commit).
    pub fn flush(&self) -> Result<()> {
        self.flush_in(IoCx::default())
    }

    /// [`Image::flush`] in the context `cx`.
    pub fn flush_in(&self, cx: IoCx<'_>) -> Result<()> {
        bump(&self.counters.flushes, 1);
        self.durability.check()?;
        self.make_durable(cx, self.durability.max_completed())
    }
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Image").field("name", &self.name).field("size_bytes", &self.size_bytes()).finish()
    }
}
