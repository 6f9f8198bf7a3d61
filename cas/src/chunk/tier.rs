//! The tier a chunk store's sealed packs go to (the bucket:
//! `crate::bucket::packs`), as the chunk core sees it: traits the core
//! defines and the tier implements, so the core never names the tier.
//!
//! At open the core asks a [`TierOpen`] what the tier holds of this
//! store ([`TierAttach`]: its host slot, the packs it lists and in which
//! phase, handles reading packs that are only in the bucket), and once the
//! store is built starts it over the store's pack files: a [`Tier`]. From
//! then on the core tells it of packs just sealed and asks it which packs
//! are other stores' (never swept or repacked); it evicts and stops it.
//! What the tier does beyond that (uploads, waits for room, reads of the
//! bucket, other stores' packs adopted) is the tier's own API, which
//! takes the chunk store where it needs it.

use super::pack_id::PackPhase;
use super::PackFiles;
use crate::dedup::slots::Bits;
use crate::error::Result;
use crate::report::FsckReport;
use crate::storage::{Storage, StorageFile};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, RwLock};

/// A pack sealed for the tier: what it needs of it without the store's
/// locks.
pub struct SealedPack {
    pub(crate) id: u32,
    /// Slots it spans (written, live or dead).
    pub(crate) slots: u32,
    pub(crate) file: Arc<dyn StorageFile>,
    /// Live slots when it was sealed.
    pub(crate) live: Bits,
}

/// Attaches a tier at open (given to [`ChunkStore::open_with_tier`](super::ChunkStore::open_with_tier)).
pub trait TierOpen {
    /// What the tier holds of store `store_id` in `dir`; None if the store
    /// has no tier. `kept(id)` says whether the open keeps pack `id`'s
    /// local file (a sealed pack it drops has nothing left to upload).
    fn attach(
        &self,
        storage: &Arc<dyn Storage>,
        dir: &Path,
        store_id: u64,
        kept: &dyn Fn(u32) -> bool,
    ) -> Result<Option<Box<dyn TierAttach>>>;
}

/// A tier attached at open, before the store is built.
pub trait TierAttach {
    /// This store's host slot: the top bits of the pack ids it gives out.
    fn host_slot(&self) -> u8;
    /// The packs the tier lists: (id, phase, slots).
    fn packs(&self) -> Vec<(u32, PackPhase, u32)>;
    /// Whether the store was opened with its bucket: only then are closed
    /// packs sealed for upload, and packs read from the bucket.
    fn has_bucket(&self) -> bool;
    /// Handles reading `packs` (id, bytes) from the bucket, in order; None
    /// without it. Called once, after the local packs are open (it
    /// prepares what reads of the bucket need even for no pack).
    fn remote_files(&mut self, packs: &[(u32, u64)]) -> Result<Option<Vec<Arc<dyn StorageFile>>>>;
    /// Starts the tier over the open store's pack files (None without a
    /// bucket): `sealed` are the packs it lists as sealed that are still
    /// here, to upload again; `uploaded_local` its uploaded packs that
    /// still have a local file, with their bytes. Its background work
    /// starts only with [`Tier::run`].
    fn start(
        self: Box<Self>,
        files: Arc<RwLock<PackFiles>>,
        sealed: Vec<SealedPack>,
        uploaded_local: Vec<(u32, u64)>,
    ) -> Result<Option<Arc<dyn Tier>>>;
}

/// A started tier: what the chunk core tells it and asks of it.
pub trait Tier: Send + Sync {
    /// Packs just sealed (every slot durable): recorded durably, then
    /// queued for upload. A failure poisons the store.
    fn sealed(&self, packs: Vec<SealedPack>) -> Result<()>;
    /// Other stores' packs, read from the bucket: never swept or repacked.
    fn foreign(&self) -> BTreeSet<u32>;
    /// Deletes local copies of uploaded packs past the tier's bound.
    fn evict(&self) -> Result<()>;
    /// A handle reading the bucket's copy of this store's pack `id`, if
    /// it was uploaded (a scrub repairs a damaged local slot from it).
    fn bucket_copy(&self, id: u32) -> Option<Arc<dyn StorageFile>>;
    /// Starts the tier's background work (uploads).
    fn run(&self) -> Result<()>;
    /// Stops it (work under way finishes first) and waits for it.
    fn stop(&self);
}

/// What a check of the chunk directory (check.rs) asks of the tier.
#[derive(Clone, Copy)]
pub struct TierCheck {
    /// True for a file of the tier's own in `chunks/` (not an unknown file).
    pub owns_file: fn(&str) -> bool,
    /// Checks what the tier lists of store `store_id` in `dir`, whose local
    /// pack files are `pack_files` (sorted), into the report; returns the
    /// packs it holds as uploaded and as foreign, sorted.
    pub packs: CheckPacks,
}

/// See [`TierCheck::packs`].
pub type CheckPacks = fn(&dyn Storage, &Path, u64, &[u32], &mut FsckReport) -> (Vec<u32>, Vec<u32>);

impl TierCheck {
    /// A store with no tier: no file of its own, no pack elsewhere.
    pub const NONE: TierCheck = TierCheck { owns_file: |_| false, packs: |_, _, _, _, _| Default::default() };
}
