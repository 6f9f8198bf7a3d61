//! The local cache of remote pack bytes: 64 KiB extents of pack objects
//! in one file (`chunks/remote-cache`), found through a map in memory and
//! replaced by CLOCK. It is emptied at every open (the map is not kept),
//! never synced, and bounded by its extent count.
//!
//! A slot being filled is skipped by the clock, so two fills never share
//! one; a reader checks after its pread that the slot still holds the same
//! fill (key and generation), so an extent replaced under it is a miss,
//! never someone else's bytes. The crc32c of the leaf that names a chunk
//! is checked on top (chunk/mod.rs).

use crate::error::Result;
use crate::io::Wait;
use crate::storage::StorageFile;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Bytes of one cached extent (16 slots: compaction writes runs of a
/// guest's blocks together, so neighbours are often read next).
pub const EXTENT_BYTES: u64 = 64 << 10;

/// (pack id, extent number within the pack).
type Key = (u32, u64);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Slot {
    Empty,
    Filling,
    Full { key: Key, generation: u64, referenced: bool },
}

struct Map {
    by_key: HashMap<Key, usize>,
    slots: Vec<Slot>,
    hand: usize,
    generation: u64,
}

/// See the module docs.
pub(crate) struct ExtentCache {
    file: Arc<dyn StorageFile>,
    map: Mutex<Map>,
}

impl ExtentCache {
    /// A cache of `bytes / EXTENT_BYTES` extents in `file` (emptied).
    pub fn new(file: Arc<dyn StorageFile>, bytes: u64) -> Result<ExtentCache> {
        file.set_len(0)?;
        let n = (bytes / EXTENT_BYTES) as usize;
        Ok(ExtentCache {
            file,
            map: Mutex::new(Map {
                by_key: HashMap::new(),
                slots: vec![Slot::Empty; n],
                hand: 0,
                generation: 0,
            }),
        })
    }

    fn map(&self) -> std::sync::MutexGuard<'_, Map> {
        crate::sync::lock(&self.map)
    }

    /// Reads `buf.len()` bytes at `offset` within extent `ext` of `pack`,
    /// if it is cached: Some(bytes read), None on a miss. The cache file is
    /// read as `wait` allows.
    pub fn read(
        &self,
        pack: u32,
        ext: u64,
        offset: u64,
        buf: &mut [u8],
        wait: Wait,
    ) -> Result<Option<usize>> {
        let key = (pack, ext);
        let (slot, generation) = {
            let mut m = self.map();
            let Some(&slot) = m.by_key.get(&key) else { return Ok(None) };
            match &mut m.slots[slot] {
                Slot::Full { generation, referenced, .. } => {
                    *referenced = true;
                    (slot, *generation)
                }
                _ => return Ok(None),
            }
        };
        let n = self.file.read_at_in(buf, slot as u64 * EXTENT_BYTES + offset, wait)?;
        let m = self.map();
        let same =
            matches!(m.slots[slot], Slot::Full { key: k, generation: g, .. } if k == key && g == generation);
        Ok(same.then_some(n))
    }

    /// Caches `data` (at most one extent) as extent `ext` of `pack`. A
    /// full cache replaces the first extent the clock finds unreferenced;
    /// when every slot is being filled, nothing is cached.
    pub fn insert(&self, pack: u32, ext: u64, data: &[u8]) -> Result<()> {
        debug_assert!(data.len() as u64 <= EXTENT_BYTES);
        let key = (pack, ext);
        let slot = {
            let mut m = self.map();
            let n = m.slots.len();
            if n == 0 || m.by_key.contains_key(&key) {
                return Ok(());
            }
            let mut victim = None;
            for _ in 0..2 * n {
                let at = m.hand;
                m.hand = (m.hand + 1) % n;
                match &mut m.slots[at] {
                    Slot::Filling => {}
                    Slot::Full { referenced, .. } if *referenced => *referenced = false,
                    _ => {
                        victim = Some(at);
                        break;
                    }
                }
            }
            let Some(at) = victim else { return Ok(()) };
            if let Slot::Full { key: old, .. } = m.slots[at] {
                if m.by_key.get(&old) == Some(&at) {
                    m.by_key.remove(&old);
                }
            }
            m.slots[at] = Slot::Filling;
            at
        };
        let written = self.file.write_all_at(data, slot as u64 * EXTENT_BYTES);
        let mut m = self.map();
        match written {
            // Another miss on the same extent filled a slot first: keep
            // that one, so the map never loses track of a filled slot.
            Ok(()) if m.by_key.contains_key(&key) => {
                m.slots[slot] = Slot::Empty;
                Ok(())
            }
            Ok(()) => {
                m.generation += 1;
                let generation = m.generation;
                m.slots[slot] = Slot::Full { key, generation, referenced: false };
                m.by_key.insert(key, slot);
                Ok(())
            }
            Err(e) => {
                m.slots[slot] = Slot::Empty;
                Err(e)
            }
        }
    }

    /// Extents cached.
    #[cfg(test)]
    pub fn cached_extents(&self) -> usize {
        self.map().by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{MemStorage, OpenMode, Storage};
    use std::path::Path;

    fn cache(extents: u64) -> ExtentCache {
        let s = MemStorage::new();
        let f = s.open(Path::new("/c"), OpenMode::Create).unwrap();
        ExtentCache::new(f, extents * EXTENT_BYTES).unwrap()
    }

    #[test]
    fn hits_what_it_holds_and_replaces_by_clock_within_its_bound() {
        let c = cache(2);
        let mut buf = [0u8; 4];
        assert_eq!(c.read(1, 0, 0, &mut buf, Wait::Block).unwrap(), None);
        c.insert(1, 0, &[1; 4096]).unwrap();
        c.insert(1, 1, &[2; 4096]).unwrap();
        assert_eq!(c.read(1, 0, 8, &mut buf, Wait::Block).unwrap(), Some(4));
        assert_eq!(buf, [1; 4]);
        // Extent 0 was just read (referenced): extent 1 goes first.
        c.insert(2, 0, &[3; 4096]).unwrap();
        assert_eq!(c.cached_extents(), 2);
        assert_eq!(c.read(1, 1, 0, &mut buf, Wait::Block).unwrap(), None);
        assert_eq!(c.read(1, 0, 0, &mut buf, Wait::Block).unwrap(), Some(4));
        assert_eq!(c.read(2, 0, 0, &mut buf, Wait::Block).unwrap(), Some(4));
        assert_eq!(buf, [3; 4]);
    }

    #[test]
    fn an_empty_cache_caches_nothing() {
        let c = cache(0);
        c.insert(1, 0, &[1; 16]).unwrap();
        assert_eq!(c.read(1, 0, 0, &mut [0u8; 4], Wait::Block).unwrap(), None);
    }
}
