//! The chunk store's half of `casblk fsck`.
//!
//! [`IndexCheck::load`] replays the index journal with the code an open
//! uses (through a [`DryRun`](crate::storage::DryRun) storage, so a torn
//! tail is reported, not cut), and names pack files nothing references.
//! [`IndexCheck::verify`] then reads every chunk (or only those a caller
//! marked referenced) pack by pack in sequential 1 MiB reads and checks
//! each against its entry's crc32c and its blake3 name. Unlike an open,
//! it goes on past a bad pack or chunk: every one is reported and its
//! entries marked, so the manifest walk can name the image blocks they
//! take down with them.

use super::forward;
use super::journal::{self, Journal, JournalOp};
use super::pack::{self, CHUNK_BYTES};
use super::tier::TierCheck;
use super::ChunkLoc;
use super::{ChunkHash, ChunkTag};
use crate::dedup::root::{Root, ROOT_FILE};
use crate::dedup::run::{self, Run};
use crate::dedup::slots::{self, Bits};
use crate::format;
use crate::report::{Finding, FsckReport};
use crate::storage::{Change, OpenMode, Storage};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes read from a pack at a time.
const READ_BYTES: usize = 1 << 20;

/// What the check knows of one chunk's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkState {
    /// Not read (yet, or not asked for).
    Unchecked,
    /// Read, crc32c and hash match.
    Good,
    /// Read, but the bytes are not the chunk's.
    Damaged,
    /// Its pack is missing, unreadable or does not hold the slot.
    Lost,
}

/// Why a chunk's bytes are not the chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mismatch {
    /// The crc32c differs from the entry's (the value found).
    Crc(u32),
    /// The crc32c matches but the blake3 name does not.
    Content,
}

impl Mismatch {
    /// The finding in words, for scrub reports: `whose` names what gave the
    /// expected `crc` ("its pointer", "its slot index").
    pub(crate) fn describe(self, crc: u32, whose: &str) -> String {
        match self {
            Mismatch::Crc(actual) => format!("crc32c {actual:#010x}, {whose} says {crc:#010x}"),
            Mismatch::Content => "the crc32c matches but the blake3 name does not".into(),
        }
    }
}

/// Checks `bytes` against an entry's crc32c and, with `rehash`, its name.
pub(crate) fn check_bytes(bytes: &[u8], hash: &ChunkHash, crc: u32, rehash: bool) -> Result<(), Mismatch> {
    let actual = format::crc32c(bytes);
    if actual != crc {
        return Err(Mismatch::Crc(actual));
    }
    if rehash && ChunkHash::of(bytes) != *hash {
        return Err(Mismatch::Content);
    }
    Ok(())
}

/// One index entry under check.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub hash: ChunkHash,
    pub pack: u32,
    pub slot: u32,
    pub crc: u32,
    pub state: ChunkState,
    /// Manifest references counted by the caller.
    pub refs: u32,
}

/// What `load_index` read: the store id, each chunk's newest entry in a
/// live slot, and the live bits.
type LoadedIndex = (u64, HashMap<ChunkHash, ChunkLoc>, BTreeMap<u32, Bits>);

/// Reads the whole index as an open would see it, reporting what is
/// damaged: (store id, each chunk's newest entry in a live slot, the live
/// bits). Index files the root does not name are removed (recorded by the
/// dry run) as an open would. None if the index cannot be read.
fn load_index(storage: &dyn Storage, dir: &Path, report: &mut FsckReport) -> Option<LoadedIndex> {
    let journal_path = dir.join(journal::INDEX_FILE);
    let root = match Root::read(storage, dir) {
        Ok(r) => r,
        Err(e) => {
            report.problem(Finding::from_error("index-root", None, &dir.join(ROOT_FILE), &e));
            return None;
        }
    };
    let mut bits: BTreeMap<u32, Bits> = BTreeMap::new();
    // Entries in order, oldest first; which are live is known only at the end.
    let mut ordered: Vec<(ChunkHash, ChunkLoc)> = Vec::new();
    let mut removed: Vec<ChunkHash> = Vec::new();
    let mut replay_journal = true;
    let mut store_id = 0;
    if let Some(root) = &root {
        store_id = root.store_id;
        if let Ok(names) = storage.list_dir(dir) {
            for n in names {
                let stale = match (run::parse_run_file_name(&n), slots::parse_slots_file_name(&n)) {
                    (Some(id), _) => !root.runs.contains(&id),
                    (_, Some(id)) => id != root.slots_id,
                    _ => run::is_keys_spill_name(&n),
                };
                if stale {
                    let _ = storage.remove_file(&dir.join(&n));
                }
            }
        }
        if root.slots_id != 0 {
            match slots::read(storage, dir, root.slots_id, root.store_id) {
                Ok(b) => bits = b,
                Err(e) => {
                    let path = dir.join(slots::slots_file_name(root.slots_id));
                    report.problem(Finding::from_error("index-slots", None, &path, &e));
                    return None;
                }
            }
        }
        for &id in &root.runs {
            let path = dir.join(run::run_file_name(id));
            let streamed = Run::open(storage, dir, id, root.store_id).and_then(|r| {
                let r = Arc::new(r);
                let (mut entries, mut keys) = (r.stream(), r.keys());
                while let Some(e) = entries.next_entry()? {
                    let key = keys.next_key()?;
                    if key.as_ref().map(|k| &k[..]) != Some(&e.hash.as_bytes()[..run::KEY_BYTES]) {
                        return Err(cas_corrupt(
                            r.path(),
                            format!("summary key of entry {} disagrees with it", e.hash),
                        ));
                    }
                    ordered.push((e.hash, e.at));
                }
                if keys.next_key()?.is_some() {
                    return Err(cas_corrupt(r.path(), "more summary keys than entries".into()));
                }
                Ok(())
            });
            if let Err(e) = streamed {
                report.problem(Finding::from_error("index-run", None, &path, &e));
                return None;
            }
        }
        match Journal::header(storage, dir) {
            Ok((v, g)) => replay_journal = v == journal::INDEX_VERSION && g == root.journal_generation,
            Err(e) => {
                report.problem(Finding::from_error("index", None, &journal_path, &e));
                return None;
            }
        }
    }
    let legacy = root.is_none();
    if replay_journal {
        let replay = Journal::open(storage, dir, |op| {
            match op {
                JournalOp::Put { hash, pack, slot, crc } => {
                    ordered.push((hash, ChunkLoc { pack, slot, crc }));
                    bits.entry(pack).or_default().set(slot);
                }
                JournalOp::Remove { hash } => removed.push(hash),
                JournalOp::Free { pack, slot } => {
                    if let Some(b) = bits.get_mut(&pack) {
                        b.clear(slot);
                    }
                }
                JournalOp::NextPack { .. } => {}
            }
            Ok(())
        });
        match replay {
            Ok(j) => store_id = j.store_id,
            Err(e) => {
                report.problem(Finding::from_error("index", None, &journal_path, &e));
                return None;
            }
        }
    }
    let mut map: HashMap<ChunkHash, ChunkLoc> = HashMap::new();
    if legacy {
        // The journal is the whole index: last put wins, removes remove.
        bits.clear();
        for (hash, at) in ordered {
            map.insert(hash, at);
        }
        for hash in removed {
            map.remove(&hash);
        }
        for at in map.values() {
            bits.entry(at.pack).or_default().set(at.slot);
        }
    } else {
        for (hash, at) in ordered {
            if slots::is_live(&bits, at) {
                map.insert(hash, at);
            }
        }
    }
    Some((store_id, map, bits))
}

fn cas_corrupt(path: &Path, detail: String) -> crate::error::Error {
    crate::error::Error::Corruption { path: path.to_path_buf(), offset: 0, detail }
}

/// The replayed index, sorted by hash.
pub struct IndexCheck {
    dir: PathBuf,
    store_id: u64,
    pub entries: Vec<Entry>,
    /// Pack ids with a file in the directory.
    pack_files: Vec<u32>,
    /// Pack ids the tier holds as uploaded, sorted (their local
    /// file may be gone: they are read from the bucket).
    remote_packs: Vec<u32>,
    /// Other stores' packs that fetched images name, sorted: their chunks
    /// are in the bucket and not in this index.
    pub foreign_packs: Vec<u32>,
    /// Pack ids some entry points into, sorted.
    pub referenced_packs: Vec<u32>,
}

impl IndexCheck {
    /// Replays the journal in `dir` through `storage` (a dry run), with
    /// what `tier` keeps of the store checked too. `None` if it cannot be
    /// replayed (reported).
    pub fn load(
        storage: &dyn Storage,
        dir: &Path,
        report: &mut FsckReport,
        tier: &TierCheck,
    ) -> Option<IndexCheck> {
        let names = match storage.list_dir(dir) {
            Ok(n) => n,
            Err(e) => {
                report.problem(Finding::from_error("chunks-dir", None, dir, &e));
                return None;
            }
        };
        let mut pack_files: Vec<u32> = names.iter().filter_map(|n| pack::parse_pack_file_name(n)).collect();
        pack_files.sort_unstable();
        for n in &names {
            if forward::is_forward_tmp_name(n) {
                // What an open removes (recorded by the dry run, reported as a leftover).
                if let Err(e) = storage.remove_file(&dir.join(n)) {
                    report.problem(Finding::from_error("forward-table", None, &dir.join(n), &e));
                }
                continue;
            }
            let known = n == journal::INDEX_FILE
                || forward::parse_forward_file_name(n).is_some()
                || n == journal::INDEX_TMP_FILE
                || n == ROOT_FILE
                || *n == format!("{ROOT_FILE}.tmp")
                || run::parse_run_file_name(n).is_some()
                || run::is_keys_spill_name(n)
                || slots::parse_slots_file_name(n).is_some()
                || (tier.owns_file)(n);
            if !known && pack::parse_pack_file_name(n).is_none() {
                let f =
                    Finding::new("unknown-file", None, &dir.join(n), "not a file casblk writes; left alone");
                report.note(f);
            }
        }
        if !storage.exists(&dir.join(journal::INDEX_FILE)) && !storage.exists(&dir.join(ROOT_FILE)) {
            if !pack_files.is_empty() {
                let detail = "pack files exist but the chunk index is missing: no chunk can be found";
                report.problem(Finding::new("index-missing", None, &dir.join(journal::INDEX_FILE), detail));
                return None;
            }
            // A store whose chunk store was never opened holds no chunks.
            let referenced_packs = vec![];
            return Some(IndexCheck {
                dir: dir.to_path_buf(),
                store_id: 0,
                entries: vec![],
                pack_files,
                remote_packs: vec![],
                foreign_packs: vec![],
                referenced_packs,
            });
        }
        let (store_id, map, bits) = load_index(storage, dir, report)?;
        let (remote_packs, foreign_packs) = (tier.packs)(storage, dir, store_id, &pack_files, report);
        let mut entries: Vec<Entry> = map
            .into_iter()
            .map(|(hash, at)| Entry {
                hash,
                pack: at.pack,
                slot: at.slot,
                crc: at.crc,
                state: ChunkState::Unchecked,
                refs: 0,
            })
            .collect();
        entries.sort_unstable_by_key(|e| e.hash);
        report.counts.chunks = entries.len() as u64;
        // Live slots no entry names: a chunk stored twice while the summary
        // did not cover it, whose older copy's entry a merge dropped (GC
        // moves it by its content), or damage. A note, not a problem.
        let mut named: Vec<(u32, u32)> = entries.iter().map(|e| (e.pack, e.slot)).collect();
        named.sort_unstable();
        for (&id, b) in &bits {
            let unnamed = b.iter().filter(|&slot| named.binary_search(&(id, slot)).is_err()).count();
            if unnamed > 0 {
                let detail = format!(
                    "{unnamed} live slots of pack {id} are named by no index entry (second copies of chunks; GC moves them by content)"
                );
                report.note(Finding::new("index-slot", None, &dir.join(pack::pack_file_name(id)), detail));
            }
        }
        let mut referenced: Vec<u32> =
            bits.iter().filter(|(_, b)| b.count() > 0).map(|(&id, _)| id).collect();
        referenced.sort_unstable();
        report.counts.packs = referenced.len() as u64;
        for &id in &pack_files {
            if referenced.binary_search(&id).is_err() {
                let path = dir.join(pack::pack_file_name(id));
                let detail = "no index entry points into this pack (a crash leftover, or emptied by GC)";
                let f = Finding::new("orphan-pack", None, &path, detail).repair(Change::Remove { path });
                report.problem(f);
            }
        }
        for (id, n) in names.iter().filter_map(|n| Some((forward::parse_forward_file_name(n)?, n))) {
            let path = dir.join(n);
            if let Err(e) = forward::read_forward(storage, &path, id, store_id) {
                let mut f = Finding::from_error("forward-table", None, &path, &e);
                f.detail +=
                    " (an open ignores it: reads of the chunks GC moved out of this pack ask the index)";
                report.problem(f.repair(Change::Remove { path }));
            }
        }
        Some(IndexCheck {
            dir: dir.to_path_buf(),
            store_id,
            entries,
            pack_files,
            remote_packs,
            foreign_packs,
            referenced_packs: referenced,
        })
    }

    /// The entry whose hash starts with `tag` (entries are sorted by hash,
    /// so also by tag).
    pub fn find(&mut self, tag: &ChunkTag) -> Option<&mut Entry> {
        let i = self.entries.binary_search_by(|e| e.hash.tag().cmp(tag)).ok()?;
        Some(&mut self.entries[i])
    }

    /// Reads and checks every entry (`only_referenced`: those with refs),
    /// setting each one's state and reporting every pack or chunk that
    /// does not hold what the index says.
    pub fn verify(&mut self, storage: &dyn Storage, only_referenced: bool, report: &mut FsckReport) {
        // Entries to read, by pack then slot: (pack, slot, index in entries).
        let mut by_pack: BTreeMap<u32, Vec<(u32, usize)>> = BTreeMap::new();
        for (i, e) in self.entries.iter().enumerate() {
            if !only_referenced || e.refs > 0 {
                by_pack.entry(e.pack).or_default().push((e.slot, i));
            }
        }
        let mut buf = vec![0u8; READ_BYTES];
        for (id, mut slots) in by_pack {
            slots.sort_unstable();
            let path = self.dir.join(pack::pack_file_name(id));
            let lose = |entries: &mut [Entry], slots: &[(u32, usize)]| {
                for &(_, i) in slots {
                    entries[i].state = ChunkState::Lost;
                }
            };
            let in_bucket =
                self.remote_packs.binary_search(&id).is_ok() || self.foreign_packs.binary_search(&id).is_ok();
            if self.pack_files.binary_search(&id).is_err() && in_bucket {
                let detail = format!(
                    "pack {id:#010x} is in the bucket only: its {} chunks were not read",
                    slots.len()
                );
                report.note(Finding::new("pack-remote", None, &path, detail));
                continue;
            }
            if self.pack_files.binary_search(&id).is_err() {
                let detail = format!("pack {id} is missing: {} chunks in it are lost", slots.len());
                report.problem(Finding::new("pack-missing", None, &path, detail));
                lose(&mut self.entries, &slots);
                continue;
            }
            let max_slot = slots.last().map_or(0, |s| s.0);
            let file = match pack::open_checked(storage, &path, self.store_id, id, max_slot) {
                Ok((file, _, _)) => file,
                Err(e) => {
                    let mut f = Finding::from_error("pack", None, &path, &e);
                    f.detail += &format!(" ({} chunks in it cannot be trusted)", slots.len());
                    report.problem(f);
                    lose(&mut self.entries, &slots);
                    continue;
                }
            };
            let per_read = (READ_BYTES / CHUNK_BYTES) as u32;
            let mut k = 0;
            while k < slots.len() {
                let first = slots[k].0;
                let end = slots[k..].iter().take_while(|s| s.0 < first.saturating_add(per_read)).count() + k;
                let last = slots[end - 1].0;
                let want = (last - first + 1) as usize * CHUNK_BYTES;
                let offset = pack::slot_offset(first);
                if let Err(e) = file.read_exact_at(&mut buf[..want], offset) {
                    let mut f = Finding::from_error("pack-read", None, &path, &e);
                    f.offset = f.offset.or(Some(offset));
                    report.problem(f);
                    lose(&mut self.entries, &slots[k..end]);
                    k = end;
                    continue;
                }
                for &(slot, i) in &slots[k..end] {
                    let at = (slot - first) as usize * CHUNK_BYTES;
                    let bytes = &buf[at..at + CHUNK_BYTES];
                    let e = &mut self.entries[i];
                    let slot_at = pack::slot_offset(slot);
                    match check_bytes(bytes, &e.hash, e.crc, true) {
                        Err(Mismatch::Crc(crc)) => {
                            let detail = format!(
                                "chunk {} in slot {slot}: crc32c {crc:#010x}, the index says {:#010x}",
                                e.hash, e.crc
                            );
                            report.problem(Finding::new("chunk-checksum", None, &path, detail).at(slot_at));
                            e.state = ChunkState::Damaged;
                        }
                        Err(Mismatch::Content) => {
                            let detail =
                                format!("slot {slot} holds other bytes than chunk {} (crc matches)", e.hash);
                            report.problem(Finding::new("chunk-content", None, &path, detail).at(slot_at));
                            e.state = ChunkState::Damaged;
                        }
                        Ok(()) => {
                            e.state = ChunkState::Good;
                            report.counts.chunks_verified += 1;
                            report.counts.bytes_verified += CHUNK_BYTES as u64;
                        }
                    }
                }
                k = end;
            }
        }
    }

    /// The crc32c of the bytes in `slot` of `pack` (None: unreadable).
    pub fn slot_crc(&self, storage: &dyn Storage, pack: u32, slot: u32) -> Option<u32> {
        let f = storage.open(&self.dir.join(pack::pack_file_name(pack)), OpenMode::Existing).ok()?;
        let mut buf = vec![0u8; CHUNK_BYTES];
        f.read_exact_at(&mut buf, pack::slot_offset(slot)).ok()?;
        Some(format::crc32c(&buf))
    }

    /// The pack file and byte offset an entry's bytes live at.
    pub fn location(&self, e: &Entry) -> (PathBuf, u64) {
        (self.dir.join(pack::pack_file_name(e.pack)), pack::slot_offset(e.slot))
    }
}
