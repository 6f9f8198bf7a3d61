//! The `memory` arm's index: the whole-index-in-memory layout the store
//! used before its on-disk dedup index (issue 17), kept here as the
//! benchmark's baseline now that the store no longer has it. 256 shards,
//! chosen by key byte 8, of swiss tables of 48-byte entries (a 32-byte
//! key, a 16-byte location), keyed as the store's maps are
//! (`cas::dedup::key`: by the hash's first 8 bytes).

use cas::chunk::{ChunkHash, ChunkTag};
use cas::dedup::key::{buckets, Key, PrefixBuild};
use std::collections::HashMap;

/// Shards of the index (chosen by one key byte).
const SHARDS: usize = 256;

/// Where a chunk lived, its checksum, and the GC epoch that last saw it.
#[derive(Clone, Copy)]
#[allow(dead_code)] // the layout is what is measured; only two fields are read
struct Loc {
    pack: u32,
    slot: u32,
    crc: u32,
    epoch: u32,
}

type IndexMap = HashMap<Key, Loc, PrefixBuild>;

/// The shard holding `key`: byte 8, which the in-shard hash does not use.
fn shard_of(key: &Key) -> usize {
    usize::from(key.0.as_bytes()[8]) % SHARDS
}

/// The old index, filled directly.
pub struct IndexBench {
    shards: Vec<IndexMap>,
}

impl Default for IndexBench {
    fn default() -> Self {
        IndexBench { shards: (0..SHARDS).map(|_| IndexMap::default()).collect() }
    }
}

impl IndexBench {
    /// Inserts `hash` at (`pack`, `slot`) unless its tag is there; true if
    /// it was new (what a dedup insert did).
    pub fn insert(&mut self, hash: &ChunkHash, pack: u32, slot: u32, crc: u32) -> bool {
        let key = Key(*hash);
        let shard = &mut self.shards[shard_of(&key)];
        if shard.contains_key(&key) {
            return false;
        }
        shard.insert(key, Loc { pack, slot, crc, epoch: 0 });
        true
    }

    /// The location of the chunk `tag` names.
    pub fn get(&self, tag: &ChunkTag) -> Option<(u32, u32)> {
        let key = Key::of_tag(tag);
        self.shards[shard_of(&key)].get(&key).map(|l| (l.pack, l.slot))
    }

    /// Buckets of the tables (entries over buckets is their load).
    pub fn buckets(&self) -> u64 {
        self.shards.iter().map(|s| buckets(s.capacity())).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_48_bytes_and_the_estimate_is_the_table() {
        assert_eq!(std::mem::size_of::<(Key, Loc)>(), 48);
        for want in [4usize, 6, 14, 28, 56, 1792, 20_000] {
            let mut fresh = IndexMap::default();
            fresh.try_reserve(want).unwrap();
            assert_eq!(buckets(fresh.capacity()), buckets(want), "capacity {want}");
        }
    }

    #[test]
    fn a_tag_finds_its_hash_and_byte_8_picks_the_shard() {
        let mut index = IndexBench::default();
        let full = ChunkHash::of(b"full");
        assert!(index.insert(&full, 1, 2, 3));
        assert!(!index.insert(&full, 4, 5, 6));
        assert_eq!(index.get(&full.tag()), Some((1, 2)));
        assert_eq!(shard_of(&Key(full)), usize::from(full.as_bytes()[8]));
    }
}
