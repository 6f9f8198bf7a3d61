//! A pack that lives only in the bucket, read as a file: each read is
//! served from the extent cache (extent_cache.rs) or by a ranged GET of
//! the 64 KiB extents it covers, which are then cached. So every reader of
//! packs (located reads, reads by hash, verify) works on it unchanged.
//!
//! A read with `Wait::Never` (a ublk queue thread) on a miss fails with
//! `WouldBlock` and the read goes to a worker, as for a disk read. A GET
//! that fails for a transient reason (no endpoint answers, server errors)
//! is retried for up to `read_retry`, which outlasts Garage's detection of
//! a dead node; then, or at once for a setup error, the read fails (EIO).
//! The pack is immutable: writes, syncs and truncation are refused.

use super::extent_cache::{ExtentCache, EXTENT_BYTES};
use super::upload::{pack_key, PART_BYTES};
use crate::error::{Error, Result};
use crate::io::Wait;
use crate::objects::Objects;
use crate::storage::StorageFile;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counters shared by every remote pack of a store.
#[derive(Default)]
pub(crate) struct ReadCounters {
    pub cache_hits: AtomicU64,
    pub gets: AtomicU64,
    pub get_bytes: AtomicU64,
    pub get_retries: AtomicU64,
}

/// What every remote pack of a store shares.
pub(crate) struct RemoteReads {
    pub objects: Arc<dyn Objects>,
    pub cache: ExtentCache,
    pub counters: ReadCounters,
    pub read_retry: Duration,
}

/// See the module docs.
pub(crate) struct RemotePackFile {
    id: u32,
    len: u64,
    path: PathBuf,
    reads: Arc<RemoteReads>,
}

impl RemotePackFile {
    /// Pack `id`, whose object is `len` bytes.
    pub fn new(id: u32, len: u64, reads: Arc<RemoteReads>) -> RemotePackFile {
        let path = PathBuf::from(format!("{}/packs/{id:08x}", reads.objects.describe()));
        RemotePackFile { id, len, path, reads }
    }

    /// Bytes `start..end` of the pack (within one part), retrying
    /// transient failures.
    fn get(&self, start: u64, end: u64) -> Result<Vec<u8>> {
        let part = start / PART_BYTES;
        debug_assert_eq!((end - 1) / PART_BYTES, part, "a read spans two parts");
        let key = pack_key(self.id, part);
        let (start, end) = (start - part * PART_BYTES, end - part * PART_BYTES);
        let started = Instant::now();
        let mut pause = Duration::from_millis(50);
        loop {
            self.reads.counters.gets.fetch_add(1, Ordering::Relaxed);
            match self.reads.objects.get_range(&key, start..end) {
                Ok(data) if data.len() as u64 == end - start => {
                    self.reads.counters.get_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                    return Ok(data);
                }
                Ok(data) => {
                    return Err(Error::Corruption {
                        path: self.path.clone(),
                        offset: start,
                        detail: format!("a GET of {} bytes returned {}", end - start, data.len()),
                    })
                }
                Err(e) if e.is_transient() && started.elapsed() < self.reads.read_retry => {
                    self.reads.counters.get_retries.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Reads up to `buf.len()` bytes at `offset` from the extent cache, or
    /// (if `wait` allows) by GETs of the extents missing.
    fn read_in(&self, buf: &mut [u8], offset: u64, wait: Wait) -> Result<usize> {
        let mut done = 0usize;
        while done < buf.len() && offset + (done as u64) < self.len {
            let pos = offset + done as u64;
            let (ext, within) = (pos / EXTENT_BYTES, pos % EXTENT_BYTES);
            let want = ((buf.len() - done) as u64).min(EXTENT_BYTES - within).min(self.len - pos) as usize;
            let out = &mut buf[done..done + want];
            // A cache file that fails to read is a miss (the GET serves it).
            let cached = match self.reads.cache.read(self.id, ext, within, out, wait) {
                Err(Error::WouldBlock) => return Err(Error::WouldBlock),
                Err(e) => {
                    tracing::warn!(pack = self.id, error = %e, "reading the remote extent cache failed");
                    None
                }
                Ok(n) => n,
            };
            if let Some(n) = cached {
                if n == want {
                    self.reads.counters.cache_hits.fetch_add(1, Ordering::Relaxed);
                    done += n;
                    continue;
                }
            }
            if wait == Wait::Never {
                return Err(Error::WouldBlock);
            }
            let start = ext * EXTENT_BYTES;
            let data = self.get(start, (start + EXTENT_BYTES).min(self.len))?;
            out.copy_from_slice(&data[within as usize..within as usize + want]);
            if let Err(e) = self.reads.cache.insert(self.id, ext, &data) {
                tracing::warn!(pack = self.id, error = %e, "caching a remote extent failed");
            }
            done += want;
        }
        Ok(done)
    }
}

impl StorageFile for RemotePackFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.read_in(buf, offset, Wait::Block)
    }

    fn read_at_nowait(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.read_in(buf, offset, Wait::Never)
    }

    fn write_all_at(&self, _buf: &[u8], _offset: u64) -> Result<()> {
        Err(Error::ReadOnly(self.path.display().to_string()))
    }

    fn sync_data(&self) -> Result<()> {
        Err(Error::ReadOnly(self.path.display().to_string()))
    }

    fn len(&self) -> Result<u64> {
        Ok(self.len)
    }

    fn set_len(&self, _len: u64) -> Result<()> {
        Err(Error::ReadOnly(self.path.display().to_string()))
    }
}
