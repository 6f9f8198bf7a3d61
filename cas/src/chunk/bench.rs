//! What `ci/bench index` drives directly: the in-memory chunk index as the
//! store lays it out (256 shards of swiss tables, 48-byte entries), without
//! pack I/O, and a synthetic store of many chunks to time an open. Not
//! part of the store's API.

use super::index::{shard_of, IndexMap, Key, Loc, PrefixBuild, SHARDS};
use super::journal::{Journal, JournalOp};
use super::pack::{self, PackHeader};
use super::{ChunkHash, ChunkTag};
use crate::error::Result;
use crate::storage::{OpenMode, Storage};
use std::path::Path;

/// Today's index: the shards of `ChunkStore`'s index, filled directly.
pub struct IndexBench {
    shards: Vec<IndexMap>,
}

impl Default for IndexBench {
    fn default() -> Self {
        IndexBench { shards: (0..SHARDS).map(|_| IndexMap::with_hasher(PrefixBuild::default())).collect() }
    }
}

impl IndexBench {
    /// Inserts `hash` at (`pack`, `slot`) unless its tag is there; true if
    /// it was new (what a dedup insert does).
    pub fn insert(&mut self, hash: &ChunkHash, pack: u32, slot: u32, crc: u32) -> bool {
        let key = Key(*hash);
        let shard = &mut self.shards[shard_of(&key)];
        if shard.contains_key(&key) {
            return false;
        }
        shard.insert(key, Loc { pack, slot, crc, epoch: 0 });
        true
    }

    /// The location of the chunk `tag` names.
    pub fn get(&self, tag: &ChunkTag) -> Option<(u32, u32)> {
        let key = Key::of_tag(tag);
        self.shards[shard_of(&key)].get(&key).map(|l| (l.pack, l.slot))
    }

    pub fn len(&self) -> u64 {
        self.shards.iter().map(|s| s.len() as u64).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Buckets of the tables (entries over buckets is their load).
    pub fn buckets(&self) -> u64 {
        self.table_bytes() / super::index::BUCKET_BYTES
    }

    /// The store's own estimate of the tables' heap bytes.
    pub fn table_bytes(&self) -> u64 {
        self.shards.iter().map(|s| super::index::table_bytes(s.capacity())).sum()
    }
}

/// Writes a chunk store in `dir` that indexes `chunks` chunks: an index
/// journal of that many puts (hashes from `hash_of`) and the packs they
/// name, as sparse files of the full length. Its chunks' bytes are zeros
/// (the store's open never reads them).
pub fn write_synthetic_store(
    storage: &dyn Storage,
    dir: &Path,
    chunks: u64,
    slots_per_pack: u32,
    hash_of: impl Fn(u64) -> ChunkHash,
) -> Result<()> {
    storage.create_dir_all(dir)?;
    let store_id = 0x5eed_1dec;
    let mut journal = Journal::create(storage, dir, store_id)?;
    let packs = chunks.div_ceil(u64::from(slots_per_pack)) as u32;
    let mut ops = Vec::with_capacity(1 << 16);
    ops.push(JournalOp::NextPack { id: packs + 1 });
    for i in 0..chunks {
        let (pack, slot) =
            ((i / u64::from(slots_per_pack)) as u32 + 1, (i % u64::from(slots_per_pack)) as u32);
        ops.push(JournalOp::Put { hash: hash_of(i), pack, slot, crc: 0 });
        if ops.len() == ops.capacity() {
            journal.append(&ops)?;
            ops.clear();
        }
    }
    journal.append(&ops)?;
    for id in 1..=packs {
        let f = storage.open(&dir.join(pack::pack_file_name(id)), OpenMode::CreateNew)?;
        let header = PackHeader { store_id, pack_id: id, capacity_slots: slots_per_pack };
        f.write_all_at(&header.encode(), 0)?;
        let used = (chunks - u64::from(id - 1) * u64::from(slots_per_pack)).min(u64::from(slots_per_pack));
        f.set_len(pack::slot_offset(used as u32))?;
    }
    storage.sync_dir(dir)
}
