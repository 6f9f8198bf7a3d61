//! A bounded, sharded CLOCK cache of clean, immutable values.
//!
//! Used for chunk bytes (keyed by hash) and decoded manifest pages (keyed
//! by file and page number). Values never change under a key (content
//! addressing, copy-on-write pages), so the cache never needs invalidating
//! for correctness; entries are only dropped to make room or to forget
//! swept chunks.
//!
//! Bounds: at most `capacity` entries in all, split evenly over the
//! shards; slots are allocated as entries arrive (nothing is reserved up
//! front). Eviction is CLOCK: a hit sets the entry's reference bit, the
//! hand clears bits until it finds an unreferenced victim.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

struct Slot<K, V> {
    key: K,
    value: V,
    referenced: bool,
}

struct Shard<K, V, S> {
    map: HashMap<K, usize, S>,
    slots: Vec<Slot<K, V>>,
    hand: usize,
    capacity: usize,
}

impl<K: Hash + Eq + Clone, V, S: BuildHasher> Shard<K, V, S> {
    /// Adds `key` (absent) with the value `make` builds from the value it
    /// evicts (None while the shard has room). `make` also returns what is
    /// left to drop, which `place` returns for the caller to drop after
    /// the unlock (with a capacity of 0, the value itself).
    fn place(&mut self, key: K, make: impl FnOnce(Option<V>) -> (V, Option<V>)) -> Option<V> {
        if self.capacity == 0 {
            return Some(make(None).0);
        }
        if self.slots.len() < self.capacity {
            let (value, rest) = make(None);
            self.map.insert(key.clone(), self.slots.len());
            self.slots.push(Slot { key, value, referenced: false });
            return rest;
        }
        // CLOCK. Bounded: the second lap finds every bit cleared.
        let victim = loop {
            let i = self.hand;
            self.hand = (self.hand + 1) % self.slots.len();
            if std::mem::take(&mut self.slots[i].referenced) {
                continue;
            }
            break i;
        };
        // Take the victim out (the last slot moves into its place), push
        // the new entry and swap it back into the victim's index: every
        // other entry ends where the map says.
        let old = self.slots.swap_remove(victim);
        self.map.remove(&old.key);
        let (value, rest) = make(Some(old.value));
        self.slots.push(Slot { key: key.clone(), value, referenced: false });
        let last = self.slots.len() - 1;
        self.slots.swap(victim, last);
        self.map.insert(key, victim);
        rest
    }
}

/// The cache; `V` is cheap to clone (an `Arc`).
pub(crate) struct ClockCache<K, V, S> {
    shards: Box<[Mutex<Shard<K, V, S>>]>,
    hasher: S,
    hits: AtomicU64,
    misses: AtomicU64,
}

use crate::sync::lock;

impl<K, V, S> ClockCache<K, V, S>
where
    K: Hash + Eq + Clone,
    V: Clone,
    S: BuildHasher + Default,
{
    /// A cache of at most `capacity` entries over `shards` shards (a cache
    /// of capacity 0 stores nothing).
    pub fn new(capacity: usize, shards: usize) -> Self {
        let shards = shards.clamp(1, capacity.max(1));
        let per = capacity / shards;
        let extra = capacity % shards;
        let shards = (0..shards)
            .map(|i| {
                Mutex::new(Shard {
                    map: HashMap::default(),
                    slots: Vec::new(),
                    hand: 0,
                    capacity: per + usize::from(i < extra),
                })
            })
            .collect();
        ClockCache { shards, hasher: S::default(), hits: AtomicU64::new(0), misses: AtomicU64::new(0) }
    }

    fn shard(&self, key: &K) -> &Mutex<Shard<K, V, S>> {
        // High bits: the map inside the shard uses the low ones.
        let h = self.hasher.hash_one(key);
        &self.shards[((h >> 40) % self.shards.len() as u64) as usize]
    }

    /// The value under `key`, counting a hit or a miss.
    pub fn get(&self, key: &K) -> Option<V> {
        let mut sh = lock(self.shard(key));
        match sh.map.get(key).copied() {
            Some(i) => {
                sh.slots[i].referenced = true;
                self.hits.fetch_add(1, Ordering::Relaxed);
                Some(sh.slots[i].value.clone())
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Stores `value` under `key`, evicting an unreferenced entry if full.
    /// The value it replaces or evicts is dropped after the shard's lock
    /// is released.
    pub fn insert(&self, key: K, value: V) {
        let mut guard = lock(self.shard(&key));
        let sh = &mut *guard;
        let old = match sh.map.get(&key) {
            Some(&i) => Some(std::mem::replace(&mut sh.slots[i].value, value)),
            None => sh.place(key, |evicted| (value, evicted)),
        };
        drop(guard);
        drop(old);
    }

    /// Stores the value `make` builds under `key`, unless `key` is present.
    /// `make` runs under the shard's lock and gets the value the insert
    /// evicts, if the shard is full, so it can reuse that value's
    /// allocation: a full cache then inserts without allocating or freeing.
    /// `make` must not panic.
    pub fn insert_with(&self, key: K, make: impl FnOnce(Option<V>) -> V) {
        let mut guard = lock(self.shard(&key));
        let sh = &mut *guard;
        if !sh.map.contains_key(&key) {
            let unused = sh.place(key, |evicted| (make(evicted), None));
            drop(guard);
            drop(unused);
        }
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).slots.len()).sum()
    }

    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::RandomState;

    #[test]
    fn bounded_and_counts_hits() {
        let c: ClockCache<u64, u64, RandomState> = ClockCache::new(64, 4);
        for i in 0..1000 {
            c.insert(i, i * 10);
            assert!(c.len() <= 64);
        }
        assert_eq!(c.len(), 64);
        let present: Vec<u64> = (0..1000).filter(|i| c.get(i).is_some()).collect();
        assert_eq!(present.len(), 64);
        assert_eq!(c.hits(), 64);
        assert_eq!(c.misses(), 1000 - 64);
        for &i in &present {
            assert_eq!(c.get(&i), Some(i * 10));
        }
    }

    #[test]
    fn referenced_entries_survive_a_sweep() {
        let c: ClockCache<u64, u64, RandomState> = ClockCache::new(4, 1);
        for i in 0..4 {
            c.insert(i, i);
        }
        c.get(&2);
        c.insert(10, 10);
        assert_eq!(c.get(&2), Some(2), "a referenced entry is evicted last");
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn insert_with_hands_over_the_evicted_value() {
        let c: ClockCache<u64, u64, RandomState> = ClockCache::new(2, 1);
        c.insert_with(1, |old| {
            assert_eq!(old, None, "room left: nothing evicted");
            10
        });
        c.insert_with(2, |_| 20);
        c.insert_with(1, |_| panic!("present keys are not rebuilt"));
        c.get(&2);
        c.insert_with(3, |old| {
            assert_eq!(old, Some(10), "the unreferenced entry is the victim");
            30
        });
        assert_eq!((c.get(&1), c.get(&2), c.get(&3)), (None, Some(20), Some(30)));
        assert_eq!(c.len(), 2);
        // Entries keep their places across many evictions.
        for k in 4..100u64 {
            c.insert_with(k, |_| k * 10);
            assert_eq!(c.get(&k), Some(k * 10));
        }
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn zero_capacity_stores_nothing() {
        let c: ClockCache<u64, u64, RandomState> = ClockCache::new(0, 8);
        c.insert(1, 1);
        assert_eq!(c.get(&1), None);
        assert_eq!(c.len(), 0);
    }
}
