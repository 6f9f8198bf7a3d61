//! A log segment: one file `wal/<index as 16 hex digits>.wal` holding a
//! 512-byte header and then records packed back to back.
//!
//! ```text
//!  segment file
//!  +----------------+----------+----------+-----+----------------------+
//!  | header (512 B) | record   | record   | ... | never written        |
//!  +----------------+----------+----------+-----+----------------------+
//!  0               512      (records start at multiples of 64)     segment_bytes
//!
//!  header
//!  offset  size  field
//!       0     8  magic          "CASWLSEG"
//!       8     4  version        u32 LE, 1
//!      12     4  crc32c         over [0,12) ++ [16,512)
//!      16     4  header_bytes   u32 LE, 512
//!      20     4  reserved       0
//!      24     8  segment_index  u64 LE, equals the file name's number
//!      32     8  segment_bytes  u64 LE, the most bytes the file may hold
//!      40     8  first_seq      u64 LE, seq of the first record written here
//!      48     8  log_id         u64 LE, the image's log identity (image header)
//!      56   456  zero
//! ```
//!
//! A segment's header is written before any record goes into it. The first
//! segment of a log is synced (file and directory) at creation; a segment
//! rolled to later is made durable by the next group-commit round, together
//! with the records in it, so recovery treats a damaged header of a later
//! segment like any other bad slot (torn unless proven durable). Files are
//! never reused, so the bytes past the last record are zeros (or the
//! debris of a torn write, which recovery truncates).

use crate::error::{Error, Result};
use crate::format::{check_version, crc32c, crc32c_append, Decoder};
use crate::storage::{OpenMode, Storage, StorageFile};
use crate::units::{BLOCK_BYTES, SECTOR_BYTES};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const SEGMENT_MAGIC: [u8; 8] = *b"CASWLSEG";
pub const SEGMENT_VERSION: u32 = 1;

const MAGIC_AT: usize = 0;
const VERSION_AT: usize = MAGIC_AT + 8;
const CRC_AT: usize = VERSION_AT + 4;
const HEADER_BYTES_AT: usize = CRC_AT + 4;
const RESERVED_AT: usize = HEADER_BYTES_AT + 4;
const INDEX_AT: usize = RESERVED_AT + 4;
const SEGMENT_BYTES_AT: usize = INDEX_AT + 8;
const FIRST_SEQ_AT: usize = SEGMENT_BYTES_AT + 8;
const LOG_ID_AT: usize = FIRST_SEQ_AT + 8;
const USED_END: usize = LOG_ID_AT + 8;
/// Size of the segment header, one sector; the first record starts here.
pub const SEGMENT_HEADER_BYTES: usize = SECTOR_BYTES as usize;
const _: () = assert!(USED_END <= SEGMENT_HEADER_BYTES);

/// Smallest and largest segment sizes a store accepts.
pub const SEGMENT_BYTES_MIN: u64 = 1 << 20;
pub const SEGMENT_BYTES_MAX: u64 = 1 << 30;

/// The decoded segment header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub index: u64,
    pub segment_bytes: u64,
    pub first_seq: u64,
    pub log_id: u64,
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut h = [0u8; SEGMENT_HEADER_BYTES];
        h[MAGIC_AT..VERSION_AT].copy_from_slice(&SEGMENT_MAGIC);
        h[VERSION_AT..CRC_AT].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
        h[HEADER_BYTES_AT..RESERVED_AT].copy_from_slice(&(SEGMENT_HEADER_BYTES as u32).to_le_bytes());
        h[INDEX_AT..SEGMENT_BYTES_AT].copy_from_slice(&self.index.to_le_bytes());
        h[SEGMENT_BYTES_AT..FIRST_SEQ_AT].copy_from_slice(&self.segment_bytes.to_le_bytes());
        h[FIRST_SEQ_AT..LOG_ID_AT].copy_from_slice(&self.first_seq.to_le_bytes());
        h[LOG_ID_AT..USED_END].copy_from_slice(&self.log_id.to_le_bytes());
        let crc = header_crc(&h);
        h[CRC_AT..HEADER_BYTES_AT].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Decodes a header; `path` names the file in errors. A checksum
    /// mismatch is [`Error::ChecksumMismatch`]; a newer version with a valid
    /// checksum is [`Error::UnsupportedVersion`]. Never panics.
    pub fn decode(buf: &[u8], path: &Path) -> Result<SegmentHeader> {
        let corrupt = |detail: String| Error::Corruption { path: path.to_path_buf(), offset: 0, detail };
        let Some(h) = buf.get(..SEGMENT_HEADER_BYTES) else {
            return Err(corrupt(format!("{} bytes is too short for a segment header", buf.len())));
        };
        let mut d = Decoder::new(h);
        if d.array::<8>() != Some(SEGMENT_MAGIC) {
            return Err(corrupt("no segment magic".into()));
        }
        let version = d.u32().expect("fits");
        let expected = d.u32().expect("fits");
        let actual = header_crc(h);
        if expected != actual {
            return Err(Error::ChecksumMismatch { path: path.to_path_buf(), offset: 0, expected, actual });
        }
        check_version(&format!("WAL segment {}", path.display()), version, SEGMENT_VERSION)?;
        let header_bytes = d.u32().expect("fits");
        let reserved = d.u32().expect("fits");
        let index = d.u64().expect("fits");
        let segment_bytes = d.u64().expect("fits");
        let first_seq = d.u64().expect("fits");
        let log_id = d.u64().expect("fits");
        if header_bytes as usize != SEGMENT_HEADER_BYTES
            || reserved != 0
            || h[USED_END..].iter().any(|&b| b != 0)
        {
            return Err(corrupt("segment header has unknown fields set".into()));
        }
        if !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&segment_bytes)
            || !segment_bytes.is_multiple_of(BLOCK_BYTES)
            || first_seq == 0
        {
            return Err(corrupt(format!("segment of {segment_bytes} bytes starting at seq {first_seq}")));
        }
        Ok(SegmentHeader { index, segment_bytes, first_seq, log_id })
    }
}

fn header_crc(h: &[u8]) -> u32 {
    crc32c_append(crc32c(&h[..CRC_AT]), &h[HEADER_BYTES_AT..SEGMENT_HEADER_BYTES])
}

/// The file name of segment `index`.
pub fn segment_file_name(index: u64) -> String {
    format!("{index:016x}.wal")
}

/// The index in a segment file name, or None for any other name.
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".wal")?;
    if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// An open segment file. Shared through `Arc` by the log and by overlay
/// extents that point into it: an in-flight read keeps its segment's file
/// open (and so readable) even if reclamation unlinks it meanwhile.
pub struct Segment {
    pub header: SegmentHeader,
    pub file: Arc<dyn StorageFile>,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment").field("header", &self.header).finish()
    }
}

impl Segment {
    pub fn index(&self) -> u64 {
        self.header.index
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Creates segment `header.index` in `dir` and writes its header. With
    /// `durable`, the file and the directory are synced before this returns;
    /// without, the next group-commit round syncs both (a segment rolled to
    /// on the write path costs no sync there). On failure the half-made
    /// file is removed (best effort); a file left by such a failure is
    /// replaced by the next attempt. With `allocate`, the whole segment is
    /// allocated first (a roll on the write path; a log's first segment
    /// is allocated when a writable image opens it, see `Log::open`).
    pub fn create(
        storage: &dyn Storage,
        dir: &Path,
        header: SegmentHeader,
        durable: bool,
        allocate: bool,
    ) -> Result<Segment> {
        let path: PathBuf = dir.join(segment_file_name(header.index));
        let file = match storage.open(&path, OpenMode::CreateNew) {
            // Left by an earlier attempt whose cleanup failed too; it holds
            // no record (the log never moved past it), so start it afresh.
            Err(Error::Io { source, .. }) if source.raw_os_error() == Some(libc::EEXIST) => {
                storage.remove_file(&path)?;
                storage.open(&path, OpenMode::CreateNew)?
            }
            other => other?,
        };
        // The whole segment is allocated before its header is written, so
        // no record written into it can fail for lack of space: a full
        // filesystem fails the roll, before any seq is assigned.
        let allocated = if allocate { file.allocate(0, header.segment_bytes) } else { Ok(()) };
        let made = allocated.and_then(|()| file.write_all_at(&header.encode(), 0)).and_then(|()| {
            if durable {
                file.sync_data()?;
                storage.sync_dir(dir)?;
            }
            Ok(())
        });
        if let Err(e) = made {
            let _ = storage.remove_file(&path);
            return Err(e);
        }
        Ok(Segment { header, file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_catches_damage() {
        let h = SegmentHeader { index: 7, segment_bytes: 8 << 20, first_seq: 100, log_id: 0xfeed };
        let buf = h.encode();
        let p = Path::new("/x");
        assert_eq!(SegmentHeader::decode(&buf, p).unwrap(), h);
        for i in [0, 9, 13, 20, 30, 60, 511] {
            let mut b = buf;
            b[i] ^= 4;
            assert!(SegmentHeader::decode(&b, p).is_err(), "flip at {i}");
        }
        assert!(SegmentHeader::decode(&buf[..100], p).is_err());
    }

    #[test]
    fn newer_segment_version_is_refused_with_a_message() {
        let mut b = SegmentHeader { index: 1, segment_bytes: 1 << 20, first_seq: 1, log_id: 1 }.encode();
        b[VERSION_AT..CRC_AT].copy_from_slice(&9u32.to_le_bytes());
        let crc = header_crc(&b);
        b[CRC_AT..HEADER_BYTES_AT].copy_from_slice(&crc.to_le_bytes());
        let e = SegmentHeader::decode(&b, Path::new("/x")).unwrap_err();
        assert!(matches!(e, Error::UnsupportedVersion { found: 9, supported: 1, .. }), "{e}");
        assert!(e.to_string().contains("upgrade casblk"));
    }

    #[test]
    fn file_names_round_trip() {
        assert_eq!(segment_file_name(26), "000000000000001a.wal");
        assert_eq!(parse_segment_file_name("000000000000001a.wal"), Some(26));
        assert_eq!(parse_segment_file_name("000000000000001A.wal"), None);
        assert_eq!(parse_segment_file_name("1a.wal"), None);
        assert_eq!(parse_segment_file_name("000000000000001a.tmp"), None);
    }
}
