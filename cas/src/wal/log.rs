//! The appending side of one image's log: seq numbers, record positions,
//! segment rolls, the set of segments a sync must cover, and reclamation.
//!
//! Appending is split so that no I/O on record bytes happens under the
//! log's lock: [`Log::assign`] hands out a seq and a slot (rolling to a new
//! segment if the record does not fit, which does I/O but is rare), then
//! the caller writes the record into its slot with [`Log::write_record`],
//! concurrently with other writers. A slot whose write fails is voided
//! with a PAD record so that the seq sequence keeps no hole.

use super::record::{RecordHeader, RecordKind, RECORD_HEADER_BYTES};
use super::recovery::{recover_log, Recovered, RecoveryReport};
use super::segment::{Segment, SegmentHeader, SEGMENT_HEADER_BYTES};
use crate::error::Result;
use crate::storage::Storage;
use crate::units::SECTOR_BYTES;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often `reclaim_through` re-checks a pinned segment.
const PIN_POLL: Duration = Duration::from_millis(1);

/// The smallest WRITE record worth placing: header plus one sector.
const MIN_WRITE_RECORD_BYTES: u64 = RECORD_HEADER_BYTES as u64 + SECTOR_BYTES;

/// A place in the log for one record.
#[derive(Clone, Debug)]
pub struct Slot {
    pub seq: u64,
    pub segment: Arc<Segment>,
    /// File offset of the record header in the segment.
    pub position: u64,
    /// Payload bytes granted (WRITE: at most what was asked for; else 0).
    pub payload_bytes: u64,
    /// Log bytes this slot consumed: the record, plus the unused tail of
    /// the previous segment if placing it rolled to a new one.
    pub consumed_bytes: u64,
    /// The segment this assignment closed by rolling, with its last seq.
    pub closed: Option<(Arc<Segment>, u64)>,
}

impl Slot {
    pub fn record_bytes(&self) -> u32 {
        u32::try_from(RECORD_HEADER_BYTES as u64 + self.payload_bytes).expect("record fits a segment")
    }

    /// File offset of the first payload byte.
    pub fn payload_position(&self) -> u64 {
        self.position + RECORD_HEADER_BYTES as u64
    }
}

struct SegState {
    segment: Arc<Segment>,
    /// Seq of the last record placed here, once the segment is closed.
    last_seq: Option<u64>,
    /// True once a sync covered every record of this closed segment.
    synced: bool,
}

struct LogState {
    /// Oldest first; the last one is the segment being appended to.
    segments: VecDeque<SegState>,
    write_pos: u64,
    next_seq: u64,
    /// Segments created so far, and how many of those creations a directory
    /// sync has made durable.
    dir_created: u64,
    dir_synced: u64,
    /// Covered segments taken out of `segments` whose files are not deleted
    /// yet because something still pinned them (see `reclaim_through`).
    retired: Vec<Arc<Segment>>,
}

/// One segment as the compactor sees it.
#[derive(Clone, Debug)]
pub struct SegmentInfo {
    pub segment: Arc<Segment>,
    /// The seq of its last record, once the segment is closed.
    pub last_seq: Option<u64>,
}

/// What one `reclaim_through` did.
#[derive(Debug, Default)]
pub struct ReclaimOutcome {
    /// Bytes of the segment files deleted (return them to the quota).
    pub freed_bytes: u64,
    pub deleted: u64,
    /// Covered segments still pinned, left for a later call.
    pub deferred: u64,
    /// The first deletion or directory sync that failed; the segments not
    /// deleted stay retired for a later call.
    pub error: Option<crate::error::Error>,
}

/// What one group-commit round must sync (from `Log::sync_targets`).
struct SyncTargets {
    pub segments: Vec<Arc<Segment>>,
    /// `Some(n)`: sync the directory too, covering the first `n` creations.
    pub dir: Option<u64>,
}

/// One image's write-ahead log. Shared by all of the image's threads.
pub struct Log {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    log_id: u64,
    /// Size of segments created from now on.
    segment_bytes: u64,
    state: Mutex<LogState>,
    /// Bytes left in the current segment, kept outside `state` so that
    /// the scheduler's reservations never wait for a roll's file I/O.
    tail_room_bytes: AtomicU64,
}

use crate::sync::lock;

impl Log {
    /// Creates an empty log (its first segment) in `dir`, which must exist.
    pub fn create(storage: &dyn Storage, dir: &Path, segment_bytes: u64, log_id: u64) -> Result<()> {
        // Not allocated here: a snapshot's log is never written; a writable
        // image allocates its tail at open.
        let header = SegmentHeader { index: 1, segment_bytes, first_seq: 1, log_id };
        Segment::create(storage, dir, header, true, false)?;
        Ok(())
    }

    /// Opens the log in `dir`, replaying records above `replay_after_seq`
    /// through `apply` (see `recovery`). Everything recovered is synced
    /// before this returns, so later records may rely on it being durable.
    pub fn open(
        storage: Arc<dyn Storage>,
        dir: &Path,
        segment_bytes: u64,
        log_id: u64,
        replay_after_seq: u64,
        allocate_tail: bool,
        apply: &mut dyn FnMut(&Arc<Segment>, u64, &RecordHeader),
    ) -> Result<(Log, RecoveryReport)> {
        let Recovered { segments, tail, next_seq, next_index, report } =
            recover_log(&*storage, dir, log_id, replay_after_seq, apply)?;
        let mut segs: VecDeque<SegState> = VecDeque::new();
        for (i, segment) in segments.iter().enumerate() {
            // Records recovered from a process crash may sit only in the
            // page cache; make them durable before anything builds on them.
            segment.file.sync_data()?;
            let last_seq = segments.get(i + 1).map(|next| next.header.first_seq - 1);
            segs.push_back(SegState { segment: segment.clone(), last_seq, synced: true });
        }
        // A kept segment's directory entry may not be durable yet (its
        // creation's directory sync failed, and a later open adopted it).
        storage.sync_dir(dir)?;
        let mut write_pos = tail;
        if segs.is_empty() {
            let header = SegmentHeader { index: next_index, segment_bytes, first_seq: next_seq, log_id };
            let segment = Segment::create(&*storage, dir, header, true, false)?;
            segs.push_back(SegState { segment: Arc::new(segment), last_seq: None, synced: true });
            write_pos = SEGMENT_HEADER_BYTES as u64;
        }
        if let Some(tail) = segs.back().filter(|_| allocate_tail) {
            // A log's first segment, and a tail whose torn records were
            // truncated, hold no blocks past the last record: allocate
            // them, or, on a full filesystem, leave the tail so that the
            // first record rolls (a roll can fail cleanly, a record write
            // cannot).
            let seg_bytes = tail.segment.header.segment_bytes;
            let rest = seg_bytes.saturating_sub(write_pos);
            if let Err(e) = if rest > 0 { tail.segment.file.allocate(write_pos, rest) } else { Ok(()) } {
                tracing::warn!(dir = %dir.display(), "cannot allocate the log's tail ({e}); the next record starts a new segment");
                write_pos = seg_bytes;
            }
        }
        let log = Log {
            storage,
            dir: dir.to_path_buf(),
            log_id,
            segment_bytes,
            tail_room_bytes: AtomicU64::new(0),
            state: Mutex::new(LogState {
                segments: segs,
                write_pos,
                next_seq,
                dir_created: 0,
                dir_synced: 0,
                retired: Vec::new(),
            }),
        };
        log.note_tail(&lock(&log.state));
        Ok((log, report))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Size of new segments.
    pub fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    /// The seq the next record will get.
    pub fn next_seq(&self) -> u64 {
        lock(&self.state).next_seq
    }

    /// Log bytes in use: closed segments whole, the current one up to its
    /// write position.
    pub fn used_bytes(&self) -> u64 {
        let st = lock(&self.state);
        let closed: u64 = st.segments.iter().rev().skip(1).map(|s| s.segment.header.segment_bytes).sum();
        closed + st.write_pos
    }

    /// Bytes left in the current segment: what records may take before
    /// the next roll needs new space.
    pub fn tail_room_bytes(&self) -> u64 {
        self.tail_room_bytes.load(Ordering::Relaxed)
    }

    /// Publishes the current segment's room after `st` changed.
    fn note_tail(&self, st: &LogState) {
        let seg = st.segments.back().expect("a log always has a segment");
        let room = seg.segment.header.segment_bytes.saturating_sub(st.write_pos);
        self.tail_room_bytes.store(room, Ordering::Relaxed);
    }

    /// Segment files: in the log, plus retired ones not deleted yet.
    pub fn segment_count(&self) -> usize {
        let st = lock(&self.state);
        st.segments.len() + st.retired.len()
    }

    /// Covered segments waiting for their pins to drop before deletion.
    pub fn retired_count(&self) -> usize {
        lock(&self.state).retired.len()
    }

    /// Segment `index` if it is still in the log.
    pub fn segment_at(&self, index: u64) -> Option<SegmentInfo> {
        let st = lock(&self.state);
        let first = st.segments.front().expect("a log always has a segment").segment.index();
        let s = st.segments.get(usize::try_from(index.checked_sub(first)?).ok()?)?;
        Some(SegmentInfo { segment: s.segment.clone(), last_seq: s.last_seq })
    }

    /// The oldest segment still in the log.
    pub fn first_segment(&self) -> SegmentInfo {
        let st = lock(&self.state);
        let s = st.segments.front().expect("a log always has a segment");
        SegmentInfo { segment: s.segment.clone(), last_seq: s.last_seq }
    }

    /// Where the next record goes: (segment index, file offset, seq).
    pub fn end_position(&self) -> (u64, u64, u64) {
        let st = lock(&self.state);
        let index = st.segments.back().expect("a log always has a segment").segment.index();
        (index, st.write_pos, st.next_seq)
    }

    /// Assigns the next seq and a slot for one record. A WRITE asks for
    /// `payload_bytes` (> 0, a multiple of 512) and may be granted less (at
    /// least 512) when the segment is nearly full; the caller places the
    /// rest in further records. Range records ask for 0. Rolls to a new
    /// segment when the record does not fit; a failed roll consumes no seq.
    pub fn assign(&self, kind: RecordKind, payload_bytes: u64) -> Result<Slot> {
        assert!(kind != RecordKind::Pad, "PAD records are only written by void()");
        assert_eq!(kind == RecordKind::Write, payload_bytes > 0, "only WRITE records carry payload");
        assert_eq!(payload_bytes % SECTOR_BYTES, 0, "payload is whole sectors");
        let mut st = lock(&self.state);
        let mut consumed = 0;
        let mut closed = None;
        let min = if payload_bytes > 0 { MIN_WRITE_RECORD_BYTES } else { RECORD_HEADER_BYTES as u64 };
        let current = st.segments.back().expect("a log always has a segment").segment.clone();
        let current_bytes = current.header.segment_bytes;
        if current_bytes - st.write_pos < min {
            // The unused tail of the closed segment and the new segment's
            // header: both count against the quota until reclaimed.
            consumed += current_bytes - st.write_pos + SEGMENT_HEADER_BYTES as u64;
            self.roll(&mut st)?;
            closed = Some((current, st.next_seq - 1));
        }
        let seg = st.segments.back().expect("a log always has a segment");
        let room = seg.segment.header.segment_bytes - st.write_pos - RECORD_HEADER_BYTES as u64;
        let granted = payload_bytes.min(room / SECTOR_BYTES * SECTOR_BYTES);
        let slot = Slot {
            seq: st.next_seq,
            segment: seg.segment.clone(),
            position: st.write_pos,
            payload_bytes: granted,
            consumed_bytes: consumed + RECORD_HEADER_BYTES as u64 + granted,
            closed,
        };
        st.next_seq += 1;
        st.write_pos += RECORD_HEADER_BYTES as u64 + granted;
        self.note_tail(&st);
        Ok(slot)
    }

    /// Closes the current segment and creates the next one, durably.
    fn roll(&self, st: &mut LogState) -> Result<()> {
        let cur = st.segments.back().expect("a log always has a segment");
        let header = SegmentHeader {
            index: cur.segment.index() + 1,
            segment_bytes: self.segment_bytes,
            first_seq: st.next_seq,
            log_id: self.log_id,
        };
        let segment = Segment::create(&*self.storage, &self.dir, header, false, true)?;
        let last = st.segments.back_mut().expect("a log always has a segment");
        last.last_seq = Some(st.next_seq - 1);
        last.synced = false;
        st.segments.push_back(SegState { segment: Arc::new(segment), last_seq: None, synced: false });
        st.write_pos = SEGMENT_HEADER_BYTES as u64;
        st.dir_created += 1;
        self.note_tail(st);
        Ok(())
    }

    /// Writes a record into its slot: the header and the payload after it
    /// (`Slot::payload_position`), in one write (one system call on a
    /// local filesystem). The header's checksum covers both, so a record
    /// torn by a crash at any point (a header without its payload, part of
    /// either) fails it and is a bad slot to recovery; it was not
    /// acknowledged, because a write completes only once its records and
    /// every earlier one are whole.
    pub fn write_record(&self, slot: &Slot, header: &RecordHeader, payload: &[u8]) -> Result<()> {
        assert_eq!(header.seq, slot.seq, "header must match its slot");
        assert_eq!(header.record_bytes, slot.record_bytes(), "header must match its slot");
        let encoded = header.encode(payload);
        debug_assert_eq!(slot.position + encoded.len() as u64, slot.payload_position());
        slot.segment.file.write_all_vectored_at(&[&encoded, payload], slot.position)
    }

    /// Voids a slot whose write failed with a PAD record, so the log keeps
    /// no hole in its seq sequence.
    pub fn void(&self, slot: &Slot, durable_seq: u64) -> Result<()> {
        let pad = RecordHeader::pad(slot.seq, durable_seq, slot.record_bytes());
        slot.segment.file.write_all_at(&pad.encode(&[]), slot.position)
    }

    /// What a sync must cover to make every completed record durable:
    /// closed segments not yet known synced, the current one, and the
    /// directory if segments were created since its last sync.
    fn sync_targets(&self) -> SyncTargets {
        let st = lock(&self.state);
        let n = st.segments.len();
        let segments = st
            .segments
            .iter()
            .enumerate()
            .filter(|(i, s)| *i + 1 == n || !s.synced)
            .map(|(_, s)| s.segment.clone())
            .collect();
        let dir = (st.dir_created > st.dir_synced).then_some(st.dir_created);
        SyncTargets { segments, dir }
    }

    /// One group-commit round: syncs every file that holds a record
    /// completed before the call (every record through `upto` had
    /// completed when it began) and returns the number of syncs issued.
    ///
    /// A closed segment may be synced by early writeback at the same time;
    /// both go through the segment's one handle, whose syncs share one
    /// outcome ([`SyncGuard`](crate::storage::SyncGuard)): if either sync
    /// failed, this round fails too, and with it every FLUSH waiting on it.
    pub fn group_sync(&self, upto: u64) -> Result<u64> {
        let targets = self.sync_targets();
        for seg in &targets.segments {
            seg.file.sync_data()?;
        }
        if targets.dir.is_some() {
            self.storage.sync_dir(&self.dir)?;
        }
        self.note_synced(&targets, upto);
        Ok(targets.segments.len() as u64 + u64::from(targets.dir.is_some()))
    }

    /// Records that a sync of `synced` (from `sync_targets`) finished after
    /// every record through `through_seq` had completed.
    fn note_synced(&self, synced: &SyncTargets, through_seq: u64) {
        let mut st = lock(&self.state);
        for s in st.segments.iter_mut() {
            if s.last_seq.is_some_and(|last| last <= through_seq)
                && synced.segments.iter().any(|x| Arc::ptr_eq(x, &s.segment))
            {
                s.synced = true;
            }
        }
        if let Some(n) = synced.dir {
            st.dir_synced = st.dir_synced.max(n);
        }
    }

    /// Syncs a closed segment ahead of group commit (early writeback); the
    /// caller waited until every record in it had completed. On success the
    /// segment counts as synced; a failure stays with the segment's handle,
    /// so a group commit that syncs it later fails as well.
    pub fn sync_closed(&self, segment: &Arc<Segment>) -> Result<()> {
        segment.file.sync_data()?;
        let mut st = lock(&self.state);
        if let Some(s) = st.segments.iter_mut().find(|s| Arc::ptr_eq(&s.segment, segment)) {
            assert!(s.last_seq.is_some(), "only closed segments are synced early");
            s.synced = true;
        }
        Ok(())
    }

    /// Deletes the closed segments whose every record has seq <=
    /// `covered_seq`, and any retired earlier, once nothing pins them. The
    /// caller guarantees their records are no longer needed (committed to
    /// the manifest and durable) and that no overlay extent points into them
    /// any more.
    ///
    /// Pins are the `Arc<Segment>` handles: a read in flight holds the
    /// segments of its pieces, the compactor the one it scans, writeback
    /// and group commit the ones they sync. A covered segment leaves the
    /// log at once (so nothing new pins it), then this waits up to
    /// `pin_wait` for the other handles to drop; a segment still pinned
    /// after that is retired and retried by the next call (its bytes stay
    /// counted against the quota until its file is gone).
    pub fn reclaim_through(&self, covered_seq: u64, pin_wait: Duration) -> ReclaimOutcome {
        let candidates: Vec<Arc<Segment>> = {
            let mut st = lock(&self.state);
            let mut out = std::mem::take(&mut st.retired);
            while st.segments.len() > 1 {
                let front = st.segments.front().expect("len > 1");
                let last = front.last_seq.expect("closed segments know their last seq");
                if last > covered_seq {
                    break;
                }
                out.push(st.segments.pop_front().expect("len > 1").segment);
            }
            out
        };
        let mut outcome = ReclaimOutcome::default();
        if candidates.is_empty() {
            return outcome;
        }
        let deadline = Instant::now() + pin_wait;
        let unpinned = |s: &Arc<Segment>| Arc::strong_count(s) == 1;
        while !candidates.iter().all(unpinned) && Instant::now() < deadline {
            std::thread::sleep(PIN_POLL);
        }
        let mut keep = Vec::new();
        for seg in candidates {
            if outcome.error.is_some() {
                keep.push(seg);
                continue;
            }
            if !unpinned(&seg) {
                outcome.deferred += 1;
                keep.push(seg);
                continue;
            }
            match self.storage.remove_file(seg.path()) {
                Ok(()) => {
                    outcome.freed_bytes += seg.header.segment_bytes;
                    outcome.deleted += 1;
                }
                Err(e) => {
                    outcome.error = Some(e);
                    keep.push(seg);
                }
            }
        }
        if outcome.deleted > 0 {
            if let Err(e) = self.storage.sync_dir(&self.dir) {
                outcome.error.get_or_insert(e);
            }
        }
        lock(&self.state).retired.extend(keep);
        outcome
    }

    /// Closes the current segment if it holds records and every record in
    /// the log is at or below `covered_seq` (so durable), making it
    /// reclaimable; returns the log bytes the roll consumed (its unused
    /// tail and the new segment's header). Used when writers wait for
    /// capacity that only this segment's deletion can give.
    pub fn roll_if_covered(&self, covered_seq: u64) -> Result<Option<u64>> {
        let mut st = lock(&self.state);
        if st.next_seq - 1 > covered_seq || st.write_pos == SEGMENT_HEADER_BYTES as u64 {
            return Ok(None);
        }
        let current = st.segments.back().expect("a log always has a segment").segment.header.segment_bytes;
        let consumed = current - st.write_pos + SEGMENT_HEADER_BYTES as u64;
        self.roll(&mut st)?;
        let n = st.segments.len();
        // Its records are covered, so durable: a sync covered all of them.
        st.segments[n - 2].synced = true;
        Ok(Some(consumed))
    }

    /// The log id every segment carries.
    pub fn log_id(&self) -> u64 {
        self.log_id
    }
}
