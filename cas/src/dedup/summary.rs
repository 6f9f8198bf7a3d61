//! The in-memory summary of the on-disk runs: 4 bytes per entry, saying
//! which runs may hold a hash.
//!
//! ```text
//!  hash bits:   | 0..12: partition (4,096) | 12..36: fingerprint (24 bits) | ...
//!  element:     fingerprint << 8 | run slot (u8)        one u32 per entry
//!  partition p: sorted Vec<u32> of its elements, exact capacity
//! ```
//!
//! A lookup searches its partition for elements of its fingerprint,
//! starting where a uniform fingerprint would sit (interpolation, then a
//! galloping search); each names a run slot whose run may hold the hash (a
//! false candidate costs one page read; the run's page is checked against
//! the full hash). With N entries a miss finds a false candidate with
//! probability N / 2^36 (0.4% at 2^28 entries, a TiB of 4 KiB chunks).
//! The fixed cost is one Vec header per partition (96 KiB).
//!
//! Sampling: only partitions below `limit` are summarized. When the
//! summary would outgrow its share of the memory budget the limit halves
//! and the upper half of the partitions is dropped: hashes there are no
//! longer found by dedup (they are stored again), which lowers the dedup
//! ratio instead of failing writes, like dm-vdo's sparse index. Hashes
//! are uniform, so the fraction summarized is `limit / 4,096`.

use super::run::KEY_BYTES;
use crate::error::Result;

pub(crate) const PARTITIONS: usize = 1 << 12;

/// Bytes of one element.
pub(crate) const ELEMENT_BYTES: u64 = 4;

/// Partition and fingerprint of hash (or summary key) bytes 0..5.
pub(crate) fn split(key: &[u8]) -> (usize, u32) {
    let bits = u64::from_be_bytes([0, 0, 0, key[0], key[1], key[2], key[3], key[4]]);
    ((bits >> 28) as usize, (bits >> 4) as u32 & 0xff_ffff)
}

/// The first index of `part` (sorted) whose element is at least
/// `target`, searched outward from `guess`.
fn lower_bound_near(part: &[u32], target: u32, guess: usize) -> usize {
    let n = part.len();
    let g = guess.min(n.saturating_sub(1));
    if n == 0 {
        return 0;
    }
    let (mut lo, mut hi);
    if part[g] < target {
        // The answer is right of g: gallop until an element >= target.
        let mut step = 1;
        lo = g + 1;
        loop {
            let probe = g + step;
            if probe >= n {
                hi = n;
                break;
            }
            if part[probe] >= target {
                hi = probe;
                break;
            }
            lo = probe + 1;
            step *= 2;
        }
    } else {
        // At or left of g.
        let mut step = 1;
        hi = g;
        loop {
            if step > g {
                lo = 0;
                break;
            }
            let probe = g - step;
            if part[probe] < target {
                lo = probe + 1;
                break;
            }
            hi = probe;
            step *= 2;
        }
    }
    lo + part[lo..hi].partition_point(|&e| e < target)
}

/// A replacement of run slots in the summary done a batch of partitions
/// at a time (`step`), so that its owner can let others take its locks in
/// between. Until it is done, partitions below `next_part` name the new
/// slot and the others still name the dropped ones, so both the new run
/// and the dropped runs must stay readable.
pub(crate) struct Replace {
    drop: [bool; 256],
    any_dropped: bool,
    slot: u8,
    started: bool,
    pending: Option<[u8; KEY_BYTES]>,
    next_part: usize,
}

impl Replace {
    pub fn new(dropped: &[u8], slot: u8) -> Replace {
        let mut drop = [false; 256];
        for &d in dropped {
            drop[usize::from(d)] = true;
        }
        Replace { drop, any_dropped: !dropped.is_empty(), slot, started: false, pending: None, next_part: 0 }
    }

    /// Replaces in up to `parts` more partitions of `summary`, reading the
    /// new run's keys from `next`; true when every partition is done.
    pub fn step(
        &mut self,
        summary: &mut Summary,
        next: &mut dyn FnMut() -> Result<Option<[u8; KEY_BYTES]>>,
        parts: usize,
    ) -> Result<bool> {
        summary.replace_parts(self, next, parts)
    }
}

pub(crate) struct Summary {
    parts: Vec<Vec<u32>>,
    len: u64,
    /// Partitions `>= limit` are not summarized (a power of two, at most
    /// `PARTITIONS`).
    limit: usize,
}

impl Summary {
    pub fn new(limit: usize) -> Summary {
        assert!(limit.is_power_of_two() && limit <= PARTITIONS, "summary limit {limit}");
        Summary { parts: vec![Vec::new(); PARTITIONS], len: 0, limit }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Elements held.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Heap bytes: the elements plus one Vec header per partition.
    pub fn memory_bytes(&self) -> u64 {
        let elements: usize = self.parts.iter().map(|p| p.capacity()).sum();
        elements as u64 * ELEMENT_BYTES + (PARTITIONS * std::mem::size_of::<Vec<u32>>()) as u64
    }

    /// Heap bytes `entries` elements would take.
    #[cfg(test)]
    pub fn bytes_for(entries: u64) -> u64 {
        entries * ELEMENT_BYTES + (PARTITIONS * std::mem::size_of::<Vec<u32>>()) as u64
    }

    /// Calls `f` with every run slot that may hold the hash starting with
    /// `key` (bytes 0..5), each once.
    pub fn candidates(&self, key: &[u8], mut f: impl FnMut(u8)) {
        let (p, fp) = split(key);
        if p >= self.limit {
            return;
        }
        let part = &self.parts[p];
        let guess = ((u64::from(fp) * part.len() as u64) >> 24) as usize;
        let lo = lower_bound_near(part, fp << 8, guess);
        let mut last = None;
        for &e in part[lo..].iter().take_while(|&&e| e >> 8 == fp) {
            let slot = e as u8;
            if last != Some(slot) {
                f(slot);
                last = Some(slot);
            }
        }
    }

    /// Removes the elements of every slot in `dropped` (runs merged
    /// away) and adds the keys `next` yields (hash bytes 0..5, in hash
    /// order) as run slot `slot`. Each partition touched is rebuilt with
    /// exact capacity. On an error from `next` the summary holds part of
    /// the new run's keys (lookups may miss, never find wrongly).
    pub fn replace(
        &mut self,
        dropped: &[u8],
        slot: u8,
        next: &mut dyn FnMut() -> Result<Option<[u8; KEY_BYTES]>>,
    ) -> Result<()> {
        let mut r = Replace::new(dropped, slot);
        while !r.step(self, next, PARTITIONS)? {}
        Ok(())
    }

    /// One step of `r`: up to `parts` more partitions; true when done.
    fn replace_parts(
        &mut self,
        r: &mut Replace,
        next: &mut dyn FnMut() -> Result<Option<[u8; KEY_BYTES]>>,
        parts: usize,
    ) -> Result<bool> {
        if !r.started {
            r.pending = next()?;
            r.started = true;
        }
        let mut added: Vec<u32> = Vec::new();
        let end = (r.next_part + parts).min(self.limit);
        for p in r.next_part..end {
            added.clear();
            while let Some(k) = r.pending {
                let (kp, fp) = split(&k);
                if kp > p {
                    break;
                }
                // Keys out of order (kp < p) are skipped: a miss, not a wrong find.
                if kp == p {
                    added.push(fp << 8 | u32::from(r.slot));
                }
                r.pending = next()?;
            }
            let part = &mut self.parts[p];
            let before = part.len();
            if r.any_dropped {
                part.retain(|&e| !r.drop[(e & 0xff) as usize]);
            }
            if added.is_empty() {
                if part.len() != before {
                    part.shrink_to_fit();
                }
                self.len = self.len + part.len() as u64 - before as u64;
                continue;
            }
            let mut merged = Vec::with_capacity(part.len() + added.len());
            let (mut i, mut j) = (0, 0);
            while i < part.len() && j < added.len() {
                if part[i] <= added[j] {
                    merged.push(part[i]);
                    i += 1;
                } else {
                    merged.push(added[j]);
                    j += 1;
                }
            }
            merged.extend_from_slice(&part[i..]);
            merged.extend_from_slice(&added[j..]);
            self.len = self.len + merged.len() as u64 - before as u64;
            *part = merged;
        }
        r.next_part = end;
        Ok(end >= self.limit)
    }

    /// Halves the partitions summarized (drops the upper half); returns
    /// the elements dropped.
    pub fn halve(&mut self) -> u64 {
        let half = (self.limit / 2).max(1);
        let mut dropped = 0;
        for part in &mut self.parts[half..self.limit] {
            dropped += part.len() as u64;
            *part = Vec::new();
        }
        self.limit = half;
        self.len -= dropped;
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(p: u16, fp: u32) -> [u8; 5] {
        let bits = u64::from(p) << 28 | u64::from(fp) << 4;
        bits.to_be_bytes()[3..].try_into().unwrap()
    }

    /// `replace` with keys from a byte string.
    fn put(s: &mut Summary, dropped: &[u8], slot: u8, keys: &[u8]) {
        let mut it = keys.chunks_exact(KEY_BYTES).map(|k| k.try_into().unwrap());
        s.replace(dropped, slot, &mut || Ok(it.next())).unwrap();
    }

    fn slots_of(s: &Summary, k: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        s.candidates(k, |slot| v.push(slot));
        v
    }

    #[test]
    fn keys_split_into_partition_and_fingerprint() {
        assert_eq!(split(&key(0xabc, 0x12_3456)), (0xabc, 0x12_3456));
        assert_eq!(split(&[0xff, 0xff, 0xff, 0xff, 0xff]), (PARTITIONS - 1, 0xff_ffff));
    }

    #[test]
    fn candidates_name_the_runs_of_a_fingerprint() {
        let mut s = Summary::new(PARTITIONS);
        let run_a: Vec<u8> = [key(1, 5), key(1, 9), key(7, 5)].concat();
        let run_b: Vec<u8> = [key(1, 9), key(9, 1)].concat();
        put(&mut s, &[], 3, &run_a);
        put(&mut s, &[], 4, &run_b);
        assert_eq!(s.len(), 5);
        assert_eq!(slots_of(&s, &key(1, 9)), vec![3, 4]);
        assert_eq!(slots_of(&s, &key(1, 5)), vec![3]);
        assert_eq!(slots_of(&s, &key(2, 5)), Vec::<u8>::new());
        // Merging both into slot 5.
        let merged: Vec<u8> = [key(1, 5), key(1, 9), key(7, 5), key(9, 1)].concat();
        put(&mut s, &[3, 4], 5, &merged);
        assert_eq!(s.len(), 4);
        assert_eq!(slots_of(&s, &key(1, 9)), vec![5]);
        assert_eq!(slots_of(&s, &key(9, 1)), vec![5]);
        assert_eq!(s.memory_bytes(), Summary::bytes_for(4));
    }

    #[test]
    fn the_search_finds_every_fingerprint_from_any_guess() {
        let part: Vec<u32> = (0..500u32).map(|i| (i * 7) << 8 | (i % 3)).collect();
        for target in 0..3600u32 {
            let want = part.partition_point(|&e| e < target << 8);
            for guess in [0, 1, 17, 250, 499, 1000] {
                assert_eq!(
                    lower_bound_near(&part, target << 8, guess),
                    want,
                    "target {target} guess {guess}"
                );
            }
        }
        assert_eq!(lower_bound_near(&[], 5, 3), 0);
    }

    #[test]
    fn halving_drops_the_upper_partitions() {
        let mut s = Summary::new(PARTITIONS);
        let keys: Vec<u8> = (0..PARTITIONS as u16).step_by(16).flat_map(|p| key(p, 1)).collect();
        put(&mut s, &[], 0, &keys);
        assert_eq!(s.len(), 256);
        assert_eq!(s.halve(), 128);
        assert!(slots_of(&s, &key(PARTITIONS as u16 / 2, 1)).is_empty());
        assert_eq!(slots_of(&s, &key(0x10, 1)), vec![0]);
        // Later runs add only covered partitions.
        put(&mut s, &[], 1, &[key(0x10, 2), key(0x900, 2)].concat());
        assert_eq!(s.len(), 129);
    }
}
