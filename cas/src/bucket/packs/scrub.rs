//! A bucket scrub's part in the tier (`casblk scrub --bucket`): each pack
//! the bucket holds for this store (its uploaded packs, and the foreign
//! packs it references) checked from the bucket's own objects, at the
//! caller's pace. The pack's slot index (`packidx/`, written from the
//! bytes uploaded) gives every live slot's blake3 name and crc32c; the
//! pack object is read in ranges of at most [`SCRUB_READ_BYTES`] (one GET
//! each, never across a part) and each live slot checked against both.
//! Which images a damaged slot affects is the store's to say
//! (store/scrub.rs walks the manifests).

use super::upload::{pack_key, PART_BYTES};
use super::PackTier;
use crate::chunk::check::check_bytes;
use crate::chunk::pack::slot_offset;
use crate::chunk::CHUNK_BYTES;
use crate::objects::ObjectErrorKind;
use crate::units::ChunkHash;

/// The most bytes one GET of a scrub reads.
pub const SCRUB_READ_BYTES: u64 = 1 << 20;

/// One damaged slot of a pack in the bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotDamage {
    pub slot: u32,
    /// What the slot index says the slot holds.
    pub hash: ChunkHash,
    pub crc: u32,
    pub detail: String,
}

/// What the check of one pack in the bucket found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PackCheck {
    /// Its live slots were read (`slots`, `bytes` of GETs); `damaged` lists
    /// those whose bytes are not the chunk the slot index names (or could
    /// not be read). `stopped`: the pacer stopped it part way.
    Checked { slots: u64, bytes: u64, damaged: Vec<SlotDamage>, stopped: bool },
    /// Its slot index could not be read or decoded: why.
    NoIndex(String),
}

impl PackTier {
    /// The packs in the bucket this store reads: its uploaded ones and
    /// the foreign ones it references, in id order.
    pub fn bucket_pack_ids(&self) -> Vec<u32> {
        use super::catalog::PackPhase;
        let s = self.state();
        s.catalog
            .packs
            .iter()
            .filter(|(_, p)| matches!(p.phase, PackPhase::Uploaded | PackPhase::Foreign))
            .map(|(&id, _)| id)
            .collect()
    }

    /// Checks pack `id` in the bucket (see the module docs); `spend(bytes)`
    /// after each GET paces the walk and returns false to stop it.
    pub fn scrub_pack(&self, id: u32, spend: &mut dyn FnMut(u64) -> bool) -> PackCheck {
        let index = match self.pack_index(id) {
            Ok(index) => index,
            Err(e) => return PackCheck::NoIndex(e.to_string()),
        };
        let live: Vec<(u32, ChunkHash, u32)> = index
            .slots
            .iter()
            .enumerate()
            .filter_map(|(slot, s)| s.map(|(hash, crc)| (slot as u32, hash, crc)))
            .collect();
        let (mut slots, mut bytes, mut damaged) = (0u64, 0u64, Vec::new());
        let mut i = 0;
        while i < live.len() {
            // One GET: the live slots from live[i] on that fit in a read
            // and in the first slot's part.
            let start = slot_offset(live[i].0);
            let part_end = (start / PART_BYTES + 1) * PART_BYTES;
            let limit = (start + SCRUB_READ_BYTES).min(part_end);
            let mut j = i;
            while j < live.len() && slot_offset(live[j].0) + CHUNK_BYTES as u64 <= limit {
                j += 1;
            }
            let end = slot_offset(live[j - 1].0) + CHUNK_BYTES as u64;
            let part = start / PART_BYTES;
            let range = (start - part * PART_BYTES)..(end - part * PART_BYTES);
            let got = self.objects.get_range(&pack_key(id, part), range);
            for &(slot, hash, crc) in &live[i..j] {
                let problem = match &got {
                    Err(e) if e.kind == ObjectErrorKind::NotFound => Some(format!(
                        "the bucket has no object {} (deleted behind casblk's back?)",
                        pack_key(id, part)
                    )),
                    Err(e) => Some(format!("reading it from the bucket failed: {e}")),
                    Ok(data) => {
                        let at = (slot_offset(slot) - start) as usize;
                        match data.get(at..at + CHUNK_BYTES).map(|b| check_bytes(b, &hash, crc, true)) {
                            None => Some(format!("the object {} is cut short", pack_key(id, part))),
                            Some(Err(m)) => Some(m.describe(crc, "its slot index")),
                            Some(Ok(())) => None,
                        }
                    }
                };
                slots += 1;
                if let Some(why) = problem {
                    damaged.push(SlotDamage {
                        slot,
                        hash,
                        crc,
                        detail: format!("pack {id:#010x} slot {slot} in the bucket: {why}"),
                    });
                }
            }
            bytes += end - start;
            i = j;
            if !spend(end - start) {
                return PackCheck::Checked { slots, bytes, damaged, stopped: true };
            }
        }
        PackCheck::Checked { slots, bytes, damaged, stopped: false }
    }
}
