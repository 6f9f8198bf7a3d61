//! The remote catalog: which of this store's packs are sealed and which
//! are uploaded, and the host slot its pack ids are drawn from.
//!
//! ```text
//! chunks/remote-packs (replaced whole with write_atomic):
//!  0 magic "CASRPACK" | 8 version u32 | 12 host_slot u32 | 16 store_id u64
//!  24 entries u32 | 28 entries x (pack u32, state u32, slots u32) sorted by pack
//!  crc32c of everything before it
//! ```
//!
//! A pack enters the catalog as `Sealed` after the sync that made its last
//! slot durable, before any byte of it is uploaded; it becomes `Uploaded`
//! only after the object's PUT returned and a HEAD saw its whole length,
//! and its slot index object was written. A sealed pack is never appended
//! to again (open does not resume it) and GC neither repacks nor deletes it:
//! its bytes are what was, or will be, uploaded.

pub use crate::chunk::pack_id::{first_pack_id, owns, PackPhase, SEQ_BITS};
use crate::error::{Error, Result};
use crate::format::{self, Encoder};
use crate::storage::{read_small, write_atomic, Storage};
use std::collections::BTreeMap;
use std::path::Path;

/// The catalog's file name in `chunks/`.
pub const CATALOG_FILE: &str = "remote-packs";
const MAGIC: [u8; 8] = *b"CASRPACK";
/// 2 once the catalog holds a foreign pack (an older casblk would not
/// know them); 1 otherwise.
const VERSION: u32 = 2;
const VERSION_WITHOUT_FOREIGN: u32 = 1;
/// Largest catalog read (about 1.4 M packs, 88 TiB of 64 MiB packs).
const MAX_CATALOG_BYTES: u64 = 16 << 20;

/// The catalog's code of a phase.
fn phase_code(phase: PackPhase) -> u32 {
    match phase {
        PackPhase::Sealed => 1,
        PackPhase::Uploaded => 2,
        PackPhase::Foreign => 3,
    }
}

fn phase_from_code(code: u32) -> Option<PackPhase> {
    match code {
        1 => Some(PackPhase::Sealed),
        2 => Some(PackPhase::Uploaded),
        3 => Some(PackPhase::Foreign),
        _ => None,
    }
}

/// One catalogued pack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CatalogEntry {
    pub phase: PackPhase,
    /// Slots the pack spans: its object is bytes `[0, slot_offset(slots))`.
    pub slots: u32,
}

/// See the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Catalog {
    pub store_id: u64,
    /// This store's slot in the bucket: its pack ids are `host_slot << 24 | seq`.
    pub host_slot: u8,
    pub packs: BTreeMap<u32, CatalogEntry>,
}

impl Catalog {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::with_capacity(32 + 12 * self.packs.len());
        let foreign = self.packs.values().any(|p| p.phase == PackPhase::Foreign);
        let version = if foreign { VERSION } else { VERSION_WITHOUT_FOREIGN };
        e.bytes(&MAGIC).u32(version).u32(u32::from(self.host_slot)).u64(self.store_id);
        e.u32(u32::try_from(self.packs.len()).expect("catalog entries fit in u32"));
        for (&id, p) in &self.packs {
            e.u32(id).u32(phase_code(p.phase)).u32(p.slots);
        }
        e.seal();
        e.buf
    }

    /// Decodes and checks a catalog; never panics on hostile input.
    pub fn decode(buf: &[u8], path: &Path) -> Result<Catalog> {
        let corrupt = |detail: String| Error::Corruption { path: path.to_path_buf(), offset: 0, detail };
        let (version, mut d) = format::open_sealed(buf, &MAGIC, "remote pack catalog", VERSION, path)?;
        let short = || corrupt("remote pack catalog is cut short".into());
        let host_slot = d.u32().ok_or_else(short)?;
        let host_slot = u8::try_from(host_slot)
            .ok()
            .filter(|&h| h != 0)
            .ok_or_else(|| corrupt(format!("host slot {host_slot} is outside 1..=255")))?;
        let store_id = d.u64().ok_or_else(short)?;
        let n = d.u32().ok_or_else(short)?;
        if d.remaining() != n as usize * 12 {
            return Err(corrupt(format!("{n} entries do not fill {} bytes", d.remaining())));
        }
        let mut packs = BTreeMap::new();
        let mut last = None;
        for _ in 0..n {
            let (id, code, slots) =
                (d.u32().ok_or_else(short)?, d.u32().ok_or_else(short)?, d.u32().ok_or_else(short)?);
            let phase = phase_from_code(code).ok_or_else(|| corrupt(format!("pack {id}: phase {code}")))?;
            // Own packs are in the host slot's range; foreign ones outside it.
            let foreign = phase == PackPhase::Foreign;
            if last.is_some_and(|l| l >= id) || owns(host_slot, id) == foreign || id >> SEQ_BITS == 0 {
                return Err(corrupt(format!(
                    "pack {id:#010x} ({phase:?}) out of order or on the wrong side of host slot {host_slot}"
                )));
            }
            if foreign && version < VERSION {
                return Err(corrupt(format!("pack {id:#010x}: foreign in a version {version} catalog")));
            }
            last = Some(id);
            packs.insert(id, CatalogEntry { phase, slots });
        }
        let foreign = packs.values().any(|p| p.phase == PackPhase::Foreign);
        if version == VERSION && !foreign {
            // Written only for a catalog with a foreign pack: one encoding each.
            return Err(corrupt(format!("a version {version} catalog without a foreign pack")));
        }
        Ok(Catalog { store_id, host_slot, packs })
    }

    /// The catalog in `dir`, if there is one.
    pub fn read(storage: &dyn Storage, dir: &Path) -> Result<Option<Catalog>> {
        let path = dir.join(CATALOG_FILE);
        let Some(buf) = read_small(storage, &path, MAX_CATALOG_BYTES, "remote catalog")? else {
            return Ok(None);
        };
        Catalog::decode(&buf, &path).map(Some)
    }

    /// Replaces the catalog in `dir` durably.
    pub fn write(&self, storage: &dyn Storage, dir: &Path) -> Result<()> {
        write_atomic(storage, dir, CATALOG_FILE, &self.encode())
    }

    /// Bytes of sealed packs not yet uploaded.
    pub fn pending_bytes(&self) -> u64 {
        self.packs
            .values()
            .filter(|p| p.phase == PackPhase::Sealed)
            .map(|p| crate::chunk::pack::slot_offset(p.slots))
            .sum()
    }
}

/// Fuzzing: decodes a catalog and returns its encoding (which must equal
/// the input).
pub fn fuzz_decode_catalog(bytes: &[u8]) -> Result<Vec<u8>> {
    Catalog::decode(bytes, Path::new("<fuzz>")).map(|c| c.encode())
}

/// A fuzzing seed: a catalog with an uploaded, a sealed and a foreign pack.
pub fn fuzz_sample_catalog() -> Vec<u8> {
    let mut packs = BTreeMap::new();
    let first = first_pack_id(2);
    packs.insert(first, CatalogEntry { phase: PackPhase::Uploaded, slots: 16383 });
    packs.insert(first + 1, CatalogEntry { phase: PackPhase::Sealed, slots: 9 });
    packs.insert(first_pack_id(7), CatalogEntry { phase: PackPhase::Foreign, slots: 40 });
    Catalog { store_id: 0x5eed, host_slot: 2, packs }.encode()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Catalog {
        let mut packs = BTreeMap::new();
        packs.insert(first_pack_id(3), CatalogEntry { phase: PackPhase::Uploaded, slots: 16383 });
        packs.insert(first_pack_id(3) + 1, CatalogEntry { phase: PackPhase::Sealed, slots: 7 });
        Catalog { store_id: 0xfeed, host_slot: 3, packs }
    }

    #[test]
    fn round_trips_and_refuses_damage_and_newer_versions() {
        let mut c = sample();
        let p = Path::new("/c");
        assert_eq!(Catalog::decode(&c.encode(), p).unwrap(), c);
        assert_eq!(c.pending_bytes(), 4096 + 7 * 4096);
        // The newest version: with a foreign pack.
        c.packs.insert(first_pack_id(9), CatalogEntry { phase: PackPhase::Foreign, slots: 3 });
        let buf = c.encode();
        assert_eq!(Catalog::decode(&buf, p).unwrap(), c);
        format::assert_refuses_damage(&buf, |b| Catalog::decode(b, p));
    }

    #[test]
    fn refuses_a_pack_outside_its_host_slot() {
        let mut c = sample();
        c.packs.insert(5, CatalogEntry { phase: PackPhase::Sealed, slots: 1 });
        assert!(Catalog::decode(&c.encode(), Path::new("/c")).is_err());
    }

    #[test]
    fn foreign_packs_are_outside_the_host_slot_and_need_version_2() {
        let mut c = sample();
        assert_eq!(c.encode()[8], 1, "a catalog without foreign packs stays at version 1");
        c.packs.insert(first_pack_id(9), CatalogEntry { phase: PackPhase::Foreign, slots: 3 });
        let buf = c.encode();
        assert_eq!(buf[8], 2);
        assert_eq!(Catalog::decode(&buf, Path::new("/c")).unwrap(), c);
        assert_eq!(c.pending_bytes(), 4096 + 7 * 4096, "foreign packs are never uploaded here");
        let mut own = sample();
        own.packs.insert(first_pack_id(3) + 5, CatalogEntry { phase: PackPhase::Foreign, slots: 3 });
        assert!(Catalog::decode(&own.encode(), Path::new("/c")).is_err(), "an own pack cannot be foreign");
        let mut v2_alone = sample().encode();
        v2_alone[8] = 2;
        let n = v2_alone.len();
        let crc = format::crc32c(&v2_alone[..n - 4]);
        v2_alone[n - 4..].copy_from_slice(&crc.to_le_bytes());
        assert!(Catalog::decode(&v2_alone, Path::new("/c")).is_err(), "version 2 without a foreign pack");
        let mut legacy = sample();
        legacy.packs.insert(7, CatalogEntry { phase: PackPhase::Foreign, slots: 3 });
        assert!(Catalog::decode(&legacy.encode(), Path::new("/c")).is_err(), "slot 0 is never in a bucket");
    }
}
