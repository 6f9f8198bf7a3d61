//! An in-memory backend with crashes and faults, for tests.
//!
//! Each file keeps `live` bytes (what reads see), `durable` bytes (what a
//! crash keeps) and the list of writes since its last `sync_data`. The
//! namespace likewise keeps a durable copy plus the directory operations
//! not yet made durable by `sync_dir`.
//!
//! [`MemStorage::crash`] models a power cut:
//! - [`CrashMode::LoseUnsynced`]: only durable bytes and entries survive.
//! - [`CrashMode::Torn`]: as above, but each unsynced write independently
//!   survives whole, not at all, or as a random subset of its 512-byte
//!   sectors, and a random prefix of each directory's unsynced operations
//!   survives. This is what a filesystem with sector-atomic writes and no
//!   write ordering may leave behind.
//!
//! Handles opened before a crash fail afterwards: the process that held
//! them is gone. Faults ([`Fault`]) make chosen operations fail with EIO
//! or ENOSPC, once or from then on.
//!
//! A sync fault is a *writeback error*, as Linux has them: the file's
//! unsynced writes are dropped from what a crash keeps (reads still see
//! them, like pages marked clean but never written), and the error is
//! reported once to each open handle: a second sync of the same handle
//! after the failed one returns Ok and makes nothing of the lost writes
//! durable. `Storage::open` wraps every handle in the [`SyncGuard`] that
//! turns this into "every later sync fails"; [`MemStorage::without_sync_guard`]
//! leaves it off, to show what the guard prevents.

use super::{OpenMode, Storage, StorageFile, StorageLock, SyncGuard};
use crate::error::{Error, Result};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const SECTOR: usize = crate::units::SECTOR_BYTES as usize;

/// What a crash keeps of unsynced state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashMode {
    LoseUnsynced,
    /// Random partial persistence, reproducible from `seed`.
    Torn {
        seed: u64,
    },
}

/// The operation a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultOp {
    Read,
    Write,
    Sync,
    Open,
    /// rename, remove, create_dir_all, remove_dir_all, sync_dir.
    Namespace,
}

/// Makes matching operations fail with `errno`.
#[derive(Clone, Debug)]
pub struct Fault {
    pub op: FaultOp,
    /// Only paths containing this string match (None: every path).
    pub path_contains: Option<String>,
    /// Let this many matching operations succeed first.
    pub skip: u64,
    /// libc errno, e.g. `libc::EIO` or `libc::ENOSPC`.
    pub errno: i32,
    /// Keep failing after the first hit (else fail once).
    pub sticky: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    Dir,
    File(u64),
}

#[derive(Clone, Debug)]
enum NsOp {
    Put(PathBuf, Entry),
    Remove(PathBuf),
    /// Atomic: the target gets the entry and the source goes, together.
    Rename(PathBuf, PathBuf, Entry),
}

#[derive(Clone, Debug)]
enum FileOp {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

#[derive(Default)]
struct FileData {
    live: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<FileOp>,
    /// Writeback errors so far (Linux's errseq of the file's mapping), and
    /// the errno of the last one.
    wb_errors: u64,
    wb_errno: i32,
}

struct State {
    generation: u64,
    next_ino: u64,
    live: BTreeMap<PathBuf, Entry>,
    durable: BTreeMap<PathBuf, Entry>,
    /// Unsynced namespace operations, in order, with the directories each touches.
    pending_ns: Vec<(NsOp, Vec<PathBuf>)>,
    /// By inode (creation order): a torn crash draws from one generator file
    /// by file, so the order must not vary between runs.
    files: BTreeMap<u64, Arc<Mutex<FileData>>>,
    faults: Vec<(Fault, u64)>,
    syncs: u64,
    /// Paths locked by `lock_exclusive`; a crash releases them all.
    locks: HashSet<PathBuf>,
    /// `open` wraps handles in a [`SyncGuard`] (the default).
    guard_syncs: bool,
    /// Each file sync sleeps this long first (a slow device).
    sync_delay: std::time::Duration,
    /// What `space` reports (`set_space`).
    space: Option<super::FsSpace>,
}

/// In-memory storage with crash and fault injection. Clones share state.
#[derive(Clone)]
pub struct MemStorage {
    state: Arc<Mutex<State>>,
}

impl Default for MemStorage {
    fn default() -> Self {
        Self::new()
    }
}

use crate::sync::lock;

fn os_err(path: &Path, errno: i32) -> Error {
    Error::io(path, std::io::Error::from_raw_os_error(errno))
}

fn parent_of(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("/"))
}

/// A small deterministic generator (splitmix64) so crashes replay from a seed.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

fn apply_write(buf: &mut Vec<u8>, off: u64, data: &[u8]) {
    let end = off as usize + data.len();
    if buf.len() < end {
        buf.resize(end, 0);
    }
    buf[off as usize..end].copy_from_slice(data);
}

fn apply_ns(map: &mut BTreeMap<PathBuf, Entry>, op: &NsOp) {
    match op {
        NsOp::Put(p, e) => {
            map.insert(p.clone(), *e);
        }
        NsOp::Remove(p) => {
            map.remove(p);
        }
        NsOp::Rename(from, to, e) => {
            map.remove(from);
            map.insert(to.clone(), *e);
        }
    }
}

impl MemStorage {
    pub fn new() -> MemStorage {
        let mut live = BTreeMap::new();
        live.insert(PathBuf::from("/"), Entry::Dir);
        let durable = live.clone();
        MemStorage {
            state: Arc::new(Mutex::new(State {
                generation: 0,
                next_ino: 1,
                live,
                durable,
                pending_ns: Vec::new(),
                files: BTreeMap::new(),
                faults: Vec::new(),
                syncs: 0,
                locks: HashSet::new(),
                guard_syncs: true,
                sync_delay: std::time::Duration::ZERO,
                space: None,
            })),
        }
    }

    /// Handles opened from now on lack the [`SyncGuard`]: a writeback error
    /// is reported once per handle, as the kernel does, and a later sync of
    /// the same handle succeeds. Only for tests that show what the guard is for.
    pub fn without_sync_guard(&self) {
        lock(&self.state).guard_syncs = false;
    }

    /// Makes every file sync from now on take at least `delay` (a slow
    /// device: lets tests fill the queues in front of a syncing stage).
    pub fn set_sync_delay(&self, delay: std::time::Duration) {
        lock(&self.state).sync_delay = delay;
    }

    /// What [`Storage::space`] reports from now on (`None`: cannot tell).
    pub fn set_space(&self, space: Option<super::FsSpace>) {
        lock(&self.state).space = space;
    }

    /// Adds a fault; it applies to operations from now on.
    pub fn inject(&self, fault: Fault) {
        lock(&self.state).faults.push((fault, 0));
    }

    pub fn clear_faults(&self) {
        lock(&self.state).faults.clear();
    }

    /// fdatasync and directory syncs issued so far.
    pub fn sync_count(&self) -> u64 {
        lock(&self.state).syncs
    }

    /// Simulates a power cut: afterwards only what `mode` keeps remains,
    /// and every handle opened before fails.
    pub fn crash(&self, mode: CrashMode) {
        tally_crash();
        let mut st = lock(&self.state);
        st.generation += 1;
        st.faults.clear();
        st.locks.clear();
        let mut rng = match mode {
            CrashMode::LoseUnsynced => None,
            CrashMode::Torn { seed } => Some(SplitMix(seed)),
        };
        // Namespace: per directory, a random prefix of its unsynced ops survives.
        let mut ns = st.durable.clone();
        if let Some(rng) = rng.as_mut() {
            let mut cut: HashMap<PathBuf, bool> = HashMap::new();
            for (op, dirs) in st.pending_ns.clone() {
                let stopped = dirs.iter().any(|d| {
                    let stop = *cut.entry(d.clone()).or_insert(false) || rng.below(3) == 0;
                    if stop {
                        cut.insert(d.clone(), true);
                    }
                    stop
                });
                if !stopped {
                    apply_ns(&mut ns, &op);
                }
            }
        }
        st.pending_ns.clear();
        st.live = ns.clone();
        st.durable = ns;
        // File contents: durable bytes, plus torn pieces of unsynced writes.
        let referenced: Vec<u64> =
            st.live.values().filter_map(|e| if let Entry::File(i) = e { Some(*i) } else { None }).collect();
        st.files.retain(|ino, _| referenced.contains(ino));
        for data in st.files.values() {
            let mut d = lock(data);
            let mut kept = d.durable.clone();
            if let Some(rng) = rng.as_mut() {
                for op in std::mem::take(&mut d.pending) {
                    match op {
                        FileOp::Write(off, bytes) => match rng.below(3) {
                            0 => {}
                            1 => apply_write(&mut kept, off, &bytes),
                            _ => {
                                for (i, sector) in bytes.chunks(SECTOR).enumerate() {
                                    if rng.below(2) == 0 {
                                        apply_write(&mut kept, off + (i * SECTOR) as u64, sector);
                                    }
                                }
                            }
                        },
                        FileOp::SetLen(len) => {
                            if rng.below(2) == 0 {
                                kept.resize(len as usize, 0);
                            }
                        }
                    }
                }
            }
            d.pending.clear();
            d.durable = kept.clone();
            d.live = kept;
        }
    }

    /// Durable bytes of a file (None if the durable namespace lacks it).
    pub fn durable_bytes(&self, path: &Path) -> Option<Vec<u8>> {
        let st = lock(&self.state);
        match st.durable.get(path) {
            Some(Entry::File(ino)) => st.files.get(ino).map(|d| lock(d).durable.clone()),
            _ => None,
        }
    }

    /// Flips bits in a file's live and durable bytes (media corruption).
    pub fn corrupt(&self, path: &Path, offset: u64, xor: u8) -> Result<()> {
        let st = lock(&self.state);
        let Some(Entry::File(ino)) = st.live.get(path) else {
            return Err(Error::NotFound(path.display().to_string()));
        };
        let mut d = lock(&st.files[ino]);
        let off = offset as usize;
        if off >= d.live.len() {
            return Err(Error::InvalidArgument(format!("offset {offset} beyond end of {}", path.display())));
        }
        d.live[off] ^= xor;
        if off < d.durable.len() {
            d.durable[off] ^= xor;
        }
        Ok(())
    }

    fn check_fault(st: &mut State, op: FaultOp, path: &Path) -> Result<()> {
        match Self::fault_errno(st, op, path) {
            None => Ok(()),
            Some(errno) => Err(os_err(path, errno)),
        }
    }

    /// The errno of the fault that hits this operation, if one does.
    fn fault_errno(st: &mut State, op: FaultOp, path: &Path) -> Option<i32> {
        let shown = path.to_string_lossy();
        let mut hit = None;
        for (i, (f, seen)) in st.faults.iter_mut().enumerate() {
            if f.op != op || f.path_contains.as_deref().is_some_and(|s| !shown.contains(s)) {
                continue;
            }
            if *seen < f.skip {
                *seen += 1;
                continue;
            }
            hit = Some((i, f.errno, f.sticky));
            break;
        }
        let (i, errno, sticky) = hit?;
        if !sticky {
            st.faults.remove(i);
        }
        Some(errno)
    }

    fn ns_op(st: &mut State, op: NsOp, dirs: Vec<PathBuf>) {
        apply_ns(&mut st.live, &op);
        st.pending_ns.push((op, dirs));
    }
}

struct MemFile {
    path: PathBuf,
    generation: u64,
    data: Arc<Mutex<FileData>>,
    state: Arc<Mutex<State>>,
    /// The file's writeback errors this handle has been told of (sampled
    /// at open, like the errseq of a Linux `struct file`).
    wb_errors_seen: Mutex<u64>,
}

impl MemFile {
    /// Checks the handle is from the current incarnation and applies faults.
    fn enter(&self, op: FaultOp) -> Result<()> {
        match self.enter_with(op)? {
            None => Ok(()),
            Some(errno) => Err(os_err(&self.path, errno)),
        }
    }

    /// Like `enter`, but hands back the errno of a fault instead of failing.
    fn enter_with(&self, op: FaultOp) -> Result<Option<i32>> {
        let mut st = lock(&self.state);
        if st.generation != self.generation {
            return Err(Error::io(
                &self.path,
                std::io::Error::other("stale handle: the storage crashed after it was opened"),
            ));
        }
        let fault = MemStorage::fault_errno(&mut st, op, &self.path);
        if op == FaultOp::Sync && fault.is_none() {
            st.syncs += 1;
        }
        Ok(fault)
    }
}

impl StorageFile for MemFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.enter(FaultOp::Read)?;
        let d = lock(&self.data);
        let off = offset as usize;
        if off >= d.live.len() {
            return Ok(0);
        }
        let n = buf.len().min(d.live.len() - off);
        buf[..n].copy_from_slice(&d.live[off..off + n]);
        Ok(n)
    }

    /// Memory never waits for a device: the same read.
    fn read_at_nowait(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.read_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.enter(FaultOp::Write)?;
        let mut d = lock(&self.data);
        apply_write(&mut d.live, offset, buf);
        d.pending.push(FileOp::Write(offset, buf.to_vec()));
        Ok(())
    }

    fn sync_data(&self) -> Result<()> {
        let delay = lock(&self.state).sync_delay;
        std::thread::sleep(delay);
        let fault = self.enter_with(FaultOp::Sync)?;
        let mut d = lock(&self.data);
        if let Some(errno) = fault {
            // Writeback failed: the pages are marked clean, never written.
            d.pending.clear();
            d.wb_errors += 1;
            d.wb_errno = errno;
        }
        let mut seen = lock(&self.wb_errors_seen);
        if *seen != d.wb_errors {
            *seen = d.wb_errors;
            return Err(os_err(&self.path, d.wb_errno));
        }
        let FileData { durable, pending, .. } = &mut *d;
        for op in pending.drain(..) {
            match op {
                FileOp::Write(off, bytes) => apply_write(durable, off, &bytes),
                FileOp::SetLen(len) => durable.resize(len as usize, 0),
            }
        }
        Ok(())
    }

    fn len(&self) -> Result<u64> {
        self.enter(FaultOp::Read)?;
        Ok(lock(&self.data).live.len() as u64)
    }

    fn set_len(&self, len: u64) -> Result<()> {
        self.enter(FaultOp::Write)?;
        let mut d = lock(&self.data);
        d.live.resize(len as usize, 0);
        d.pending.push(FileOp::SetLen(len));
        Ok(())
    }
}

impl Storage for MemStorage {
    fn open(&self, path: &Path, mode: OpenMode) -> Result<Arc<dyn StorageFile>> {
        let mut st = lock(&self.state);
        Self::check_fault(&mut st, FaultOp::Open, path)?;
        let ino = match (st.live.get(path).copied(), mode) {
            (Some(Entry::Dir), _) => return Err(os_err(path, libc::EISDIR)),
            (Some(Entry::File(_)), OpenMode::CreateNew) => return Err(os_err(path, libc::EEXIST)),
            (Some(Entry::File(ino)), _) => ino,
            (None, OpenMode::Existing) => return Err(os_err(path, libc::ENOENT)),
            (None, _) => {
                let parent = parent_of(path);
                if st.live.get(&parent) != Some(&Entry::Dir) {
                    return Err(os_err(path, libc::ENOENT));
                }
                let ino = st.next_ino;
                st.next_ino += 1;
                st.files.insert(ino, Arc::new(Mutex::new(FileData::default())));
                Self::ns_op(&mut st, NsOp::Put(path.to_path_buf(), Entry::File(ino)), vec![parent]);
                ino
            }
        };
        let data = st.files[&ino].clone();
        let wb_errors_seen = Mutex::new(lock(&data).wb_errors);
        let file = MemFile {
            path: path.to_path_buf(),
            generation: st.generation,
            data,
            state: self.state.clone(),
            wb_errors_seen,
        };
        if st.guard_syncs {
            Ok(Arc::new(SyncGuard::new(file)))
        } else {
            Ok(Arc::new(file))
        }
    }

    fn remove_file(&self, path: &Path) -> Result<()> {
        let mut st = lock(&self.state);
        Self::check_fault(&mut st, FaultOp::Namespace, path)?;
        match st.live.get(path) {
            Some(Entry::File(_)) => {
                Self::ns_op(&mut st, NsOp::Remove(path.to_path_buf()), vec![parent_of(path)]);
                Ok(())
            }
            Some(Entry::Dir) => Err(os_err(path, libc::EISDIR)),
            None => Err(os_err(path, libc::ENOENT)),
        }
    }

    fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        let mut st = lock(&self.state);
        Self::check_fault(&mut st, FaultOp::Namespace, from)?;
        let Some(entry @ Entry::File(_)) = st.live.get(from).copied() else {
            return Err(os_err(from, libc::ENOENT));
        };
        if st.live.get(&parent_of(to)) != Some(&Entry::Dir) {
            return Err(os_err(to, libc::ENOENT));
        }
        let dirs = vec![parent_of(from), parent_of(to)];
        Self::ns_op(&mut st, NsOp::Rename(from.to_path_buf(), to.to_path_buf(), entry), dirs);
        Ok(())
    }

    fn hard_link(&self, from: &Path, to: &Path) -> Result<()> {
        let mut st = lock(&self.state);
        Self::check_fault(&mut st, FaultOp::Namespace, to)?;
        let Some(entry @ Entry::File(_)) = st.live.get(from).copied() else {
            return Err(os_err(from, libc::ENOENT));
        };
        if st.live.contains_key(to) {
            return Err(os_err(to, libc::EEXIST));
        }
        if st.live.get(&parent_of(to)) != Some(&Entry::Dir) {
            return Err(os_err(to, libc::ENOENT));
        }
        Self::ns_op(&mut st, NsOp::Put(to.to_path_buf(), entry), vec![parent_of(to)]);
        Ok(())
    }

    fn list_dir(&self, dir: &Path) -> Result<Vec<String>> {
        let st = lock(&self.state);
        if st.live.get(dir) != Some(&Entry::Dir) {
            return Err(os_err(dir, libc::ENOENT));
        }
        let mut names: Vec<String> = st
            .live
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(String::from))
            .collect();
        names.sort();
        Ok(names)
    }

    fn create_dir_all(&self, dir: &Path) -> Result<()> {
        let mut st = lock(&self.state);
        Self::check_fault(&mut st, FaultOp::Namespace, dir)?;
        let mut to_make = Vec::new();
        let mut cur = Some(dir);
        while let Some(p) = cur {
            match st.live.get(p) {
                Some(Entry::Dir) => break,
                Some(Entry::File(_)) => return Err(os_err(p, libc::ENOTDIR)),
                None => to_make.push(p.to_path_buf()),
            }
            cur = p.parent();
        }
        for p in to_make.into_iter().rev() {
            let parent = parent_of(&p);
            Self::ns_op(&mut st, NsOp::Put(p, Entry::Dir), vec![parent]);
        }
        Ok(())
    }

    fn remove_dir_all(&self, dir: &Path) -> Result<()> {
        let mut st = lock(&self.state);
        Self::check_fault(&mut st, FaultOp::Namespace, dir)?;
        if st.live.get(dir) != Some(&Entry::Dir) {
            return Err(os_err(dir, libc::ENOENT));
        }
        let doomed: Vec<PathBuf> = st.live.keys().filter(|p| p.starts_with(dir)).cloned().collect();
        for p in doomed.into_iter().rev() {
            let parent = parent_of(&p);
            Self::ns_op(&mut st, NsOp::Remove(p), vec![parent]);
        }
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> Result<()> {
        let mut st = lock(&self.state);
        Self::check_fault(&mut st, FaultOp::Namespace, dir)?;
        st.syncs += 1;
        let pending = std::mem::take(&mut st.pending_ns);
        let mut rest = Vec::new();
        for (op, dirs) in pending {
            if dirs.iter().any(|d| d == dir) {
                apply_ns(&mut st.durable, &op);
            } else {
                rest.push((op, dirs));
            }
        }
        st.pending_ns = rest;
        Ok(())
    }

    fn exists(&self, path: &Path) -> bool {
        lock(&self.state).live.contains_key(path)
    }

    fn lock_exclusive(&self, path: &Path) -> Result<StorageLock> {
        drop(self.open(path, OpenMode::Create)?);
        let mut st = lock(&self.state);
        if !st.locks.insert(path.to_path_buf()) {
            return Err(Error::Unavailable(path.display().to_string(), "locked by another holder".into()));
        }
        let guard =
            MemLock { path: path.to_path_buf(), generation: st.generation, state: self.state.clone() };
        Ok(StorageLock::new(Box::new(guard)))
    }
    fn space(&self, _dir: &Path) -> Result<Option<super::FsSpace>> {
        Ok(lock(&self.state).space)
    }
}

/// Releases a `MemStorage` lock on drop, unless a crash already did.
struct MemLock {
    path: PathBuf,
    generation: u64,
    state: Arc<Mutex<State>>,
}

impl Drop for MemLock {
    fn drop(&mut self) {
        let mut st = lock(&self.state);
        if st.generation == self.generation {
            st.locks.remove(&self.path);
        }
    }
}

/// Counts a simulated crash for `docs/reliability.md`: with
/// `CASBLK_CRASH_TALLY_DIR` set, each crash appends one byte to a file
/// named after the test binary there (so concurrent tests and binaries
/// need no coordination; the count is the file's size). Unset: nothing.
fn tally_crash() {
    use std::io::Write;
    let Some(dir) = std::env::var_os("CASBLK_CRASH_TALLY_DIR") else { return };
    let exe = std::env::current_exe().ok();
    let name = exe.as_deref().and_then(Path::file_stem).map_or("unknown".into(), |n| n.to_string_lossy());
    // Test binaries are named NAME-HASH; the hash says nothing to a reader.
    let name = name.rsplit_once('-').map_or(&*name, |(n, _)| n).to_string();
    let path = Path::new(&dir).join(name);
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = f.write_all(b".");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (MemStorage, PathBuf) {
        let s = MemStorage::new();
        let dir = PathBuf::from("/s");
        s.create_dir_all(&dir).unwrap();
        s.sync_dir(Path::new("/")).unwrap();
        (s, dir)
    }

    #[test]
    fn unsynced_data_is_lost_and_synced_data_kept() {
        let (s, dir) = setup();
        let p = dir.join("f");
        let f = s.open(&p, OpenMode::CreateNew).unwrap();
        s.sync_dir(&dir).unwrap();
        f.write_all_at(b"durable", 0).unwrap();
        f.sync_data().unwrap();
        f.write_all_at(b"LOST", 0).unwrap();
        s.crash(CrashMode::LoseUnsynced);
        assert!(f.write_all_at(b"x", 0).is_err(), "stale handle must fail");
        let f = s.open(&p, OpenMode::Existing).unwrap();
        let mut buf = [0u8; 7];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"durable");
    }

    #[test]
    fn unsynced_create_is_lost() {
        let (s, dir) = setup();
        let p = dir.join("f");
        let f = s.open(&p, OpenMode::CreateNew).unwrap();
        f.write_all_at(b"x", 0).unwrap();
        f.sync_data().unwrap();
        s.crash(CrashMode::LoseUnsynced);
        assert!(!s.exists(&p));
    }

    #[test]
    fn a_link_survives_after_dir_sync_and_keeps_the_content_when_the_first_name_goes() {
        let (s, dir) = setup();
        let (a, b) = (dir.join("a"), dir.join("b"));
        let f = s.open(&a, OpenMode::CreateNew).unwrap();
        f.write_all_at(b"shared", 0).unwrap();
        f.sync_data().unwrap();
        s.sync_dir(&dir).unwrap();
        s.hard_link(&a, &b).unwrap();
        s.crash(CrashMode::LoseUnsynced);
        assert!(s.exists(&a) && !s.exists(&b), "an unsynced link is lost");
        s.hard_link(&a, &b).unwrap();
        s.sync_dir(&dir).unwrap();
        s.remove_file(&a).unwrap();
        s.sync_dir(&dir).unwrap();
        s.crash(CrashMode::LoseUnsynced);
        assert!(!s.exists(&a));
        assert_eq!(s.durable_bytes(&b).unwrap(), b"shared");
    }

    #[test]
    fn rename_survives_only_after_dir_sync() {
        let (s, dir) = setup();
        let (a, b) = (dir.join("a"), dir.join("b"));
        s.open(&a, OpenMode::CreateNew).unwrap().sync_data().unwrap();
        s.sync_dir(&dir).unwrap();
        s.rename(&a, &b).unwrap();
        s.crash(CrashMode::LoseUnsynced);
        assert!(s.exists(&a) && !s.exists(&b));
        s.rename(&a, &b).unwrap();
        s.sync_dir(&dir).unwrap();
        s.crash(CrashMode::LoseUnsynced);
        assert!(!s.exists(&a) && s.exists(&b));
    }

    #[test]
    fn torn_crash_keeps_sector_granular_pieces() {
        // Over many seeds, a torn crash keeps whole, none, or sectors of
        // the unsynced write, and never anything else.
        let mut saw_partial = false;
        for seed in 0..64 {
            let (s, dir) = setup();
            let p = dir.join("f");
            let f = s.open(&p, OpenMode::CreateNew).unwrap();
            s.sync_dir(&dir).unwrap();
            f.write_all_at(&[1u8; 4096], 0).unwrap();
            f.sync_data().unwrap();
            f.write_all_at(&[2u8; 4096], 0).unwrap();
            s.crash(CrashMode::Torn { seed });
            let f = s.open(&p, OpenMode::Existing).unwrap();
            let mut buf = vec![0u8; 4096];
            f.read_exact_at(&mut buf, 0).unwrap();
            let twos = buf.chunks(SECTOR).filter(|c| c.iter().all(|&b| b == 2)).count();
            let ones = buf.chunks(SECTOR).filter(|c| c.iter().all(|&b| b == 1)).count();
            assert_eq!(ones + twos, 8, "seed {seed}: sectors must be all-old or all-new");
            saw_partial |= twos > 0 && ones > 0;
        }
        assert!(saw_partial, "some seed should tear the write");
    }

    #[test]
    fn faults_fire_once_or_sticky() {
        let (s, dir) = setup();
        let f = s.open(&dir.join("f"), OpenMode::CreateNew).unwrap();
        s.inject(Fault {
            op: FaultOp::Write,
            path_contains: None,
            skip: 1,
            errno: libc::ENOSPC,
            sticky: false,
        });
        f.write_all_at(b"a", 0).unwrap();
        let e = f.write_all_at(b"b", 0).unwrap_err();
        assert!(e.is_no_space());
        f.write_all_at(b"c", 0).unwrap();
        s.inject(Fault {
            op: FaultOp::Sync,
            path_contains: Some("f".into()),
            skip: 0,
            errno: libc::EIO,
            sticky: true,
        });
        assert!(f.sync_data().is_err());
        assert!(f.sync_data().is_err());
        s.clear_faults();
        assert!(f.sync_data().is_err(), "a handle whose sync failed never syncs again");
        s.open(&dir.join("f"), OpenMode::Existing).unwrap().sync_data().unwrap();
    }

    /// The kernel's side, with the guard off: the writes a failed writeback
    /// dropped stay readable, the error is told once per handle, and the
    /// next sync of that handle "succeeds" without making them durable.
    #[test]
    fn a_writeback_error_is_told_once_per_handle_and_loses_the_writes() {
        let (s, dir) = setup();
        s.without_sync_guard();
        let p = dir.join("f");
        let f = s.open(&p, OpenMode::CreateNew).unwrap();
        let other = s.open(&p, OpenMode::Existing).unwrap();
        s.sync_dir(&dir).unwrap();
        f.write_all_at(b"kept", 0).unwrap();
        f.sync_data().unwrap();
        f.write_all_at(b"lost", 4).unwrap();
        s.inject(Fault { op: FaultOp::Sync, path_contains: None, skip: 0, errno: libc::EIO, sticky: false });
        assert_eq!(f.sync_data().unwrap_err().errno(), -libc::EIO);
        let mut buf = [0u8; 8];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"keptlost", "reads still see the dropped writes");
        f.sync_data().expect("the error was told once: this sync returns 0");
        assert!(other.sync_data().is_err(), "each open handle is told once");
        f.write_all_at(b"late", 8).unwrap();
        f.sync_data().unwrap();
        s.crash(CrashMode::LoseUnsynced);
        let f = s.open(&p, OpenMode::Existing).unwrap();
        let mut buf = [0u8; 12];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert_eq!(&buf, b"kept\0\0\0\0late", "the dropped writes never became durable");
    }

    /// The guard's side: both syncs after the failure fail, on every thread.
    #[test]
    fn a_guarded_handle_fails_every_sync_after_the_first_failure() {
        let (s, dir) = setup();
        let f = s.open(&dir.join("f"), OpenMode::CreateNew).unwrap();
        f.write_all_at(b"lost", 0).unwrap();
        s.inject(Fault { op: FaultOp::Sync, path_contains: None, skip: 0, errno: libc::EIO, sticky: false });
        let results: Vec<bool> = std::thread::scope(|scope| {
            let syncs: Vec<_> = (0..4).map(|_| scope.spawn(|| f.sync_data().is_ok())).collect();
            syncs.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert_eq!(results, [false; 4], "one fault, four syncs of the handle: all fail");
        let e = f.sync_data().unwrap_err();
        assert_eq!(e.errno(), -libc::EIO);
        assert!(e.to_string().contains("earlier sync"), "{e}");
    }
}
