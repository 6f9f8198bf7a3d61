//! Online scrub, the chunk core's part: every live index entry streamed
//! while the store serves, and one stored chunk checked where it lies.
//! The orchestration (pacing, naming the image blocks a damaged chunk
//! holds) is `crate::store::scrub`'s.
//!
//! A check reads the slot from its pack file, never from the clean cache
//! (the cache may hold a good copy of a chunk whose disk copy rotted), and
//! checks the crc32c its pointer carries and the blake3 name. A mismatch
//! counts only if the slot is still live and still the chunk's afterwards:
//! GC may repack and sweep while a scrub runs, and a slot it freed may hold
//! anything.
//!
//! The walk holds no lock while it reads: it copies the in-memory index
//! tables (bounded by the index's memory budget), takes the list of runs
//! (each an `Arc` with its open file, readable even if a merge replaces
//! it meanwhile), and streams each run's pages, which checks their own
//! checksums: a damaged index page is a finding too.

use super::check::Mismatch;
use super::{lock, pack, ChunkHash, ChunkLoc, ChunkStore, CHUNK_BYTES};
use crate::error::Result;
use crate::units::ChunkTag;

/// What the check of one stored chunk found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checked {
    Good,
    /// The slot is no longer the chunk's (GC moved or swept it): nothing to
    /// say about it.
    Gone,
    /// The bytes on disk are not the chunk's: why.
    Damaged(String),
}

/// What the chunk of one live index entry, or of one manifest ref, is.
#[derive(Clone, Copy, Debug)]
pub enum Expected<'a> {
    /// An index entry: the whole name.
    Hash(&'a ChunkHash),
    /// A manifest ref: the name's tag.
    Tag(&'a ChunkTag),
}

impl ChunkStore {
    /// Checks the chunk `expected` at `at` (its crc32c is `at.crc`),
    /// reading into `buf` (4096 bytes), bypassing the cache.
    pub fn scrub_slot(&self, expected: Expected<'_>, at: ChunkLoc, buf: &mut [u8]) -> Checked {
        let live = || lock(&self.writer).is_live(at);
        let Some(file) = self.read_files().get(&at.pack).cloned() else { return Checked::Gone };
        if !live() {
            return Checked::Gone;
        }
        let offset = pack::slot_offset(at.slot);
        let problem = match file.read_exact_at(&mut buf[..CHUNK_BYTES], offset) {
            Err(e) => format!("reading it failed: {e}"),
            Ok(()) => match verdict(expected, at.crc, &buf[..CHUNK_BYTES]) {
                None => return Checked::Good,
                Some(why) => why,
            },
        };
        // Damage counts only where the chunk still lives.
        if live() && self.read_files().contains_key(&at.pack) {
            Checked::Damaged(format!("pack {} slot {}: {problem}", at.pack, at.slot))
        } else {
            Checked::Gone
        }
    }

    /// Calls `each(hash, at)` for every index entry whose slot is live now
    /// (a chunk may come more than once: memtables and runs), until it
    /// returns false. A run that cannot be read (a damaged index page) is
    /// reported to `damaged_run` and the walk goes on with the next.
    /// Returns the entries visited.
    pub fn scrub_entries(
        &self,
        each: &mut dyn FnMut(&ChunkHash, ChunkLoc) -> bool,
        damaged_run: &mut dyn FnMut(String),
    ) -> Result<u64> {
        let (tables, runs) = {
            let idx = self.read_index();
            let tables: Vec<(ChunkHash, ChunkLoc)> = std::iter::once(&idx.mem)
                .chain(idx.frozen.as_deref())
                .flat_map(|m| m.iter().map(|(k, &at)| (k.0, at)))
                .collect();
            (tables, idx.runs().cloned().collect::<Vec<_>>())
        };
        let live = |at: ChunkLoc| lock(&self.writer).is_live(at);
        let mut visited = 0;
        for (hash, at) in tables {
            if live(at) {
                visited += 1;
                if !each(&hash, at) {
                    return Ok(visited);
                }
            }
        }
        for run in runs {
            let mut s = run.stream();
            loop {
                match s.next_entry() {
                    Ok(Some(e)) => {
                        if live(e.at) {
                            visited += 1;
                            if !each(&e.hash, e.at) {
                                return Ok(visited);
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        damaged_run(format!("index run {}: {e}", run.path().display()));
                        break;
                    }
                }
            }
        }
        Ok(visited)
    }
}

/// What is wrong with `bytes` as chunk `expected` with crc32c `crc`;
/// None if nothing.
fn verdict(expected: Expected<'_>, crc: u32, bytes: &[u8]) -> Option<String> {
    let actual = crate::format::crc32c(bytes);
    let mismatch = if actual != crc {
        Some(Mismatch::Crc(actual))
    } else {
        let name = ChunkHash::of(bytes);
        let same = match expected {
            Expected::Hash(hash) => name == *hash,
            Expected::Tag(tag) => name.tag() == *tag,
        };
        (!same).then_some(Mismatch::Content)
    };
    mismatch.map(|m| m.describe(crc, "its pointer"))
}

impl ChunkStore {
    /// The packs with a file on this host now. A pack evicted to the
    /// bucket, or another store's, is read through the bucket: a scrub
    /// leaves it alone (a pass over the bucket would download it, and the
    /// bucket keeps its own checksums).
    pub fn local_pack_ids(&self) -> Result<std::collections::HashSet<u32>> {
        Ok(self.storage.list_dir(&self.dir)?.iter().filter_map(|n| pack::parse_pack_file_name(n)).collect())
    }

    /// Rewrites slot `at` of its local pack with the bucket's copy of the
    /// chunk, if the tier holds the pack and its copy checks (crc32c and
    /// name); synced before it returns. Returns whether it did. The bytes
    /// written are the chunk's own, so readers see no change but the fix.
    pub fn repair_from_bucket(&self, expected: Expected<'_>, at: ChunkLoc) -> Result<bool> {
        let Some(copy) = self.tier.as_ref().and_then(|t| t.bucket_copy(at.pack)) else { return Ok(false) };
        let mut buf = vec![0u8; CHUNK_BYTES];
        let offset = pack::slot_offset(at.slot);
        copy.read_exact_at(&mut buf, offset)?;
        if verdict(expected, at.crc, &buf).is_some() {
            return Ok(false);
        }
        let path = self.dir.join(pack::pack_file_name(at.pack));
        let file = self.storage.open(&path, crate::storage::OpenMode::Existing)?;
        file.write_all_at(&buf, offset)?;
        file.sync_data()?;
        Ok(true)
    }

    /// Where the index puts the chunk tagged `tag` now (a live slot), for
    /// a manifest ref that carries no location.
    pub fn locate(&self, tag: &ChunkTag) -> Result<Option<ChunkLoc>> {
        // As reads find chunks: the writer's lock is never taken under the
        // index's (a writer holding it takes the index's).
        let open = |at: ChunkLoc| self.read_files().contains_key(&at.pack);
        let found = self.read_index().find_in(tag, &open, crate::io::Wait::Block)?.map(|e| e.at);
        Ok(found.filter(|&at| lock(&self.writer).is_live(at)))
    }
}
