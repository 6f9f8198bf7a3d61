//! Shared helpers for the chunk, manifest and GC integration tests: a
//! storage wrapper that "kills the process" after N mutating operations,
//! deterministic block contents, and seeds.
#![allow(dead_code)]

use cas::chunk::{ChunkHash, CHUNK_BYTES};
use cas::storage::{CrashMode, MemStorage, OpenMode, Storage, StorageFile, StorageLock};
use cas::{Error, Result};
use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

/// Forwards to a [`MemStorage`] until `budget` mutating operations (writes,
/// syncs, set_len, creates, renames, removes, directory syncs) have run;
/// from then on every operation fails with EIO, as if the process had
/// died at that point. The test then crashes the MemStorage and reopens.
pub struct CrashAfter {
    inner: MemStorage,
    left: AtomicI64,
    done: AtomicU64,
}

impl CrashAfter {
    pub fn new(inner: &MemStorage, budget: u64) -> Arc<CrashAfter> {
        Arc::new(CrashAfter {
            inner: inner.clone(),
            left: AtomicI64::new(budget.min(i64::MAX as u64) as i64),
            done: AtomicU64::new(0),
        })
    }

    /// From now on, die after `budget` more mutating operations.
    pub fn arm(&self, budget: u64) {
        self.left.store(budget.min(i64::MAX as u64) as i64, Ordering::SeqCst);
    }

    /// Never die (until armed again).
    pub fn disarm(&self) {
        self.arm(u64::MAX);
    }

    /// True once the budget ran out (the simulated process died).
    pub fn died(&self) -> bool {
        self.left.load(Ordering::SeqCst) < 0
    }

    /// Mutating operations performed.
    pub fn ops(&self) -> u64 {
        self.done.load(Ordering::SeqCst)
    }

    fn dead(path: &Path) -> Error {
        Error::io(path, std::io::Error::other("simulated crash: the process is gone"))
    }

    fn tick(&self, path: &Path) -> Result<()> {
        if self.left.fetch_sub(1, Ordering::SeqCst) <= 0 {
            self.left.store(-1, Ordering::SeqCst);
            return Err(Self::dead(path));
        }
        self.done.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn alive(&self, path: &Path) -> Result<()> {
        if self.died() {
            return Err(Self::dead(path));
        }
        Ok(())
    }
}

struct File {
    inner: Arc<dyn StorageFile>,
    owner: Arc<CrashAfter>,
}

impl StorageFile for File {
    fn path(&self) -> &Path {
        self.inner.path()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.owner.alive(self.path())?;
        self.inner.read_at(buf, offset)
    }
    fn read_at_nowait(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.owner.alive(self.path())?;
        self.inner.read_at_nowait(buf, offset)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.owner.tick(self.path())?;
        self.inner.write_all_at(buf, offset)
    }
    fn sync_data(&self) -> Result<()> {
        self.owner.tick(self.path())?;
        self.inner.sync_data()
    }
    fn len(&self) -> Result<u64> {
        self.owner.alive(self.path())?;
        self.inner.len()
    }
    fn set_len(&self, len: u64) -> Result<()> {
        self.owner.tick(self.path())?;
        self.inner.set_len(len)
    }
}

/// `Storage` for an `Arc<CrashAfter>` (handles need the owner).
pub struct Crashing(pub Arc<CrashAfter>);

impl Storage for Crashing {
    fn open(&self, path: &Path, mode: OpenMode) -> Result<Arc<dyn StorageFile>> {
        if mode == OpenMode::Existing || (mode == OpenMode::Create && self.0.inner.exists(path)) {
            self.0.alive(path)?;
        } else {
            self.0.tick(path)?;
        }
        let inner = self.0.inner.open(path, mode)?;
        Ok(Arc::new(File { inner, owner: self.0.clone() }))
    }
    fn remove_file(&self, path: &Path) -> Result<()> {
        self.0.tick(path)?;
        self.0.inner.remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        self.0.tick(from)?;
        self.0.inner.rename(from, to)
    }
    fn hard_link(&self, from: &Path, to: &Path) -> Result<()> {
        self.0.tick(to)?;
        self.0.inner.hard_link(from, to)
    }
    fn list_dir(&self, dir: &Path) -> Result<Vec<String>> {
        self.0.alive(dir)?;
        self.0.inner.list_dir(dir)
    }
    fn create_dir_all(&self, dir: &Path) -> Result<()> {
        self.0.tick(dir)?;
        self.0.inner.create_dir_all(dir)
    }
    fn remove_dir_all(&self, dir: &Path) -> Result<()> {
        self.0.tick(dir)?;
        self.0.inner.remove_dir_all(dir)
    }
    fn sync_dir(&self, dir: &Path) -> Result<()> {
        self.0.tick(dir)?;
        self.0.inner.sync_dir(dir)
    }
    fn exists(&self, path: &Path) -> bool {
        self.0.inner.exists(path)
    }
    fn lock_exclusive(&self, path: &Path) -> Result<StorageLock> {
        self.0.alive(path)?;
        self.0.inner.lock_exclusive(path)
    }
}

/// Where a crash loop cuts: after each of the first `dense` mutating
/// storage operations, then after every `stride`th; `torn` adds a torn
/// cut (`CrashMode::Torn`, seeded with the budget) to each lost-unsynced
/// one. A workload needing `max` operations or more fails the test.
#[derive(Clone, Copy, Debug)]
pub struct Cuts {
    pub torn: bool,
    pub dense: u64,
    pub stride: u64,
    pub max: u64,
}

impl Cuts {
    /// Both modes after every operation, below `max`.
    pub fn every(max: u64) -> Cuts {
        Cuts { torn: true, dense: u64::MAX, stride: 1, max }
    }
}

/// The crash-at-every-operation loop: `attempt(budget, mode)` runs the
/// workload on a storage that dies after `budget` mutating operations
/// (`crashing`) and returns true if it finished without dying; if it
/// died, the attempt applies `mode` (`MemStorage::crash`) and checks what
/// is left. Budgets grow as `cuts` says until an attempt finishes; the
/// result is that budget: the operations the workload takes.
pub fn crash_at_every_op(cuts: Cuts, mut attempt: impl FnMut(u64, CrashMode) -> bool) -> u64 {
    let mut budget = 0;
    loop {
        let torn = cuts.torn.then_some(CrashMode::Torn { seed: budget });
        for mode in std::iter::once(CrashMode::LoseUnsynced).chain(torn) {
            if attempt(budget, mode) {
                return budget;
            }
        }
        budget += if budget >= cuts.dense { cuts.stride } else { 1 };
        assert!(budget < cuts.max, "the workload did not finish within {} storage operations", cuts.max);
    }
}

/// A storage that dies after `budget` mutating operations.
pub fn crashing(inner: &MemStorage, budget: u64) -> (Arc<dyn Storage>, Arc<CrashAfter>) {
    let c = CrashAfter::new(inner, budget);
    (Arc::new(Crashing(c.clone())), c)
}

/// Deterministic, never all-zero 4 KiB content for `id`.
pub fn block(id: u64) -> Vec<u8> {
    let mut x = id.wrapping_add(0x1234_5678).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(CHUNK_BYTES);
    while out.len() < CHUNK_BYTES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

pub fn block_hash(id: u64) -> ChunkHash {
    ChunkHash::of(&block(id))
}

/// Seeds for a randomized test: `CAS_TEST_SEEDS` (count) scales it up;
/// `CAS_TEST_SEED` runs one seed.
pub fn seeds(default_count: u64) -> Vec<u64> {
    if let Ok(one) = std::env::var("CAS_TEST_SEED") {
        return vec![one.parse().expect("CAS_TEST_SEED is a u64")];
    }
    let n = std::env::var("CAS_TEST_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(default_count);
    (0..n).collect()
}

/// Runs `f(seed)`, printing the seed if it panics.
pub fn with_seed(seed: u64, f: impl FnOnce(u64)) {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(seed)));
    if let Err(e) = r {
        eprintln!("failing seed: {seed} (rerun with CAS_TEST_SEED={seed})");
        std::panic::resume_unwind(e);
    }
}
