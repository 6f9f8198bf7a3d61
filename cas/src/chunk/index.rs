//! The in-memory hash -> location index, its shards, and its memory
//! estimate.
//!
//! Keys are blake3 hashes, already uniformly distributed, so a shard's map
//! hashes a key by taking its first 8 bytes: a lookup is one table probe
//! with no hashing work. Each entry is 48 bytes (32-byte key, 16-byte
//! [`Loc`]) plus one control byte of the swiss table; [`table_bytes`]
//! estimates a table's size from its capacity so growth can be refused
//! before it allocates.
//!
//! ```text
//!  key: | bytes 0..8: hash inside a shard | byte 8: shard | 9..32 |
//!
//!  Index: [RwLock<IndexMap>; 256]   each on its own cache line
//! ```
//!
//! Why shards: a reader takes one shard's read lock, so anything that
//! needs a shard exclusively (publishing an insert, a GC stamp or removal,
//! swapping in a grown table) holds out only the readers of that shard, for
//! work proportional to the entries it changes. The chunk store changes a
//! shard only with its writer lock held (the `&mut Writer` the mutating
//! methods demand), so a growth can copy a shard into a bigger table under
//! the shard's *read* lock, with readers still inside, and then swap the
//! copy in under the write lock in O(1) (see `ChunkStore::grow_shard`).

use super::{ChunkHash, ChunkLoc, ChunkTag, Writer};
use crossbeam::utils::CachePadded;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A chunk hash as a map key: equal to another when their tags (first 20
/// bytes, [`ChunkTag`]) are, so a manifest's tag finds the entry its full
/// hash made; hashes by its first 8 bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Key(pub ChunkHash);

impl Key {
    /// The key a tag looks up (the hash's bytes past the tag are zero; the
    /// entry found carries the full hash).
    pub fn of_tag(tag: &ChunkTag) -> Key {
        let mut bytes = [0u8; ChunkHash::BYTES];
        bytes[..ChunkTag::BYTES].copy_from_slice(tag.as_bytes());
        Key(ChunkHash::from_bytes(bytes))
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.0.as_bytes()[..ChunkTag::BYTES] == other.0.as_bytes()[..ChunkTag::BYTES]
    }
}

impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let prefix: [u8; 8] = self.0.as_bytes()[..8].try_into().expect("32-byte key");
        state.write_u64(u64::from_le_bytes(prefix));
    }
}

/// Passes a key's 8-byte prefix through as the hash.
#[derive(Default)]
pub(crate) struct PrefixHasher(u64);

impl Hasher for PrefixHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only reached for non-Key uses; fold the bytes in (FNV-1a).
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 ^= v;
    }
}

pub(crate) type PrefixBuild = BuildHasherDefault<PrefixHasher>;

/// Where a chunk lives, its checksum, and the GC epoch that last saw it live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Loc {
    pub pack: u32,
    pub slot: u32,
    /// crc32c of the chunk's 4096 bytes, checked on every read.
    pub crc: u32,
    /// The newest GC epoch in which the chunk was inserted, deduplicated
    /// against, or marked. GC sweeps only entries older than its epoch.
    pub epoch: u32,
}

impl Loc {
    /// The location a manifest leaf records (without the GC epoch).
    pub fn at(&self) -> ChunkLoc {
        ChunkLoc { pack: self.pack, slot: self.slot, crc: self.crc }
    }
}

pub(crate) type IndexMap = HashMap<Key, Loc, PrefixBuild>;

/// Bytes of one table bucket: key, value and the control byte.
pub(crate) const BUCKET_BYTES: u64 = (std::mem::size_of::<(Key, Loc)>() + 1) as u64;

/// Estimated heap bytes of a swiss table that can hold `capacity` entries
/// without growing (buckets are a power of two, at most 7/8 full).
pub(crate) fn table_bytes(capacity: usize) -> u64 {
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        (capacity + 1).next_power_of_two()
    } else {
        (capacity * 8 / 7).next_power_of_two()
    };
    buckets as u64 * BUCKET_BYTES
}

/// The capacity a table grows to when it must hold `needed` entries and
/// currently holds up to `capacity` (the table at least doubles).
pub(crate) fn grown_capacity(capacity: usize, needed: usize) -> usize {
    if needed <= capacity {
        capacity
    } else {
        needed.max(capacity.saturating_mul(2)).max(4)
    }
}

/// Shards of the index (a power of two up to 256: chosen by one key byte).
pub(crate) const SHARDS: usize = 256;

/// The shard holding `key`: byte 8, which the in-shard hash (bytes 0..8)
/// does not use.
pub(crate) fn shard_of(key: &Key) -> usize {
    usize::from(key.0.as_bytes()[8]) % SHARDS
}

/// The sharded index. Readers: [`Index::get`] or [`Index::read`]. Every
/// change goes through [`Index::write`], which asks for the chunk store's
/// writer state as proof that its lock is held.
pub(crate) struct Index {
    shards: Box<[CachePadded<RwLock<IndexMap>>]>,
}

impl Index {
    /// Wraps `SHARDS` maps, each holding only keys of its shard.
    pub fn from_maps(maps: Vec<IndexMap>) -> Index {
        assert_eq!(maps.len(), SHARDS, "one map per shard");
        Index { shards: maps.into_iter().map(|m| CachePadded::new(RwLock::new(m))).collect() }
    }

    /// Shard `s` for reading.
    pub fn read(&self, s: usize) -> RwLockReadGuard<'_, IndexMap> {
        self.shards[s].read().unwrap_or_else(|p| p.into_inner())
    }

    /// Shard `s` for changing; `_writer` proves the writer lock is held.
    pub fn write(&self, _writer: &mut Writer, s: usize) -> RwLockWriteGuard<'_, IndexMap> {
        self.shards[s].write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, key: &Key) -> Option<Loc> {
        self.read(shard_of(key)).get(key).copied()
    }

    /// Entries in all shards (each shard read in turn).
    pub fn len(&self) -> usize {
        (0..SHARDS).map(|s| self.read(s).len()).sum()
    }

    /// Calls `f` with every entry, one shard's read lock at a time.
    pub fn for_each(&self, mut f: impl FnMut(&Key, &Loc)) {
        for s in 0..SHARDS {
            for (k, l) in self.read(s).iter() {
                f(k, l);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn estimate_covers_the_real_table() {
        assert_eq!(std::mem::size_of::<(Key, Loc)>(), 48);
        let mut m = IndexMap::default();
        for i in 0..10_000u32 {
            let mut k = [0u8; ChunkHash::BYTES];
            k[..4].copy_from_slice(&i.wrapping_mul(2_654_435_761).to_le_bytes());
            m.insert(Key(ChunkHash::from_bytes(k)), Loc { pack: 0, slot: i, crc: 0, epoch: 0 });
        }
        let est = table_bytes(m.capacity());
        // 10k entries need 16384 buckets of 49 bytes.
        assert_eq!(est, 16384 * 49);
        assert!(grown_capacity(m.capacity(), m.capacity() + 1) >= 2 * m.capacity());
        // A table built fresh for the grown capacity is what the estimate said.
        for cap in [0usize, 3, 7, 14, 28, 896, 10_000] {
            let want = grown_capacity(cap, cap + 1);
            let mut fresh = IndexMap::default();
            fresh.try_reserve(want).unwrap();
            assert_eq!(table_bytes(fresh.capacity()), table_bytes(want), "capacity {cap} -> {want}");
        }
    }

    #[test]
    fn the_shard_byte_is_not_the_in_shard_hash() {
        let key = |byte_8: u8| {
            let mut k = [0u8; ChunkHash::BYTES];
            k[8] = byte_8;
            Key(ChunkHash::from_bytes(k))
        };
        assert_eq!(shard_of(&key(7)), 7);
        let h = |k: &Key| PrefixBuild::default().hash_one(k);
        assert_eq!(h(&key(7)), h(&key(200)), "byte 8 does not feed the table's hash");
    }

    #[test]
    fn a_tag_finds_the_entry_of_its_full_hash() {
        let full = ChunkHash::of(b"full");
        let mut m = IndexMap::default();
        m.insert(Key(full), Loc { pack: 1, slot: 2, crc: 3, epoch: 0 });
        let by_tag = Key::of_tag(&full.tag());
        assert_ne!(by_tag.0, full);
        assert_eq!(m.get(&by_tag).map(|l| l.slot), Some(2));
        assert_eq!(shard_of(&by_tag), shard_of(&Key(full)));
        assert_eq!(m.keys().next().map(|k| k.0), Some(full), "the entry keeps the full hash");
    }
}
