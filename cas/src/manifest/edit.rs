//! Edit batches and the commit that turns them into new pages.
//!
//! A [`ManifestEdit`] records `(entry, ref)` pairs per leaf, in the order
//! given, growing as edits arrive; no page is read until commit. `commit`
//! walks the current tree top-down once, along the paths to dirty leaves
//! only: each old page on those paths is read once, each dirty leaf gets
//! its final content, and each page is written once, children before
//! parents (post-order), so page numbers are consecutive and all new
//! pages go out in a few large writes. A leaf whose content does not
//! change keeps its old page; a node whose children did not change keeps
//! its old page; a node left with no entries disappears (a hole subtree).
//!
//! The tree grows in height when an edit lands beyond what the root
//! covers: new interior pages are stacked above the old root, which
//! becomes child 0 (`Old::AboveRoot` marks those levels).

use super::file::{self, Failure, PageSink};
use super::page::{self, Body, ChildRef, InteriorBody, LeafBody, Page, FANOUT, LEAF_ENTRIES, PAGE_BYTES};
use super::root::{RootRecord, FIRST_TREE_PAGE};
use super::{lock, ChunkRef, Manifest, Snapshot};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

/// Hashes a leaf index (Fibonacci multiplicative hashing).
#[derive(Default)]
struct LeafHasher(u64);

impl Hasher for LeafHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type Edits = Vec<(u8, Option<ChunkRef>)>;
const EDIT_BYTES: u64 = std::mem::size_of::<(u8, Option<ChunkRef>)>() as u64;

fn assert_located_right(r: &Option<ChunkRef>) {
    let pack_0 = r.and_then(|r| r.at).is_some_and(|at| at.pack == 0);
    assert!(!pack_0, "a chunk location in pack 0: {r:?}");
}

/// What a commit did: the work counters behind the compaction benchmark.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Generation of the root this commit wrote.
    pub generation: u64,
    /// `set` calls in the batch (blocks edited, repeats included).
    pub blocks_set: u64,
    /// Distinct leaves the batch edited.
    pub leaf_pages_touched: u64,
    /// Tree pages written (leaves and interior; only reachable ones).
    pub pages_written: u64,
    pub leaf_pages_written: u64,
    /// Bytes written: pages plus the root slot.
    pub bytes_written: u64,
    /// Bytes of buffers filled to prepare the commit: edit records, copies
    /// of old page bodies, encoded pages, the root slot.
    pub bytes_initialized: u64,
    /// fdatasync and directory syncs issued.
    pub syncs: u64,
    /// After the commit: pages the tree reaches, and garbage pages.
    pub live_pages: u64,
    pub garbage_pages: u64,
    /// Blocks that mapped a chunk before the commit and now map none or
    /// another one: each may have left a chunk unreferenced (what
    /// automatic GC counts, cas::gc::auto).
    pub refs_dropped: u64,
}

/// A batch of edits (see the module docs). Dropping it discards the edits.
pub struct ManifestEdit<'m> {
    manifest: &'m Manifest,
    slots: HashMap<u64, usize, BuildHasherDefault<LeafHasher>>,
    leaves: Vec<(u64, Edits)>,
    last: Option<(u64, usize)>,
    sets: u64,
}

impl<'m> ManifestEdit<'m> {
    pub(crate) fn new(manifest: &'m Manifest) -> ManifestEdit<'m> {
        ManifestEdit { manifest, slots: HashMap::default(), leaves: Vec::new(), last: None, sets: 0 }
    }

    fn leaf_edits(&mut self, leaf: u64) -> &mut Edits {
        let i = match self.last {
            Some((l, i)) if l == leaf => i,
            _ => {
                let next = self.leaves.len();
                let i = *self.slots.entry(leaf).or_insert(next);
                if i == next {
                    self.leaves.push((leaf, Vec::new()));
                }
                self.last = Some((leaf, i));
                i
            }
        };
        &mut self.leaves[i].1
    }

    /// Maps `block` to `r` (None: make it a hole). Later sets of the
    /// same block in the batch win.
    ///
    /// Panics on a location in pack 0 (no pack has id 0; locations come
    /// from the chunk store).
    pub fn set(&mut self, block: u64, r: Option<ChunkRef>) {
        assert_located_right(&r);
        let leaf = block / LEAF_ENTRIES as u64;
        let entry = (block % LEAF_ENTRIES as u64) as u8;
        self.leaf_edits(leaf).push((entry, r));
        self.sets += 1;
    }

    /// Sets `refs.len()` consecutive blocks from `first_block`, one leaf
    /// lookup per leaf.
    pub fn set_range(&mut self, first_block: u64, refs: &[Option<ChunkRef>]) -> Result<()> {
        if first_block.checked_add((refs.len() as u64).saturating_sub(1)).is_none() {
            return Err(Error::InvalidArgument("block range overflows u64".into()));
        }
        refs.iter().for_each(assert_located_right);
        let mut i = 0;
        while i < refs.len() {
            let block = first_block + i as u64;
            let entry = (block % LEAF_ENTRIES as u64) as usize;
            let n = (LEAF_ENTRIES - entry).min(refs.len() - i);
            let edits = self.leaf_edits(block / LEAF_ENTRIES as u64);
            edits.extend(refs[i..i + n].iter().enumerate().map(|(j, h)| ((entry + j) as u8, *h)));
            i += n;
        }
        self.sets += refs.len() as u64;
        Ok(())
    }

    /// Appends `later`'s edits after this batch's, as if they had been
    /// made here: for a block set in both, `later`'s set wins. Lets a
    /// caller that fell behind commit several batches at once.
    ///
    /// Panics if the two batches edit different manifests.
    pub fn append(&mut self, later: ManifestEdit<'m>) {
        assert!(std::ptr::eq(self.manifest, later.manifest), "edits of two manifests");
        for (leaf, edits) in later.leaves {
            self.leaf_edits(leaf).extend(edits);
        }
        self.sets += later.sets;
    }

    /// Edits recorded so far.
    pub fn len(&self) -> u64 {
        self.sets
    }

    pub fn is_empty(&self) -> bool {
        self.sets == 0
    }

    /// Distinct leaves edited so far.
    pub fn leaves_touched(&self) -> usize {
        self.leaves.len()
    }

    /// Estimated heap bytes the batch holds (for the caller's budget).
    pub fn memory_bytes(&self) -> u64 {
        let edits: u64 = self.leaves.iter().map(|(_, e)| e.capacity() as u64 * EDIT_BYTES).sum();
        edits + self.leaves.capacity() as u64 * 32 + self.slots.capacity() as u64 * 17
    }

    /// Applies the batch to the committed tree and makes it durable (see
    /// the protocol in the module docs of `manifest`), recording `covered`
    /// (an opaque log position, never below the current one) in the root.
    /// On success readers see the new tree.
    pub fn commit(self, covered: u64) -> Result<CommitStats> {
        let m = self.manifest;
        let mut state = lock(&m.commit_state);
        Manifest::check_poison(&state, &m.path)?;
        if m.snapshot().shared {
            // A frozen base is never appended to: the tree moves to an own file first.
            m.rewrite_locked(&mut state)?;
        }
        let snap = m.snapshot();
        let old = snap.root;
        if covered < old.covered {
            return Err(Error::InvalidArgument(format!(
                "commit covers log position {covered}, below the committed {}",
                old.covered
            )));
        }
        let mut stats = CommitStats {
            blocks_set: self.sets,
            bytes_initialized: self.sets * EDIT_BYTES,
            leaf_pages_touched: self.leaves.len() as u64,
            ..CommitStats::default()
        };
        if self.leaves.is_empty() && covered == old.covered && old.generation > 0 {
            stats.generation = old.generation;
            stats.live_pages = old.live_pages;
            stats.garbage_pages = old.garbage_pages();
            return Ok(stats);
        }
        let mut leaves = self.leaves;
        leaves.sort_unstable_by_key(|(leaf, _)| *leaf);

        let fresh = snap.file.is_none();
        let (file, tmp) = match &snap.file {
            Some(f) => (f.clone(), None),
            None => {
                let (f, tmp) = file::create_tmp(m.storage.as_ref(), &m.path)?;
                (f, Some(tmp))
            }
        };
        let generation = old.generation + 1;
        let mut b = Builder {
            m,
            snap: &snap,
            sink: PageSink::new(file.clone(), old.file_pages),
            generation,
            keep: Vec::new(),
            keep_max: m.opts.page_cache.capacity_pages() / KEEP_LEAVES_CACHE_FRACTION,
            stats: &mut stats,
            live_delta: 0,
            mapped_delta: 0,
        };
        let built = (|| {
            let Some(&(max_leaf, _)) = leaves.last() else { return Ok((old.root, old.height)) };
            let height = old.height.max(height_for_leaf(max_leaf));
            let top = if old.height == 0 {
                Old::Null
            } else if height > old.height {
                Old::AboveRoot
            } else {
                Old::Page(old.root)
            };
            let (root, _) = b.node(height - 1, 0, top, &leaves)?;
            b.sink.flush()?;
            Ok((root, if root.is_none() { 0 } else { height }))
        })();
        let (root_ptr, height) = match built {
            Ok(r) => r,
            Err(e) => {
                if let Some(tmp) = &tmp {
                    let _ = m.storage.remove_file(tmp);
                }
                return Err(e);
            }
        };
        let (live_delta, mapped_delta, keep) = (b.live_delta, b.mapped_delta, std::mem::take(&mut b.keep));
        let file_pages = b.sink.next_page;
        let root = RootRecord {
            generation,
            covered,
            height,
            root: root_ptr,
            file_pages,
            live_pages: old.live_pages.checked_add_signed(live_delta).expect("live page count underflow"),
            mapped_blocks: old
                .mapped_blocks
                .checked_add_signed(mapped_delta)
                .expect("mapped count underflow"),
        };
        stats.bytes_written = stats.pages_written * PAGE_BYTES as u64 + PAGE_BYTES as u64;
        stats.bytes_initialized += PAGE_BYTES as u64;
        let committed = if fresh {
            let tmp = tmp.expect("fresh file has a tmp path");
            file::commit_new_file(m.storage.as_ref(), file.as_ref(), &tmp, &m.path, &root)
                .map(|(f, syncs)| (Some(f), syncs))
                .inspect_err(|_| {
                    let _ = m.storage.remove_file(&tmp);
                })
        } else {
            commit_in_place(file.as_ref(), &root, stats.pages_written > 0)
        };
        let (file, syncs) = match committed {
            Ok((f, syncs)) => (f.unwrap_or(file), syncs),
            Err(Failure { error, uncertain }) => {
                if uncertain {
                    state.poisoned = Some(error.to_string());
                }
                return Err(error);
            }
        };
        stats.syncs = syncs;
        stats.generation = generation;
        stats.live_pages = root.live_pages;
        stats.garbage_pages = root.garbage_pages();
        let file_id = if fresh { m.new_file_id() } else { snap.file_id };
        for (page_no, p) in keep {
            m.opts.page_cache.insert(file_id, page_no, p);
        }
        m.install(Snapshot::new(Some(file), file_id, root, false));
        Ok(stats)
    }
}

/// Steps 2 and 3 of the commit on an existing file. Every failure is
/// uncertain: after a failed sync, the page cache may no longer hold what
/// the disk lacks.
fn commit_in_place(
    file: &dyn crate::storage::StorageFile,
    root: &RootRecord,
    pages_written: bool,
) -> std::result::Result<(Option<Arc<dyn crate::storage::StorageFile>>, u64), Failure> {
    let u = Failure::uncertain;
    let mut syncs = 0;
    if pages_written {
        file.sync_data().map_err(u)?;
        syncs += 1;
    }
    file.write_all_at(&root.encode(), root.slot() * PAGE_BYTES as u64).map_err(u)?;
    file.sync_data().map_err(u)?;
    Ok((None, syncs + 1))
}

/// The smallest height whose root covers leaf `leaf`.
fn height_for_leaf(leaf: u64) -> u8 {
    let mut h = 1;
    while leaf >= page::span_leaves(h - 1) {
        h += 1;
    }
    h
}

/// What stood at a tree position before the commit.
#[derive(Clone, Copy, Debug)]
enum Old {
    Null,
    Page(ChildRef),
    /// A level above the old root on the path to it (the tree grew).
    AboveRoot,
}

/// The new leaves a commit seeds the page cache with are at most this
/// fraction of the cache. They are held until the commit installs them,
/// beside the cached pages they replace: an edit of every leaf once held
/// twice the cache (natively, 3 passes of 80 MiB of 4 KiB random writes
/// over 512 MiB: 66-68 MiB peak with the whole cache, 59-61 with a
/// quarter). A leaf not kept is read again on its next lookup. Interior
/// pages, which every lookup walks, are always kept: one per 338 leaves.
pub(super) const KEEP_LEAVES_CACHE_FRACTION: usize = 4;

struct Builder<'a> {
    m: &'a Manifest,
    snap: &'a Snapshot,
    sink: PageSink,
    generation: u64,
    /// New pages to seed the cache with: every interior page, and leaves
    /// while fewer than `keep_max` pages are kept.
    keep: Vec<(u64, Arc<Page>)>,
    keep_max: usize,
    stats: &'a mut CommitStats,
    live_delta: i64,
    mapped_delta: i64,
}

impl Builder<'_> {
    fn emit(&mut self, level: u8, first_block: u64, body: Body) -> Result<ChildRef> {
        let ptr = self.sink.push(level, first_block, self.generation, &body)?;
        self.stats.pages_written += 1;
        self.stats.bytes_initialized += PAGE_BYTES as u64;
        self.live_delta += 1;
        if level > 0 || self.keep.len() < self.keep_max {
            let p = Page { level, first_block, generation: self.generation, crc: ptr.crc, body };
            self.keep.push((ptr.page, Arc::new(p)));
        }
        Ok(ptr)
    }

    /// Rebuilds the node `index` at `level` with the dirty leaves below it;
    /// returns its new pointer and whether it changed.
    fn node(&mut self, level: u8, index: u64, old: Old, dirty: &[(u64, Edits)]) -> Result<(ChildRef, bool)> {
        let first_block = u64::try_from(u128::from(index) * page::span_blocks(level))
            .expect("dirty nodes start below block 2^64");
        if dirty.is_empty() {
            match old {
                Old::Null => return Ok((ChildRef::NONE, false)),
                Old::Page(p) => return Ok((p, false)),
                Old::AboveRoot => {}
            }
        }
        let old_page = match old {
            Old::Page(p) => Some(self.m.load(self.snap, p, level, first_block, crate::io::Wait::Block)?),
            _ => None,
        };
        if old_page.is_some() {
            self.live_delta -= 1; // re-added by emit() unless the page is kept
        }
        if level == 0 {
            let [(leaf, edits)] = dirty else { unreachable!("one dirty leaf per leaf position") };
            debug_assert_eq!(*leaf, index);
            let mut body = match old_page.as_deref() {
                Some(Page { body: Body::Leaf(l), .. }) => l.clone(),
                Some(_) => unreachable!("level 0 pages decode as leaves"),
                None => LeafBody::default(),
            };
            self.stats.bytes_initialized += std::mem::size_of::<LeafBody>() as u64;
            for &(entry, r) in edits {
                body.set(usize::from(entry), r);
            }
            let old_count = match old_page.as_deref() {
                Some(Page { body: Body::Leaf(l), .. }) => {
                    self.stats.refs_dropped += refs_dropped(l, &body);
                    if *l == body {
                        self.live_delta += 1;
                        let Old::Page(p) = old else { unreachable!("an old leaf page came from a pointer") };
                        return Ok((p, false));
                    }
                    l.count()
                }
                _ => 0,
            };
            self.mapped_delta += i64::from(body.count()) - i64::from(old_count);
            if body.present == 0 {
                return Ok((ChildRef::NONE, old_page.is_some()));
            }
            self.stats.leaf_pages_written += 1;
            return Ok((self.emit(0, first_block, Body::Leaf(body))?, true));
        }

        let mut node = match old_page.as_deref() {
            // Written as the current version, whatever it was read as.
            Some(Page { body: Body::Interior(n), .. }) => {
                let mut fresh = InteriorBody::default();
                fresh.children = n.children;
                fresh
            }
            Some(_) => unreachable!("interior levels decode as interior pages"),
            None => InteriorBody::default(),
        };
        self.stats.bytes_initialized += std::mem::size_of::<InteriorBody>() as u64;
        let above = matches!(old, Old::AboveRoot);
        // Below an AboveRoot node, child 0 leads to the old root.
        let old_child0 = match above {
            true if level == self.snap.root.height => Old::Page(self.snap.root.root),
            true => Old::AboveRoot,
            false => Old::Null,
        };
        let child_leaves = page::span_leaves(level - 1);
        let first_child = index * FANOUT as u64;
        let mut changed = above;
        let mut done0 = false;
        let mut pos = 0;
        while pos < dirty.len() {
            let child = dirty[pos].0 / child_leaves;
            let end = pos + dirty[pos..].iter().take_while(|(l, _)| l / child_leaves == child).count();
            let ci = (child - first_child) as usize;
            let prev = if above && ci == 0 {
                done0 = true;
                old_child0
            } else if node.children[ci].is_none() {
                Old::Null
            } else {
                Old::Page(node.children[ci])
            };
            let (ptr, ch) = self.node(level - 1, child, prev, &dirty[pos..end])?;
            node.children[ci] = ptr;
            changed |= ch;
            pos = end;
        }
        if above && !done0 {
            node.children[0] = self.node(level - 1, first_child, old_child0, &[])?.0;
        }
        if !changed {
            return Ok(match old {
                Old::Page(p) => {
                    self.live_delta += 1;
                    (p, false)
                }
                _ => (ChildRef::NONE, false),
            });
        }
        if node.count() == 0 {
            return Ok((ChildRef::NONE, old_page.is_some()));
        }
        Ok((self.emit(level, first_block, Body::Interior(node))?, true))
    }
}

const _: () = assert!(FIRST_TREE_PAGE == 2);

/// Entries of `old` that mapped a chunk which `new` no longer maps there
/// (unmapped, or another chunk).
fn refs_dropped(old: &LeafBody, new: &LeafBody) -> u64 {
    (0..LEAF_ENTRIES)
        .filter(|&i| match (old.get(i), new.get(i)) {
            (Some(o), Some(n)) => o.tag != n.tag,
            (Some(_), None) => true,
            (None, _) => false,
        })
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heights() {
        assert_eq!(height_for_leaf(0), 1);
        assert_eq!(height_for_leaf(1), 2);
        assert_eq!(height_for_leaf(337), 2);
        assert_eq!(height_for_leaf(338), 3);
        assert_eq!(height_for_leaf(u64::MAX / LEAF_ENTRIES as u64), 8);
    }
}
