//! The per-image write-ahead log: segments of records, their encoding,
//! appending, and recovery.
//!
//! ```text
//!  images/<name>/wal/
//!    0000000000000001.wal   segment 1: header, records seq 1..=k
//!    0000000000000002.wal   segment 2: header, records seq k+1..
//!    ...                    (the last one is appended to)
//! ```
//!
//! Byte layouts: [`segment`] (segment header) and [`record`] (record
//! header). Recovery rules: [`recovery`]. The durability protocol built on
//! top (visible / durable, group commit, FUA) lives in `image` and in
//! docs/design.md.

pub mod log;
pub mod record;
pub mod recovery;
pub mod segment;

pub use log::{Log, ReclaimOutcome, SegmentInfo, Slot};
pub use record::{RecordHeader, RecordKind, RECORD_HEADER_BYTES, SECTOR_BYTES};
pub use recovery::RecoveryReport;
pub use segment::{Segment, SegmentHeader, SEGMENT_HEADER_BYTES};

/// The body of the WAL decoder fuzz target (`fuzz/fuzz_targets/wal_record.rs`):
/// feeds `data` to every WAL decoder as a record, a segment header and a
/// whole segment. It must never panic; what decodes must re-encode to the
/// same bytes.
pub fn fuzz_decode(data: &[u8]) {
    if let Ok((h, payload)) = record::decode(data) {
        let again = h.encode(payload);
        assert_eq!(&again[..], &data[..RECORD_HEADER_BYTES], "a decoded record re-encodes to its bytes");
        assert!(h.durable_seq < h.seq, "decode only accepts durable_seq < seq");
        if h.kind != RecordKind::Pad {
            assert!(
                h.offset_bytes.is_multiple_of(SECTOR_BYTES)
                    && h.len_bytes.is_multiple_of(SECTOR_BYTES)
                    && h.len_bytes > 0
            );
        }
    }
    let path = std::path::Path::new("fuzz");
    if let Ok(h) = SegmentHeader::decode(data, path) {
        assert_eq!(
            &h.encode()[..],
            &data[..SEGMENT_HEADER_BYTES],
            "a decoded header re-encodes to its bytes"
        );
    }
    let first = data.get(..8).map_or(1, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    let mut last = None;
    let (next, end) = recovery::scan_segment(data, first, &mut |pos, h| {
        assert!(last.is_none_or(|(p, s)| pos > p && h.seq == s + 1), "records come in order");
        last = Some((pos, h.seq));
    });
    assert!(next >= first);
    if let recovery::SegmentEnd::BadSlot { offset, .. } = end {
        let _ = recovery::find_durability_proof(data, offset, next);
    }
    let _ = recovery::holds_any_record(data);
}
