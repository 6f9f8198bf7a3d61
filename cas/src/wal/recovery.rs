//! Recovery: reads a log's segments in order, hands every valid record to
//! the caller, and decides where the log ends.
//!
//! Rules (docs/design.md, "WAL recovery"):
//! - With a checkpoint (the manifest's covered seq `C`), recovery starts at
//!   the newest segment whose header is valid and whose first seq is at or
//!   below `C + 1`: every older segment holds only covered records, so it
//!   is deleted unread (finishing a reclamation a crash interrupted, which
//!   may have removed any subset of them).
//! - From there on segments are numbered without gaps; a missing one is
//!   corruption.
//! - Records carry seq 1, 2, 3, ... with no gaps. At each record position
//!   the scan expects seq `e`. A position that does not hold a valid record
//!   with seq `e` is a *bad slot*:
//!   - if the next segment exists and starts at `e`, this segment simply
//!     ended there (the record did not fit and went to the next segment);
//!   - else, if any later valid record (in this segment or a later one)
//!     has `durable_seq >= e`, then seq `e` was durable before that record
//!     was written, so its damage is media corruption in the middle of the
//!     log: the image is refused with the segment and offset;
//!   - else the slot starts a torn tail (writes never synced): the segment
//!     is truncated at the slot, later segments are deleted, and the log
//!     continues from there.
//! - A record whose checksum holds but whose version is newer is refused
//!   (`UnsupportedVersion`); one whose fields contradict each other is
//!   refused as corruption.
//! - A segment header that does not decode is a bad slot at offset 0 of
//!   that segment (a segment rolled to is made durable only by the next
//!   sync, so its header may be torn): refused if proven durable, else the
//!   segment and all after it are deleted.
//!
//! - If the records kept end at or below `C` (the only records lost are
//!   covered ones, so nothing the manifest lacks is missing), the kept
//!   segments are deleted and the log restarts empty at seq `C + 1`.
//!
//! The pure scanning parts work on in-memory buffers so that the fuzz
//! target can drive them with arbitrary bytes.

use super::record::{decode, has_record_magic, DecodeError, RecordHeader, RECORD_HEADER_BYTES};
use super::segment::{
    parse_segment_file_name, segment_file_name, Segment, SegmentHeader, SEGMENT_BYTES_MAX,
    SEGMENT_HEADER_BYTES,
};
use crate::error::{Error, Result};
use crate::storage::{OpenMode, Storage, StorageFile, WholeFile};
use std::path::Path;
use std::sync::Arc;

/// How the records of one segment buffer ended.
#[derive(Debug, PartialEq, Eq)]
pub enum SegmentEnd {
    /// A bad slot at this offset (possibly the end of the buffer).
    BadSlot { offset: u64, detail: String },
    /// A record whose checksum holds but which must be refused.
    Refuse { offset: u64, error: RefuseKind },
}

#[derive(Debug, PartialEq, Eq)]
pub enum RefuseKind {
    NewerVersion(u32),
    Invalid(String),
}

/// Walks the records of one segment buffer (header included) from the
/// first record position, expecting seq `expected` first. Calls `each` for
/// every valid record in order and returns where and why the walk stopped.
/// Never panics, whatever `buf` holds.
pub fn scan_segment(
    buf: &[u8],
    mut expected: u64,
    each: &mut dyn FnMut(u64, &RecordHeader),
) -> (u64, SegmentEnd) {
    let mut pos = SEGMENT_HEADER_BYTES;
    loop {
        let rest = buf.get(pos..).unwrap_or(&[]);
        let stop = |detail: String| SegmentEnd::BadSlot { offset: pos as u64, detail };
        match decode(rest) {
            Ok((h, _)) if h.seq == expected => {
                each(pos as u64, &h);
                expected += 1;
                pos += h.record_bytes as usize;
            }
            Ok((h, _)) if h.seq < expected => {
                let detail = format!("record seq {} where seq {expected} was due (replayed seq)", h.seq);
                return (
                    expected,
                    SegmentEnd::Refuse { offset: pos as u64, error: RefuseKind::Invalid(detail) },
                );
            }
            Ok((h, _)) => {
                return (expected, stop(format!("record seq {} where seq {expected} was due", h.seq)))
            }
            Err(DecodeError::Bad { detail }) => return (expected, stop(detail)),
            Err(DecodeError::NewerVersion { found }) => {
                return (
                    expected,
                    SegmentEnd::Refuse { offset: pos as u64, error: RefuseKind::NewerVersion(found) },
                )
            }
            Err(DecodeError::Invalid { detail }) => {
                return (
                    expected,
                    SegmentEnd::Refuse { offset: pos as u64, error: RefuseKind::Invalid(detail) },
                )
            }
        }
    }
}

/// Looks in `buf` from `from` on for a valid record with `durable_seq >=
/// seq`, proof that `seq` had been made durable. Returns its offset and
/// header. Never panics.
pub fn find_durability_proof(buf: &[u8], from: u64, seq: u64) -> Option<(u64, RecordHeader)> {
    let step = RECORD_HEADER_BYTES;
    // Record positions are multiples of 64 in every segment.
    let from = usize::try_from(from).ok().filter(|&f| f <= buf.len())?;
    let mut pos = from.div_ceil(step) * step;
    while pos + step <= buf.len() {
        let rest = &buf[pos..];
        if has_record_magic(rest) {
            if let Ok((h, _)) = decode(rest) {
                if h.durable_seq >= seq {
                    return Some((pos as u64, h));
                }
                pos += h.record_bytes as usize;
                continue;
            }
        }
        pos += step;
    }
    None
}

/// Reads a whole segment file into memory (bounded by the largest segment).
pub fn read_segment_file(file: &dyn crate::storage::StorageFile) -> Result<WholeFile> {
    let len = file.len()?;
    if len > SEGMENT_BYTES_MAX {
        return Err(Error::Corruption {
            path: file.path().to_path_buf(),
            offset: 0,
            detail: format!("segment file of {len} bytes is larger than any segment ({SEGMENT_BYTES_MAX})"),
        });
    }
    file.read_whole()
}

/// Converts a refusal at `offset` of `path` into the crate error.
pub fn refusal(path: &Path, offset: u64, kind: RefuseKind) -> Error {
    match kind {
        RefuseKind::NewerVersion(found) => Error::UnsupportedVersion {
            what: format!("WAL record in {} at offset {offset}", path.display()),
            found,
            supported: super::record::RECORD_VERSION,
        },
        RefuseKind::Invalid(detail) => Error::Corruption { path: path.to_path_buf(), offset, detail },
    }
}

/// Decodes a segment header and checks it belongs where it was found.
pub fn check_segment_header(buf: &[u8], path: &Path, index: u64, log_id: u64) -> Result<SegmentHeader> {
    let h = SegmentHeader::decode(buf, path)?;
    let corrupt = |detail: String| Error::Corruption { path: path.to_path_buf(), offset: 0, detail };
    if h.index != index {
        return Err(corrupt(format!("header says segment {} but the file name says {index}", h.index)));
    }
    if h.log_id != log_id {
        return Err(corrupt(format!("segment belongs to log {:#x}, not this image's {log_id:#x}", h.log_id)));
    }
    if (buf.len() as u64) > h.segment_bytes {
        return Err(corrupt(format!("{} bytes in a segment of {}", buf.len(), h.segment_bytes)));
    }
    Ok(h)
}

/// True if a buffer whose header did not decode still holds a valid record
/// (so it is not merely a segment torn during creation).
pub fn holds_any_record(buf: &[u8]) -> bool {
    find_durability_proof(buf, SEGMENT_HEADER_BYTES as u64, 0).is_some()
}

/// What recovery found and did, for logs and stats.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RecoveryReport {
    /// Segments kept.
    pub segments: u64,
    /// Valid records read (PAD included).
    pub records: u64,
    /// Records handed on for replay (seq above the checkpoint).
    pub replayed_records: u64,
    /// Bytes of torn tail cut off (truncated or in deleted segments).
    pub torn_tail_bytes: u64,
    /// Segments deleted because they held only torn tail.
    pub deleted_segments: u64,
    /// Segments deleted unread because the checkpoint covered them.
    pub covered_segments_deleted: u64,
}

/// The log as recovery leaves it.
pub struct Recovered {
    /// Kept segments, oldest first; empty only if the log had none.
    pub segments: Vec<std::sync::Arc<Segment>>,
    /// Where the next record goes in the last segment.
    pub tail: u64,
    /// The seq of the next record.
    pub next_seq: u64,
    /// The index a new segment gets if `segments` is empty.
    pub next_index: u64,
    pub report: RecoveryReport,
}

fn load(storage: &dyn Storage, dir: &Path, index: u64) -> Result<(Arc<dyn StorageFile>, WholeFile)> {
    let file = storage.open(&dir.join(segment_file_name(index)), OpenMode::Existing)?;
    let bytes = read_segment_file(&*file)?;
    Ok((file, bytes))
}

/// A bad slot: in `segment` (position `i` among `indices`), at `offset`
/// (0: its header), where seq `expected` was due.
struct BadSlot<'a> {
    i: usize,
    file: &'a Arc<dyn StorageFile>,
    bytes: &'a [u8],
    offset: u64,
    expected: u64,
    why: String,
}

/// Settles a bad slot: refuses the log if a later record proves the slot
/// was durable, else cuts the torn tail off (truncating the segment at the
/// slot, or deleting it if its header is the slot, and deleting every later
/// segment). `next` is the already loaded following segment, if any.
fn settle(
    storage: &dyn Storage,
    dir: &Path,
    indices: &[u64],
    slot: BadSlot<'_>,
    mut next: Option<(Arc<dyn StorageFile>, WholeFile)>,
    report: &mut RecoveryReport,
) -> Result<()> {
    let path = slot.file.path().to_path_buf();
    let from = slot.offset.max(SEGMENT_HEADER_BYTES as u64 - RECORD_HEADER_BYTES as u64)
        + RECORD_HEADER_BYTES as u64;
    let mut proof = find_durability_proof(slot.bytes, from, slot.expected).map(|(p, h)| (path.clone(), p, h));
    let mut later = Vec::new();
    for &index in &indices[slot.i + 1..] {
        let (lfile, lbytes) = match next.take() {
            Some(l) => l,
            None => load(storage, dir, index)?,
        };
        if proof.is_none() {
            proof = find_durability_proof(&lbytes, SEGMENT_HEADER_BYTES as u64, slot.expected)
                .map(|(p, h)| (lfile.path().to_path_buf(), p, h));
        }
        later.push((lfile.path().to_path_buf(), lbytes.len() as u64));
    }
    if let Some((ppath, ppos, ph)) = proof {
        return Err(Error::Corruption {
            path,
            offset: slot.offset,
            detail: format!(
                "WAL segment {} is damaged at offset {} where record seq {} was due ({}), but record seq {} \
                 in {} at offset {ppos} was written after records through seq {} were durable: this is \
                 corruption in the middle of the log, not a torn tail; refusing the image",
                indices[slot.i],
                slot.offset,
                slot.expected,
                slot.why,
                ph.seq,
                ppath.display(),
                ph.durable_seq
            ),
        });
    }
    // A torn tail: cut it off so that nothing behind it can be mistaken
    // for a record later, and make the cut durable before appending.
    if slot.offset == 0 {
        later.insert(0, (path, slot.bytes.len() as u64));
    } else if slot.bytes.len() as u64 > slot.offset {
        report.torn_tail_bytes += slot.bytes.len() as u64 - slot.offset;
        slot.file.set_len(slot.offset)?;
        slot.file.sync_data()?;
    }
    for (lpath, len) in later.iter().rev() {
        storage.remove_file(lpath)?;
        report.deleted_segments += 1;
        report.torn_tail_bytes += len;
    }
    if !later.is_empty() {
        storage.sync_dir(dir)?;
    }
    Ok(())
}

/// Recovers the log in `dir`: validates every segment and record, calls
/// `apply` for each valid record with seq above `replay_after_seq` in seq
/// order, cuts off a torn tail, and refuses mid-log damage. See the module
/// docs for the rules.
pub fn recover_log(
    storage: &dyn Storage,
    dir: &Path,
    log_id: u64,
    replay_after_seq: u64,
    apply: &mut dyn FnMut(&Arc<Segment>, u64, &RecordHeader),
) -> Result<Recovered> {
    let mut indices: Vec<u64> =
        storage.list_dir(dir)?.iter().filter_map(|n| parse_segment_file_name(n)).collect();
    indices.sort_unstable();
    let next_index = indices.last().map_or(1, |&i| i + 1);
    let mut report = RecoveryReport::default();
    if replay_after_seq > 0 {
        skip_covered(storage, dir, &mut indices, log_id, replay_after_seq, &mut report)?;
    }
    for w in indices.windows(2) {
        if w[1] != w[0] + 1 {
            return Err(Error::Corruption {
                path: dir.join(segment_file_name(w[0] + 1)),
                offset: 0,
                detail: format!("segment {} is missing between {} and {}", w[0] + 1, w[0], w[1]),
            });
        }
    }
    let mut kept: Vec<Arc<Segment>> = Vec::new();
    let mut expected = replay_after_seq + 1;
    let mut tail = SEGMENT_HEADER_BYTES as u64;
    let mut next_loaded: Option<(Arc<dyn StorageFile>, WholeFile)> = None;
    let mut i = 0;
    while i < indices.len() {
        let (file, bytes) = match next_loaded.take() {
            Some(l) => l,
            None => load(storage, dir, indices[i])?,
        };
        let path = file.path().to_path_buf();
        // Later segments are entered only through a header checked below.
        let header = match check_segment_header(&bytes, &path, indices[i], log_id) {
            Ok(h) => h,
            Err(e @ Error::UnsupportedVersion { .. }) => return Err(e),
            Err(e) => {
                let slot = BadSlot { i, file: &file, bytes: &bytes, offset: 0, expected, why: e.to_string() };
                settle(storage, dir, &indices, slot, None, &mut report)?;
                break;
            }
        };
        if i == 0 {
            if header.first_seq > replay_after_seq + 1 {
                return Err(Error::Corruption {
                    path,
                    offset: 0,
                    detail: format!(
                        "the log starts at seq {} but the checkpoint covers only up to seq {replay_after_seq}: \
                         records are missing",
                        header.first_seq
                    ),
                });
            }
            expected = header.first_seq;
        }
        assert_eq!(header.first_seq, expected, "segments are only entered at their first seq");
        let seg = Arc::new(Segment { header, file: file.clone() });
        let (next, end) = scan_segment(&bytes, expected, &mut |pos, h| {
            report.records += 1;
            if h.seq > replay_after_seq {
                report.replayed_records += 1;
                apply(&seg, pos, h);
            }
        });
        expected = next;
        kept.push(seg);
        let (offset, mut why) = match end {
            SegmentEnd::Refuse { offset, error } => return Err(refusal(&path, offset, error)),
            SegmentEnd::BadSlot { offset, detail } => (offset, detail),
        };
        // Did this segment simply end, its next record placed in the next one?
        if i + 1 < indices.len() {
            let (nfile, nbytes) = load(storage, dir, indices[i + 1])?;
            match check_segment_header(&nbytes, nfile.path(), indices[i + 1], log_id) {
                Ok(nh) if nh.first_seq == expected => {
                    next_loaded = Some((nfile, nbytes));
                    i += 1;
                    continue;
                }
                Ok(nh) => why += &format!("; the next segment starts at seq {}", nh.first_seq),
                Err(e @ Error::UnsupportedVersion { .. }) => return Err(e),
                Err(e) => why += &format!("; the next segment's header is bad: {e}"),
            }
            next_loaded = Some((nfile, nbytes));
        }
        tail = offset;
        let slot = BadSlot { i, file: &file, bytes: &bytes, offset, expected, why };
        settle(storage, dir, &indices, slot, next_loaded.take(), &mut report)?;
        break;
    }
    if expected <= replay_after_seq {
        // Only covered records are kept (the rest of the covered prefix was
        // damaged or cut as a torn tail): nothing is needed from this log.
        tracing::warn!(
            dir = %dir.display(),
            log_end = expected,
            covered = replay_after_seq,
            "the log ends inside the part the manifest covers; restarting it after the covered seq"
        );
        for seg in kept.drain(..) {
            storage.remove_file(seg.path())?;
            report.covered_segments_deleted += 1;
        }
        storage.sync_dir(dir)?;
        expected = replay_after_seq + 1;
    }
    report.segments = kept.len() as u64;
    if kept.is_empty() {
        tail = SEGMENT_HEADER_BYTES as u64;
    }
    Ok(Recovered { segments: kept, tail, next_seq: expected, next_index, report })
}

/// Drops the segments before the newest one that starts at or below
/// `covered + 1` (see the module docs) from `indices` and from the disk.
fn skip_covered(
    storage: &dyn Storage,
    dir: &Path,
    indices: &mut Vec<u64>,
    log_id: u64,
    covered: u64,
    report: &mut RecoveryReport,
) -> Result<()> {
    let mut start = None;
    for (k, &index) in indices.iter().enumerate().rev() {
        let file = storage.open(&dir.join(segment_file_name(index)), OpenMode::Existing)?;
        let mut head = vec![0u8; SEGMENT_HEADER_BYTES];
        let n = file.read_at(&mut head, 0)?;
        match check_segment_header(&head[..n], file.path(), index, log_id) {
            Ok(h) if h.first_seq <= covered + 1 => {
                start = Some(k);
                break;
            }
            Err(e @ Error::UnsupportedVersion { .. }) => return Err(e),
            _ => {}
        }
    }
    let Some(k) = start.filter(|&k| k > 0) else { return Ok(()) };
    for &index in &indices[..k] {
        storage.remove_file(&dir.join(segment_file_name(index)))?;
        report.covered_segments_deleted += 1;
    }
    storage.sync_dir(dir)?;
    indices.drain(..k);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn segment_with(records: &[(u64, u64)]) -> Vec<u8> {
        let mut buf =
            SegmentHeader { index: 1, segment_bytes: 1 << 20, first_seq: 1, log_id: 1 }.encode().to_vec();
        for &(seq, durable) in records {
            let payload = vec![seq as u8; 512];
            buf.extend_from_slice(&RecordHeader::write(seq, durable, 0, 512).encode(&payload));
            buf.extend_from_slice(&payload);
        }
        buf
    }

    #[test]
    fn scan_stops_at_the_first_bad_slot() {
        let mut buf = segment_with(&[(1, 0), (2, 0), (3, 1)]);
        let rec = (RECORD_HEADER_BYTES + 512) as u64;
        let mut seen = vec![];
        let (next, end) = scan_segment(&buf, 1, &mut |pos, h| seen.push((pos, h.seq)));
        assert_eq!(next, 4);
        assert_eq!(seen, vec![(512, 1), (512 + rec, 2), (512 + 2 * rec, 3)]);
        assert!(matches!(end, SegmentEnd::BadSlot { offset, .. } if offset == 512 + 3 * rec));
        // Damage record 2: the scan stops there, and record 3 (durable_seq 1)
        // does not prove seq 2 durable.
        buf[512 + rec as usize + 100] ^= 1;
        let (next, end) = scan_segment(&buf, 1, &mut |_, _| {});
        assert_eq!(next, 2);
        assert!(matches!(end, SegmentEnd::BadSlot { offset, .. } if offset == 512 + rec));
        assert_eq!(find_durability_proof(&buf, 512 + rec + 64, 2), None);
        assert_eq!(find_durability_proof(&buf, 512 + rec + 64, 1).map(|(_, h)| h.seq), Some(3));
    }

    #[test]
    fn scanners_find_nothing_in_garbage_and_a_record_hidden_in_it() {
        let mut rng = StdRng::seed_from_u64(0x1234_5678);
        for len in [0usize, 1, 63, 64, 511, 512, 600, 4096, 65536] {
            let mut buf = vec![0u8; len];
            rng.fill(&mut buf[..]);
            // Random bytes hold no record: nothing is seen, the scan stops
            // at the first slot, and nothing proves anything durable.
            let mut seen = 0;
            let (next, end) = scan_segment(&buf, 1, &mut |_, _| seen += 1);
            assert_eq!((seen, next), (0, 1), "len {len}");
            assert!(
                matches!(end, SegmentEnd::BadSlot { offset, .. } if offset == SEGMENT_HEADER_BYTES as u64),
                "len {len}: {end:?}"
            );
            assert_eq!(find_durability_proof(&buf, 0, 1), None, "len {len}");
            assert_eq!(find_durability_proof(&buf, u64::MAX, 1), None, "len {len}");
            assert!(!holds_any_record(&buf), "len {len}");
        }
        // A valid record written over garbage at a 64-byte boundary past
        // the segment header is found, by both the proof search and the
        // any-record probe; the sequential scan still stops before it.
        let mut buf = vec![0u8; 16384];
        rng.fill(&mut buf[..]);
        let payload = vec![7u8; 512];
        let at = SEGMENT_HEADER_BYTES + 64 * 37;
        let record = RecordHeader::write(9, 5, 0, 512).encode(&payload);
        buf[at..at + record.len()].copy_from_slice(&record);
        buf[at + record.len()..at + record.len() + 512].copy_from_slice(&payload);
        assert_eq!(find_durability_proof(&buf, 0, 5).map(|(pos, h)| (pos, h.seq)), Some((at as u64, 9)));
        assert_eq!(find_durability_proof(&buf, 0, 6), None, "its durable_seq 5 proves nothing past 5");
        assert!(holds_any_record(&buf));
        let (next, _) = scan_segment(&buf, 1, &mut |_, _| {});
        assert_eq!(next, 1, "the record is not where seq 1 would be");
    }
}
