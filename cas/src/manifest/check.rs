//! The manifest's half of `casblk fsck`: a walk over every page of the
//! committed tree that, unlike [`ManifestIter`](super::ManifestIter), goes
//! on past a damaged page (its subtree is skipped and reported) and counts
//! what it saw, so the counts can be held against the root record.

use super::page::{self, Body, ChildRef};
use super::{ChunkRef, Manifest, Snapshot};
use crate::error::Error;

/// What a walk of the committed tree saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeCounts {
    /// Pages read and decoded.
    pub pages: u64,
    /// Blocks mapped by those pages.
    pub mapped_blocks: u64,
    /// Pages that did not read or decode (their subtrees were skipped).
    pub damaged_pages: u64,
}

impl Manifest {
    /// Walks every page of the committed tree, depth first in block order,
    /// reading pages directly (no cache). Calls `each` for every mapped
    /// block, and `damaged` with the error, first block and block span of
    /// every page that does not read or decode, whose subtree is skipped.
    pub fn check_tree(
        &self,
        each: &mut dyn FnMut(u64, &ChunkRef),
        damaged: &mut dyn FnMut(&Error, u64, u128),
    ) -> TreeCounts {
        let snap = self.snapshot();
        let mut counts = TreeCounts::default();
        let root = snap.root;
        if root.height > 0 {
            walk(&snap, root.root, root.height - 1, 0, each, damaged, &mut counts);
        }
        counts
    }
}

fn walk(
    snap: &Snapshot,
    ptr: ChildRef,
    level: u8,
    first_block: u64,
    each: &mut dyn FnMut(u64, &ChunkRef),
    damaged: &mut dyn FnMut(&Error, u64, u128),
    counts: &mut TreeCounts,
) {
    let p = match snap.read_page(ptr, level, first_block, crate::io::Wait::Block) {
        Ok(p) => p,
        Err(e) => {
            counts.damaged_pages += 1;
            damaged(&e, first_block, page::span_blocks(level));
            return;
        }
    };
    counts.pages += 1;
    match &p.body {
        Body::Leaf(leaf) => {
            for i in 0..page::LEAF_ENTRIES {
                if let Some(h) = leaf.get(i) {
                    counts.mapped_blocks += 1;
                    each(first_block + i as u64, &h);
                }
            }
        }
        Body::Interior(node) => {
            let span = page::span_blocks(level - 1);
            for (i, child) in node.children.iter().enumerate() {
                if !child.is_none() {
                    let first = first_block + (i as u128 * span) as u64;
                    walk(snap, *child, level - 1, first, each, damaged, counts);
                }
            }
        }
    }
}
