//! Phase 1 of a batch: read the next durable records from the log, check
//! them, and index what they do per sector.
//!
//! ```text
//!  cursor (segment, position, seq, skip)       validated: the record found
//!        |                                     there must carry `seq`
//!        v
//!  segment k: [hdr][rec seq][rec seq+1]...     read in chunks of up to
//!  segment k+1: [hdr][rec]...                  READ_CHUNK_BYTES, appended
//!        |                                     to the batch buffer
//!        v
//!  batch buffer: | region of k | region of k+1 |       (records verbatim)
//!  batch map (Overlay<BatchSrc>): sector -> Mem(offset in buffer) | Zero
//! ```
//!
//! Each record is decoded whole (checksum over header and payload) before
//! it is used: durable records that do not decode are corruption, never
//! skipped. Records are applied in seq order, so the map holds, per
//! sector, the newest bytes as of the batch's last record.
//!
//! A batch ends at the durable seq, when its records reach the batch byte
//! target, when the blocks they touch reach the block cap, or when the
//! memory budget refuses more buffer (back-pressure: a smaller batch). A
//! WRITE_ZEROES / DISCARD record alone over more blocks than the cap is
//! split: the batch applies its first part and covers only the records
//! before it (`covered = seq - 1`); the cursor's `skip_sectors` says where
//! the next batch resumes. Re-applying a record part already in the
//! manifest is harmless (it writes the same zeros), which is what replay
//! after a crash then does.

use super::budget::{GrowBuf, Lease};
use crate::error::{Error, Result};
use crate::image::overlay::{Advance, Overlay};
use crate::units::{SECTORS_PER_BLOCK, SECTOR_BYTES};
use crate::wal::record::decode;
use crate::wal::{Log, RecordKind, SegmentInfo, RECORD_HEADER_BYTES, SEGMENT_HEADER_BYTES};
use std::time::Instant;

/// Bytes read from a segment per call (more when one record is larger).
pub const READ_CHUNK_BYTES: u64 = 1 << 20;

/// Budget charge per record for its batch-map extents (at most three
/// extents per record, about 96 bytes each with the B-tree's overhead).
const MAP_BYTES_PER_RECORD: u64 = 3 * 96;

/// Where the compactor resumes: the record `seq` at file offset `position`
/// of segment `segment`, of whose range the first `skip_sectors` are
/// already in the manifest (a range record split across batches).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    pub segment: u64,
    pub position: u64,
    pub seq: u64,
    pub skip_sectors: u64,
}

/// Where the newest bytes of a sector of the batch are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BatchSrc {
    /// WRITE_ZEROES / DISCARD: zeros.
    Zero,
    /// At this offset of the batch buffer.
    Mem(u64),
}

impl Advance for BatchSrc {
    fn advanced(&self, sectors: u64) -> BatchSrc {
        match self {
            BatchSrc::Zero => BatchSrc::Zero,
            BatchSrc::Mem(at) => BatchSrc::Mem(at + sectors * SECTOR_BYTES),
        }
    }
}

/// One batch: the records read, and what they map.
pub struct Batch<'b> {
    pub buf: GrowBuf,
    pub lease: Lease<'b>,
    pub map: Overlay<BatchSrc>,
    map_bytes: u64,
    /// Every record through this seq is wholly applied.
    pub covered: u64,
    pub next: Cursor,
    pub records: u64,
    pub record_bytes: u64,
    pub blocks: u64,
    pub input_bytes: u64,
    pub zeroed_bytes: u64,
    pub reads: u64,
    pub read_bytes: u64,
    pub initialized: u64,
    pub read_ns: u64,
    /// Ended early because the memory budget refused more buffer.
    pub budget_cut: bool,
    /// The last record applied ended on a block boundary (or wrote none).
    last_end_aligned: bool,
}

impl<'b> Batch<'b> {
    pub fn new(lease: Lease<'b>) -> Batch<'b> {
        let zero = Cursor { segment: 0, position: 0, seq: 0, skip_sectors: 0 };
        Batch {
            buf: GrowBuf::new(),
            lease,
            map: Overlay::new(),
            map_bytes: 0,
            covered: 0,
            next: zero,
            records: 0,
            record_bytes: 0,
            blocks: 0,
            input_bytes: 0,
            zeroed_bytes: 0,
            reads: 0,
            read_bytes: 0,
            initialized: 0,
            read_ns: 0,
            budget_cut: false,
            last_end_aligned: true,
        }
    }

    /// Empties the batch for reuse (buffer memory is kept).
    fn reset(&mut self) {
        self.buf.clear();
        self.map.clear();
        self.lease.shrink(self.map_bytes);
        self.map_bytes = 0;
        self.records = 0;
        self.record_bytes = 0;
        self.blocks = 0;
        self.input_bytes = 0;
        self.zeroed_bytes = 0;
        self.reads = 0;
        self.read_bytes = 0;
        self.initialized = 0;
        self.read_ns = 0;
        self.budget_cut = false;
        self.last_end_aligned = true;
    }
}

/// What bounds a batch.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Records above this seq are not durable: never read.
    pub durable_seq: u64,
    /// Stop adding records once they add up to this many bytes.
    pub batch_bytes: u64,
    /// Stop adding records once they touch this many blocks.
    pub batch_blocks: u64,
    pub image_sectors: u64,
}

/// Why `read_batch` could not use its cursor.
#[derive(Debug)]
pub enum Outcome {
    Read,
    /// The cursor does not name a record with its seq: scan instead.
    CursorInvalid(String),
}

/// The part of one segment copied into the batch buffer.
struct Region {
    seg: SegmentInfo,
    file_start: u64,
    file_end: u64,
    buf_start: usize,
}

fn corrupt(seg: &SegmentInfo, offset: u64, detail: String) -> Error {
    Error::Corruption { path: seg.segment.path().to_path_buf(), offset, detail }
}

/// Blocks that sectors `[start, end)` touch.
fn blocks_of(start: u64, end: u64) -> u64 {
    end.div_ceil(SECTORS_PER_BLOCK) - start / SECTORS_PER_BLOCK
}

impl Batch<'_> {
    /// Makes file bytes `[pos, pos + n)` of the region's segment present in
    /// the buffer, reading ahead up to `READ_CHUNK_BYTES`.
    fn ensure(&mut self, r: &mut Region, pos: u64, n: u64) -> Result<()> {
        assert!(pos >= r.file_start, "records are read in order");
        if pos + n <= r.file_end {
            return Ok(());
        }
        let seg_bytes = r.seg.segment.header.segment_bytes;
        let want_end = (pos + n).max((r.file_end + READ_CHUNK_BYTES).min(seg_bytes));
        let len = (want_end - r.file_end) as usize;
        let space = self.buf.spare(len, &mut self.lease, &mut self.initialized)?;
        let got = r.seg.segment.file.read_at(space, r.file_end)?;
        self.reads += 1;
        self.read_bytes += got as u64;
        self.buf.advance(got);
        r.file_end += got as u64;
        if pos + n > r.file_end {
            return Err(corrupt(
                &r.seg,
                r.file_end,
                format!("the segment ends inside a durable record at offset {pos} ({n} bytes)"),
            ));
        }
        Ok(())
    }
}

/// The cursor of the first record above `covered`, found by walking the
/// log's segments (the safe fallback when the cursor does not validate;
/// `read_batch` then skips the records at or below `covered`).
pub fn fallback_cursor(log: &Log, covered: u64) -> Result<Cursor> {
    let mut seg = log.first_segment();
    loop {
        let h = seg.segment.header;
        if h.first_seq > covered + 1 {
            return Err(corrupt(
                &seg,
                0,
                format!("the log starts at seq {} but the manifest covers only seq {covered}", h.first_seq),
            ));
        }
        if seg.last_seq.is_none_or(|last| last > covered) {
            let position = SEGMENT_HEADER_BYTES as u64;
            return Ok(Cursor { segment: h.index, position, seq: h.first_seq, skip_sectors: 0 });
        }
        seg = log
            .segment_at(h.index + 1)
            .ok_or_else(|| corrupt(&seg, 0, format!("closed segment {} has no successor", h.index)))?;
    }
}

/// Reads the batch starting at `start` into `batch` (reset first): every
/// record from `start.seq` on is decoded, and those from `apply_from` on
/// are applied to the map (the fallback scan skips the covered ones).
pub fn read_batch(
    log: &Log,
    start: Cursor,
    apply_from: u64,
    lim: &Limits,
    batch: &mut Batch<'_>,
) -> Result<Outcome> {
    let t = Instant::now();
    batch.reset();
    let r = read_records(log, start, apply_from, lim, batch);
    batch.read_ns = t.elapsed().as_nanos() as u64;
    r
}

fn read_records(
    log: &Log,
    start: Cursor,
    apply_from: u64,
    lim: &Limits,
    batch: &mut Batch<'_>,
) -> Result<Outcome> {
    let Some(seg) = log.segment_at(start.segment) else {
        return Ok(Outcome::CursorInvalid(format!("segment {} is no longer in the log", start.segment)));
    };
    let (mut seq, mut pos, mut skip) = (start.seq, start.position, start.skip_sectors);
    let mut region = Region { seg, file_start: pos, file_end: pos, buf_start: batch.buf.len() };
    let mut first = true;
    batch.covered = seq - 1;
    loop {
        let here = Cursor { segment: region.seg.segment.index(), position: pos, seq, skip_sectors: skip };
        batch.next = here;
        if seq > lim.durable_seq {
            return Ok(Outcome::Read);
        }
        if region.seg.last_seq.is_some_and(|last| seq > last) {
            let index = region.seg.segment.index() + 1;
            let next = log.segment_at(index).ok_or_else(|| {
                corrupt(&region.seg, pos, format!("closed segment {} has no successor", index - 1))
            })?;
            if next.segment.header.first_seq != seq {
                if first {
                    return Ok(Outcome::CursorInvalid(format!(
                        "segment {index} starts at seq {}, not {seq}",
                        next.segment.header.first_seq
                    )));
                }
                let detail = format!(
                    "segment starts at seq {} where seq {seq} was due",
                    next.segment.header.first_seq
                );
                return Err(corrupt(&next, 0, detail));
            }
            pos = SEGMENT_HEADER_BYTES as u64;
            region = Region { seg: next, file_start: pos, file_end: pos, buf_start: batch.buf.len() };
            continue;
        }
        // End at the byte target, but not between two records that split
        // one block (a WRITE cut at a segment end): that block would be
        // merged and stored twice. Past twice the target, end anyway.
        if batch.records > 0
            && batch.record_bytes >= lim.batch_bytes
            && (batch.last_end_aligned || batch.record_bytes >= 2 * lim.batch_bytes)
        {
            return Ok(Outcome::Read);
        }
        // The header first, then the whole record it announces.
        let room = |b: &mut Batch<'_>, r: &mut Region, n: u64| -> Result<bool> {
            match b.ensure(r, pos, n) {
                Ok(()) => Ok(true),
                Err(Error::MemoryBudget(_)) if b.records > 0 => {
                    b.budget_cut = true;
                    Ok(false)
                }
                Err(e) => Err(e),
            }
        };
        if !room(batch, &mut region, RECORD_HEADER_BYTES as u64)? {
            return Ok(Outcome::Read);
        }
        let at = region.buf_start + (pos - region.file_start) as usize;
        let (record_bytes, is_pad) = peek(&batch.buf.as_slice()[at..at + RECORD_HEADER_BYTES]);
        let need =
            if is_pad { RECORD_HEADER_BYTES as u64 } else { record_bytes.max(RECORD_HEADER_BYTES as u64) };
        if need > region.seg.segment.header.segment_bytes - pos {
            let why = format!("record at offset {pos} claims {record_bytes} bytes");
            return bad_record(first, &region, pos, seq, why);
        }
        if !room(batch, &mut region, need)? {
            return Ok(Outcome::Read);
        }
        let avail = (region.file_end - pos) as usize;
        let h = match decode(&batch.buf.as_slice()[at..at + avail]) {
            Ok((h, _)) if h.seq == seq => h,
            Ok((h, _)) => return bad_record(first, &region, pos, seq, format!("record seq {} found", h.seq)),
            Err(e) => return bad_record(first, &region, pos, seq, format!("{e:?}")),
        };
        first = false;
        if seq >= apply_from && h.kind != RecordKind::Pad {
            let (s0, n) = (h.offset_bytes / SECTOR_BYTES, h.len_bytes / SECTOR_BYTES);
            if s0 + n > lim.image_sectors {
                let detail = format!("record seq {seq} reaches past the image's end");
                return Err(corrupt(&region.seg, pos, detail));
            }
            let start_sector = s0 + skip;
            let mut end_sector = s0 + n;
            if batch.blocks + blocks_of(start_sector, end_sector) > lim.batch_blocks {
                if batch.blocks > 0 {
                    return Ok(Outcome::Read); // the next batch starts with this record
                }
                // One record over more blocks than a batch may hold (a huge
                // DISCARD): apply its first part only (see the module docs).
                end_sector =
                    end_sector.min((start_sector / SECTORS_PER_BLOCK + lim.batch_blocks) * SECTORS_PER_BLOCK);
            }
            if let Err(e) = batch.lease.grow(MAP_BYTES_PER_RECORD) {
                if batch.records > 0 {
                    batch.budget_cut = true;
                    return Ok(Outcome::Read);
                }
                return Err(e);
            }
            batch.map_bytes += MAP_BYTES_PER_RECORD;
            let bytes = (end_sector - start_sector) * SECTOR_BYTES;
            let src = match h.kind {
                RecordKind::Write => {
                    batch.input_bytes += bytes;
                    BatchSrc::Mem((at + RECORD_HEADER_BYTES) as u64).advanced(skip)
                }
                _ => {
                    batch.zeroed_bytes += bytes;
                    BatchSrc::Zero
                }
            };
            batch.map.insert(start_sector, end_sector - start_sector, seq, src);
            batch.blocks += blocks_of(start_sector, end_sector);
            batch.last_end_aligned = end_sector.is_multiple_of(SECTORS_PER_BLOCK);
            if end_sector < s0 + n {
                batch.records += 1;
                batch.next.skip_sectors = end_sector - s0;
                return Ok(Outcome::Read);
            }
        }
        skip = 0;
        batch.records += 1;
        batch.record_bytes += record_bytes;
        batch.covered = seq;
        pos += record_bytes;
        seq += 1;
    }
}

/// Record length and whether it is a PAD, from a record header's fixed
/// fields (checked later by `decode`).
fn peek(head: &[u8]) -> (u64, bool) {
    let (record_bytes, kind) = crate::wal::record::peek_header(head);
    (u64::from(record_bytes), kind == Some(RecordKind::Pad))
}

/// A record that does not decode where seq `seq` was due: at the cursor's
/// own position that only means the cursor is stale (`Ok`: scan instead);
/// anywhere after it, a durable record is damaged (`Err`).
fn bad_record(first: bool, r: &Region, pos: u64, seq: u64, why: String) -> Result<Outcome> {
    if first {
        return Ok(Outcome::CursorInvalid(format!("no record seq {seq} at offset {pos}: {why}")));
    }
    Err(corrupt(&r.seg, pos, format!("durable record seq {seq} does not decode: {why}")))
}
