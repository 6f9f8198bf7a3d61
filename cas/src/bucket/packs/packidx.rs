//! The slot index object written beside each uploaded pack: the hash and
//! crc32c of every live slot, so another host can learn what the pack holds
//! (cross-host dedup) without reading it.
//!
//! ```text
//! packidx/<pack:08x>:
//!  0 magic "CASPKIDX" | 8 version u32 | 12 pack u32 | 16 store_id u64 | 24 slots u32
//!  28 slots x (blake3 hash [32], crc32c u32), all zero for a dead slot
//!  crc32c of everything before it
//! ```
//!
//! Entries are computed from the bytes uploaded, so each is true of the
//! pack object whatever happened to the local index.

use crate::error::{Error, Result};
use crate::format::{self, Encoder};
use crate::units::ChunkHash;
use std::path::Path;

const MAGIC: [u8; 8] = *b"CASPKIDX";
const VERSION: u32 = 1;
const ENTRY_BYTES: usize = ChunkHash::BYTES + 4;

/// The decoded slot index of one pack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackIndex {
    pub pack: u32,
    pub store_id: u64,
    /// `(hash, crc32c)` per slot; None for a dead slot.
    pub slots: Vec<Option<(ChunkHash, u32)>>,
}

impl PackIndex {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::with_capacity(32 + ENTRY_BYTES * self.slots.len());
        e.bytes(&MAGIC).u32(VERSION).u32(self.pack).u64(self.store_id);
        e.u32(u32::try_from(self.slots.len()).expect("slots fit in u32"));
        for s in &self.slots {
            match s {
                Some((hash, crc)) => e.bytes(hash.as_bytes()).u32(*crc),
                None => e.bytes(&[0; ENTRY_BYTES]),
            };
        }
        e.seal();
        e.buf
    }

    /// Decodes and checks a slot index; never panics on hostile input.
    /// `what` names the object in errors.
    pub fn decode(buf: &[u8], what: &Path) -> Result<PackIndex> {
        let corrupt = |detail: String| Error::Corruption { path: what.to_path_buf(), offset: 0, detail };
        let (_, mut d) = format::open_sealed(buf, &MAGIC, "pack slot index", VERSION, what)?;
        let short = || corrupt("pack slot index is cut short".into());
        let pack = d.u32().ok_or_else(short)?;
        let store_id = d.u64().ok_or_else(short)?;
        let n = d.u32().ok_or_else(short)? as usize;
        if d.remaining() != n * ENTRY_BYTES {
            return Err(corrupt(format!("{n} slots do not fill {} bytes", d.remaining())));
        }
        let mut slots = Vec::with_capacity(n);
        for _ in 0..n {
            let hash = d.array::<{ ChunkHash::BYTES }>().ok_or_else(short)?;
            let crc = d.u32().ok_or_else(short)?;
            let dead = crc == 0 && hash == [0; ChunkHash::BYTES];
            slots.push((!dead).then(|| (ChunkHash::from_bytes(hash), crc)));
        }
        Ok(PackIndex { pack, store_id, slots })
    }

    /// The index of a pack whose bytes (header included) are `pack_bytes`,
    /// with `live(slot)` saying which slots hold a live chunk.
    pub fn of_pack(pack: u32, store_id: u64, pack_bytes: &[u8], live: impl Fn(u32) -> bool) -> PackIndex {
        let body = &pack_bytes[crate::chunk::PACK_HEADER_BYTES as usize..];
        let slots = body
            .chunks_exact(crate::chunk::CHUNK_BYTES)
            .enumerate()
            .map(|(i, chunk)| live(i as u32).then(|| (ChunkHash::of(chunk), format::crc32c(chunk))))
            .collect();
        PackIndex { pack, store_id, slots }
    }
}

/// Fuzzing: decodes a slot index and returns its encoding (which must
/// equal the input).
pub fn fuzz_decode_packidx(bytes: &[u8]) -> Result<Vec<u8>> {
    PackIndex::decode(bytes, Path::new("<fuzz>")).map(|i| i.encode())
}

/// A fuzzing seed: the slot index of a 3-slot pack of host slot 2 whose
/// slot 1 is dead.
pub fn fuzz_sample_packidx() -> Vec<u8> {
    let mut pack = vec![0u8; crate::chunk::PACK_HEADER_BYTES as usize + 3 * crate::chunk::CHUNK_BYTES];
    pack.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 253) as u8);
    PackIndex::of_pack(crate::chunk::pack_id::first_pack_id(2), 0x5eed, &pack, |slot| slot != 1).encode()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_damage() {
        let mut bytes = vec![0u8; 4096 * 4];
        bytes[4096..].iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8 + 1);
        let idx = PackIndex::of_pack(7, 9, &bytes, |s| s != 1);
        assert_eq!(idx.slots.len(), 3);
        assert!(idx.slots[1].is_none());
        assert_eq!(idx.slots[0].unwrap().0, ChunkHash::of(&bytes[4096..8192]));
        let buf = idx.encode();
        let p = Path::new("packidx/7");
        assert_eq!(PackIndex::decode(&buf, p).unwrap(), idx);
        for i in (0..buf.len()).step_by(7) {
            let mut bad = buf.clone();
            bad[i] ^= 1;
            assert!(PackIndex::decode(&bad, p).is_err(), "flip at {i} accepted");
        }
        assert!(PackIndex::decode(&buf[..buf.len() - 1], p).is_err());
    }
}
