//! One image's manifest: a copy-on-write page tree mapping block numbers
//! (4 KiB blocks, u64) to chunk refs (a chunk's tag and where it was
//! stored), `None` meaning a hole.
//!
//! It owns one file (the path the image gives it), laid out as two root
//! slots followed by tree pages (root.rs, page.rs):
//!
//! ```text
//! +---------+---------+-----------------------------------------------+
//! | slot 0  | slot 1  | tree pages, appended by commits (COW)          |
//! +---------+---------+-----------------------------------------------+
//!  page 0    page 1    page 2 ...                       file_pages ^
//!
//!              root (slot g % 2): height, covered, root ptr
//!                  |
//!            [interior L1] --(page, crc)--> [leaf: 126 refs]
//!                  \------------------------> [leaf] ...
//! ```
//!
//! Reads: [`Manifest::lookup`] walks the current snapshot through a bounded
//! cache of decoded pages. Many threads may look up while a commit runs:
//! a commit only appends pages past the snapshot's `file_pages`, and the
//! new snapshot is installed after its root is durable, so readers see the
//! old tree or the new one, never a mix.
//!
//! Writes: [`Manifest::begin`] returns a [`ManifestEdit`] that records
//! edits per leaf, in memory, without I/O; `commit` applies them to the
//! current tree (edit.rs) and follows the protocol:
//! 1. write every reachable new page (each dirty leaf once, each dirty
//!    interior page once; pages superseded within the batch are never
//!    written) past `file_pages`, in writes of up to 4 MiB;
//! 2. sync the file;
//! 3. write the root record (with `covered`) into slot `g % 2`, sync;
//! 4. install the new snapshot.
//!
//! The first commit builds a new file and renames it into place instead.
//!
//! Space: pages a commit replaces become garbage below `file_pages`.
//! [`Manifest::compact_if_needed`] rewrites the live tree into a new file
//! when garbage exceeds a fraction of the live pages (file.rs, rewrite.rs).
//! Until then, exactly `file_pages - 2 - live_pages` garbage pages remain.
//!
//! A failed sync (or a failed step after the old root stopped being the
//! only possible one) poisons the manifest: commits fail with
//! `Error::Unavailable` until it is reopened. Lookups continue.

pub mod base;
mod check;
mod edit;
mod export;
mod file;
mod iter;
mod page;
mod page_cache;
mod rewrite;
mod root;
mod view;

pub use crate::chunk::{ChunkHash, ChunkLoc, ChunkRef, ChunkTag};
pub use check::TreeCounts;
pub use edit::{CommitStats, ManifestEdit};
pub use export::{build_from_pages, Committed};
pub use iter::ManifestIter;
pub use page::{
    fuzz_decode_page, fuzz_encode_page, Body, ChildRef, InteriorBody, LeafBody, Page, FANOUT, LEAF_ENTRIES,
    PAGE_BYTES,
};
pub use page_cache::PageCache;
pub use rewrite::RewriteStats;
pub use root::{fuzz_decode_root, RootRecord, FIRST_TREE_PAGE};
pub use view::CompactedView;

use crate::error::{Error, Result};
use crate::io::Wait;
use crate::storage::{OpenMode, Storage, StorageFile};
use page::Expect;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// Bytes of one block, the unit a manifest maps.
pub use crate::units::BLOCK_BYTES;

/// Tunables of a manifest.
#[derive(Clone, Debug)]
pub struct ManifestOptions {
    /// The decoded pages lookups go through: a store passes the one all
    /// its images share (`StoreOptions::manifest_cache_bytes`); the default
    /// is a private cache of 8 MiB.
    pub page_cache: Arc<PageCache>,
    /// `compact_if_needed` rewrites the file when garbage pages exceed this
    /// fraction of live pages (default 1.0) ...
    pub rewrite_garbage_fraction: f64,
    /// ... and this many pages (default 256, 1 MiB).
    pub rewrite_min_garbage_pages: u64,
}

impl Default for ManifestOptions {
    fn default() -> Self {
        ManifestOptions {
            page_cache: PageCache::new(8 << 20),
            rewrite_garbage_fraction: 1.0,
            rewrite_min_garbage_pages: 256,
        }
    }
}

/// Counters of a manifest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ManifestStats {
    pub generation: u64,
    pub covered: u64,
    pub height: u8,
    pub mapped_blocks: u64,
    pub live_pages: u64,
    pub garbage_pages: u64,
    pub file_pages: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
}

/// A committed tree: what readers use.
pub(crate) struct Snapshot {
    /// None until the first commit creates the file.
    pub file: Option<Arc<dyn StorageFile>>,
    /// Distinguishes files across rewrites in the page cache.
    pub file_id: u64,
    pub root: RootRecord,
    /// The file is a frozen base (base.rs), shared with other images:
    /// never written; the first commit rewrites the tree into an own file.
    pub shared: bool,
    /// The root page, kept once a read loaded it: every lookup starts
    /// there, and the page cache's lock and hash cost more than the rest
    /// of a compacted read's walk (one page per image beyond the cache's
    /// budget, while this snapshot is current).
    root_page: OnceLock<Arc<Page>>,
}

impl Snapshot {
    pub fn new(file: Option<Arc<dyn StorageFile>>, file_id: u64, root: RootRecord, shared: bool) -> Snapshot {
        Snapshot { file, file_id, root, shared, root_page: OnceLock::new() }
    }

    /// Reads and checks the page `ptr` names (no cache), waiting for the
    /// device as `wait` allows.
    pub fn read_page(&self, ptr: ChildRef, level: u8, first_block: u64, wait: Wait) -> Result<Page> {
        let file = self.file.as_ref().expect("a snapshot with pages has a file");
        let offset = ptr.page * PAGE_BYTES as u64;
        let mut buf = vec![0u8; PAGE_BYTES];
        file.read_exact_at_in(&mut buf, offset, wait)?;
        let expect = Expect {
            level,
            first_block,
            crc: ptr.crc,
            file_pages: self.root.file_pages,
            max_generation: self.root.generation,
        };
        page::decode(&buf, Some(expect), file.path(), offset)
    }
}

pub(crate) struct CommitState {
    pub poisoned: Option<String>,
}

/// An image's manifest. `Send + Sync`; lookups from any thread.
pub struct Manifest {
    pub(crate) storage: Arc<dyn Storage>,
    pub(crate) path: PathBuf,
    pub(crate) opts: ManifestOptions,
    current: RwLock<Arc<Snapshot>>,
    pub(crate) commit_state: Mutex<CommitState>,
    /// This manifest's lookups that found their page in the (shared) cache,
    /// and those that read it.
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
}

/// A file shorter than the pages its root spans is damage.
fn check_len(file: &dyn StorageFile, root: &RootRecord, path: &Path) -> Result<()> {
    let len = file.len()?;
    if len < root.file_pages * PAGE_BYTES as u64 {
        return Err(Error::Corruption {
            path: path.to_path_buf(),
            offset: len,
            detail: format!("file ends before the {} pages its root spans", root.file_pages),
        });
    }
    Ok(())
}

pub(crate) use crate::sync::lock;

impl Manifest {
    /// Opens the manifest at `path`; an absent file is the empty manifest
    /// (every block a hole, covered 0), created by the first commit.
    pub fn open(storage: Arc<dyn Storage>, path: &Path, opts: ManifestOptions) -> Result<Manifest> {
        let tmp = file::tmp_path(path);
        if storage.exists(&tmp) {
            // A first commit or rewrite that never reached its rename.
            storage.remove_file(&tmp)?;
        }
        let snapshot = if storage.exists(path) {
            let file = storage.open(path, OpenMode::Existing)?;
            let mut slots = vec![0u8; 2 * PAGE_BYTES];
            let n = file.read_at(&mut slots, 0)?;
            slots.truncate(n);
            let (s0, s1) = slots.split_at(n.min(PAGE_BYTES));
            let root = root::choose(s0, s1, path)?;
            check_len(file.as_ref(), &root, path)?;
            // A rollback or an unsharing rewrite that stopped after its
            // switch; removed only once the own file proved readable.
            base::remove_leftovers(storage.as_ref(), path, None)?;
            Snapshot::new(Some(file), opts.page_cache.new_file_id(), root, false)
        } else if let Some(b) = base::read(storage.as_ref(), path)? {
            base::remove_leftovers(storage.as_ref(), path, Some(&b.link))?;
            let file = storage.open(&b.link, OpenMode::Existing)?;
            check_len(file.as_ref(), &b.root, &b.link)?;
            Snapshot::new(Some(file), opts.page_cache.new_file_id(), b.root, true)
        } else {
            base::remove_leftovers(storage.as_ref(), path, None)?;
            Snapshot::new(None, opts.page_cache.new_file_id(), RootRecord::empty(), false)
        };
        let m = Manifest {
            storage,
            path: path.to_path_buf(),
            opts,
            current: RwLock::new(Arc::new(snapshot)),
            commit_state: Mutex::new(CommitState { poisoned: None }),
            cache_hits: AtomicU64::new(0),
            cache_misses: AtomicU64::new(0),
        };
        // Check the root page now, so a damaged manifest fails at open.
        let snap = m.snapshot();
        if snap.root.height > 0 {
            m.load(&snap, snap.root.root, snap.root.height - 1, 0, Wait::Block)?;
        }
        Ok(m)
    }

    pub(crate) fn snapshot(&self) -> Arc<Snapshot> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn install(&self, snap: Snapshot) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(snap);
    }

    pub(crate) fn new_file_id(&self) -> u64 {
        self.opts.page_cache.new_file_id()
    }

    /// A page through the cache; a miss reads as `wait` allows.
    pub(crate) fn load(
        &self,
        snap: &Snapshot,
        ptr: ChildRef,
        level: u8,
        first_block: u64,
        wait: Wait,
    ) -> Result<Arc<Page>> {
        let cache = &self.opts.page_cache;
        if let Some(p) = cache.get(snap.file_id, ptr.page) {
            self.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(p);
        }
        self.cache_misses.fetch_add(1, Ordering::Relaxed);
        let p = Arc::new(snap.read_page(ptr, level, first_block, wait)?);
        cache.insert(snap.file_id, ptr.page, p.clone());
        Ok(p)
    }

    /// The leaf holding `block` in `snap`, with the leaf's first block.
    fn leaf_for(&self, snap: &Snapshot, block: u64, wait: Wait) -> Result<Option<Arc<Page>>> {
        let root = &snap.root;
        if root.height == 0 || u128::from(block) >= page::span_blocks(root.height - 1) {
            return Ok(None);
        }
        let (mut level, mut first) = (root.height - 1, 0u64);
        let root_page = match snap.root_page.get() {
            Some(p) => p,
            None => {
                let p = self.load(snap, root.root, level, first, wait)?;
                snap.root_page.get_or_init(|| p)
            }
        };
        // The page below, once the walk leaves the root.
        let mut below: Arc<Page>;
        let mut p = root_page;
        loop {
            let Body::Interior(node) = &p.body else { return Ok(Some(p.clone())) };
            let span = page::span_blocks(level - 1) as u64;
            let i = ((block - first) / span) as usize;
            let child = node.children[i];
            if child.is_none() {
                return Ok(None);
            }
            level -= 1;
            first += i as u64 * span;
            below = self.load(snap, child, level, first, wait)?;
            p = &below;
        }
    }

    /// The chunk mapped at `block` (None: a hole).
    pub fn lookup(&self, block: u64) -> Result<Option<ChunkRef>> {
        self.lookup_in(block, Wait::Block)
    }

    /// [`Manifest::lookup`], reading pages as `wait` allows.
    pub fn lookup_in(&self, block: u64, wait: Wait) -> Result<Option<ChunkRef>> {
        let snap = self.snapshot();
        Ok(match self.leaf_for(&snap, block, wait)? {
            Some(p) => match &p.body {
                Body::Leaf(l) => l.get((block - p.first_block) as usize),
                Body::Interior(_) => unreachable!("leaf_for returns leaves"),
            },
            None => None,
        })
    }

    /// Looks up `out.len()` consecutive blocks from `first_block`, one tree
    /// walk per leaf, all from one snapshot.
    pub fn lookup_range(&self, first_block: u64, out: &mut [Option<ChunkRef>]) -> Result<()> {
        self.lookup_range_in(first_block, out, Wait::Block)
    }

    /// [`Manifest::lookup_range`], reading pages as `wait` allows.
    pub fn lookup_range_in(&self, first_block: u64, out: &mut [Option<ChunkRef>], wait: Wait) -> Result<()> {
        if first_block.checked_add((out.len() as u64).saturating_sub(1)).is_none() {
            return Err(Error::InvalidArgument("block range overflows u64".into()));
        }
        let snap = self.snapshot();
        let mut i = 0;
        while i < out.len() {
            let block = first_block + i as u64;
            let in_leaf = LEAF_ENTRIES - (block % LEAF_ENTRIES as u64) as usize;
            let n = in_leaf.min(out.len() - i);
            match self.leaf_for(&snap, block, wait)? {
                Some(p) => {
                    let Body::Leaf(l) = &p.body else { unreachable!("leaf_for returns leaves") };
                    let base = (block - p.first_block) as usize;
                    for (j, o) in out[i..i + n].iter_mut().enumerate() {
                        *o = l.get(base + j);
                    }
                }
                None => out[i..i + n].fill(None),
            }
            i += n;
        }
        Ok(())
    }

    /// Starts a batch of edits on top of whatever is committed when the
    /// batch commits.
    pub fn begin(&self) -> ManifestEdit<'_> {
        ManifestEdit::new(self)
    }

    /// The log position the committed manifest covers.
    pub fn covered(&self) -> u64 {
        self.snapshot().root.covered
    }

    pub fn generation(&self) -> u64 {
        self.snapshot().root.generation
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn stats(&self) -> ManifestStats {
        let r = self.snapshot().root;
        ManifestStats {
            generation: r.generation,
            covered: r.covered,
            height: r.height,
            mapped_blocks: r.mapped_blocks,
            live_pages: r.live_pages,
            garbage_pages: r.garbage_pages(),
            file_pages: r.file_pages,
            cache_hits: self.cache_hits.load(Ordering::Relaxed),
            cache_misses: self.cache_misses.load(Ordering::Relaxed),
        }
    }

    /// Every mapped `(block, ref)` of the committed tree at this moment,
    /// in block order (reads pages without filling the cache).
    pub fn iter(&self) -> ManifestIter {
        ManifestIter::new(self.snapshot())
    }

    /// True while the tree is a frozen base shared with other images.
    pub fn is_shared(&self) -> bool {
        self.snapshot().shared
    }

    /// Makes the committed tree of this moment the manifest of
    /// `target` (the manifest path of another, closed image) with
    /// `covered`, without copying it: the file is linked beside `target`
    /// as its base (base.rs). Durable when it returns. Holds the commit
    /// lock throughout, so no commit or rewrite moves the file meanwhile.
    pub fn freeze_into(&self, target: &Path, covered: u64) -> Result<RootRecord> {
        let state = lock(&self.commit_state);
        Manifest::check_poison(&state, &self.path)?;
        let snap = self.snapshot();
        let s = self.storage.as_ref();
        let Some(from) = &snap.file else {
            // Nothing committed: the target gets an own, empty tree.
            let root = RootRecord { generation: 1, covered, ..RootRecord::empty() };
            let (tmp_file, tmp) = file::create_tmp(s, target)?;
            file::commit_new_file(s, tmp_file.as_ref(), &tmp, target, &root).map_err(|f| f.error)?;
            base::remove_leftovers(s, target, None)?;
            return Ok(root);
        };
        let id = base::new_link_id();
        let link = base::link_path(target, id);
        s.hard_link(from.path(), &link)?;
        let root = RootRecord { covered, ..snap.root };
        base::write(s, target, id, &root)?;
        drop(state);
        if s.exists(target) {
            s.remove_file(target)?;
        }
        base::remove_leftovers(s, target, Some(&link))?;
        s.sync_dir(target.parent().unwrap_or(Path::new("/")))?;
        Ok(root)
    }

    pub(crate) fn check_poison(state: &CommitState, path: &Path) -> Result<()> {
        match &state.poisoned {
            Some(reason) => Err(Error::Unavailable(
                format!("manifest {}", path.display()),
                format!("an earlier commit failed uncertainly ({reason}); reopen it"),
            )),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
