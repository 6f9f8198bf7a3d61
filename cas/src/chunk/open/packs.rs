//! Opening the packs: every local pack with a live slot checked (header,
//! store id, length), those with none deleted (crash leftovers, packs GC
//! emptied); with a tier, packs only in the bucket and other stores'
//! packs given handles that read it; then where appends resume, and which
//! packs closed before a crash wait to be sealed.

use super::super::pack::{self, PACK_HEADER_BYTES};
use super::super::pack_id::{self, PackPhase};
use super::super::tier::{SealedPack, TierAttach, TierOpen};
use super::super::{
    corrupt, lock, ActivePack, ChunkStore, ChunkStoreOptions, OpenReport, PackFiles, PackState, Writer,
    CHUNK_BYTES,
};
use crate::dedup::slots::Bits;
use crate::error::{Error, Result};
use crate::storage::Storage;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Chunks a pack of `opts.pack_bytes` holds.
pub(super) fn slots_per_pack(opts: &ChunkStoreOptions) -> Result<u32> {
    let slots = opts.pack_bytes.saturating_sub(PACK_HEADER_BYTES) / CHUNK_BYTES as u64;
    if slots == 0 || opts.pack_bytes > pack::MAX_PACK_BYTES {
        return Err(Error::InvalidArgument(format!(
            "pack_bytes {} must leave room for a chunk after the {PACK_HEADER_BYTES}-byte header and be at most {}",
            opts.pack_bytes,
            pack::MAX_PACK_BYTES
        )));
    }
    Ok(u32::try_from(slots).unwrap_or(u32::MAX))
}

/// The packs at open.
pub(super) struct OpenedPacks {
    pub packs: BTreeMap<u32, PackState>,
    pub files: PackFiles,
    /// What the tier lists: (id, phase, slots).
    pub listed: Vec<(u32, PackPhase, u32)>,
    /// With a tier: this store's host slot.
    pub host_slot: Option<u8>,
    /// The store was opened with its bucket (closed packs are sealed).
    pub has_bucket: bool,
}

/// Opens the packs of store `store_id` in `dir` (local files `pack_ids`,
/// live slots `bits`), attaching `tier` if given.
pub(super) fn open_packs(
    storage: &Arc<dyn Storage>,
    dir: &Path,
    store_id: u64,
    mut bits: BTreeMap<u32, Bits>,
    pack_ids: &[u32],
    tier: Option<&dyn TierOpen>,
    report: &mut OpenReport,
) -> Result<(OpenedPacks, Option<Box<dyn TierAttach>>)> {
    bits.retain(|_, b| b.count() > 0);
    let kept = |id: u32| pack_ids.contains(&id) && bits.contains_key(&id);
    let mut attached = match tier {
        Some(t) => t.attach(storage, dir, store_id, &kept)?,
        None => None,
    };
    let listed = attached.as_ref().map_or(Vec::new(), |a| a.packs());
    // Uploaded packs whose local copy was deleted: read from the bucket.
    let remote_only: Vec<(u32, u32)> = listed
        .iter()
        .filter(|&&(id, phase, _)| {
            matches!(phase, PackPhase::Uploaded | PackPhase::Foreign)
                && !pack_ids.contains(&id)
                && bits.contains_key(&id)
        })
        .map(|&(id, _, slots)| (id, slots))
        .collect();
    let in_bucket = |id: &u32| remote_only.iter().any(|r| r.0 == *id);
    if let Some(missing) = bits.keys().find(|id| !pack_ids.contains(id) && !in_bucket(id)) {
        return Err(corrupt(
            dir,
            0,
            format!("the index has live chunks in pack {missing}, which does not exist"),
        ));
    }
    let mut packs = BTreeMap::new();
    let mut files = PackFiles::new();
    for &id in pack_ids {
        let path = dir.join(pack::pack_file_name(id));
        let Some(live) = bits.remove(&id) else {
            // Crash leftover or emptied by GC: no live slot in it.
            storage.remove_file(&path)?;
            report.packs_removed += 1;
            continue;
        };
        let max_slot = live.max().expect("live packs have a live slot");
        let (file, header, slots) = pack::open_checked(storage.as_ref(), &path, store_id, id, max_slot)?;
        report.packs_checked += 1;
        packs.insert(id, PackState::new(slots, header.capacity_slots, live));
        files.insert(id, file);
    }
    // Other stores' packs that fetched images name: no live slot here.
    let foreign: Vec<(u32, u32)> = listed
        .iter()
        .filter(|&&(id, phase, _)| phase == PackPhase::Foreign && !in_bucket(&id))
        .map(|&(id, _, slots)| (id, slots))
        .collect();
    let wanted: Vec<(u32, u64)> =
        remote_only.iter().chain(&foreign).map(|&(id, slots)| (id, pack::slot_offset(slots))).collect();
    let handles = match attached.as_mut() {
        Some(a) => a.remote_files(&wanted)?,
        None => None,
    };
    let mut handles = handles.map(Vec::into_iter);
    for &(id, slots) in &remote_only {
        let Some(file) = handles.as_mut().and_then(Iterator::next) else {
            return Err(Error::Unavailable(
                format!("pack {id:#010x}"),
                "it is only in the bucket: open the store with its remote".into(),
            ));
        };
        let live = bits.remove(&id).expect("remote-only packs have live slots");
        if live.max().is_some_and(|m| m >= slots) {
            return Err(corrupt(
                dir,
                0,
                format!(
                    "the index has live slot {:?} in pack {id:#010x}, which was uploaded with {slots}",
                    live.max()
                ),
            ));
        }
        packs.insert(id, PackState::new(slots, slots, live));
        files.insert(id, file);
    }
    for &(id, _) in &foreign {
        let Some(file) = handles.as_mut().and_then(Iterator::next) else {
            return Err(Error::Unavailable(
                format!("pack {id:#010x}"),
                "a fetched image reads it from the bucket: open the store with its remote".into(),
            ));
        };
        files.entry(id).or_insert(file);
    }
    let host_slot = attached.as_ref().map(|a| a.host_slot());
    let has_bucket = attached.as_ref().is_some_and(|a| a.has_bucket());
    Ok((OpenedPacks { packs, files, listed, host_slot, has_bucket }, attached))
}

/// The writer's state over `opened`, with where appends resume: never at
/// an id given out before (`next_pack_floor`, local files `pack_ids`, the
/// tier's list), in the newest pack with room that is not sealed. Also
/// returns the open pack files and what the tier lists.
pub(super) fn resume(
    opened: OpenedPacks,
    pack_ids: &[u32],
    next_pack_floor: u32,
) -> (Writer, PackFiles, Vec<(u32, PackPhase, u32)>) {
    // Never an id given out before, even if its file is gone (journal.rs).
    let mut next_pack_id = pack_ids.iter().max().map_or(1, |m| m + 1).max(next_pack_floor);
    let listed = |id: u32| opened.listed.iter().any(|p| p.0 == id);
    if let Some(h) = opened.host_slot {
        // Listed ids too: their objects in the bucket are never written again.
        let after_listed =
            opened.listed.iter().map(|p| p.0).filter(|&id| pack_id::owns(h, id)).max().map_or(0, |id| id + 1);
        next_pack_id = next_pack_id.max(pack_id::first_pack_id(h)).max(after_listed);
    }
    // Keep appending to the newest pack if it has room (with a tier: the
    // newest of this store's host slot, if it is not sealed).
    let resumable = |id: &u32| match opened.host_slot {
        Some(h) => pack_id::owns(h, *id) && !listed(*id),
        None => true,
    };
    let active = opened.packs.iter().rfind(|(id, _)| resumable(id)).and_then(|(&id, p)| {
        (p.slots < p.capacity).then(|| ActivePack {
            id,
            file: opened.files[&id].clone(),
            next_slot: p.slots,
            capacity: p.capacity,
        })
    });
    // Packs of the host slot closed before a crash let them be sealed:
    // every live slot is durable already.
    let to_seal = if opened.has_bucket {
        opened
            .packs
            .keys()
            .filter(|id| resumable(id) && active.as_ref().is_none_or(|a| a.id != **id))
            .map(|&id| (id, 0))
            .collect()
    } else {
        Vec::new()
    };
    let writer = Writer {
        active,
        packs: opened.packs,
        next_pack_id,
        buf: Vec::new(),
        pending: Vec::new(),
        seq: 0,
        dirty: BTreeMap::new(),
        dir_dirty: false,
        host_slot: opened.host_slot,
        to_seal,
    };
    (writer, opened.files, opened.listed)
}

impl ChunkStore {
    /// Starts the tier `attached` once the store is built: the packs it
    /// lists as sealed go back in its queue, its uploaded packs still here
    /// are noted, the packs closed before a crash are sealed, local copies
    /// past its bound evicted, then its background work started.
    pub(super) fn start_tier(
        &mut self,
        attached: Box<dyn TierAttach>,
        listed: &[(u32, PackPhase, u32)],
        pack_ids: &[u32],
    ) -> Result<()> {
        let (sealed, uploaded_local) = {
            let w = lock(&self.writer);
            let files = self.read_files();
            let mut sealed = Vec::new();
            let mut uploaded_local = Vec::new();
            for &(id, phase, slots) in listed {
                let (Some(p), Some(file)) = (w.packs.get(&id), files.get(&id)) else { continue };
                match phase {
                    PackPhase::Sealed => {
                        sealed.push(SealedPack { id, slots, file: file.clone(), live: p.live_bits.clone() })
                    }
                    PackPhase::Uploaded if pack_ids.contains(&id) => {
                        uploaded_local.push((id, pack::slot_offset(slots)))
                    }
                    PackPhase::Uploaded | PackPhase::Foreign => {}
                }
            }
            (sealed, uploaded_local)
        };
        let Some(tier) = attached.start(self.files.clone(), sealed, uploaded_local)? else { return Ok(()) };
        self.tier = Some(tier.clone());
        self.seal_durable(0)?;
        if let Err(e) = tier.evict() {
            tracing::warn!(error = %e, "deleting local copies of uploaded packs failed; retried after the next upload");
        }
        tier.run()
    }
}
