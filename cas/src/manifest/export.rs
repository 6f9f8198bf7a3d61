//! An export of a manifest: what publication to the bucket reads of it
//! (cas::bucket::manifests), and how another host builds a manifest file
//! from the exported pages.
//!
//! A publisher sends a manifest as ranges of raw pages. It reads the
//! committed tree of one moment ([`Committed`]): pages below that root's
//! `file_pages` never change while the file exists, so the ranges it sends
//! are consistent with the root it publishes, whatever commits run
//! meanwhile. A rewrite (garbage, or a first commit) makes a new file: a
//! new `file_id`, and the publisher starts a new series of ranges.
//!
//! A commit writes every page after the pages it points to (a parent
//! carries its children's crc32c), so the pages a publication has not sent
//! yet, those at or past some page number, are reached only through other
//! such pages: [`Committed::refs_since`] walks just them.

use super::file;
use super::page::{Body, ChildRef, PAGE_BYTES};
use super::root::{RootRecord, FIRST_TREE_PAGE};
use super::{Manifest, Snapshot};
use crate::chunk::ChunkRef;
use crate::error::{Error, Result};
use crate::storage::{Storage, StorageFile};
use std::path::Path;
use std::sync::Arc;

/// The committed tree of one moment, held open (see the module docs).
pub struct Committed {
    snap: Arc<Snapshot>,
}

impl Manifest {
    /// The committed tree now, for publication.
    pub fn committed(&self) -> Committed {
        Committed { snap: self.snapshot() }
    }
}

impl Committed {
    pub fn root(&self) -> RootRecord {
        self.snap.root
    }

    /// Which file the pages are in: changes when a rewrite or the first
    /// commit makes a new one. None before the first commit.
    pub fn file_id(&self) -> Option<u64> {
        self.snap.file.as_ref().map(|_| self.snap.file_id)
    }

    /// Raw pages `first..end` (each below the root's `file_pages`).
    pub fn read_pages(&self, first: u64, end: u64) -> Result<Vec<u8>> {
        let file = self.file()?;
        if first < FIRST_TREE_PAGE || end < first || end > self.snap.root.file_pages {
            return Err(Error::InvalidArgument(format!(
                "pages {first}..{end} are outside the tree's {FIRST_TREE_PAGE}..{}",
                self.snap.root.file_pages
            )));
        }
        let mut buf = vec![0u8; ((end - first) * PAGE_BYTES as u64) as usize];
        file.read_exact_at(&mut buf, first * PAGE_BYTES as u64)?;
        Ok(buf)
    }

    /// Calls `each` with every ref of the leaves reachable from the root
    /// through pages numbered `from_page` or more (checking each page).
    pub fn refs_since(&self, from_page: u64, each: &mut dyn FnMut(&ChunkRef)) -> Result<()> {
        let root = self.snap.root;
        if root.height == 0 || root.root.page < from_page {
            return Ok(());
        }
        walk(&self.snap, root.root, root.height - 1, 0, from_page, each)
    }

    fn file(&self) -> Result<&Arc<dyn StorageFile>> {
        self.snap
            .file
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("the manifest has no committed tree".into()))
    }
}

fn walk(
    snap: &Snapshot,
    ptr: ChildRef,
    level: u8,
    first_block: u64,
    from_page: u64,
    each: &mut dyn FnMut(&ChunkRef),
) -> Result<()> {
    let p = snap.read_page(ptr, level, first_block, crate::io::Wait::Block)?;
    match &p.body {
        Body::Leaf(leaf) => {
            for i in 0..super::LEAF_ENTRIES {
                if let Some(r) = leaf.get(i) {
                    each(&r);
                }
            }
        }
        Body::Interior(node) => {
            let span = super::page::span_blocks(level - 1);
            for (i, c) in node.children.iter().enumerate() {
                if !c.is_none() && c.page >= from_page {
                    walk(snap, *c, level - 1, first_block + (i as u128 * span) as u64, from_page, each)?;
                }
            }
        }
    }
    Ok(())
}

/// Builds the manifest file `path` from published page ranges and their
/// root, atomically (a crash leaves no file or the whole one), then opens
/// it as [`Manifest::open`] does, which checks the root page. Pages no
/// range covers are zero: the root reaches none of them.
pub fn build_from_pages(
    storage: &dyn Storage,
    path: &Path,
    root: &RootRecord,
    ranges: &mut dyn Iterator<Item = Result<(u64, Vec<u8>)>>,
) -> Result<()> {
    let (tmp_file, tmp) = file::create_tmp(storage, path)?;
    for r in ranges {
        let (first, pages) = r?;
        let end = first + (pages.len() / PAGE_BYTES) as u64;
        if first < FIRST_TREE_PAGE || !pages.len().is_multiple_of(PAGE_BYTES) || end > root.file_pages {
            return Err(Error::Corruption {
                path: path.to_path_buf(),
                offset: first * PAGE_BYTES as u64,
                detail: format!(
                    "published pages {first}..{end} do not fit a tree of {} pages",
                    root.file_pages
                ),
            });
        }
        tmp_file.write_all_at(&pages, first * PAGE_BYTES as u64)?;
    }
    file::commit_new_file(storage, tmp_file.as_ref(), &tmp, path, root).map_err(|f| f.error)?;
    Ok(())
}
