//! Fuzz entry points for the chunk index journal: replay hostile bytes as
//! an `index` file, and reseal a mutated one so a fuzzer gets past the
//! checksums. Used by `fuzz/fuzz_targets/chunk_index.rs` and by the stable
//! smoke test (`cas/tests/fuzz_corpus.rs`).

use super::journal::{self, Journal, JournalOp, BATCH_HEADER_BYTES, FILE_HEADER_USED, RECORD_BYTES};
use super::ChunkHash;
use crate::error::Result;
use crate::format;
use crate::storage::{MemStorage, OpenMode, Storage};
use std::path::Path;

/// The file header's crc32c: the last field of its used bytes.
const HEADER_CRC_AT: usize = FILE_HEADER_USED - 4;
const SECTOR: usize = crate::units::SECTOR_BYTES as usize;

/// Replays `bytes` as a chunk index journal, as an open does. Returns the
/// puts and removes replayed, or the open's error; never panics.
pub fn fuzz_replay_index(bytes: &[u8]) -> Result<(u64, u64)> {
    let storage = MemStorage::new();
    let dir = Path::new("/chunks");
    storage.create_dir_all(dir)?;
    let f = storage.open(&dir.join(journal::INDEX_FILE), OpenMode::CreateNew)?;
    f.write_all_at(bytes, 0)?;
    let (mut puts, mut removes) = (0u64, 0u64);
    Journal::open(&storage, dir, |op| {
        match op {
            JournalOp::Put { .. } => puts += 1,
            JournalOp::Remove { .. } | JournalOp::Free { .. } => removes += 1,
            JournalOp::NextPack { .. } => {}
        }
        Ok(())
    })?;
    Ok((puts, removes))
}

/// Rewrites the crc32c of the file header and of every batch whose header
/// and length parse, in place, so mutated input reaches the decoders
/// behind the checksums.
pub fn fuzz_reseal_index(bytes: &mut [u8]) {
    if bytes.len() >= HEADER_CRC_AT + 4 {
        let crc = format::crc32c(&bytes[..HEADER_CRC_AT]);
        bytes[HEADER_CRC_AT..HEADER_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    }
    let mut at = SECTOR;
    while at + BATCH_HEADER_BYTES + 4 <= bytes.len() {
        let count = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().expect("4 bytes")) as usize;
        let Some(end) = count
            .checked_mul(RECORD_BYTES)
            .and_then(|b| (at + BATCH_HEADER_BYTES).checked_add(b))
            .filter(|&e| e + 4 <= bytes.len())
        else {
            return;
        };
        let crc = format::crc32c(&bytes[at..end]);
        bytes[end..end + 4].copy_from_slice(&crc.to_le_bytes());
        at = (end + 4).div_ceil(SECTOR) * SECTOR;
    }
}

/// A valid journal of `batches` batches of a next-pack record, puts and a
/// remove each (seeds).
pub fn fuzz_sample_index(batches: u32) -> Vec<u8> {
    let storage = MemStorage::new();
    let dir = Path::new("/chunks");
    let build = || -> Result<Vec<u8>> {
        storage.create_dir_all(dir)?;
        let mut j = Journal::create(&storage, dir, 0x5eed, 0)?;
        for b in 0..batches {
            let hash = |i: u32| {
                let mut h = [0u8; ChunkHash::BYTES];
                h[..4].copy_from_slice(&(b * 16 + i).to_le_bytes());
                ChunkHash::from_bytes(h)
            };
            let mut ops = vec![JournalOp::NextPack { id: 2 + b }];
            ops.extend((0..3).map(|i| JournalOp::Put { hash: hash(i), pack: 1, slot: b * 3 + i, crc: i }));
            ops.push(JournalOp::Remove { hash: hash(0) });
            ops.push(JournalOp::Free { pack: 1, slot: b * 3 });
            j.append(&ops)?;
        }
        let f = storage.open(&dir.join(journal::INDEX_FILE), OpenMode::Existing)?;
        let mut out = vec![0u8; f.len()? as usize];
        f.read_exact_at(&mut out, 0)?;
        Ok(out)
    };
    build().expect("an in-memory journal builds")
}
