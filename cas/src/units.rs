//! The store's vocabulary of sizes and names, defined once.
//!
//! ```text
//!  SECTOR_BYTES  512   the WAL's and the overlay's unit (ublk's logical block)
//!  BLOCK_BYTES   4096  the manifest's unit, and the size of every chunk
//!  ChunkHash     blake3 of one block: a chunk's name
//! ```
//!
//! Every module takes these from here (re-exported where they were first
//! public: `cas::image::BLOCK_BYTES`, `cas::wal::SECTOR_BYTES`,
//! `cas::chunk::ChunkHash`, ...).

/// Bytes of a sector: the unit of WAL records and overlay extents.
pub const SECTOR_BYTES: u64 = 512;

/// Bytes of a block: the unit of the manifest; every chunk is one block.
pub const BLOCK_BYTES: u64 = 4096;

/// Sectors in a block.
pub const SECTORS_PER_BLOCK: u64 = BLOCK_BYTES / SECTOR_BYTES;

/// blake3 hash of a 4 KiB block: the name of a chunk.
pub type ChunkHash = [u8; 32];
