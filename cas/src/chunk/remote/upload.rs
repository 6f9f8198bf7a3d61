//! Uploading one sealed pack: its bytes, a check of the stored length,
//! then its slot index (see the parent module for the order's reasons).

use super::packidx::PackIndex;
use super::UploadJob;
use crate::chunk::pack::slot_offset;
use crate::error::{Error, Result};
use crate::objects::Objects;

/// The object key of pack `id`'s bytes.
pub fn pack_key(id: u32) -> String {
    format!("packs/{id:08x}")
}

/// The object key of pack `id`'s slot index.
pub fn packidx_key(id: u32) -> String {
    format!("packidx/{id:08x}")
}

/// PUTs `job`'s pack and slot index; returns the bytes sent.
pub(super) fn put_pack(objects: &dyn Objects, store_id: u64, job: &UploadJob) -> Result<u64> {
    let len = slot_offset(job.slots);
    let mut bytes = vec![0u8; len as usize];
    // A crash may have cut the pack's tail: slots past its last live one,
    // dead, uploaded as zeros.
    let have = job.file.len()?.min(len) as usize;
    job.file.read_exact_at(&mut bytes[..have], 0)?;
    let key = pack_key(job.id);
    objects.put(&key, &bytes)?;
    match objects.head(&key)? {
        Some(n) if n == len => {}
        found => {
            return Err(Error::Unavailable(
                objects.describe(),
                format!("{key} holds {found:?} bytes after a PUT of {len}"),
            ))
        }
    }
    let idx = PackIndex::of_pack(job.id, store_id, &bytes, |slot| job.live.get(slot));
    let idx_bytes = idx.encode();
    objects.put(&packidx_key(job.id), &idx_bytes)?;
    Ok(len + idx_bytes.len() as u64)
}
