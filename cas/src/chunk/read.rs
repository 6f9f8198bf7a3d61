//! Reads of chunks (see the module docs): located refs straight from their
//! pack (or through the forward tables of a pack GC deleted), everything
//! else through the index, each checked against its crc32c; and the
//! offline check of every stored chunk.

use super::{check, corrupt, lock, pack, ChunkHash, ChunkLoc, ChunkRef, ChunkStore, CHUNK_BYTES};
use crate::dedup;
use crate::dedup::key::Key;
use crate::error::{Error, Result};
use crate::format;
use crate::io::{IoCx, Wait};
use crate::storage::StorageFile;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use trace::IoSource;

impl ChunkStore {
    /// Reads chunk `hash` into `out` (4096 bytes) through the clean cache,
    /// finding it in the index. Fails with `NotFound` if the chunk is not
    /// stored, and with `ChecksumMismatch` (leaving `out` zeroed) if its
    /// bytes are damaged.
    pub fn read(&self, hash: &ChunkHash, out: &mut [u8]) -> Result<()> {
        self.read_ref_in(&ChunkRef::unlocated(hash), out, IoCx::default())
    }

    /// Reads the chunk a manifest leaf names into `out` (4096 bytes),
    /// through the clean cache. A located ref whose pack exists is read
    /// there without consulting the index: ids are never reused and a
    /// slot's bytes never change while its pack exists. One whose pack GC
    /// repacked and deleted follows the pack's forward table. Only an
    /// unlocated ref, or one no table leads on from (the chunk was swept),
    /// asks the index ([`ChunkStats::read_index_lookups`](super::ChunkStats::read_index_lookups)).
    /// Errors as [`ChunkStore::read`].
    pub fn read_ref(&self, r: &ChunkRef, out: &mut [u8]) -> Result<()> {
        self.read_ref_in(r, out, IoCx::default())
    }

    /// [`ChunkStore::read_ref`] in the context `cx`: its storage reads wait
    /// as `cx.wait` allows, and its time goes to `cx` (cache or chunk).
    pub fn read_ref_in(&self, r: &ChunkRef, out: &mut [u8], cx: IoCx<'_>) -> Result<()> {
        if out.len() != CHUNK_BYTES {
            return Err(Error::InvalidArgument(format!(
                "chunk reads are {CHUNK_BYTES} bytes, not {}",
                out.len()
            )));
        }
        let key = Key::of_tag(&r.tag);
        let begun = cx.begin();
        if let Some(bytes) = self.cache.get(&key) {
            out.copy_from_slice(&bytes);
            cx.end(IoSource::Cache, begun);
            return Ok(());
        }
        // Where the leaf says, or where its old pack's forward table says.
        // (The `files` guard is dropped before `forwarded` takes it again:
        // a writer queued in between would otherwise block both.)
        let direct = r.at.and_then(|at| Some((at, self.read_files().get(&at.pack)?.clone())));
        let located = direct.map(|d| (d, false)).or_else(|| Some((self.forwarded(r.at?)?, true)));
        let result = match located {
            Some(((at, file), forwarded)) => {
                if forwarded {
                    // Only then: an add of 0 would still be a locked
                    // instruction on every read.
                    self.reads_forwarded.fetch_add(1, Ordering::Relaxed);
                }
                match self.read_slot(&file, at, out, cx.wait) {
                    // A read that must not wait gives up here: the index
                    // would only lead to the same pack.
                    Err(Error::WouldBlock) => Err(Error::WouldBlock),
                    // A table that led astray (damaged on disk) or a failed
                    // read: the index knows where the chunk is.
                    Err(_) if forwarded => self.read_indexed(r, out, cx.wait),
                    other => other,
                }
            }
            None => self.read_indexed(r, out, cx.wait),
        };
        cx.end(IoSource::Chunk, begun);
        result?;
        // A chunk read once is not worth a copy and an eviction: it enters
        // the cache on its second miss (admission.rs).
        if !self.admission.admit(&r.tag) {
            self.cache_admits_deferred.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        // Into the buffer of the entry it evicts when nobody else holds
        // it: no 4 KiB allocation and free per miss (the allocator's arena
        // locks were where reads stalled next).
        self.cache.insert_with(key, |evicted| {
            if let Some(mut bytes) = evicted {
                if let Some(buf) = Arc::get_mut(&mut bytes) {
                    buf.copy_from_slice(out);
                    return bytes;
                }
            }
            Arc::from(&out[..])
        });
        Ok(())
    }

    /// Finds chunk `r` in the index (counted) and reads it: the newest
    /// entry whose pack is open. A pack GC deletes between the lookup and
    /// the read sends it back to the index, which by then has the moved
    /// chunk's entry (bounded: GC holds a pass lock and deletes one pack at
    /// a time).
    fn read_indexed(&self, r: &ChunkRef, out: &mut [u8], wait: Wait) -> Result<()> {
        self.read_index_lookups.fetch_add(1, Ordering::Relaxed);
        for _ in 0..4 {
            let open = |at: ChunkLoc| self.read_files().contains_key(&at.pack);
            let Some(e) = self.read_index().find_in(&r.tag, &open, wait)? else { break };
            let Some(file) = self.read_files().get(&e.at.pack).cloned() else { continue };
            return self.read_slot(&file, e.at, out, wait);
        }
        Err(Error::NotFound(format!("chunk {}", r.tag)))
    }

    /// Reads slot `at.slot` of `file` into `out` and checks it against
    /// `at.crc` (`ChecksumMismatch`, `out` zeroed, if it differs), reading
    /// as `wait` allows.
    fn read_slot(&self, file: &Arc<dyn StorageFile>, at: ChunkLoc, out: &mut [u8], wait: Wait) -> Result<()> {
        let offset = pack::slot_offset(at.slot);
        file.read_exact_at_in(out, offset, wait)?;
        let actual = format::crc32c(out);
        if actual != at.crc {
            out.fill(0);
            return Err(Error::ChecksumMismatch {
                path: file.path().to_path_buf(),
                offset,
                expected: at.crc,
                actual,
            });
        }
        Ok(())
    }

    /// Reads every stored chunk and checks its crc32c (and, with `rehash`,
    /// its blake3 hash): an offline consistency check. Returns the number
    /// of chunks checked.
    pub fn verify(&self, rehash: bool) -> Result<u64> {
        let mut entries = self.live_entries()?;
        entries.sort_unstable_by_key(|e| (e.at.pack, e.at.slot));
        entries.dedup_by_key(|e| (e.at.pack, e.at.slot));
        let mut buf = vec![0u8; CHUNK_BYTES];
        for e in &entries {
            let (hash, loc) = (e.hash, e.at);
            let file = {
                match self.read_files().get(&loc.pack) {
                    Some(f) => f.clone(),
                    None => {
                        return Err(corrupt(
                            &self.dir,
                            0,
                            format!("entry points at missing pack {}", loc.pack),
                        ))
                    }
                }
            };
            let offset = pack::slot_offset(loc.slot);
            file.read_exact_at(&mut buf, offset)?;
            match check::check_bytes(&buf, &hash, loc.crc, rehash) {
                Ok(()) => {}
                Err(check::Mismatch::Crc(actual)) => {
                    return Err(Error::ChecksumMismatch {
                        path: file.path().to_path_buf(),
                        offset,
                        expected: loc.crc,
                        actual,
                    })
                }
                Err(check::Mismatch::Content) => {
                    return Err(corrupt(file.path(), offset, format!("chunk {hash} has other content")))
                }
            }
        }
        Ok(entries.len() as u64)
    }

    /// Every index entry whose slot is live (the memtables' and every
    /// run's; a chunk may appear more than once). Reads every run.
    pub(crate) fn live_entries(&self) -> Result<Vec<dedup::run::Entry>> {
        let w = lock(&self.writer);
        let idx = self.read_index();
        let mut out = Vec::new();
        for m in std::iter::once(&idx.mem).chain(idx.frozen.as_deref()) {
            out.extend(
                m.iter().filter(|(_, &at)| w.is_live(at)).map(|(k, &at)| dedup::run::Entry { hash: k.0, at }),
            );
        }
        for run in idx.runs() {
            let mut s = run.stream();
            while let Some(e) = s.next_entry()? {
                if w.is_live(e.at) {
                    out.push(e);
                }
            }
        }
        Ok(out)
    }
}
