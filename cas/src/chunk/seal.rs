//! Sealing packs for the tier (tier.rs): a pack closed for good is sealed
//! once a sync covers its last write, and the active pack is closed on
//! demand. What the tier does with a sealed pack is its own business.

use super::tier::SealedPack;
use super::{lock, ChunkStore};
use crate::error::Result;
use std::collections::BTreeSet;

/// How far a pack of this store's host slot is from being sealed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closing {
    /// It is the active pack: appended to until closed.
    Active,
    /// Closed, waiting for a sync to cover its last write.
    AwaitingSync,
    /// Neither (sealed already, or not a pack of this store).
    No,
}

impl ChunkStore {
    /// Seals the packs closed before change `durable_seq` (which a sync
    /// has made durable): hands them to the tier, which records and
    /// queues them. A failure to do so poisons the store.
    pub(crate) fn seal_durable(&self, durable_seq: u64) -> Result<()> {
        let Some(tier) = &self.tier else { return Ok(()) };
        let (packs, taken) = {
            let mut guard = lock(&self.writer);
            if guard.to_seal.is_empty() {
                return Ok(());
            }
            let w = &mut *guard;
            let files = self.read_files();
            let mut packs = Vec::new();
            let mut taken = Vec::new();
            w.to_seal.retain(|&(id, seq)| {
                if seq > durable_seq {
                    return true;
                }
                taken.push((id, seq));
                if let (Some(p), Some(file)) = (w.packs.get(&id), files.get(&id)) {
                    let live = p.live_bits.clone();
                    packs.push(SealedPack { id, slots: p.slots, file: file.clone(), live });
                }
                false
            });
            (packs, taken)
        };
        tier.sealed(packs).inspect_err(|e| {
            // Still to seal (by a reopen: the store is poisoned).
            lock(&self.writer).to_seal.extend(taken);
            self.poison(e);
        })
    }

    /// Closes the active pack (if it holds a chunk) and seals it for
    /// upload; returns its id. Without a tier, does nothing.
    pub fn seal_active(&self) -> Result<Option<u32>> {
        if self.tier.is_none() {
            return Ok(None);
        }
        let id = {
            let mut w = lock(&self.writer);
            if w.active.as_ref().is_none_or(|a| a.next_slot == 0) {
                return Ok(None);
            }
            w.close_active().expect("checked above")
        };
        self.sync()?;
        Ok(Some(id))
    }

    /// Whether sealed packs go to a tier (and inserts may wait for its
    /// upload room).
    pub fn has_tier(&self) -> bool {
        self.tier.is_some()
    }

    /// Bytes the active pack spans (0 when it holds no chunk, or there is
    /// none).
    pub fn active_bytes(&self) -> u64 {
        lock(&self.writer).active.as_ref().map_or(0, |a| {
            if a.next_slot == 0 {
                0
            } else {
                super::pack::slot_offset(a.next_slot)
            }
        })
    }

    /// How far pack `id` is from being sealed.
    pub fn closing(&self, id: u32) -> Closing {
        let w = lock(&self.writer);
        if w.active.as_ref().is_some_and(|a| a.id == id) {
            Closing::Active
        } else if w.to_seal.iter().any(|&(s, _)| s == id) {
            Closing::AwaitingSync
        } else {
            Closing::No
        }
    }

    /// Other stores' packs, read from the bucket (never swept or
    /// repacked).
    pub(crate) fn foreign_packs(&self) -> BTreeSet<u32> {
        self.tier.as_ref().map_or_else(Default::default, |t| t.foreign())
    }
}
