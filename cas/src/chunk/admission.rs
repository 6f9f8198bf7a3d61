//! Admission to the clean chunk cache: a chunk enters it on its second
//! miss within a window, not on its first.
//!
//! Why: the cache's misses are mostly chunks read once. A guest's random
//! reads over a working set many times the cache's size miss about every
//! time, and admitting each miss costs a 4 KiB copy and a CLOCK eviction
//! for an entry that is evicted before it is read again. In the test VM's
//! profile of 4 KiB random reads (512 MiB over the 16 MiB cache) the
//! inserts and their copies took about a fifth of the queue thread's time.
//! The chunks worth keeping are the ones read again soon (many guests
//! booting from one base image): their second miss admits them.
//!
//! How: a direct-mapped table of 32-bit fingerprints (a "doorkeeper", as
//! in TinyLFU), twice as many slots as the cache has entries. A miss
//! writes its fingerprint into its slot and is admitted when the slot
//! already held it. Any other miss that maps to the slot overwrites it,
//! so the window is about as many misses as there are slots. The table is
//! a fixed array of atomics: no lock, no allocation after open, and a race
//! between two readers only changes whether one chunk is admitted.

use crate::units::ChunkTag;
use std::sync::atomic::{AtomicU32, Ordering};

/// Fewest slots, for tiny caches.
const MIN_SLOTS: usize = 64;

/// The admission filter of a cache of `cache_entries` entries.
pub(crate) struct Doorkeeper {
    /// Fingerprints of recent misses; 0 is an empty slot (a fingerprint
    /// is never 0).
    seen: Box<[AtomicU32]>,
    /// `seen.len() - 1` (a power of two less one); 0 for an empty table.
    mask: u64,
}

impl Doorkeeper {
    /// A filter for a cache of `cache_entries` entries. A cache of none
    /// gets an empty table, which admits nothing.
    pub fn new(cache_entries: usize) -> Doorkeeper {
        let slots =
            if cache_entries == 0 { 0 } else { (2 * cache_entries).max(MIN_SLOTS).next_power_of_two() };
        let mask = (slots as u64).saturating_sub(1);
        Doorkeeper { seen: (0..slots).map(|_| AtomicU32::new(0)).collect(), mask }
    }

    /// Whether chunk `tag`, which just missed the cache, should enter it:
    /// true when its previous miss is still in its slot.
    pub fn admit(&self, tag: &ChunkTag) -> bool {
        // Tags are blake3 bytes: any eight are uniformly distributed.
        let [a, b, c, d, e, f, g, h, ..] = *tag.as_bytes();
        self.admit_key(u64::from_le_bytes([a, b, c, d, e, f, g, h]))
    }

    /// [`Doorkeeper::admit`] for a uniformly distributed key.
    fn admit_key(&self, key: u64) -> bool {
        let Some(slot) = self.seen.get((key & self.mask) as usize) else {
            return false; // no table: the cache holds nothing
        };
        let fingerprint = ((key >> 32) as u32).max(1);
        slot.swap(fingerprint, Ordering::Relaxed) == fingerprint
    }

    /// Bytes the table takes.
    #[cfg(test)]
    fn memory_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.seen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_admitted_on_its_second_miss() {
        let d = Doorkeeper::new(4096);
        let key = 0x1234_5678_9abc_def0;
        assert!(!d.admit_key(key), "the first miss only leaves a fingerprint");
        assert!(d.admit_key(key), "the second miss admits");
    }

    #[test]
    fn a_colliding_miss_in_between_resets_the_window() {
        let d = Doorkeeper::new(4096);
        let (a, b) = (0x0000_0001_0000_0005u64, 0x0000_0002_0000_0005u64);
        assert_eq!(a & d.mask, b & d.mask, "the two keys share a slot");
        assert!(!d.admit_key(a));
        assert!(!d.admit_key(b));
        assert!(!d.admit_key(a), "b took the slot: a starts over");
    }

    #[test]
    fn keys_read_once_are_almost_never_admitted() {
        // 100,000 distinct keys, each read once: a false admission needs
        // a fingerprint match in the key's slot, about 1 in 4 billion.
        let d = Doorkeeper::new(4096);
        let admitted = (0..100_000u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) // spread like a hash
            .filter(|&k| d.admit_key(k))
            .count();
        assert_eq!(admitted, 0);
    }

    #[test]
    fn a_cache_of_nothing_admits_nothing() {
        let d = Doorkeeper::new(0);
        let key = 0x1234_5678_9abc_def0;
        assert!(!d.admit_key(key));
        assert!(!d.admit_key(key), "no second miss admits either");
    }

    #[test]
    fn the_table_is_bounded_by_the_cache() {
        assert_eq!(Doorkeeper::new(0).memory_bytes(), 0);
        assert_eq!(Doorkeeper::new(4).memory_bytes(), MIN_SLOTS * 4);
        // The default 16 MiB cache: 4,096 entries, 8,192 slots, 32 KiB.
        assert_eq!(Doorkeeper::new(4096).memory_bytes(), 32 << 10);
    }
}
