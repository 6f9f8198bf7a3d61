//! The store's vocabulary of sizes and names, defined once.
//!
//! ```text
//!  SECTOR_BYTES  512   the WAL's and the overlay's unit (ublk's logical block)
//!  BLOCK_BYTES   4096  the manifest's unit, and the size of every chunk
//!  ChunkHash     blake3 of one block: a chunk's name (32 bytes on disk)
//!  ChunkTag      its first 20 bytes: what identifies a chunk in the index
//!  ChunkRef      what a manifest leaf maps a block to: tag + where stored
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

/// Display and Debug of a name as lower-case hex of its bytes.
macro_rules! hex_name {
    ($t:ty) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
        }

        impl fmt::Debug for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }
    };
}

hex_name!(ChunkHash);

impl ChunkHash {
    /// The part of the hash that identifies the chunk (see [`ChunkTag`]).
    pub fn tag(&self) -> ChunkTag {
        ChunkTag(self.0[..ChunkTag::BYTES].try_into().expect("a hash is longer than its tag"))
    }
}

/// The first 160 bits of a chunk's blake3 hash: what identifies a chunk.
/// Two blocks with equal tags are one chunk to the store; finding two
/// blocks that differ and share a tag takes about 2^80 hash evaluations.
/// Manifest leaves hold the tag, not the whole hash, to make room for the
/// chunk's location beside it (see [`ChunkRef`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkTag([u8; ChunkTag::BYTES]);

impl ChunkTag {
    pub const BYTES: usize = 20;

    pub const fn from_bytes(bytes: [u8; ChunkTag::BYTES]) -> ChunkTag {
        ChunkTag(bytes)
    }

    pub const fn as_bytes(&self) -> &[u8; ChunkTag::BYTES] {
        &self.0
    }
}

hex_name!(ChunkTag);

/// Where a chunk's bytes were stored: a pack (ids are never reused), a
/// slot in it, and the crc32c of the 4096 bytes. A pack's slot never
/// changes its bytes while the pack exists, so a location stays right
/// until GC moves the chunk and deletes the pack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChunkLoc {
    /// Never 0 (pack ids start at 1).
    pub pack: u32,
    pub slot: u32,
    pub crc: u32,
}

/// What a manifest leaf maps a block to: the chunk's tag and, when the
/// leaf was written with it, where the chunk was stored. A read goes to
/// the location directly; only a ref without one (a leaf from before
/// locations) or whose pack GC has since deleted asks the chunk index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChunkRef {
    pub tag: ChunkTag,
    pub at: Option<ChunkLoc>,
}

impl ChunkRef {
    /// Bytes of a ref in a manifest leaf: tag, pack, slot, crc (an
    /// unlocated ref has zero pack, slot and crc).
    pub const BYTES: usize = ChunkTag::BYTES + 12;

    /// A ref found through `hash` alone (no location).
    pub fn unlocated(hash: &ChunkHash) -> ChunkRef {
        ChunkRef { tag: hash.tag(), at: None }
    }

    /// The ref's on-disk bytes.
    pub fn encode(&self) -> [u8; ChunkRef::BYTES] {
        let mut out = [0u8; ChunkRef::BYTES];
        out[..ChunkTag::BYTES].copy_from_slice(&self.tag.0);
        if let Some(at) = self.at {
            for (i, v) in [at.pack, at.slot, at.crc].into_iter().enumerate() {
                let o = ChunkTag::BYTES + 4 * i;
                out[o..o + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
        out
    }

    /// A ref from its on-disk bytes; `None` when they are not canonical
    /// (pack 0 with a nonzero slot or crc).
    pub fn decode(bytes: &[u8; ChunkRef::BYTES]) -> Option<ChunkRef> {
        let tag = ChunkTag(bytes[..ChunkTag::BYTES].try_into().expect("20 bytes"));
        let u = |i: usize| {
            let o = ChunkTag::BYTES + 4 * i;
            u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"))
        };
        let (pack, slot, crc) = (u(0), u(1), u(2));
        if pack == 0 {
            return (slot == 0 && crc == 0).then_some(ChunkRef { tag, at: None });
        }
        Some(ChunkRef { tag, at: Some(ChunkLoc { pack, slot, crc }) })
    }
}

impl From<ChunkHash> for ChunkRef {
    fn from(hash: ChunkHash) -> ChunkRef {
        ChunkRef::unlocated(&hash)
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
        assert_eq!(h.tag().to_string(), hex[..40]);
    }

    #[test]
    fn refs_round_trip_and_only_canonical_bytes_decode() {
        let tag = ChunkHash::of(b"y").tag();
        for at in
            [None, Some(ChunkLoc { pack: 7, slot: 0, crc: 0 }), Some(ChunkLoc { pack: 1, slot: 9, crc: 3 })]
        {
            let r = ChunkRef { tag, at };
            assert_eq!(ChunkRef::decode(&r.encode()), Some(r));
        }
        let mut bytes = ChunkRef { tag, at: None }.encode();
        bytes[ChunkTag::BYTES + 4] = 1;
        assert_eq!(ChunkRef::decode(&bytes), None, "pack 0 with a slot");
    }
}
