//! The store's vocabulary of sizes and names, defined once.
//!
//! ```text
//!  SECTOR_BYTES  512   the WAL's and the overlay's unit (ublk's logical block)
//!  BLOCK_BYTES   4096  the manifest's unit, and the size of every chunk
//!  ChunkHash     blake3 of one block: a chunk's name (32 bytes on disk)
//! ```
//!
//! Every module takes these from here (re-exported where they were first
//! public: `cas::image::BLOCK_BYTES`, `cas::wal::SECTOR_BYTES`,
//! `cas::chunk::ChunkHash`, ...).

use std::fmt;

/// Bytes of a sector: the unit of WAL records and overlay extents.
pub const SECTOR_BYTES: u64 = 512;

/// Bytes of a block: the unit of the manifest; every chunk is one block.
pub const BLOCK_BYTES: u64 = 4096;

/// Sectors in a block.
pub const SECTORS_PER_BLOCK: u64 = BLOCK_BYTES / SECTOR_BYTES;

/// blake3 hash of a 4 KiB block: the name of a chunk. On disk (manifest
/// leaves, the chunk index journal) it is its 32 bytes as they are
/// ([`ChunkHash::as_bytes`], [`ChunkHash::from_bytes`]); in messages,
/// lower-case hex (`Display` and `Debug`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkHash([u8; ChunkHash::BYTES]);

impl ChunkHash {
    /// Bytes of a hash, on disk and in memory.
    pub const BYTES: usize = 32;

    /// The name of `block`'s content: its blake3 hash.
    pub fn of(block: &[u8]) -> ChunkHash {
        ChunkHash(*blake3::hash(block).as_bytes())
    }

    /// A hash from its stored bytes.
    pub const fn from_bytes(bytes: [u8; ChunkHash::BYTES]) -> ChunkHash {
        ChunkHash(bytes)
    }

    /// The bytes to store.
    pub const fn as_bytes(&self) -> &[u8; ChunkHash::BYTES] {
        &self.0
    }
}

impl fmt::Display for ChunkHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for ChunkHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_prints_as_lower_case_hex_of_its_bytes() {
        let mut bytes = [0u8; ChunkHash::BYTES];
        bytes[0] = 0xab;
        bytes[31] = 0x0f;
        let h = ChunkHash::from_bytes(bytes);
        let hex = format!("ab{}0f", "00".repeat(30));
        assert_eq!(h.to_string(), hex);
        assert_eq!(format!("{h:?}"), hex);
        assert_eq!(h.as_bytes(), &bytes);
        assert_eq!(ChunkHash::of(b"x").as_bytes(), blake3::hash(b"x").as_bytes());
    }
}
