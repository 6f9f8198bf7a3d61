//! One log record: its 64-byte header, its encoder and its decoder.
//!
//! ```text
//!  offset  size  field
//!  ------  ----  -----------------------------------------------------
//!       0     8  magic        "CASWLREC"
//!       8     4  version      u32 LE, 1
//!      12     4  crc32c       over bytes [0,12) ++ [16, record_bytes)
//!                             (PAD: over [0,12) ++ [16,64), the header only)
//!      16     4  record_bytes u32 LE: header + payload
//!      20     2  kind         u16 LE: 1 WRITE, 2 WRITE_ZEROES, 3 DISCARD, 4 PAD
//!      22     2  flags        u16 LE, 0 (reserved)
//!      24     8  seq          u64 LE: 1, 2, 3, ... with no gaps across the log
//!      32     8  durable_seq  u64 LE: every record <= this was durable (a sync
//!                             had completed) when this record was encoded
//!      40     8  offset_bytes u64 LE: image byte offset, 512-aligned
//!      48     8  len_bytes    u64 LE: range length, 512-aligned, > 0
//!      56     8  reserved     0
//!      64     -  payload      WRITE: len_bytes bytes; others: none
//!                             (PAD: record_bytes - 64 bytes of ignored filler)
//! ```
//!
//! The first 20 bytes (magic, version, crc, length) keep their places in
//! every version, so the checksum is verified before the version is read:
//! a torn record can never pose as a "newer version", and a record whose
//! checksum holds but whose version is newer is refused, not skipped.

use crate::format::{crc32c, crc32c_append, Decoder};

pub const RECORD_MAGIC: [u8; 8] = *b"CASWLREC";
/// The record format this build writes and the newest it reads.
pub const RECORD_VERSION: u32 = 1;

const MAGIC_AT: usize = 0;
const VERSION_AT: usize = MAGIC_AT + 8;
const CRC_AT: usize = VERSION_AT + 4;
const RECORD_BYTES_AT: usize = CRC_AT + 4;
const KIND_AT: usize = RECORD_BYTES_AT + 4;
const FLAGS_AT: usize = KIND_AT + 2;
const SEQ_AT: usize = FLAGS_AT + 2;
const DURABLE_SEQ_AT: usize = SEQ_AT + 8;
const OFFSET_AT: usize = DURABLE_SEQ_AT + 8;
const LEN_AT: usize = OFFSET_AT + 8;
const RESERVED_AT: usize = LEN_AT + 8;
/// Size of every record header; records start at multiples of it.
pub const RECORD_HEADER_BYTES: usize = RESERVED_AT + 8;
const _: () = assert!(RECORD_HEADER_BYTES == 64);

/// Offsets and lengths in records are multiples of this.
pub use crate::units::SECTOR_BYTES;

/// What a record says happened to its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum RecordKind {
    /// New bytes for the range (the payload).
    Write,
    /// The range reads as zeros.
    WriteZeroes,
    /// The range is deallocated and reads as zeros.
    Discard,
    /// A no-op filling a slot whose write failed; `record_bytes` says how far to skip.
    Pad,
}

impl RecordKind {
    fn code(self) -> u16 {
        match self {
            RecordKind::Write => 1,
            RecordKind::WriteZeroes => 2,
            RecordKind::Discard => 3,
            RecordKind::Pad => 4,
        }
    }

    fn from_code(code: u16) -> Option<RecordKind> {
        Some(match code {
            1 => RecordKind::Write,
            2 => RecordKind::WriteZeroes,
            3 => RecordKind::Discard,
            4 => RecordKind::Pad,
            _ => return None,
        })
    }
}

/// The decoded fields of a record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub kind: RecordKind,
    pub seq: u64,
    pub durable_seq: u64,
    pub offset_bytes: u64,
    pub len_bytes: u64,
    /// Header plus payload (or filler, for PAD).
    pub record_bytes: u32,
}

/// Why bytes at a record position are not a usable record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Not a complete record: wrong magic, impossible length, or a
    /// checksum mismatch. A torn write looks like this, and so does media
    /// corruption; recovery tells them apart (see `recovery`).
    Bad { detail: String },
    /// The checksum holds but the version is newer than this build reads.
    NewerVersion { found: u32 },
    /// The checksum holds but the fields contradict each other: written by
    /// a broken or hostile writer, never by a torn write.
    Invalid { detail: String },
}

impl RecordHeader {
    /// A WRITE header for `payload` at image offset `offset_bytes`.
    pub fn write(seq: u64, durable_seq: u64, offset_bytes: u64, payload_len: usize) -> RecordHeader {
        RecordHeader {
            kind: RecordKind::Write,
            seq,
            durable_seq,
            offset_bytes,
            len_bytes: payload_len as u64,
            record_bytes: u32::try_from(RECORD_HEADER_BYTES + payload_len).expect("record fits a segment"),
        }
    }

    /// A WRITE_ZEROES or DISCARD header.
    pub fn range(kind: RecordKind, seq: u64, durable_seq: u64, offset_bytes: u64, len: u64) -> RecordHeader {
        assert!(matches!(kind, RecordKind::WriteZeroes | RecordKind::Discard), "range kinds only");
        RecordHeader {
            kind,
            seq,
            durable_seq,
            offset_bytes,
            len_bytes: len,
            record_bytes: RECORD_HEADER_BYTES as u32,
        }
    }

    /// A PAD header voiding a slot of `record_bytes`.
    pub fn pad(seq: u64, durable_seq: u64, record_bytes: u32) -> RecordHeader {
        RecordHeader { kind: RecordKind::Pad, seq, durable_seq, offset_bytes: 0, len_bytes: 0, record_bytes }
    }

    /// Bytes of payload that follow the header and are covered by its checksum.
    pub fn payload_bytes(&self) -> u64 {
        match self.kind {
            RecordKind::Write => self.len_bytes,
            _ => 0,
        }
    }

    /// The header bytes, with the checksum over them and `payload`.
    pub fn encode(&self, payload: &[u8]) -> [u8; RECORD_HEADER_BYTES] {
        assert_eq!(payload.len() as u64, self.payload_bytes(), "payload length must match the header");
        let mut h = [0u8; RECORD_HEADER_BYTES];
        h[MAGIC_AT..VERSION_AT].copy_from_slice(&RECORD_MAGIC);
        h[VERSION_AT..CRC_AT].copy_from_slice(&RECORD_VERSION.to_le_bytes());
        h[RECORD_BYTES_AT..KIND_AT].copy_from_slice(&self.record_bytes.to_le_bytes());
        h[KIND_AT..FLAGS_AT].copy_from_slice(&self.kind.code().to_le_bytes());
        h[SEQ_AT..DURABLE_SEQ_AT].copy_from_slice(&self.seq.to_le_bytes());
        h[DURABLE_SEQ_AT..OFFSET_AT].copy_from_slice(&self.durable_seq.to_le_bytes());
        h[OFFSET_AT..LEN_AT].copy_from_slice(&self.offset_bytes.to_le_bytes());
        h[LEN_AT..RESERVED_AT].copy_from_slice(&self.len_bytes.to_le_bytes());
        let crc = record_crc(&h, payload);
        h[CRC_AT..RECORD_BYTES_AT].copy_from_slice(&crc.to_le_bytes());
        h
    }
}

fn record_crc(header: &[u8], payload: &[u8]) -> u32 {
    let crc = crc32c(&header[..CRC_AT]);
    let crc = crc32c_append(crc, &header[RECORD_BYTES_AT..RECORD_HEADER_BYTES]);
    crc32c_append(crc, payload)
}

/// The length and kind a record header announces (`kind` None when the
/// code is unknown), read without any check: `decode` must still accept
/// the record before anything relies on it. `head` is at least 64 bytes.
pub fn peek_header(head: &[u8]) -> (u32, Option<RecordKind>) {
    let record_bytes = u32::from_le_bytes(head[RECORD_BYTES_AT..KIND_AT].try_into().expect("4 bytes"));
    let kind = u16::from_le_bytes(head[KIND_AT..FLAGS_AT].try_into().expect("2 bytes"));
    (record_bytes, RecordKind::from_code(kind))
}

/// True if `buf` starts with the record magic (a cheap pre-check for scans).
pub fn has_record_magic(buf: &[u8]) -> bool {
    buf.get(..8) == Some(&RECORD_MAGIC[..])
}

fn bad(detail: impl Into<String>) -> DecodeError {
    DecodeError::Bad { detail: detail.into() }
}

fn invalid(detail: impl Into<String>) -> DecodeError {
    DecodeError::Invalid { detail: detail.into() }
}

/// Decodes the record at the start of `buf` (the rest of its segment) and
/// returns its header and payload. Never panics, whatever `buf` holds.
pub fn decode(buf: &[u8]) -> Result<(RecordHeader, &[u8]), DecodeError> {
    let mut d = Decoder::new(buf);
    let header = d.bytes(RECORD_HEADER_BYTES).ok_or_else(|| bad("too short for a record header"))?;
    let mut h = Decoder::new(header);
    if h.array::<8>() != Some(RECORD_MAGIC) {
        return Err(bad("no record magic"));
    }
    let version = h.u32().ok_or_else(|| bad("short"))?;
    let crc_stored = h.u32().ok_or_else(|| bad("short"))?;
    let record_bytes = h.u32().ok_or_else(|| bad("short"))?;
    let kind_code = h.u16().ok_or_else(|| bad("short"))?;
    let flags = h.u16().ok_or_else(|| bad("short"))?;
    let seq = h.u64().ok_or_else(|| bad("short"))?;
    let durable_seq = h.u64().ok_or_else(|| bad("short"))?;
    let offset_bytes = h.u64().ok_or_else(|| bad("short"))?;
    let len_bytes = h.u64().ok_or_else(|| bad("short"))?;
    let reserved = h.u64().ok_or_else(|| bad("short"))?;

    let record_len = record_bytes as usize;
    if record_len < RECORD_HEADER_BYTES || !record_len.is_multiple_of(RECORD_HEADER_BYTES) {
        return Err(bad(format!("impossible record length {record_bytes}")));
    }
    // PAD covers only its header: the slot behind it holds a failed write,
    // which may never have reached the file (so it may end inside the slot).
    let is_pad = kind_code == RecordKind::Pad.code();
    if record_len > buf.len() && !is_pad {
        return Err(bad(format!("record of {record_bytes} bytes runs past the end of its segment")));
    }
    let covered = if is_pad { &[][..] } else { &buf[RECORD_HEADER_BYTES..record_len] };
    let crc_actual = record_crc(header, covered);
    if crc_actual != crc_stored {
        return Err(bad(format!(
            "checksum mismatch: stored {crc_stored:#010x}, computed {crc_actual:#010x}"
        )));
    }
    if version == 0 {
        return Err(invalid("record version 0 is never written"));
    }
    if version > RECORD_VERSION {
        return Err(DecodeError::NewerVersion { found: version });
    }
    let kind =
        RecordKind::from_code(kind_code).ok_or_else(|| invalid(format!("unknown kind {kind_code}")))?;
    if flags != 0 || reserved != 0 {
        return Err(invalid("reserved fields are not zero"));
    }
    if seq == 0 || durable_seq >= seq {
        return Err(invalid(format!("seq {seq} with durable_seq {durable_seq}")));
    }
    let header = RecordHeader { kind, seq, durable_seq, offset_bytes, len_bytes, record_bytes };
    match kind {
        RecordKind::Pad => {
            if offset_bytes != 0 || len_bytes != 0 {
                return Err(invalid("PAD with a range"));
            }
            return Ok((header, &[]));
        }
        RecordKind::Write => {
            if len_bytes != (record_len - RECORD_HEADER_BYTES) as u64 {
                return Err(invalid(format!("WRITE of {len_bytes} bytes in a {record_bytes}-byte record")));
            }
        }
        RecordKind::WriteZeroes | RecordKind::Discard => {
            if record_len != RECORD_HEADER_BYTES {
                return Err(invalid(format!("{kind:?} with {record_bytes} record bytes")));
            }
        }
    }
    if len_bytes == 0 || !len_bytes.is_multiple_of(SECTOR_BYTES) || !offset_bytes.is_multiple_of(SECTOR_BYTES)
    {
        return Err(invalid(format!("range {offset_bytes}+{len_bytes} is not {SECTOR_BYTES}-byte aligned")));
    }
    if offset_bytes.checked_add(len_bytes).is_none() {
        return Err(invalid("range overflows"));
    }
    Ok((header, &buf[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + header.payload_bytes() as usize]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(h: &RecordHeader, payload: &[u8]) -> Vec<u8> {
        let mut v = h.encode(payload).to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn round_trips_every_kind() {
        let payload = vec![7u8; 1024];
        let w = RecordHeader::write(5, 3, 4096, payload.len());
        let buf = encoded(&w, &payload);
        assert_eq!(decode(&buf), Ok((w, &payload[..])));
        for kind in [RecordKind::WriteZeroes, RecordKind::Discard] {
            let r = RecordHeader::range(kind, 9, 0, 512, 1 << 20);
            assert_eq!(decode(&encoded(&r, &[])), Ok((r, &[][..])));
        }
        let p = RecordHeader::pad(6, 5, 64 + 512);
        let mut buf = encoded(&p, &[]);
        // A PAD may end past the end of the file: its failed payload
        // write never got there.
        assert_eq!(decode(&buf), Ok((p, &[][..])));
        buf.extend_from_slice(&[0xAB; 512]);
        assert_eq!(decode(&buf), Ok((p, &[][..])));
    }

    #[test]
    fn any_flipped_byte_is_caught() {
        let payload = vec![1u8; 512];
        let buf = encoded(&RecordHeader::write(1, 0, 0, 512), &payload);
        for i in 0..buf.len() {
            let mut b = buf.clone();
            b[i] ^= 0x10;
            assert!(decode(&b).is_err(), "flip at {i} went unnoticed");
        }
        assert!(matches!(decode(&buf[..buf.len() - 1]), Err(DecodeError::Bad { .. })));
        assert!(matches!(decode(&[0u8; 64]), Err(DecodeError::Bad { .. })));
    }

    #[test]
    fn newer_version_with_valid_checksum_is_refused() {
        let mut h = RecordHeader::range(RecordKind::Discard, 1, 0, 0, 512).encode(&[]);
        h[VERSION_AT..CRC_AT].copy_from_slice(&2u32.to_le_bytes());
        let crc = record_crc(&h, &[]);
        h[CRC_AT..RECORD_BYTES_AT].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(decode(&h), Err(DecodeError::NewerVersion { found: 2 }));
        // The same header torn (bad checksum) is just a bad record.
        h[40] ^= 1;
        assert!(matches!(decode(&h), Err(DecodeError::Bad { .. })));
    }

    #[test]
    fn contradictory_fields_are_invalid() {
        let mut h = RecordHeader::range(RecordKind::Discard, 1, 0, 0, 512);
        h.len_bytes = 100;
        assert!(matches!(decode(&encoded(&h, &[])), Err(DecodeError::Invalid { .. })));
        let mut h = RecordHeader::range(RecordKind::Discard, 2, 0, 0, 512);
        h.durable_seq = 2;
        assert!(matches!(decode(&encoded(&h, &[])), Err(DecodeError::Invalid { .. })));
    }
}
