//! Fuzz entry points for the dedup index's files: a run (read whole, as an
//! open and fsck do), the root and the slots file, chosen by the input's
//! first byte (0, 1, 2; others are refused). A resealer recomputes every
//! checksum so mutated input reaches the decoders behind them. Used by
//! `fuzz/fuzz_targets/dedup_index.rs` and the stable corpus test
//! (`ci/tests/fuzz_corpus.rs`).

use super::root::Root;
use super::run::{self, Entry, Run, RunWriter, PAGE_BYTES, PAGE_RECORDS};
use super::slots::{self, Bits};
use crate::error::{Error, Result};
use crate::format;
use crate::storage::{MemStorage, OpenMode, Storage};
use crate::units::{ChunkHash, ChunkLoc};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

const STORE_ID: u64 = 0x5eed;
const RUN_ID: u64 = 1;
const KIND_RUN: u8 = 0;
const KIND_ROOT: u8 = 1;
const KIND_SLOTS: u8 = 2;

/// Decodes `data[1..]` as the object `data[0]` names; returns the entries
/// (run), runs (root) or packs (slots) it holds, or the decoder's error.
/// Never panics. A decoded root encodes back to the same bytes.
pub fn fuzz_decode_dedup(data: &[u8]) -> Result<u64> {
    let Some((&kind, body)) = data.split_first() else {
        return Err(Error::InvalidArgument("empty input".into()));
    };
    let path = Path::new("/fuzz");
    match kind {
        KIND_RUN => {
            let storage = MemStorage::new();
            let dir = Path::new("/chunks");
            storage.create_dir_all(dir)?;
            let f = storage.open(&dir.join(run::run_file_name(RUN_ID)), OpenMode::CreateNew)?;
            f.write_all_at(body, 0)?;
            let r = Arc::new(Run::open(&storage, dir, RUN_ID, STORE_ID)?);
            let (mut entries, mut keys) = (r.stream(), r.keys());
            let mut n = 0;
            while let Some(e) = entries.next_entry()? {
                let k = keys
                    .next_key()?
                    .ok_or_else(|| Error::InvalidArgument("fewer keys than entries".into()))?;
                if k[..] != e.hash.as_bytes()[..run::KEY_BYTES] {
                    return Err(Error::InvalidArgument("a key disagrees with its entry".into()));
                }
                if let Some(found) = r.find(&e.hash.tag(), crate::io::Wait::Block)? {
                    assert_eq!(found.hash, e.hash, "a run finds the entry it streams");
                }
                n += 1;
            }
            Ok(n)
        }
        KIND_ROOT => {
            let root = Root::decode(body, path)?;
            assert_eq!(root.encode(), body, "decode/encode round trip");
            Ok(root.runs.len() as u64)
        }
        KIND_SLOTS => Ok(slots::decode(body, path, STORE_ID)?.len() as u64),
        other => Err(Error::InvalidArgument(format!("no object kind {other}"))),
    }
}

fn reseal_tail(bytes: &mut [u8]) {
    if bytes.len() >= 4 {
        let n = bytes.len() - 4;
        let crc = format::crc32c(&bytes[..n]);
        bytes[n..].copy_from_slice(&crc.to_le_bytes());
    }
}

/// Rewrites the checksums of `data[1..]` as its kind lays them out (a run
/// only when its length is what its header's entry count calls for).
pub fn fuzz_reseal_dedup(data: &mut [u8]) {
    let Some((&mut kind, body)) = data.split_first_mut() else { return };
    match kind {
        KIND_ROOT | KIND_SLOTS => reseal_tail(body),
        KIND_RUN if body.len() >= 44 => {
            let entries = u64::from_le_bytes(body[32..40].try_into().expect("8 bytes"));
            if entries == 0 || entries > 1 << 20 || body.len() as u64 != run::run_file_bytes(entries) {
                return;
            }
            let crc = format::crc32c(&body[..40]);
            body[40..44].copy_from_slice(&crc.to_le_bytes());
            let pages = entries.div_ceil(PAGE_RECORDS as u64) as usize;
            for p in 0..pages {
                reseal_tail(&mut body[PAGE_BYTES * (1 + p)..PAGE_BYTES * (2 + p)]);
            }
            let fences = PAGE_BYTES * (1 + pages);
            reseal_tail(&mut body[fences..fences + pages * 8 + 4]);
            reseal_tail(&mut body[fences + pages * 8 + 4..]);
        }
        _ => {}
    }
}

/// One valid object of each kind, selector byte first (seeds).
pub fn fuzz_sample_dedup() -> Vec<Vec<u8>> {
    let build = || -> Result<Vec<Vec<u8>>> {
        let storage = MemStorage::new();
        let dir = Path::new("/chunks");
        storage.create_dir_all(dir)?;
        let mut entries: Vec<Entry> = (0..200u64)
            .map(|i| Entry {
                hash: ChunkHash::of(&i.to_le_bytes()),
                at: ChunkLoc { pack: 1 + (i / 64) as u32, slot: (i % 64) as u32, crc: i as u32 },
            })
            .collect();
        entries.sort_unstable_by(|a, b| run::hash_order(&a.hash, &b.hash));
        let mut w = RunWriter::create(&storage, dir, RUN_ID, 0, STORE_ID)?;
        let mut packs: BTreeMap<u32, Bits> = BTreeMap::new();
        for e in &entries {
            w.push(e)?;
            packs.entry(e.at.pack).or_default().set(e.at.slot);
        }
        w.finish()?;
        let f = storage.open(&dir.join(run::run_file_name(RUN_ID)), OpenMode::Existing)?;
        let mut run_bytes = vec![KIND_RUN; 1 + f.len()? as usize];
        f.read_exact_at(&mut run_bytes[1..], 0)?;
        let root = Root {
            store_id: STORE_ID,
            generation: 3,
            next_file_id: 5,
            next_pack_id: 5,
            journal_generation: 3,
            slots_id: 4,
            runs: vec![RUN_ID, 2],
            summary_limit: 1 << 10,
        };
        let mut root_bytes = vec![KIND_ROOT];
        root_bytes.extend(root.encode());
        let mut slots_bytes = vec![KIND_SLOTS];
        slots_bytes.extend(slots::encode(STORE_ID, &packs));
        Ok(vec![run_bytes, root_bytes, slots_bytes])
    };
    build().expect("in-memory samples build")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_decode_and_resealed_damage_is_still_refused_or_decoded() {
        let samples = fuzz_sample_dedup();
        let counts: Vec<u64> = samples.iter().map(|s| fuzz_decode_dedup(s).unwrap()).collect();
        assert_eq!(counts, vec![200, 2, 4]);
        for s in &samples {
            let mut resealed = s.clone();
            fuzz_reseal_dedup(&mut resealed);
            assert_eq!(&resealed, s, "resealing a valid object changes nothing");
            for at in (1..s.len()).step_by(31) {
                if s[0] == KIND_RUN && (45..1 + PAGE_BYTES).contains(&at) {
                    continue; // the run header's zero padding, which nothing reads
                }
                let mut bad = s.clone();
                bad[at] ^= 0x21;
                assert!(fuzz_decode_dedup(&bad).is_err(), "a flip at {at} of kind {} decoded", s[0]);
                fuzz_reseal_dedup(&mut bad);
                let _ = fuzz_decode_dedup(&bad);
            }
        }
        assert!(fuzz_decode_dedup(&[]).is_err() && fuzz_decode_dedup(&[9, 1]).is_err());
    }
}
