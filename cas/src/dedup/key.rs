//! Keys of in-memory hash maps of chunk hashes: the dedup index's
//! memtable, and the chunk store's clean cache.
//!
//! Keys are blake3 hashes, already uniformly distributed, so a map hashes
//! a key by taking its first 8 bytes: a lookup is one table probe with no
//! hashing work. [`buckets`] says how many buckets a swiss table of a
//! capacity has, from which the memtable's size is estimated. Public for
//! `ci/bench index`, whose baseline (the index the store used before its
//! on-disk one) keys its tables the same way.

use crate::units::{ChunkHash, ChunkTag};
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// A chunk hash as a map key: equal to another when their tags (first 20
/// bytes, [`ChunkTag`]) are, so a manifest's tag finds the entry its full
/// hash made; hashes by its first 8 bytes.
#[derive(Clone, Copy, Debug)]
pub struct Key(pub ChunkHash);

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
pub struct PrefixHasher(u64);

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

pub type PrefixBuild = BuildHasherDefault<PrefixHasher>;

/// Buckets of a swiss table that can hold `capacity` entries without
/// growing (a power of two, at most 7/8 full).
pub fn buckets(capacity: usize) -> u64 {
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        (capacity + 1).next_power_of_two()
    } else {
        (capacity * 8 / 7).next_power_of_two()
    };
    buckets as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::ChunkLoc;
    use std::collections::HashMap;

    #[test]
    fn the_estimate_is_the_real_table() {
        // A table built fresh for a capacity has the buckets estimated.
        for want in [4usize, 6, 14, 28, 56, 1792, 20_000] {
            let mut fresh: HashMap<Key, ChunkLoc, PrefixBuild> = HashMap::default();
            fresh.try_reserve(want).unwrap();
            assert_eq!(buckets(fresh.capacity()), buckets(want), "capacity {want}");
        }
        assert_eq!(buckets(10_000), 16384);
    }

    #[test]
    fn a_tag_finds_the_entry_of_its_full_hash() {
        let full = ChunkHash::of(b"full");
        let mut m: HashMap<Key, u32, PrefixBuild> = HashMap::default();
        m.insert(Key(full), 2);
        let by_tag = Key::of_tag(&full.tag());
        assert_ne!(by_tag.0, full);
        assert_eq!(m.get(&by_tag), Some(&2));
        assert_eq!(m.keys().next().map(|k| k.0), Some(full), "the entry keeps the full hash");
    }
}
