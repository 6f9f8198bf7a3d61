//! Keys of in-memory hash maps of chunk hashes (the dedup index's
//! memtable, the chunk cache), and the whole-index-in-memory layout the
//! store used before the on-disk index, kept as `ci/bench index`'s
//! baseline (bench.rs).
//!
//! Keys are blake3 hashes, already uniformly distributed, so a map hashes
//! a key by taking its first 8 bytes: a lookup is one table probe with no
//! hashing work. The old index's entries were 48 bytes (32-byte key,
//! 16-byte [`Loc`]) plus one control byte of the swiss table, in 256
//! shards chosen by key byte 8; [`table_bytes`] estimates a table's size
//! from its capacity.

use super::{ChunkHash, ChunkTag};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

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

/// Shards of the index (a power of two up to 256: chosen by one key byte).
pub(crate) const SHARDS: usize = 256;

/// The shard holding `key`: byte 8, which the in-shard hash (bytes 0..8)
/// does not use.
pub(crate) fn shard_of(key: &Key) -> usize {
    usize::from(key.0.as_bytes()[8]) % SHARDS
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
        // A table built fresh for a capacity is what the estimate said.
        for want in [4usize, 6, 14, 28, 56, 1792, 20_000] {
            let mut fresh = IndexMap::default();
            fresh.try_reserve(want).unwrap();
            assert_eq!(table_bytes(fresh.capacity()), table_bytes(want), "capacity {want}");
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
