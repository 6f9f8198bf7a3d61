//! Iteration over every mapped `(block, chunk ref)` of one committed tree.
//!
//! Depth-first, in block order, holding one page per level (at most 8),
//! so memory stays bounded whatever the manifest's size. Pages are read
//! directly, not through the lookup cache, so a full scan (GC's mark) does
//! not evict the pages lookups need. The iterator keeps its snapshot alive;
//! commits made meanwhile are not seen.

use super::page::{self, Body, LeafBody};
use super::{ChunkRef, Snapshot};
use crate::error::Result;
use std::sync::Arc;

/// See the module docs. Yields `Err` once, then ends, on a damaged page.
pub struct ManifestIter {
    snap: Arc<Snapshot>,
    /// Interior pages on the current path, with the next child to visit.
    stack: Vec<(page::Page, usize)>,
    leaf: Option<(LeafBody, u64, usize)>,
    started: bool,
    failed: bool,
}

impl ManifestIter {
    pub(crate) fn new(snap: Arc<Snapshot>) -> ManifestIter {
        ManifestIter { snap, stack: Vec::new(), leaf: None, started: false, failed: false }
    }

    /// Descends into a page: leaves become the current leaf.
    fn enter(&mut self, p: page::Page) {
        match p.body {
            Body::Leaf(l) => self.leaf = Some((l, p.first_block, 0)),
            Body::Interior(_) => self.stack.push((p, 0)),
        }
    }

    fn step(&mut self) -> Result<Option<(u64, ChunkRef)>> {
        if !self.started {
            self.started = true;
            let root = self.snap.root;
            if root.height > 0 {
                let p = self.snap.read_page(root.root, root.height - 1, 0, crate::io::Wait::Block)?;
                self.enter(p);
            }
        }
        loop {
            if let Some((leaf, first, next)) = &mut self.leaf {
                while *next < page::LEAF_ENTRIES {
                    let i = *next;
                    *next += 1;
                    if let Some(h) = leaf.get(i) {
                        return Ok(Some((*first + i as u64, h)));
                    }
                }
                self.leaf = None;
            }
            let Some((p, next)) = self.stack.last_mut() else { return Ok(None) };
            let Body::Interior(node) = &p.body else { unreachable!("only interior pages are stacked") };
            let Some(i) = (*next..page::FANOUT).find(|&i| !node.children[i].is_none()) else {
                self.stack.pop();
                continue;
            };
            *next = i + 1;
            let (level, child) = (p.level - 1, node.children[i]);
            let first = p.first_block + (i as u128 * page::span_blocks(level)) as u64;
            let c = self.snap.read_page(child, level, first, crate::io::Wait::Block)?;
            self.enter(c);
        }
    }
}

impl Iterator for ManifestIter {
    type Item = Result<(u64, ChunkRef)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.step() {
            Ok(item) => item.map(Ok),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}
