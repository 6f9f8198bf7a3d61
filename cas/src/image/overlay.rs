//! The overlay index: for each 512-byte sector of the image written since
//! the last compaction, where its newest bytes are.
//!
//! ```text
//!  BTreeMap<start sector, Extent { len sectors, seq, source }>
//!
//!   sectors:  0    8        24   32
//!             [ A ][   B    ][ C ]        non-overlapping extents
//!   A, B: Source::Log { segment, position_bytes }   bytes in a WAL segment
//!   C:    Source::Zero                               WRITE_ZEROES / DISCARD
//!   gaps: not in the overlay -> the manifest (a chunk, or a hole = zeros)
//! ```
//!
//! Newest wins by seq, not by arrival: inserting an extent only replaces
//! the parts of older extents (lower seq) it overlaps, so concurrent
//! writers that make their writes visible out of seq order leave the same
//! index that replay in seq order builds.
//!
//! Reclamation: a second index orders extents by `(seq, start)`, so
//! [`Overlay::remove_through`] finds the extents a manifest commit covers
//! without walking the others, and removes at most a given number per call
//! (the image releases its lock between calls). It also raises a floor:
//! a record at or below it is in the manifest, so inserting it later (a
//! writer inserts after its record was already compacted) is dropped;
//! otherwise it would shadow newer compacted data.
//!
//! Bound: each insert adds at most one new extent per gap between newer
//! extents plus two split remainders, so the extent count stays below
//! three times the records in the log, which the log quota bounds.
//!
//! The map is generic over its source type: the compactor builds the same
//! index over the records of one batch, with sources in its own buffer.

use crate::units::SECTOR_BYTES;
use crate::wal::Segment;
use smallvec::SmallVec;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Pieces a lookup returns in place: a read mostly meets the manifest, one
/// log extent, or both with a gap on either side.
pub const INLINE_PIECES: usize = 4;

/// The result of [`Overlay::lookup`].
pub type Pieces<S> = SmallVec<[Piece<S>; INLINE_PIECES]>;

/// Where an extent's bytes are.
#[derive(Clone, Debug)]
pub enum Source {
    /// Reads as zeros (WRITE_ZEROES, DISCARD), hiding the manifest.
    Zero,
    /// In a WAL segment, starting `position_bytes` into its file.
    Log { segment: Arc<Segment>, position_bytes: u64 },
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
            Source::Log { segment, position_bytes } => Source::Log {
                segment: segment.clone(),
                position_bytes: position_bytes + sectors * SECTOR_BYTES,
            },
        }
    }
}

#[derive(Clone, Debug)]
struct Extent<S> {
    sectors: u64,
    seq: u64,
    src: S,
}

/// One contiguous part of a lookup, in sectors.
#[derive(Clone, Debug)]
pub struct Piece<S = Source> {
    pub start_sector: u64,
    pub sectors: u64,
    /// None: not in the overlay (ask the manifest).
    pub src: Option<S>,
}

#[derive(Debug)]
pub struct Overlay<S = Source> {
    /// Start sector -> extent.
    map: BTreeMap<u64, Extent<S>>,
    /// `(seq, start sector)` of every extent in `map`.
    by_seq: BTreeSet<(u64, u64)>,
    /// Records at or below this seq were removed as compacted: inserts of
    /// them are dropped.
    removed_through: u64,
}

impl<S> Default for Overlay<S> {
    fn default() -> Self {
        Overlay { map: BTreeMap::new(), by_seq: BTreeSet::new(), removed_through: 0 }
    }
}

impl<S: Advance> Overlay<S> {
    pub fn new() -> Overlay<S> {
        Overlay::default()
    }

    pub fn extent_count(&self) -> usize {
        self.map.len()
    }

    /// Adds an extent at `start_sector` (the place is free), in both indexes.
    fn put(&mut self, start_sector: u64, e: Extent<S>) {
        self.by_seq.insert((e.seq, start_sector));
        let old = self.map.insert(start_sector, e);
        assert!(old.is_none(), "overlay extents never share a start");
    }

    /// Takes out the extent at `start_sector`, from both indexes.
    fn take(&mut self, start_sector: u64) -> Extent<S> {
        let e = self.map.remove(&start_sector).expect("an extent starts here");
        assert!(self.by_seq.remove(&(e.seq, start_sector)), "the seq index lists every extent");
        e
    }

    /// Takes out every extent overlapping sectors `[start, end)`, with
    /// their start sectors.
    fn take_overlapping(&mut self, start: u64, end: u64) -> Vec<(u64, Extent<S>)> {
        let mut keys: Vec<u64> = Vec::new();
        if let Some((&k, e)) = self.map.range(..start).next_back() {
            if k + e.sectors > start {
                keys.push(k);
            }
        }
        keys.extend(self.map.range(start..end).map(|(&k, _)| k));
        keys.into_iter().map(|k| (k, self.take(k))).collect()
    }

    /// Records that sectors `[start_sector, start_sector + sectors)` now
    /// come from `src`, as of record `seq`, except where a newer record
    /// already says otherwise. A record at or below what `remove_through`
    /// removed is dropped: the manifest holds it, or something newer.
    pub fn insert(&mut self, start_sector: u64, sectors: u64, seq: u64, src: S) {
        assert!(sectors > 0, "empty extent");
        if seq <= self.removed_through {
            return;
        }
        let end = start_sector + sectors;
        let mut newer: Vec<(u64, u64)> = Vec::new();
        for (k, e) in self.take_overlapping(start_sector, end) {
            let e_end = k + e.sectors;
            if e.seq > seq {
                newer.push((k.max(start_sector), e_end.min(end)));
                self.put(k, e);
                continue;
            }
            if k < start_sector {
                self.put(k, Extent { sectors: start_sector - k, seq: e.seq, src: e.src.clone() });
            }
            if e_end > end {
                self.put(end, Extent { sectors: e_end - end, seq: e.seq, src: e.src.advanced(end - k) });
            }
        }
        newer.sort_unstable();
        let mut cur = start_sector;
        for (ns, ne) in newer.into_iter().chain(std::iter::once((end, end))) {
            if cur < ns {
                self.put(cur, Extent { sectors: ns - cur, seq, src: src.advanced(cur - start_sector) });
            }
            cur = cur.max(ne);
        }
    }

    /// The pieces covering sectors `[start_sector, start_sector + sectors)`,
    /// in order, gaps included. Up to [`INLINE_PIECES`] pieces are returned
    /// without a heap allocation (a read that crosses more extents than
    /// that is rare).
    pub fn lookup(&self, start_sector: u64, sectors: u64) -> Pieces<S> {
        let end = start_sector + sectors;
        let mut out = Pieces::new();
        let mut cur = start_sector;
        let first = self.map.range(..start_sector).next_back().filter(|(&k, e)| k + e.sectors > start_sector);
        for (&k, e) in first.into_iter().chain(self.map.range(start_sector..end)) {
            if k > cur {
                out.push(Piece { start_sector: cur, sectors: k - cur, src: None });
                cur = k;
            }
            let piece_end = (k + e.sectors).min(end);
            out.push(Piece {
                start_sector: cur,
                sectors: piece_end - cur,
                src: Some(e.src.advanced(cur - k)),
            });
            cur = piece_end;
        }
        if cur < end {
            out.push(Piece { start_sector: cur, sectors: end - cur, src: None });
        }
        out
    }

    /// Drops extents from records with seq <= `covered_seq` (their data is
    /// now in the manifest), at most `max` of them, oldest first, and from
    /// now on drops inserts of such records. Returns the sources removed
    /// (for the caller to drop outside its lock) and whether covered
    /// extents remain. Work: O(removed x log extents); the others are not
    /// visited.
    pub fn remove_through(&mut self, covered_seq: u64, max: usize) -> (Vec<S>, bool) {
        self.removed_through = self.removed_through.max(covered_seq);
        let mut removed = Vec::new();
        while let Some(&(seq, start)) = self.by_seq.first() {
            if seq > covered_seq {
                break;
            }
            if removed.len() == max {
                return (removed, true);
            }
            removed.push(self.take(start).src);
        }
        (removed, false)
    }

    /// The highest seq any extent holds (0 if empty).
    pub fn max_seq(&self) -> u64 {
        self.by_seq.last().map_or(0, |&(seq, _)| seq)
    }

    /// Every extent in sector order: `(start_sector, sectors, source)`.
    pub fn extents(&self) -> impl Iterator<Item = (u64, u64, &S)> + '_ {
        self.map.iter().map(|(&start, e)| (start, e.sectors, &e.src))
    }

    /// Empties the overlay (the floor of `remove_through` stays).
    pub fn clear(&mut self) {
        self.map.clear();
        self.by_seq.clear();
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
            ov.insert(start, len, seq, Source::Log { segment: dummy(), position_bytes: seq << 32 });
            for s in start..start + len {
                let m = &mut model[s as usize];
                if m.is_none_or(|(old, _)| old <= seq) {
                    *m = Some((seq, ((seq << 32) + (s - start) * SECTOR_BYTES)));
                }
            }
        }
        let mut got = vec![None; sectors as usize];
        for p in ov.lookup(0, sectors) {
            for s in p.start_sector..p.start_sector + p.sectors {
                got[s as usize] = match &p.src {
                    None => None,
                    Some(Source::Log { position_bytes, .. }) => {
                        Some((position_bytes >> 32, position_bytes + (s - p.start_sector) * SECTOR_BYTES))
                    }
                    Some(Source::Zero) => unreachable!(),
                };
            }
        }
        assert_eq!(got, model, "ops {ops:?}");
        assert!(ov.extent_count() <= 3 * ops.len() + 1);
        let by_seq: BTreeSet<(u64, u64)> = ov.map.iter().map(|(&k, e)| (e.seq, k)).collect();
        assert_eq!(ov.by_seq, by_seq, "the seq index lists exactly the extents");
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
            ov.lookup(0, 16).iter().map(|p| (p.start_sector, p.sectors, p.src.is_some())).collect();
        assert_eq!(pieces, vec![(0, 4, false), (4, 4, true), (8, 2, false), (10, 2, true), (12, 4, false)]);
        assert_eq!(ov.remove_through(1, usize::MAX).0.len(), 1);
        assert_eq!(ov.max_seq(), 2);
        assert!(ov.lookup(5, 1)[0].src.is_none());
    }

    /// Reclamation removes exactly the covered extents, in bounded steps,
    /// and visits only those: the step count follows what is removed, not
    /// what stays.
    #[test]
    fn remove_through_takes_only_covered_extents_in_bounded_steps() {
        let mut ov: Overlay = Overlay::new();
        // 1000 old extents (seq 1..=1000) and 5000 newer ones elsewhere.
        for seq in 1..=6000u64 {
            ov.insert(seq * 16, 8, seq, Source::Zero);
        }
        let mut removed = 0;
        let mut calls = 0;
        loop {
            let (gone, more) = ov.remove_through(1000, 64);
            assert!(gone.len() <= 64);
            removed += gone.len();
            calls += 1;
            if !more {
                break;
            }
        }
        assert_eq!(removed, 1000);
        assert_eq!(calls, 1000 / 64 + 1);
        assert_eq!(ov.extent_count(), 5000);
        assert!(ov.lookup(16, 8)[0].src.is_none(), "seq 1 is gone");
        assert!(ov.lookup(1001 * 16, 8)[0].src.is_some(), "seq 1001 stays");
        // Nothing covered is left: one call, nothing removed.
        assert_eq!(ov.remove_through(1000, 64).0.len(), 0);
    }

    /// Regression: a writer inserts its extent after its record was
    /// compacted and reclaimed (it completed, a flush made it durable and a
    /// pass covered it, all before the insert). The late extent must not
    /// shadow the manifest, which holds a newer record of those sectors.
    #[test]
    fn a_record_inserted_after_its_reclamation_is_dropped() {
        let mut ov: Overlay = Overlay::new();
        // Record 2 (newer) inserted; record 1 (older, same sectors) not yet.
        ov.insert(0, 8, 2, Source::Zero);
        // A pass covers both; reclamation removes what the overlay holds.
        assert_eq!(ov.remove_through(2, usize::MAX).0.len(), 1);
        // Record 1's writer inserts now.
        ov.insert(0, 8, 1, Source::Zero);
        assert!(ov.lookup(0, 8)[0].src.is_none(), "sectors read from the manifest");
        assert_eq!(ov.extent_count(), 0);
        // Records above the floor are still taken.
        ov.insert(0, 8, 3, Source::Zero);
        assert_eq!(ov.extent_count(), 1);
    }
}
