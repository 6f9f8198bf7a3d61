//! The overlay index: for each 512-byte sector of the image written since
//! the last compaction, where its newest bytes are.
//!
//! ```text
//!  BTreeMap<start sector, Extent { len sectors, seq, source }>
//!
//!   sectors:  0    8        24   32
//!             [ A ][   B    ][ C ]        non-overlapping extents
//!   A, B: Source::Log { segment, position }   bytes in a WAL segment
//!   C:    Source::Zero                         WRITE_ZEROES / DISCARD
//!   gaps: not in the overlay -> the manifest (a chunk, or a hole = zeros)
//! ```
//!
//! Newest wins by seq, not by arrival: inserting an extent only replaces
//! the parts of older extents (lower seq) it overlaps, so concurrent
//! writers that publish out of seq order leave the same index that replay
//! in seq order builds.
//!
//! Bound: each insert adds at most one new extent per gap between newer
//! extents plus two split remainders, so the extent count stays below
//! three times the records in the log, which the log quota bounds.
//!
//! The map is generic over its source type: the compactor builds the same
//! index over the records of one batch, with sources in its own buffer.

use crate::wal::{Segment, SECTOR_BYTES};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Where an extent's bytes are.
#[derive(Clone, Debug)]
pub enum Source {
    /// Reads as zeros (WRITE_ZEROES, DISCARD), hiding the manifest.
    Zero,
    /// In a WAL segment, starting at file offset `position`.
    Log { segment: Arc<Segment>, position: u64 },
}

/// A source that can be moved forward by some sectors (the tail of an
/// extent that was split).
pub trait Advance: Clone {
    fn advanced(&self, sectors: u64) -> Self;
}

impl Advance for Source {
    fn advanced(&self, sectors: u64) -> Source {
        match self {
            Source::Zero => Source::Zero,
            Source::Log { segment, position } => {
                Source::Log { segment: segment.clone(), position: position + sectors * SECTOR_BYTES }
            }
        }
    }
}

#[derive(Clone, Debug)]
struct Extent<S> {
    len: u64,
    seq: u64,
    src: S,
}

/// One contiguous part of a lookup, in sectors.
#[derive(Clone, Debug)]
pub struct Piece<S = Source> {
    pub start: u64,
    pub len: u64,
    /// None: not in the overlay (ask the manifest).
    pub src: Option<S>,
}

#[derive(Debug)]
pub struct Overlay<S = Source> {
    map: BTreeMap<u64, Extent<S>>,
}

impl<S> Default for Overlay<S> {
    fn default() -> Self {
        Overlay { map: BTreeMap::new() }
    }
}

impl<S: Advance> Overlay<S> {
    pub fn new() -> Overlay<S> {
        Overlay::default()
    }

    pub fn extent_count(&self) -> usize {
        self.map.len()
    }

    /// Takes out every extent overlapping `[start, end)`.
    fn take_overlapping(&mut self, start: u64, end: u64) -> Vec<(u64, Extent<S>)> {
        let mut keys: Vec<u64> = Vec::new();
        if let Some((&k, e)) = self.map.range(..start).next_back() {
            if k + e.len > start {
                keys.push(k);
            }
        }
        keys.extend(self.map.range(start..end).map(|(&k, _)| k));
        keys.into_iter().map(|k| (k, self.map.remove(&k).expect("key just seen"))).collect()
    }

    /// Records that sectors `[start, start + len)` now come from `src`, as
    /// of record `seq`, except where a newer record already says otherwise.
    pub fn insert(&mut self, start: u64, len: u64, seq: u64, src: S) {
        assert!(len > 0, "empty extent");
        let end = start + len;
        let mut newer: Vec<(u64, u64)> = Vec::new();
        for (k, e) in self.take_overlapping(start, end) {
            let e_end = k + e.len;
            if e.seq > seq {
                newer.push((k.max(start), e_end.min(end)));
                self.map.insert(k, e);
                continue;
            }
            if k < start {
                self.map.insert(k, Extent { len: start - k, seq: e.seq, src: e.src.clone() });
            }
            if e_end > end {
                self.map.insert(end, Extent { len: e_end - end, seq: e.seq, src: e.src.advanced(end - k) });
            }
        }
        newer.sort_unstable();
        let mut cur = start;
        for (ns, ne) in newer.into_iter().chain(std::iter::once((end, end))) {
            if cur < ns {
                self.map.insert(cur, Extent { len: ns - cur, seq, src: src.advanced(cur - start) });
            }
            cur = cur.max(ne);
        }
    }

    /// The pieces covering `[start, start + len)`, in order, gaps included.
    pub fn lookup(&self, start: u64, len: u64) -> Vec<Piece<S>> {
        let end = start + len;
        let mut out = Vec::new();
        let mut cur = start;
        let first = self.map.range(..start).next_back().filter(|(&k, e)| k + e.len > start);
        for (&k, e) in first.into_iter().chain(self.map.range(start..end)) {
            if k > cur {
                out.push(Piece { start: cur, len: k - cur, src: None });
                cur = k;
            }
            let piece_end = (k + e.len).min(end);
            out.push(Piece { start: cur, len: piece_end - cur, src: Some(e.src.advanced(cur - k)) });
            cur = piece_end;
        }
        if cur < end {
            out.push(Piece { start: cur, len: end - cur, src: None });
        }
        out
    }

    /// Drops every extent from a record with seq <= `covered_seq` (its
    /// data is now in the manifest) and returns how many went.
    pub fn remove_through(&mut self, covered_seq: u64) -> usize {
        let before = self.map.len();
        self.map.retain(|_, e| e.seq > covered_seq);
        before - self.map.len()
    }

    /// The highest seq any extent holds (0 if empty).
    pub fn max_seq(&self) -> u64 {
        self.map.values().map(|e| e.seq).max().unwrap_or(0)
    }

    /// Every extent in sector order: `(start, len, source)`.
    pub fn extents(&self) -> impl Iterator<Item = (u64, u64, &S)> + '_ {
        self.map.iter().map(|(&start, e)| (start, e.len, &e.src))
    }

    pub fn clear(&mut self) {
        self.map.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute force: per sector, the (seq, tag) of its newest record.
    fn check(ops: &[(u64, u64, u64)], sectors: u64) {
        let mut ov: Overlay = Overlay::new();
        let mut model = vec![None::<(u64, u64)>; sectors as usize];
        for &(start, len, seq) in ops {
            // Encode the record and the sector inside it in the position.
            ov.insert(start, len, seq, Source::Log { segment: dummy(), position: seq << 32 });
            for s in start..start + len {
                let m = &mut model[s as usize];
                if m.is_none_or(|(old, _)| old <= seq) {
                    *m = Some((seq, ((seq << 32) + (s - start) * SECTOR_BYTES)));
                }
            }
        }
        let mut got = vec![None; sectors as usize];
        for p in ov.lookup(0, sectors) {
            for s in p.start..p.start + p.len {
                got[s as usize] = match &p.src {
                    None => None,
                    Some(Source::Log { position, .. }) => {
                        Some((position >> 32, position + (s - p.start) * SECTOR_BYTES))
                    }
                    Some(Source::Zero) => unreachable!(),
                };
            }
        }
        assert_eq!(got, model, "ops {ops:?}");
        assert!(ov.extent_count() <= 3 * ops.len() + 1);
    }

    fn dummy() -> Arc<Segment> {
        use crate::storage::{MemStorage, OpenMode, Storage};
        let s = MemStorage::new();
        let file = s.open(std::path::Path::new("/f"), OpenMode::Create).unwrap();
        let header = crate::wal::SegmentHeader { index: 1, segment_bytes: 1 << 20, first_seq: 1, log_id: 1 };
        Arc::new(Segment { header, file })
    }

    #[test]
    fn newest_seq_wins_in_any_arrival_order() {
        check(&[(0, 8, 1), (2, 2, 2), (1, 10, 3)], 16);
        check(&[(1, 10, 3), (2, 2, 2), (0, 8, 1)], 16);
        check(&[(4, 4, 5), (0, 16, 1), (6, 1, 7), (0, 3, 6)], 16);
        let mut x = 99u64;
        for _ in 0..300 {
            let mut ops = Vec::new();
            for seq in 1..12 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let start = (x >> 33) % 30;
                let len = 1 + (x >> 45) % 12;
                ops.push((start, len, seq));
            }
            // Shuffle arrival order deterministically.
            ops.sort_by_key(|&(s, l, q)| (s * 7 + l * 3 + q * 5) % 11);
            check(&ops, 48);
        }
    }

    #[test]
    fn lookup_reports_gaps_and_remove_through_drops_old_extents() {
        let mut ov: Overlay = Overlay::new();
        ov.insert(4, 4, 1, Source::Zero);
        ov.insert(10, 2, 2, Source::Zero);
        let pieces: Vec<(u64, u64, bool)> =
            ov.lookup(0, 16).iter().map(|p| (p.start, p.len, p.src.is_some())).collect();
        assert_eq!(pieces, vec![(0, 4, false), (4, 4, true), (8, 2, false), (10, 2, true), (12, 4, false)]);
        assert_eq!(ov.remove_through(1), 1);
        assert_eq!(ov.max_seq(), 2);
        assert!(ov.lookup(5, 1)[0].src.is_none());
    }
}
