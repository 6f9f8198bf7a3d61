//! What `ci/bench index` drives directly: the dedup index as the chunk
//! store drives it (memtable, runs, summary, with the store's flush and
//! merge policy; `DedupBench`), without pack I/O; and a synthetic store of
//! many chunks to time an open. Not part of the store's API. (The
//! benchmark's baseline, the index the store used before, is in ci/.)

use super::journal::Journal;
use super::pack::{self, PackHeader};
use super::{ChunkHash, ChunkLoc};
use crate::dedup::merge::{MergeJob, MergeRunner, MergeSpec};
use crate::dedup::root::Root;
use crate::dedup::run::{Entry, RunWriter};
use crate::dedup::slots::{self, Bits};
use crate::dedup::summary::PARTITIONS;
use crate::dedup::{self, DedupIndex, ProbeCost};
use crate::error::Result;
use crate::storage::{OpenMode, Storage};
use crate::tasks::Tasks;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The dedup index as the chunk store drives it, without packs: an insert
/// probes it and, if the hash is new, puts it in the memtable; once the
/// memtable holds what the store would flush at this size, it is written
/// as a run (merged with the newest runs as the store does). Every entry
/// stays valid (nothing is freed).
pub struct DedupBench {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    index: DedupIndex,
    next_id: u64,
    entries: u64,
    /// Run pages read by probes.
    pub page_reads: u64,
    pub flushes: u64,
    /// The longest install step (a batch of summary partitions rebuilt;
    /// the store holds its writer and index locks across one), the
    /// longest whole install, and the longest flush (what a sync waits
    /// for), in milliseconds.
    pub install_ms_max: u64,
    pub install_total_ms_max: u64,
    pub flush_ms_max: u64,
    /// Merges installed, the longest (on its own thread), and flushes that
    /// waited for one because the runs had piled up.
    pub merges: u64,
    pub merge_ms_max: u64,
    pub merge_waits: u64,
    merge: Option<MergeJob>,
}

impl DedupBench {
    /// An empty index writing its runs into `dir` (created), with the
    /// summary limited to `summary_budget_bytes`.
    pub fn new(storage: Arc<dyn Storage>, dir: &Path, summary_budget_bytes: u64) -> Result<DedupBench> {
        storage.create_dir_all(dir)?;
        Ok(DedupBench {
            storage,
            dir: dir.to_path_buf(),
            index: DedupIndex::new(PARTITIONS, summary_budget_bytes),
            next_id: 1,
            entries: 0,
            page_reads: 0,
            flushes: 0,
            install_ms_max: 0,
            install_total_ms_max: 0,
            flush_ms_max: 0,
            merges: 0,
            merge_ms_max: 0,
            merge_waits: 0,
            merge: None,
        })
    }

    /// Inserts `hash` at (`pack`, `slot`) unless the index finds it; true
    /// if it was new.
    pub fn insert(&mut self, hash: &ChunkHash, pack: u32, slot: u32, crc: u32) -> Result<bool> {
        if self.lookup(hash)?.is_some() {
            return Ok(false);
        }
        self.index.put(*hash, ChunkLoc { pack, slot, crc });
        self.entries += 1;
        let flush_at = super::writer::flush_records(
            self.entries,
            super::ChunkStoreOptions::default().index_checkpoint_min_bytes,
        );
        if self.index.mem.len() as u64 >= flush_at {
            self.flush()?;
        }
        Ok(true)
    }

    /// The dedup lookup the store's inserts make.
    pub fn lookup(&mut self, hash: &ChunkHash) -> Result<Option<(u32, u32)>> {
        let mut cost = ProbeCost::default();
        let found = self.index.probe(hash, &|_| true, &mut cost)?;
        self.page_reads += cost.page_reads;
        Ok(found.map(|at| (at.pack, at.slot)))
    }

    /// Writes the memtable as a level-0 run, then installs a finished
    /// merge and starts the next one due, on its own thread as the store
    /// does (waiting for the running one at the store's run limit).
    pub fn flush(&mut self) -> Result<()> {
        let started = std::time::Instant::now();
        let frozen = self.index.freeze();
        let new = dedup::write_merged(
            self.storage.as_ref(),
            &self.dir,
            1,
            self.next_id,
            0,
            &[],
            &dedup::sorted_entries(&frozen),
            &|_| true,
        )?;
        self.next_id += 1;
        let install = self.index.begin_flush(new);
        self.install(install)?;
        self.merge_runs(false)?;
        self.flushes += 1;
        self.flush_ms_max = self.flush_ms_max.max(started.elapsed().as_millis() as u64);
        Ok(())
    }

    /// Installs in steps as the store does, timing each step (a hold of
    /// the store's writer and index locks) and the whole.
    fn install(&mut self, mut install: dedup::Install) -> Result<()> {
        let started = std::time::Instant::now();
        loop {
            let step = std::time::Instant::now();
            if self.index.install_step(&mut install, super::ChunkStore::INSTALL_STEP_PARTITIONS)? {
                self.index.finish_install(install);
                self.install_ms_max = self.install_ms_max.max(step.elapsed().as_millis() as u64);
                break;
            }
            self.install_ms_max = self.install_ms_max.max(step.elapsed().as_millis() as u64);
        }
        self.install_total_ms_max = self.install_total_ms_max.max(started.elapsed().as_millis() as u64);
        Ok(())
    }

    /// Installs the running merge if it finished (or must be waited for:
    /// `wait`, or too many runs), then starts the next one due.
    pub fn merge_runs(&mut self, wait: bool) -> Result<()> {
        loop {
            if let Some(job) = &self.merge {
                let runs = self.index.runs().count();
                if !job.is_finished() && !wait && runs < super::ChunkStore::MERGE_WAIT_RUNS {
                    return Ok(());
                }
                if !job.is_finished() && !wait {
                    self.merge_waits += 1;
                }
                let job = self.merge.take().expect("checked");
                let inputs = job.inputs.clone();
                let (result, took) = job.wait();
                let install = self.index.begin_merge(&inputs, result?);
                self.install(install)?;
                self.merge_ms_max = self.merge_ms_max.max(took.as_millis() as u64);
                self.merges += 1;
                for run in &inputs {
                    self.storage.remove_file(run.path())?;
                }
            }
            let Some((inputs, level)) = self.index.plan_merge() else { return Ok(()) };
            let spec = MergeSpec {
                storage: self.storage.clone(),
                dir: self.dir.clone(),
                store_id: 1,
                run_id: self.next_id,
                level,
                inputs,
            };
            self.next_id += 1;
            self.merge = Some(MergeJob::start(spec, Box::new(|_| true), MergeRunner::Task(&Tasks::Threads))?);
            if !wait {
                return Ok(());
            }
        }
    }

    /// The index's own estimate of its heap bytes.
    pub fn memory_bytes(&self) -> u64 {
        self.index.memory_bytes()
    }

    pub fn runs(&self) -> u64 {
        self.index.runs().count() as u64
    }

    /// Fraction of hash space the summary covers.
    pub fn summary_fraction(&self) -> f64 {
        self.index.summary_limit() as f64 / PARTITIONS as f64
    }
}

/// Heap bytes of the largest memtable a store keeps (a flush's worth of
/// entries at the most), whatever its size: the fixed part of the index's
/// memory in a large store.
pub fn memtable_cap_bytes() -> u64 {
    let records = super::writer::flush_records(
        u64::MAX,
        super::ChunkStoreOptions::default().index_checkpoint_min_bytes,
    );
    dedup::mem_bytes_for(records as usize)
}

/// Heap bytes of the slot bits (live and keep) of `chunks` chunks in full
/// packs.
pub fn slot_bits_bytes(chunks: u64) -> u64 {
    chunks.div_ceil(64) * 8 * 2
}

/// Writes a chunk store in `dir` that indexes `chunks` chunks as a flush
/// leaves it: one run of that many entries (hashes from `hash_of`), a
/// slots file, an empty journal, the root, and the packs they name, as
/// sparse files of the full length. Its chunks' bytes are zeros (the
/// store's open never reads them).
pub fn write_synthetic_store(
    storage: &dyn Storage,
    dir: &Path,
    chunks: u64,
    slots_per_pack: u32,
    hash_of: impl Fn(u64) -> ChunkHash,
) -> Result<()> {
    storage.create_dir_all(dir)?;
    let store_id = 0x5eed_1dec;
    let packs = chunks.div_ceil(u64::from(slots_per_pack)) as u32;
    let place = |i: u64| ((i / u64::from(slots_per_pack)) as u32 + 1, (i % u64::from(slots_per_pack)) as u32);
    let mut entries: Vec<Entry> = (0..chunks)
        .map(|i| {
            let (pack, slot) = place(i);
            Entry { hash: hash_of(i), at: ChunkLoc { pack, slot, crc: 0 } }
        })
        .collect();
    entries.sort_unstable_by(|a, b| crate::dedup::run::hash_order(&a.hash, &b.hash));
    entries.dedup_by(|a, b| a.hash == b.hash);
    let mut run = RunWriter::create(storage, dir, 1, 0, store_id)?;
    let mut bits: BTreeMap<u32, Bits> = BTreeMap::new();
    for e in &entries {
        run.push(e)?;
        bits.entry(e.at.pack).or_default().set(e.at.slot);
    }
    drop(entries);
    run.finish()?;
    slots::write(storage, dir, 2, &slots::encode(store_id, &bits))?;
    Journal::create(storage, dir, store_id, 1)?;
    let root = Root {
        store_id,
        generation: 1,
        next_file_id: 3,
        next_pack_id: packs + 1,
        journal_generation: 1,
        slots_id: 2,
        runs: vec![1],
        summary_limit: PARTITIONS as u32,
    };
    root.write(storage, dir)?;
    for id in 1..=packs {
        let f = storage.open(&dir.join(pack::pack_file_name(id)), OpenMode::CreateNew)?;
        let header = PackHeader { store_id, pack_id: id, capacity_slots: slots_per_pack };
        f.write_all_at(&header.encode(), 0)?;
        let used = (chunks - u64::from(id - 1) * u64::from(slots_per_pack)).min(u64::from(slots_per_pack));
        f.set_len(pack::slot_offset(used as u32))?;
    }
    storage.sync_dir(dir)
}
