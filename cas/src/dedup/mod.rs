//! The dedup index: chunk hash -> where the chunk is stored, kept on disk
//! as sorted runs with a small summary in memory (issue 17).
//!
//! ```text
//!   memtable   HashMap of the entries since the last flush (the index
//!              journal is its write-ahead log)
//!   frozen     the memtable being written out by a flush (still read)
//!   runs       sorted files (run.rs), oldest to newest, each with its
//!              fences in memory (8 bytes per 92 entries)
//!   summary    4 bytes per run entry: partition + 24-bit fingerprint +
//!              run slot (summary.rs)
//! ```
//!
//! Reads never come here: manifest leaves hold locations. The index is
//! asked by inserts (is this hash stored?), by GC (where is the chunk a
//! leaf without a location names; is this slot's content the entry's),
//! and by reads of leaves written before locations.
//!
//! Entries are never removed or changed in place: a new location is a
//! newer entry, and whether an entry still holds is decided by the chunk
//! store's slot bitmaps (`valid`): a slot once freed is never used again
//! (packs are append-only and pack ids are never reused), so a stale entry
//! can never become valid again. Merges drop stale entries and older
//! duplicates.
//!
//! Flushes write the memtable as a level-0 run. Whenever a level holds
//! `FAN_IN` runs, its oldest `FAN_IN` are merged into one run of the next
//! level, which takes their place (merge.rs: on a thread of its own, one
//! merge at a time), so an entry is rewritten about log8(entries /
//! memtable) times and a level holds 7 runs, plus those flushed while a
//! merge runs (the store waits for a merge past `MERGE_WAIT_RUNS` runs).

pub(crate) mod fuzz;
pub mod key;
pub(crate) mod merge;
pub(crate) mod root;
pub(crate) mod run;
pub(crate) mod slots;
pub(crate) mod summary;

pub use fuzz::{fuzz_decode_dedup, fuzz_reseal_dedup, fuzz_sample_dedup};

use crate::error::Result;
use crate::io::Wait;
use crate::storage::Storage;
use crate::units::{ChunkHash, ChunkLoc, ChunkTag};
use key::{Key, PrefixBuild};
use run::{Entry, Run, RunWriter};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use summary::Summary;

/// The entries since the last flush.
pub(crate) type MemTable = HashMap<Key, ChunkLoc, PrefixBuild>;

/// Runs of one level merged into one run of the next.
pub(crate) const FAN_IN: usize = 8;
/// Run slots (the summary names a run in 8 bits).
const SLOTS: usize = 256;

/// `<prefix><16 hex digits>`: the file name of index file `id`.
pub(crate) fn file_name(prefix: &str, id: u64) -> String {
    format!("{prefix}{id:016x}")
}

/// The id in a name `file_name(prefix, id)` made.
pub(crate) fn parse_file_name(name: &str, prefix: &str) -> Option<u64> {
    let hex = name.strip_prefix(prefix)?;
    (hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u64::from_str_radix(hex, 16).ok())?
}

/// Bytes of one memtable bucket (key, location, control byte).
const MEM_BUCKET_BYTES: u64 = (std::mem::size_of::<(Key, ChunkLoc)>() + 1) as u64;

/// Heap bytes of a memtable (estimated from its capacity).
pub(crate) fn mem_bytes(m: &MemTable) -> u64 {
    mem_bytes_for(m.capacity())
}

/// Heap bytes of a memtable that holds `entries` without growing.
pub(crate) fn mem_bytes_for(entries: usize) -> u64 {
    key::buckets(entries) * MEM_BUCKET_BYTES
}

pub(crate) struct DedupIndex {
    pub mem: MemTable,
    pub frozen: Option<Arc<MemTable>>,
    /// Oldest first, with the summary slot each holds.
    runs: Vec<(u8, Arc<Run>)>,
    summary: Summary,
    /// What the summary may take; past it, it halves (see summary.rs).
    summary_budget: u64,
}

/// A flush's or merge's run being installed a batch of summary
/// partitions at a time, so that inserts (which take the same locks) run
/// in between: from `begin_*` to `finish_install` the new run is among
/// the runs beside those it replaces (and a flush's frozen memtable is
/// still read), so a lookup finds its entries whichever partitions are
/// done (summary::Replace).
pub(crate) struct Install {
    merged: Vec<Arc<Run>>,
    flush: bool,
    replace: summary::Replace,
    keys: Option<run::KeyStream>,
}

/// Where an entry was found (for counting what lookups cost).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ProbeCost {
    pub page_reads: u64,
}

impl DedupIndex {
    pub fn new(summary_limit: usize, summary_budget: u64) -> DedupIndex {
        DedupIndex {
            mem: MemTable::default(),
            frozen: None,
            runs: Vec::new(),
            summary: Summary::new(summary_limit),
            summary_budget,
        }
    }

    /// The dedup lookup: the newest valid entry of `hash` in the memtables
    /// or in a run the summary names. A hash in a partition the summary
    /// no longer covers is found only in the memtables.
    pub fn probe(
        &self,
        hash: &ChunkHash,
        valid: &dyn Fn(ChunkLoc) -> bool,
        cost: &mut ProbeCost,
    ) -> Result<Option<ChunkLoc>> {
        let key = Key(*hash);
        for m in std::iter::once(&self.mem).chain(self.frozen.as_deref()) {
            if let Some(&at) = m.get(&key) {
                if valid(at) {
                    return Ok(Some(at));
                }
            }
        }
        let mut slots = smallvec::SmallVec::<[u8; 4]>::new();
        self.summary.candidates(hash.as_bytes(), |s| slots.push(s));
        if slots.is_empty() {
            return Ok(None);
        }
        for (slot, run) in self.runs.iter().rev() {
            if !slots.contains(slot) {
                continue;
            }
            cost.page_reads += 1;
            if let Some(e) = run.find(&hash.tag(), Wait::Block)? {
                if e.hash == *hash && valid(e.at) {
                    return Ok(Some(e.at));
                }
            }
        }
        Ok(None)
    }

    /// The newest entry of the chunk `tag` names for which `valid` holds,
    /// looking in every run (not only those the summary names): exact
    /// whatever the summary covers.
    pub fn find(&self, tag: &ChunkTag, valid: &dyn Fn(ChunkLoc) -> bool) -> Result<Option<Entry>> {
        self.find_in(tag, valid, Wait::Block)
    }

    /// [`Index::find`], reading run pages as `wait` allows.
    pub fn find_in(
        &self,
        tag: &ChunkTag,
        valid: &dyn Fn(ChunkLoc) -> bool,
        wait: Wait,
    ) -> Result<Option<Entry>> {
        let key = Key::of_tag(tag);
        for m in std::iter::once(&self.mem).chain(self.frozen.as_deref()) {
            if let Some((k, &at)) = m.get_key_value(&key) {
                if valid(at) {
                    return Ok(Some(Entry { hash: k.0, at }));
                }
            }
        }
        for (_, run) in self.runs.iter().rev() {
            if let Some(e) = run.find(tag, wait)? {
                if valid(e.at) {
                    return Ok(Some(e));
                }
            }
        }
        Ok(None)
    }

    pub fn put(&mut self, hash: ChunkHash, at: ChunkLoc) {
        self.mem.insert(Key(hash), at);
    }

    /// Moves the memtable aside for a flush (still read until `install`).
    pub fn freeze(&mut self) -> Arc<MemTable> {
        assert!(self.frozen.is_none(), "one flush at a time");
        let m = Arc::new(std::mem::take(&mut self.mem));
        self.frozen = Some(m.clone());
        m
    }

    pub fn runs(&self) -> impl DoubleEndedIterator<Item = &Arc<Run>> {
        self.runs.iter().map(|(_, r)| r)
    }

    /// The next merge, if one is due (see the module docs): the oldest
    /// `FAN_IN` runs of the lowest level that has that many, and the
    /// merged run's level. Runs of a level are contiguous (levels never
    /// grow from older to newer runs), so the merged run takes their place.
    pub fn plan_merge(&self) -> Option<(Vec<Arc<Run>>, u32)> {
        let mut start = 0;
        let mut groups: Vec<(u32, usize, usize)> = Vec::new();
        while start < self.runs.len() {
            let level = self.runs[start].1.level;
            let len = self.runs[start..].iter().take_while(|(_, r)| r.level == level).count();
            groups.push((level, start, len));
            start += len;
        }
        let (level, start, _) = groups.into_iter().filter(|g| g.2 >= FAN_IN).min_by_key(|g| g.0)?;
        let inputs = self.runs[start..start + FAN_IN].iter().map(|(_, r)| r.clone()).collect();
        Some((inputs, level + 1))
    }

    /// Installs a flush's result: `new` (the frozen memtable as a level-0
    /// run; None when every entry was stale) becomes the newest run and
    /// the frozen memtable is dropped. Halves the summary while it is over
    /// its budget; returns the summary elements that dropped. Fails if the
    /// run's keys cannot be read back. (All at once: the store installs in
    /// steps, see [`Install`].)
    #[cfg(test)]
    pub fn install_flush(&mut self, new: Option<Run>) -> Result<u64> {
        let mut inst = self.begin_flush(new);
        while !self.install_step(&mut inst, summary::PARTITIONS)? {}
        Ok(self.finish_install(inst))
    }

    /// Installs a merge's result: the contiguous runs `merged` replaced by
    /// `new` (None when every entry was stale) in their place.
    #[cfg(test)]
    pub fn install_merge(&mut self, merged: &[Arc<Run>], new: Option<Run>) -> Result<u64> {
        let mut inst = self.begin_merge(merged, new);
        while !self.install_step(&mut inst, summary::PARTITIONS)? {}
        Ok(self.finish_install(inst))
    }

    /// Starts installing a flush's run (see [`Install`]).
    pub fn begin_flush(&mut self, new: Option<Run>) -> Install {
        let at = self.runs.len();
        self.begin(at, Vec::new(), new, true)
    }

    /// Starts installing a merge's run, just above its inputs.
    pub fn begin_merge(&mut self, merged: &[Arc<Run>], new: Option<Run>) -> Install {
        let first = merged.first().expect("a merge has inputs");
        let at =
            self.runs.iter().position(|(_, r)| Arc::ptr_eq(r, first)).expect("merged runs are installed");
        assert!(
            self.runs[at..].iter().zip(merged).filter(|((_, a), b)| Arc::ptr_eq(a, b)).count()
                == merged.len(),
            "merged runs are contiguous"
        );
        self.begin(at + merged.len(), merged.to_vec(), new, false)
    }

    /// Puts `new` among the runs at position `at` (the runs it replaces
    /// stay until `finish_install`), under a slot no run holds.
    fn begin(&mut self, at: usize, merged: Vec<Arc<Run>>, new: Option<Run>, flush: bool) -> Install {
        let dropped: Vec<u8> = self
            .runs
            .iter()
            .filter(|(_, r)| merged.iter().any(|m| Arc::ptr_eq(m, r)))
            .map(|(s, _)| *s)
            .collect();
        let free = (0..SLOTS as u16)
            .map(|s| s as u8)
            .find(|s| !self.runs.iter().any(|(used, _)| used == s))
            .expect("fewer than 256 runs");
        let keys = new.map(|run| {
            let run = Arc::new(run);
            self.runs.insert(at, (free, run.clone()));
            run.keys()
        });
        Install { merged, flush, replace: summary::Replace::new(&dropped, free), keys }
    }

    /// Replaces the summary's elements in up to `parts` more partitions;
    /// true when every partition is done.
    pub fn install_step(&mut self, inst: &mut Install, parts: usize) -> Result<bool> {
        let keys = &mut inst.keys;
        let mut next = || keys.as_mut().map_or(Ok(None), |k| k.next_key());
        inst.replace.step(&mut self.summary, &mut next, parts)
    }

    /// Ends an install whose steps are done: the replaced runs (and, for a
    /// flush, the frozen memtable) go. Halves the summary while it is over
    /// its budget; returns the elements dropped.
    pub fn finish_install(&mut self, inst: Install) -> u64 {
        self.runs.retain(|(_, r)| !inst.merged.iter().any(|m| Arc::ptr_eq(m, r)));
        if inst.flush {
            self.frozen = None;
        }
        self.fit_summary()
    }

    /// Adds a run read at open (oldest first), streaming its keys into the
    /// summary.
    pub fn add_opened(&mut self, run: Run) -> Result<()> {
        let slot = self.runs.len() as u8;
        assert!(self.runs.len() < SLOTS, "too many runs");
        let run = Arc::new(run);
        let mut keys = run.keys();
        self.summary.replace(&[], slot, &mut || keys.next_key())?;
        self.runs.push((slot, run));
        Ok(())
    }

    /// Halves the summary until it fits its budget (or covers one
    /// partition); returns the elements dropped.
    pub fn fit_summary(&mut self) -> u64 {
        let mut dropped = 0;
        while self.summary.memory_bytes() > self.summary_budget && self.summary.limit() > 1 {
            dropped += self.summary.halve();
        }
        if dropped > 0 {
            tracing::warn!(
                dropped,
                summarized_fraction = self.summary.limit() as f64 / summary::PARTITIONS as f64,
                "dedup index summary over its memory budget: part of the stored chunks is no longer found by dedup"
            );
        }
        dropped
    }

    pub fn set_summary_budget(&mut self, bytes: u64) {
        self.summary_budget = bytes;
    }

    pub fn summary_limit(&self) -> usize {
        self.summary.limit()
    }

    /// Entries in the runs (stale ones included) and in the memtables.
    #[cfg(test)]
    pub fn entries(&self) -> u64 {
        let runs: u64 = self.runs().map(|r| r.entries).sum();
        runs + self.mem.len() as u64 + self.frozen.as_ref().map_or(0, |f| f.len() as u64)
    }

    /// Summary elements (run entries in covered partitions).
    pub fn summarized(&self) -> u64 {
        self.summary.len()
    }

    /// Heap bytes: memtables, summary, fences.
    pub fn memory_bytes(&self) -> u64 {
        let mem = mem_bytes(&self.mem) + self.frozen.as_deref().map_or(0, mem_bytes);
        mem + self.summary.memory_bytes() + self.runs().map(|r| r.memory_bytes()).sum::<u64>()
    }
}

/// The entries of a frozen memtable in hash order.
pub(crate) fn sorted_entries(m: &MemTable) -> Vec<Entry> {
    let mut v: Vec<Entry> = m.iter().map(|(k, &at)| Entry { hash: k.0, at }).collect();
    v.sort_unstable_by(|a, b| run::hash_order(&a.hash, &b.hash));
    v
}

/// Writes run `id` at `level`: the entries of `inputs` (oldest first)
/// and `newest` (sorted), of each hash the newest entry for which `valid`
/// holds (none if it holds for none). None (and no file) if nothing is
/// left. A chunk with two live copies keeps the newer one's entry; GC
/// moves the other by its content (maintenance.rs).
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_merged(
    storage: &dyn Storage,
    dir: &Path,
    store_id: u64,
    id: u64,
    level: u32,
    inputs: &[Arc<Run>],
    newest: &[Entry],
    valid: &dyn Fn(ChunkLoc) -> bool,
) -> Result<Option<Run>> {
    let mut streams: Vec<run::RunStream> = inputs.iter().map(|r| r.stream()).collect();
    // Heads, by input: index `inputs.len()` is `newest`.
    let mut heads: Vec<Option<Entry>> = Vec::with_capacity(streams.len() + 1);
    for s in &mut streams {
        heads.push(s.next_entry()?);
    }
    let mut newest_at = 0;
    heads.push(newest.first().copied());
    let mut writer: Option<RunWriter> = None;
    loop {
        // The smallest hash; on a tie the newest input (the highest index).
        let mut best: Option<(usize, u64)> = None;
        for (i, h) in heads.iter().enumerate() {
            let Some(h) = h else { continue };
            let p = run::prefix_of(h.hash.as_bytes());
            let newer_or_smaller = match best {
                None => true,
                Some((b, bp)) => {
                    p < bp || (p == bp && h.hash.as_bytes() <= heads[b].expect("head").hash.as_bytes())
                }
            };
            if newer_or_smaller {
                best = Some((i, p));
            }
        }
        let Some((b, bp)) = best else { break };
        let hash = heads[b].expect("head").hash;
        // Of the inputs at this hash, the newest valid entry is kept (an
        // older copy may be the valid one: a chunk stored twice while the
        // summary did not cover it, whose newer copy was freed); advance
        // them all.
        let mut keep: Option<Entry> = None;
        for i in 0..heads.len() {
            let Some(h) = heads[i].filter(|h| run::prefix_of(h.hash.as_bytes()) == bp && h.hash == hash)
            else {
                continue;
            };
            if valid(h.at) {
                keep = Some(h);
            }
            heads[i] = if i == streams.len() {
                newest_at += 1;
                newest.get(newest_at).copied()
            } else {
                streams[i].next_entry()?
            };
        }
        let Some(winner) = keep else { continue };
        if writer.is_none() {
            writer = Some(RunWriter::create(storage, dir, id, level, store_id)?);
        }
        writer.as_mut().expect("created").push(&winner)?;
    }
    writer.map(|w| w.finish()).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemStorage;

    fn hash(i: u64) -> ChunkHash {
        ChunkHash::of(&i.to_le_bytes())
    }

    fn at(i: u64) -> ChunkLoc {
        ChunkLoc { pack: 1 + (i >> 10) as u32, slot: (i & 1023) as u32, crc: i as u32 }
    }

    /// Storage with the directory `/d` for runs, and an empty index whose
    /// summary covers every partition within `budget` bytes.
    fn index(budget: u64) -> (MemStorage, DedupIndex) {
        let s = MemStorage::new();
        s.create_dir_all(Path::new("/d")).unwrap();
        (s, DedupIndex::new(summary::PARTITIONS, budget))
    }

    /// Freezes `idx`'s memtable and writes it as level-0 run `next_id + 1`
    /// (not installed).
    fn write_level0(
        idx: &mut DedupIndex,
        s: &MemStorage,
        next_id: &mut u64,
        valid: &dyn Fn(ChunkLoc) -> bool,
    ) -> Option<Run> {
        let frozen = idx.freeze();
        *next_id += 1;
        write_merged(s, Path::new("/d"), 1, *next_id, 0, &[], &sorted_entries(&frozen), valid).unwrap()
    }

    /// Flushes `idx`'s memtable the way the chunk store does, then makes
    /// every merge due (in line).
    fn flush(idx: &mut DedupIndex, s: &MemStorage, next_id: &mut u64, valid: &dyn Fn(ChunkLoc) -> bool) {
        let new = write_level0(idx, s, next_id, valid);
        idx.install_flush(new).unwrap();
        while let Some((inputs, level)) = idx.plan_merge() {
            *next_id += 1;
            let new = write_merged(s, Path::new("/d"), 1, *next_id, level, &inputs, &[], valid).unwrap();
            idx.install_merge(&inputs, new).unwrap();
        }
    }

    #[test]
    fn flushes_and_merges_keep_every_entry_findable() {
        let (s, mut idx) = index(u64::MAX);
        let mut next_id = 0;
        let all = |_: ChunkLoc| true;
        let mut cost = ProbeCost::default();
        for round in 0..20u64 {
            for i in round * 100..(round + 1) * 100 {
                assert_eq!(idx.probe(&hash(i), &all, &mut cost).unwrap(), None);
                idx.put(hash(i), at(i));
            }
            flush(&mut idx, &s, &mut next_id, &all);
            let levels = idx.runs().map(|r| r.level).max().unwrap_or(0) as usize + 1;
            assert!(
                idx.runs().count() <= (FAN_IN - 1) * levels,
                "{} runs after round {round}",
                idx.runs().count()
            );
        }
        // 20 flushes: two level-1 runs of 8 plus four level-0 runs.
        let levels: Vec<u32> = idx.runs().map(|r| r.level).collect();
        assert_eq!(levels, vec![1, 1, 0, 0, 0, 0]);
        for i in 0..2000 {
            assert_eq!(idx.probe(&hash(i), &all, &mut cost).unwrap(), Some(at(i)), "entry {i}");
            assert_eq!(idx.find(&hash(i).tag(), &all).unwrap().map(|e| e.at), Some(at(i)));
        }
        assert_eq!(idx.summarized(), 2000);
        assert_eq!(idx.probe(&hash(5000), &all, &mut cost).unwrap(), None);
    }

    #[test]
    fn newer_entries_win_and_stale_ones_are_dropped_by_merges() {
        let (s, mut idx) = index(u64::MAX);
        let mut next_id = 0;
        let all = |_: ChunkLoc| true;
        for i in 0..50 {
            idx.put(hash(i), at(i));
        }
        flush(&mut idx, &s, &mut next_id, &all);
        // Chunk 3 moved (pack 9); chunks 10..20 freed (their slots fail `valid`).
        idx.put(hash(3), ChunkLoc { pack: 9, slot: 0, crc: 3 });
        let valid = |a: ChunkLoc| !(a.pack == 1 && (10..20).contains(&a.slot));
        let mut cost = ProbeCost::default();
        assert_eq!(idx.probe(&hash(3), &valid, &mut cost).unwrap().map(|a| a.pack), Some(9));
        assert_eq!(idx.probe(&hash(12), &valid, &mut cost).unwrap(), None);
        for k in 0..FAN_IN as u64 - 1 {
            if k > 0 {
                idx.put(hash(1000 + k), at(1000 + k));
            }
            flush(&mut idx, &s, &mut next_id, &valid);
        }
        assert_eq!(idx.runs().count(), 1, "everything merged");
        assert_eq!(idx.entries(), 40 + FAN_IN as u64 - 2);
        assert_eq!(idx.find(&hash(3).tag(), &all).unwrap().map(|e| e.at.pack), Some(9));
        assert_eq!(idx.find(&hash(12).tag(), &all).unwrap(), None, "dropped by the merge");
    }

    /// A merge that finishes after newer runs were flushed installs its run
    /// in its inputs' place: the newer runs still win.
    #[test]
    fn a_merge_installed_after_newer_flushes_stays_below_them() {
        let (s, mut idx) = index(u64::MAX);
        let all = |_: ChunkLoc| true;
        let mut next_id = 0;
        let flush_only = |idx: &mut DedupIndex, next_id: &mut u64| {
            let new = write_level0(idx, &s, next_id, &all);
            idx.install_flush(new).unwrap();
        };
        for k in 0..FAN_IN as u64 {
            idx.put(hash(k), at(k));
            flush_only(&mut idx, &mut next_id);
        }
        let (inputs, level) = idx.plan_merge().expect("8 level-0 runs");
        assert_eq!((inputs.len(), level), (FAN_IN, 1));
        // While the merge runs, chunk 2 moves (pack 9) and a run is flushed.
        idx.put(hash(2), ChunkLoc { pack: 9, slot: 0, crc: 2 });
        flush_only(&mut idx, &mut next_id);
        let merged = write_merged(&s, Path::new("/d"), 1, 100, level, &inputs, &[], &all).unwrap();
        idx.install_merge(&inputs, merged).unwrap();
        assert_eq!(idx.runs().map(|r| r.level).collect::<Vec<_>>(), vec![1, 0]);
        assert!(idx.plan_merge().is_none());
        let mut cost = ProbeCost::default();
        assert_eq!(idx.probe(&hash(2), &all, &mut cost).unwrap().map(|a| a.pack), Some(9));
        assert_eq!(idx.find(&hash(2).tag(), &all).unwrap().map(|e| e.at.pack), Some(9));
        for k in (0..FAN_IN as u64).filter(|&k| k != 2) {
            assert_eq!(idx.probe(&hash(k), &all, &mut cost).unwrap(), Some(at(k)), "entry {k}");
        }
        assert_eq!(idx.summarized(), FAN_IN as u64 + 1);
    }

    /// Halfway through an install (some summary partitions replaced, some
    /// not), every entry is still found, for a flush and for a merge.
    #[test]
    fn lookups_find_every_entry_midway_through_an_install() {
        let (s, mut idx) = index(u64::MAX);
        let all = |_: ChunkLoc| true;
        let mut next_id = 0;
        let mut cost = ProbeCost::default();
        let check = |idx: &DedupIndex, n: u64, cost: &mut ProbeCost| {
            for i in 0..n {
                assert_eq!(idx.probe(&hash(i), &all, cost).unwrap(), Some(at(i)), "entry {i}");
            }
        };
        for k in 0..FAN_IN as u64 {
            for i in k * 500..(k + 1) * 500 {
                idx.put(hash(i), at(i));
            }
            let new = write_level0(&mut idx, &s, &mut next_id, &all);
            let mut inst = idx.begin_flush(new);
            assert!(!idx.install_step(&mut inst, summary::PARTITIONS / 3).unwrap());
            check(&idx, (k + 1) * 500, &mut cost);
            while !idx.install_step(&mut inst, summary::PARTITIONS / 3).unwrap() {}
            idx.finish_install(inst);
            check(&idx, (k + 1) * 500, &mut cost);
        }
        let (inputs, level) = idx.plan_merge().unwrap();
        let merged = write_merged(&s, Path::new("/d"), 1, 100, level, &inputs, &[], &all).unwrap();
        let mut inst = idx.begin_merge(&inputs, merged);
        assert!(!idx.install_step(&mut inst, summary::PARTITIONS / 2).unwrap());
        check(&idx, 4000, &mut cost);
        assert!(idx.install_step(&mut inst, summary::PARTITIONS / 2).unwrap());
        idx.finish_install(inst);
        assert_eq!(idx.runs().count(), 1);
        check(&idx, 4000, &mut cost);
        assert_eq!(idx.summarized(), 4000);
    }

    /// A merge keeps, per hash, the newest entry whose slot is live, even
    /// when a newer one is stale (two copies of a chunk, the newer freed).
    #[test]
    fn a_merge_keeps_the_newest_valid_entry_not_the_newest() {
        let (s, mut idx) = index(u64::MAX);
        let mut next_id = 0;
        let older = ChunkLoc { pack: 1, slot: 0, crc: 5 };
        let newer = ChunkLoc { pack: 2, slot: 0, crc: 5 };
        idx.put(hash(5), older);
        flush(&mut idx, &s, &mut next_id, &|_| true);
        idx.put(hash(5), newer);
        let newer_freed = |at: ChunkLoc| at != newer;
        // The first of these flushes writes no run (its one entry is stale).
        for k in 0..FAN_IN as u64 {
            if k > 0 {
                idx.put(hash(100 + k), at(100 + k));
            }
            flush(&mut idx, &s, &mut next_id, &newer_freed);
        }
        assert_eq!(idx.runs().count(), 1, "everything merged");
        assert_eq!(idx.find(&hash(5).tag(), &|_| true).unwrap().map(|e| e.at), Some(older));
    }

    #[test]
    fn over_budget_the_summary_samples_and_dedup_is_lost_not_writes() {
        // Room for about 3000 elements.
        let budget = summary::Summary::bytes_for(3000);
        let (s, mut idx) = index(budget);
        let mut next_id = 0;
        let all = |_: ChunkLoc| true;
        for i in 0..10_000 {
            idx.put(hash(i), at(i));
        }
        flush(&mut idx, &s, &mut next_id, &all);
        assert!(idx.memory_bytes() - mem_bytes(&idx.mem) <= budget + 4096);
        let limit = idx.summary_limit();
        assert_eq!(limit, summary::PARTITIONS / 4, "10k entries in room for 3k: a quarter summarized");
        let mut cost = ProbeCost::default();
        let found = (0..10_000).filter(|&i| idx.probe(&hash(i), &all, &mut cost).unwrap().is_some()).count();
        assert!((2000..3000).contains(&found), "{found} of 10000 still found by dedup");
        // The exact lookup still finds every entry.
        assert!((0..10_000).all(|i| idx.find(&hash(i).tag(), &all).unwrap().is_some()));
    }
}
