//! Which slots of each pack hold a live chunk: one bit per slot, in memory
//! and, at each index flush, in a slots file the index root names.
//!
//! A slot's bit is set when a chunk is written into it (or moved into it
//! by GC) and cleared when GC frees it. Slots are never reused, so a
//! cleared bit stays cleared: an index entry pointing at a cleared slot,
//! or into a pack that is gone, is stale for good.
//!
//! ```text
//! index-slots-<16 hex>
//!  0 magic "CASISLOT" | 8 version u32 | 12 reserved u32 | 16 store_id u64 | 24 packs u32
//!  then per pack:  id u32 | bits u32 | ceil(bits / 64) words u64 (bit s of word s / 64: slot s)
//!  crc32c of everything before
//! ```

use crate::error::{Error, Result};
use crate::format::{self, Decoder, Encoder};
use crate::storage::{OpenMode, Storage};
use std::collections::BTreeMap;
use std::path::Path;

pub(crate) const SLOTS_VERSION: u32 = 1;
const SLOTS_MAGIC: [u8; 8] = *b"CASISLOT";

/// The file name of slots file `id`.
pub(crate) fn slots_file_name(id: u64) -> String {
    super::file_name("index-slots-", id)
}

pub(crate) fn parse_slots_file_name(name: &str) -> Option<u64> {
    super::parse_file_name(name, "index-slots-")
}

/// A growable bitmap of slots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Bits {
    words: Vec<u64>,
}

impl Bits {
    pub fn get(&self, slot: u32) -> bool {
        self.words.get(slot as usize / 64).is_some_and(|w| w >> (slot % 64) & 1 == 1)
    }

    /// Sets bit `slot`; true if it was clear.
    pub fn set(&mut self, slot: u32) -> bool {
        let i = slot as usize / 64;
        if i >= self.words.len() {
            self.words.resize(i + 1, 0);
        }
        let was = self.words[i] >> (slot % 64) & 1;
        self.words[i] |= 1 << (slot % 64);
        was == 0
    }

    /// Clears bit `slot`; true if it was set.
    pub fn clear(&mut self, slot: u32) -> bool {
        let Some(w) = self.words.get_mut(slot as usize / 64) else { return false };
        let was = *w >> (slot % 64) & 1;
        *w &= !(1 << (slot % 64));
        was == 1
    }

    pub fn clear_all(&mut self) {
        self.words.iter_mut().for_each(|w| *w = 0);
    }

    pub fn count(&self) -> u32 {
        self.words.iter().map(|w| w.count_ones()).sum()
    }

    /// The highest set bit.
    pub fn max(&self) -> Option<u32> {
        let (i, w) = self.words.iter().enumerate().rev().find(|(_, w)| **w != 0)?;
        Some(i as u32 * 64 + 63 - w.leading_zeros())
    }

    /// Set bits in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        static NONE: Bits = Bits { words: Vec::new() };
        self.and_not(&NONE)
    }

    /// Bits set here and clear in `other`, in ascending order.
    pub fn and_not<'a>(&'a self, other: &'a Bits) -> impl Iterator<Item = u32> + 'a {
        self.words.iter().enumerate().flat_map(move |(i, &w)| {
            let mut w = w & !other.words.get(i).copied().unwrap_or(0);
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let b = w.trailing_zeros();
                w &= w - 1;
                Some(i as u32 * 64 + b)
            })
        })
    }

    pub fn memory_bytes(&self) -> u64 {
        (self.words.capacity() * 8) as u64
    }
}

/// The live bits of every pack, by pack id (a slots file's content).
pub(crate) type PackBits = BTreeMap<u32, Bits>;

/// True when `bits` shows slot `at` live.
pub(crate) fn is_live(bits: &PackBits, at: crate::units::ChunkLoc) -> bool {
    bits.get(&at.pack).is_some_and(|b| b.get(at.slot))
}

/// Encodes the live bits of every pack.
pub(crate) fn encode(store_id: u64, packs: &BTreeMap<u32, Bits>) -> Vec<u8> {
    let words: usize = packs.values().map(|b| b.words.len()).sum();
    let mut e = Encoder::with_capacity(32 + packs.len() * 8 + words * 8 + 4);
    e.bytes(&SLOTS_MAGIC).u32(SLOTS_VERSION).u32(0).u64(store_id).u32(packs.len() as u32);
    for (&id, bits) in packs {
        let n = bits.max().map_or(0, |m| m + 1);
        e.u32(id).u32(n);
        for w in &bits.words[..n.div_ceil(64) as usize] {
            e.u64(*w);
        }
    }
    e.seal();
    e.buf
}

/// Decodes a slots file.
pub(crate) fn decode(buf: &[u8], path: &Path, store_id: u64) -> Result<BTreeMap<u32, Bits>> {
    let corrupt = |detail: String| Error::Corruption { path: path.to_path_buf(), offset: 0, detail };
    let body = format::unseal(buf, path, 0)?;
    let mut d = Decoder::new(body);
    let short = || corrupt("short slots file".into());
    if d.array::<8>().ok_or_else(short)? != SLOTS_MAGIC {
        return Err(corrupt("not an index slots file (bad magic)".into()));
    }
    format::check_version("index slots file", d.u32().ok_or_else(short)?, SLOTS_VERSION)?;
    let _reserved = d.u32().ok_or_else(short)?;
    let file_store = d.u64().ok_or_else(short)?;
    if file_store != store_id {
        return Err(corrupt(format!("slots file of store {file_store:#x}, expected {store_id:#x}")));
    }
    let n = d.u32().ok_or_else(short)?;
    let mut packs = BTreeMap::new();
    for _ in 0..n {
        let (id, bits) = (d.u32().ok_or_else(short)?, d.u32().ok_or_else(short)?);
        let words = bits.div_ceil(64) as usize;
        if words * 8 > d.remaining() {
            return Err(short());
        }
        let words: Vec<u64> = (0..words).map(|_| d.u64().expect("length checked")).collect();
        if id == 0 || packs.insert(id, Bits { words }).is_some() {
            return Err(corrupt(format!("pack {id} listed twice or as 0")));
        }
    }
    if d.remaining() != 0 {
        return Err(corrupt(format!("{} bytes after the last pack", d.remaining())));
    }
    Ok(packs)
}

/// Writes slots file `id` (a fresh name) and syncs it.
pub(crate) fn write(storage: &dyn Storage, dir: &Path, id: u64, bytes: &[u8]) -> Result<()> {
    let f = storage.open(&dir.join(slots_file_name(id)), OpenMode::CreateNew)?;
    f.write_all_at(bytes, 0)?;
    f.sync_data()
}

/// Reads slots file `id`.
pub(crate) fn read(storage: &dyn Storage, dir: &Path, id: u64, store_id: u64) -> Result<BTreeMap<u32, Bits>> {
    let path = dir.join(slots_file_name(id));
    let f = storage.open(&path, OpenMode::Existing)?;
    let len = f.len()?;
    let mut buf = vec![0u8; usize::try_from(len).unwrap_or(usize::MAX).min(1 << 34)];
    f.read_exact_at(&mut buf, 0)?;
    decode(&buf, &path, store_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_and_files_round_trip() {
        let mut b = Bits::default();
        assert!(b.set(3) && b.set(130) && !b.set(3));
        assert_eq!((b.count(), b.max(), b.iter().collect::<Vec<_>>()), (2, Some(130), vec![3, 130]));
        let mut keep = Bits::default();
        keep.set(130);
        assert_eq!(b.and_not(&keep).collect::<Vec<_>>(), vec![3]);
        assert!(b.clear(130) && !b.clear(130) && !b.clear(9999));
        let mut packs = BTreeMap::new();
        packs.insert(1, b.clone());
        packs.insert(7, Bits::default());
        let bytes = encode(5, &packs);
        let path = Path::new("/s");
        let back = decode(&bytes, path, 5).unwrap();
        assert_eq!(back[&1].iter().collect::<Vec<_>>(), vec![3]);
        assert_eq!(back[&7].count(), 0);
        assert!(decode(&bytes, path, 6).is_err());
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 1;
            assert!(decode(&bad, path, 5).is_err(), "flip at {i}");
        }
        assert_eq!(parse_slots_file_name(&slots_file_name(77)), Some(77));
    }
}
