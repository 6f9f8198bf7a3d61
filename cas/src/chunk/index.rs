//! The in-memory hash -> location index and its memory estimate.
//!
//! Keys are blake3 hashes, already uniformly distributed, so the map hashes
//! a key by taking its first 8 bytes: a lookup is one table probe with no
//! hashing work. Each entry is 48 bytes (32-byte key, 16-byte [`Loc`]) plus
//! one control byte of the swiss table; [`table_bytes`] estimates the table
//! size from its capacity so growth can be refused before it allocates.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// A chunk hash as a map key (hashes by its first 8 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Key(pub [u8; 32]);

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        let prefix: [u8; 8] = self.0[..8].try_into().expect("32-byte key");
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

/// The capacity a table grows to when it must hold `needed` entries and
/// currently holds up to `capacity` (the table at least doubles).
pub(crate) fn grown_capacity(capacity: usize, needed: usize) -> usize {
    if needed <= capacity {
        capacity
    } else {
        needed.max(capacity.saturating_mul(2)).max(4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimate_covers_the_real_table() {
        assert_eq!(std::mem::size_of::<(Key, Loc)>(), 48);
        let mut m = IndexMap::default();
        for i in 0..10_000u32 {
            let mut k = [0u8; 32];
            k[..4].copy_from_slice(&i.wrapping_mul(2_654_435_761).to_le_bytes());
            m.insert(Key(k), Loc { pack: 0, slot: i, crc: 0, epoch: 0 });
        }
        let est = table_bytes(m.capacity());
        // 10k entries need 16384 buckets of 49 bytes.
        assert_eq!(est, 16384 * 49);
        assert!(grown_capacity(m.capacity(), m.capacity() + 1) >= 2 * m.capacity());
    }
}
