//! Forward tables: where the chunks of a pack GC repacked and deleted went.
//!
//! Manifest leaves name a chunk by pack and slot. When GC repacks pack P,
//! it moves P's live chunks into the active pack and deletes P; the leaves
//! that name P are not rewritten. Before P is deleted, `pack-P.fwd`
//! records, for each slot of P that held a live chunk, the pack and slot it
//! moved to, so a read of `(P, s)` goes on to the new place without the
//! chunk index. A chunk moved twice is found through two tables (a chain,
//! followed a bounded number of hops).
//!
//! ```text
//! pack-NNNNNNNN.fwd (written whole: tmp, sync, rename, directory sync)
//!  0          8         12        16         24      28
//!  | magic    | version | pack_id | store_id | count | crc32c of 0..28 |
//!  "CASPFWD\0"  u32 = 1   u32       u64        u32
//!  32: count x { slot u32, to_pack u32, to_slot u32 }, slots strictly increasing
//!  32 + 12 count: crc32c of the entries
//! ```
//!
//! A table lives as long as some manifest may name its pack: each GC pass
//! notes, while marking, which tables the leaves' locations go through, and
//! deletes the tables none did (see crate::gc). In memory each table costs
//! 12 bytes per moved chunk.

use super::{pack, ChunkLoc, ChunkStore};
use crate::error::{Error, Result};
use crate::format::{self, Decoder, Encoder};
use crate::storage::{write_atomic, OpenMode, Storage, StorageFile};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

const MAGIC: [u8; 8] = *b"CASPFWD\0";
pub(crate) const FORWARD_VERSION: u32 = 1;
const HEADER_BYTES: usize = 8 + 4 + 4 + 8 + 4 + 4;
const ENTRY_BYTES: usize = 12;
/// Largest table accepted: as many moves as the largest pack has slots.
const MAX_ENTRIES: u32 = (pack::MAX_PACK_BYTES / pack::CHUNK_BYTES as u64) as u32;

/// Where one slot's chunk went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    pub slot: u32,
    pub to_pack: u32,
    pub to_slot: u32,
}

/// The decoded table of one deleted pack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forward {
    pub pack: u32,
    pub store_id: u64,
    /// Sorted by `slot`.
    pub moves: Box<[Move]>,
}

impl Forward {
    /// Where the chunk that was in `slot` went, if it was live when moved.
    pub fn lookup(&self, slot: u32) -> Option<(u32, u32)> {
        let i = self.moves.binary_search_by_key(&slot, |m| m.slot).ok()?;
        Some((self.moves[i].to_pack, self.moves[i].to_slot))
    }

    pub fn encode(&self) -> Vec<u8> {
        let count = u32::try_from(self.moves.len()).expect("fewer moves than slots");
        let mut e = Encoder::with_capacity(HEADER_BYTES + self.moves.len() * ENTRY_BYTES + 4);
        e.bytes(&MAGIC).u32(FORWARD_VERSION).u32(self.pack).u64(self.store_id).u32(count).seal();
        let start = e.len();
        for m in self.moves.iter() {
            e.u32(m.slot).u32(m.to_pack).u32(m.to_slot);
        }
        let crc = format::crc32c(&e.buf[start..]);
        e.u32(crc);
        e.buf
    }

    /// Decodes and checks a table read from `path`. Never panics on hostile
    /// bytes.
    pub fn decode(buf: &[u8], path: &Path) -> Result<Forward> {
        let corrupt = |detail: String| Error::Corruption { path: path.to_path_buf(), offset: 0, detail };
        if buf.len() < HEADER_BYTES + 4 {
            return Err(corrupt(format!("forward table of {} bytes has no header", buf.len())));
        }
        if buf[..8] != MAGIC {
            return Err(corrupt("not a forward table (bad magic)".into()));
        }
        let head = format::unseal(&buf[..HEADER_BYTES], path, 0)?;
        let mut d = Decoder::new(&head[8..]);
        let (version, pack, store_id, count) = (d.u32(), d.u32(), d.u64(), d.u32());
        let (Some(version), Some(pack), Some(store_id), Some(count)) = (version, pack, store_id, count)
        else {
            return Err(corrupt("short forward table header".into()));
        };
        format::check_version("forward table", version, FORWARD_VERSION)?;
        if count > MAX_ENTRIES || buf.len() != HEADER_BYTES + count as usize * ENTRY_BYTES + 4 {
            return Err(corrupt(format!("forward table of {} bytes does not hold {count} moves", buf.len())));
        }
        let body = format::unseal(&buf[HEADER_BYTES..], path, HEADER_BYTES as u64)?;
        let mut d = Decoder::new(body);
        let mut moves = Vec::with_capacity(count as usize);
        for i in 0..count {
            let (Some(slot), Some(to_pack), Some(to_slot)) = (d.u32(), d.u32(), d.u32()) else {
                return Err(corrupt(format!("move {i} is truncated")));
            };
            if moves.last().is_some_and(|m: &Move| m.slot >= slot) {
                return Err(corrupt(format!("move {i} is out of slot order")));
            }
            if to_pack == 0 || to_pack == pack {
                return Err(corrupt(format!("move {i} goes to pack {to_pack}")));
            }
            moves.push(Move { slot, to_pack, to_slot });
        }
        Ok(Forward { pack, store_id, moves: moves.into_boxed_slice() })
    }
}

/// The file name of pack `id`'s forward table.
pub fn forward_file_name(id: u32) -> String {
    pack::pack_id_file_name(id, ".fwd")
}

/// The pack id a forward table's file name names.
pub fn parse_forward_file_name(name: &str) -> Option<u32> {
    pack::parse_pack_id_file_name(name, ".fwd")
}

/// True for a table write a crash cut short (`write_atomic`'s tmp file):
/// what an open deletes.
pub(crate) fn is_forward_tmp_name(name: &str) -> bool {
    pack::parse_pack_id_file_name(name, ".fwd.tmp").is_some()
}

/// Decodes hostile bytes as a forward table (the fuzz entry point).
pub fn fuzz_decode_forward(bytes: &[u8]) -> Result<Forward> {
    Forward::decode(bytes, Path::new("<fuzz>"))
}

/// A valid table (the fuzz seed).
pub fn fuzz_sample_forward() -> Vec<u8> {
    let moves =
        [(3, 9, 0), (4, 9, 1), (70, 12, 5)].map(|(slot, to_pack, to_slot)| Move { slot, to_pack, to_slot });
    Forward { pack: 7, store_id: 0x5eed, moves: moves.into() }.encode()
}

/// Hops a read follows through forward tables before it asks the index.
pub(crate) const MAX_FORWARD_HOPS: usize = 8;

/// The forward tables in memory, by the id of the deleted pack.
pub(crate) type Forwards = HashMap<u32, Arc<Forward>>;

impl ChunkStore {
    /// Where the chunk that was at `at` is now, following forward tables
    /// from a deleted pack to one that exists (None: not forwarded there,
    /// or more than `MAX_FORWARD_HOPS` moves).
    pub(crate) fn forwarded(&self, at: ChunkLoc) -> Option<(ChunkLoc, Arc<dyn StorageFile>)> {
        let at = self.forward_target(at, |p| self.read_files().contains_key(&p))?;
        // Deleted since (then the index answers).
        let file = self.read_files().get(&at.pack)?.clone();
        Some((at, file))
    }

    /// Where forward tables send the chunk that was at `at`: the first
    /// place whose pack `exists` says is there (None: no table leads on,
    /// or more than `MAX_FORWARD_HOPS` moves).
    pub(crate) fn forward_target(&self, mut at: ChunkLoc, exists: impl Fn(u32) -> bool) -> Option<ChunkLoc> {
        let forwards = self.forwards.read().unwrap_or_else(|p| p.into_inner());
        for _ in 0..MAX_FORWARD_HOPS {
            let (pack, slot) = forwards.get(&at.pack)?.lookup(at.slot)?;
            at = ChunkLoc { pack, slot, crc: at.crc };
            if exists(pack) {
                return Some(at);
            }
        }
        None
    }

    /// Makes pack `id`'s forward table durable (before the pack is
    /// deleted) and readers use it from now on.
    pub(crate) fn write_forward(&self, id: u32, mut moves: Vec<Move>) -> Result<()> {
        moves.sort_unstable_by_key(|m| m.slot);
        let table = Forward { pack: id, store_id: self.store_id, moves: moves.into() };
        self.count_syncs(2);
        write_atomic(self.storage.as_ref(), &self.dir, &forward_file_name(id), &table.encode())?;
        self.forwards.write().unwrap_or_else(|p| p.into_inner()).insert(id, Arc::new(table));
        Ok(())
    }

    /// The packs with forward tables now (GC notes these before marking).
    pub(crate) fn forward_ids(&self) -> HashSet<u32> {
        self.forwards.read().unwrap_or_else(|p| p.into_inner()).keys().copied().collect()
    }

    /// Adds to `used` every table in `tables` a read of `at` goes through.
    pub(crate) fn note_forward_route(&self, at: ChunkLoc, tables: &HashSet<u32>, used: &mut HashSet<u32>) {
        if !tables.contains(&at.pack) {
            return;
        }
        let forwards = self.forwards.read().unwrap_or_else(|p| p.into_inner());
        let mut at = (at.pack, at.slot);
        for _ in 0..MAX_FORWARD_HOPS {
            let Some(table) = forwards.get(&at.0) else { return };
            used.insert(at.0);
            let Some(next) = table.lookup(at.1) else { return };
            at = next;
        }
    }

    /// Deletes the tables of `ids`: no manifest's leaf goes through them.
    /// A deletion lost in a crash only brings back an unused table.
    pub(crate) fn retire_forwards(&self, ids: impl IntoIterator<Item = u32>) -> Result<u64> {
        let mut retired = 0;
        for id in ids {
            self.forwards.write().unwrap_or_else(|p| p.into_inner()).remove(&id);
            self.storage.remove_file(&self.dir.join(forward_file_name(id)))?;
            retired += 1;
        }
        Ok(retired)
    }
}

/// Loads every forward table in `dir` (open), removing a table write that
/// never reached its rename.
pub(crate) fn load_forwards(
    storage: &dyn Storage,
    dir: &Path,
    names: &[String],
    store_id: u64,
) -> Result<Forwards> {
    let mut forwards = Forwards::new();
    for name in names {
        if is_forward_tmp_name(name) {
            storage.remove_file(&dir.join(name))?;
            continue;
        }
        let Some(id) = parse_forward_file_name(name) else { continue };
        let path = dir.join(name);
        match read_forward(storage, &path, id, store_id) {
            Ok(table) => {
                forwards.insert(id, Arc::new(table));
            }
            // Only an optimisation: reads of the chunks it moved ask the
            // index instead. Left in place for fsck to report.
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "forward table ignored"),
        }
    }
    Ok(forwards)
}

/// Reads and checks pack `id`'s table at `path` (open, fsck).
pub(crate) fn read_forward(storage: &dyn Storage, path: &Path, id: u32, store_id: u64) -> Result<Forward> {
    let corrupt = |detail: String| Error::Corruption { path: path.to_path_buf(), offset: 0, detail };
    let f = storage.open(path, OpenMode::Existing)?;
    let len = f.len()?;
    if len > (HEADER_BYTES + MAX_ENTRIES as usize * ENTRY_BYTES + 4) as u64 {
        return Err(corrupt(format!("forward table of {len} bytes")));
    }
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, 0)?;
    let table = Forward::decode(&buf, path)?;
    if table.pack != id || table.store_id != store_id {
        return Err(corrupt(format!(
            "forward table of pack {} of store {:#x} in this store's pack {id}",
            table.pack, table.store_id
        )));
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_round_trip_and_damage_is_caught() {
        let bytes = fuzz_sample_forward();
        let f = fuzz_decode_forward(&bytes).unwrap();
        assert_eq!(f.encode(), bytes);
        assert_eq!((f.lookup(4), f.lookup(5), f.lookup(70)), (Some((9, 1)), None, Some((12, 5))));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(fuzz_decode_forward(&bad).is_err(), "flip at {i} accepted");
        }
        assert!(fuzz_decode_forward(&bytes[..bytes.len() - 1]).is_err());
        let names = (forward_file_name(0xab), parse_forward_file_name("pack-000000ab.fwd"));
        assert_eq!(names, ("pack-000000ab.fwd".to_string(), Some(0xab)));
        assert_eq!(parse_forward_file_name("pack-000000ab.pack"), None);
    }

    #[test]
    fn out_of_order_or_self_moves_are_refused() {
        let bad = |moves: Vec<Move>| {
            let bytes = Forward { pack: 7, store_id: 1, moves: moves.into() }.encode();
            fuzz_decode_forward(&bytes).unwrap_err().to_string()
        };
        let m = |slot, to_pack| Move { slot, to_pack, to_slot: 0 };
        assert!(bad(vec![m(5, 8), m(5, 8)]).contains("order"));
        assert!(bad(vec![m(5, 7)]).contains("goes to pack 7"));
        assert!(bad(vec![m(5, 0)]).contains("goes to pack 0"));
    }
}
