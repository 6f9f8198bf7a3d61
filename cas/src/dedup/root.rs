//! The dedup index's root: which runs, slots file and journal make up the
//! index now. Replaced whole (`write_atomic`) by each flush, after the
//! files it names are durable, so a crash leaves the old root (and the old
//! files, which a flush deletes only afterwards) or the new one.
//!
//! ```text
//! index-root
//!  0 magic "CASIROOT" | 8 version u32 | 12 summary_limit u32 | 16 store_id u64
//!  24 generation u64 | 32 next_file_id u64 | 40 next_pack_id u32 | 44 journal_generation u32
//!  48 slots_id u64 (0: no slots file) | 56 runs u32 | run ids u64, oldest first | crc32c
//! ```
//!
//! `journal_generation` is the generation the index journal's header must
//! carry for its records to be replayed: a journal left from before the
//! flush that wrote this root holds only records the root's files
//! already include, and is skipped (then rewritten) by the next open.

use super::summary::PARTITIONS;
use crate::error::{Error, Result};
use crate::format::{self, Decoder, Encoder};
use crate::storage::{read_small, write_atomic, Storage};
use std::path::Path;

pub(crate) const ROOT_FILE: &str = "index-root";
pub(crate) const ROOT_VERSION: u32 = 1;
const ROOT_MAGIC: [u8; 8] = *b"CASIROOT";
/// Runs a root may name (the summary's run slots).
const MAX_RUNS: usize = 256;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Root {
    pub store_id: u64,
    pub generation: u64,
    /// Ids of runs and slots files are never reused: the next one.
    pub next_file_id: u64,
    pub next_pack_id: u32,
    pub journal_generation: u32,
    pub slots_id: u64,
    pub runs: Vec<u64>,
    /// Partitions the summary covers (summary.rs).
    pub summary_limit: u32,
}

impl Root {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::with_capacity(64 + self.runs.len() * 8);
        e.bytes(&ROOT_MAGIC).u32(ROOT_VERSION).u32(self.summary_limit).u64(self.store_id);
        e.u64(self.generation).u64(self.next_file_id).u32(self.next_pack_id).u32(self.journal_generation);
        e.u64(self.slots_id).u32(self.runs.len() as u32);
        for r in &self.runs {
            e.u64(*r);
        }
        e.seal();
        e.buf
    }

    pub fn decode(buf: &[u8], path: &Path) -> Result<Root> {
        let corrupt = |detail: String| Error::Corruption { path: path.to_path_buf(), offset: 0, detail };
        if buf.get(..8) != Some(&ROOT_MAGIC[..]) {
            return Err(corrupt("not an index root (bad magic)".into()));
        }
        let body = format::unseal(buf, path, 0)?;
        let mut d = Decoder::new(&body[8..]);
        let short = || corrupt("short index root".into());
        format::check_version("index root", d.u32().ok_or_else(short)?, ROOT_VERSION)?;
        let summary_limit = d.u32().ok_or_else(short)?;
        let store_id = d.u64().ok_or_else(short)?;
        let (generation, next_file_id) = (d.u64().ok_or_else(short)?, d.u64().ok_or_else(short)?);
        let (next_pack_id, journal_generation) = (d.u32().ok_or_else(short)?, d.u32().ok_or_else(short)?);
        let slots_id = d.u64().ok_or_else(short)?;
        let n = d.u32().ok_or_else(short)? as usize;
        if n > MAX_RUNS || d.remaining() != n * 8 {
            return Err(corrupt(format!("index root names {n} runs in {} bytes", d.remaining())));
        }
        let runs: Vec<u64> = (0..n).map(|_| d.u64().expect("length checked")).collect();
        let limit_ok = summary_limit.is_power_of_two() && summary_limit as usize <= PARTITIONS;
        let ids_ok = runs.iter().chain([&slots_id]).all(|&id| id < next_file_id);
        let mut sorted = runs.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if !limit_ok || !ids_ok || sorted.len() != runs.len() || runs.contains(&0) {
            return Err(corrupt(format!(
                "index root is inconsistent (summary limit {summary_limit}, next file id {next_file_id}, runs {runs:?}, slots {slots_id})"
            )));
        }
        Ok(Root {
            store_id,
            generation,
            next_file_id,
            next_pack_id,
            journal_generation,
            slots_id,
            runs,
            summary_limit,
        })
    }

    /// Reads the root in `dir`, if there is one.
    pub fn read(storage: &dyn Storage, dir: &Path) -> Result<Option<Root>> {
        let path = dir.join(ROOT_FILE);
        let Some(buf) = read_small(storage, &path, 4096, "index root")? else { return Ok(None) };
        Root::decode(&buf, &path).map(Some)
    }

    /// Replaces the root in `dir` durably.
    pub fn write(&self, storage: &dyn Storage, dir: &Path) -> Result<()> {
        write_atomic(storage, dir, ROOT_FILE, &self.encode())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_round_trip_and_damage_is_refused() {
        let r = Root {
            store_id: 9,
            generation: 4,
            next_file_id: 12,
            next_pack_id: 30,
            journal_generation: 4,
            slots_id: 11,
            runs: vec![3, 10, 7],
            summary_limit: PARTITIONS as u32,
        };
        let bytes = r.encode();
        let p = Path::new("/r");
        assert_eq!(Root::decode(&bytes, p).unwrap(), r);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 4;
            assert!(Root::decode(&bad, p).is_err(), "flip at {i}");
        }
        let mut newer = bytes.clone();
        newer[8] = 9;
        let n = newer.len() - 4;
        let crc = format::crc32c(&newer[..n]);
        newer[n..].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(Root::decode(&newer, p), Err(Error::UnsupportedVersion { .. })));
    }
}
