//! Uploading one sealed pack: its bytes, in parts of `PART_BYTES`, a
//! check of each part's stored length, then its slot index (see the
//! parent module for the order's reasons).
//!
//! Why parts: on a 3-node Garage 2.5 a ranged GET of an object of 32 MiB
//! or more takes 45-48 ms (p50), against 3-4 ms for 8-16 MiB objects and
//! 2-3 ms at any size on one node (measured with 64 KiB and 1 MiB ranges);
//! a whole 64 MiB pack object made every cold read that slow.

use super::packidx::PackIndex;
use crate::chunk::pack::slot_offset;
use crate::chunk::tier::SealedPack;
use crate::error::{Error, Result};
use crate::objects::Objects;

/// Bytes of one part of a pack object (a multiple of the extent cache's
/// 64 KiB, so an extent never spans two parts).
pub const PART_BYTES: u64 = 16 << 20;

/// The object key of part `part` of pack `id` (bytes `part * PART_BYTES`
/// onwards).
pub fn pack_key(id: u32, part: u64) -> String {
    format!("packs/{id:08x}/{part:04x}")
}

/// The object key of pack `id`'s slot index.
pub fn packidx_key(id: u32) -> String {
    format!("packidx/{id:08x}")
}

/// PUTs `job`'s pack and slot index; returns the bytes sent.
pub(super) fn put_pack(objects: &dyn Objects, store_id: u64, job: &SealedPack) -> Result<u64> {
    let len = slot_offset(job.slots);
    let mut bytes = vec![0u8; len as usize];
    // A crash may have cut the pack's tail: slots past its last live one,
    // dead, uploaded as zeros.
    let have = job.file.len()?.min(len) as usize;
    job.file.read_exact_at(&mut bytes[..have], 0)?;
    for (part, data) in bytes.chunks(PART_BYTES as usize).enumerate() {
        let key = pack_key(job.id, part as u64);
        objects.put(&key, data)?;
        match objects.head(&key)? {
            Some(n) if n == data.len() as u64 => {}
            found => {
                return Err(Error::Unavailable(
                    objects.describe(),
                    format!("{key} holds {found:?} bytes after a PUT of {}", data.len()),
                ))
            }
        }
    }
    let idx = PackIndex::of_pack(job.id, store_id, &bytes, |slot| job.live.get(slot));
    let idx_bytes = idx.encode();
    objects.put(&packidx_key(job.id), &idx_bytes)?;
    Ok(len + idx_bytes.len() as u64)
}
