//! Reclaiming a manifest file's garbage by rewriting its live tree.
//!
//! Commits never overwrite pages, so replaced pages pile up below
//! `file_pages`. A rewrite copies the pages the current root reaches into a
//! new file (children first, so each parent is written with its children's
//! new page numbers), writes a root of the next generation with the same
//! `covered`, and renames the file into place (file.rs). Readers holding
//! the old snapshot keep reading the old, now unlinked, file through their
//! handle. Crash at any point: the old file or the complete new one.

use super::file::{self, Failure, PageSink};
use super::page::{self, Body, ChildRef};
use super::root::{RootRecord, FIRST_TREE_PAGE};
use super::{base, lock, CommitState, Manifest, Snapshot};
use crate::error::Result;

/// What a rewrite did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RewriteStats {
    pub pages_before: u64,
    pub pages_after: u64,
    pub pages_written: u64,
    pub syncs: u64,
}

impl Manifest {
    /// Rewrites the file if its garbage exceeds the configured fraction of
    /// live pages and the configured minimum; returns what it did.
    pub fn compact_if_needed(&self) -> Result<Option<RewriteStats>> {
        let _state = lock(&self.commit_state);
        let r = self.snapshot().root;
        let garbage = r.garbage_pages();
        let threshold = (r.live_pages as f64 * self.opts.rewrite_garbage_fraction) as u64;
        if garbage < self.opts.rewrite_min_garbage_pages.max(1) || garbage <= threshold {
            return Ok(None);
        }
        drop(_state);
        self.compact().map(Some)
    }

    /// Rewrites the file now, dropping every garbage page (a frozen base
    /// becomes an own file).
    pub fn compact(&self) -> Result<RewriteStats> {
        let mut state = lock(&self.commit_state);
        self.rewrite_locked(&mut state)
    }

    /// `compact`, with the commit lock held.
    pub(crate) fn rewrite_locked(&self, state: &mut CommitState) -> Result<RewriteStats> {
        Manifest::check_poison(state, &self.path)?;
        let snap = self.snapshot();
        if snap.file.is_none() {
            return Ok(RewriteStats::default());
        }
        let old = snap.root;
        let (tmp_file, tmp) = file::create_tmp(self.storage.as_ref(), &self.path)?;
        let generation = old.generation + 1;
        let mut sink = PageSink::new(tmp_file.clone(), FIRST_TREE_PAGE);
        let copied = (|| {
            let root = match old.height {
                0 => ChildRef::NONE,
                h => copy(&snap, &mut sink, old.root, h - 1, 0, generation)?,
            };
            sink.flush()?;
            Ok(root)
        })();
        let root_ptr = match copied {
            Ok(r) => r,
            Err(e) => {
                let _ = self.storage.remove_file(&tmp);
                return Err(e);
            }
        };
        if sink.pages != old.live_pages {
            tracing::warn!(
                path = %self.path.display(),
                counted = old.live_pages,
                found = sink.pages,
                "manifest live page count was off; the rewrite corrects it"
            );
        }
        let root = RootRecord {
            generation,
            root: root_ptr,
            file_pages: sink.next_page,
            live_pages: sink.pages,
            ..old
        };
        let committed =
            file::commit_new_file(self.storage.as_ref(), tmp_file.as_ref(), &tmp, &self.path, &root);
        let (new_file, syncs) = match committed {
            Ok(r) => r,
            Err(Failure { error, uncertain }) => {
                if uncertain {
                    state.poisoned = Some(error.to_string());
                } else {
                    let _ = self.storage.remove_file(&tmp);
                }
                return Err(error);
            }
        };
        let stats = RewriteStats {
            pages_before: old.file_pages,
            pages_after: root.file_pages,
            pages_written: sink.pages,
            syncs,
        };
        self.install(Snapshot::new(Some(new_file), self.new_file_id(), root, false));
        if snap.shared {
            // The own file wins from its rename on; the base entries are
            // leftovers an open would also remove.
            if let Err(e) = base::remove_leftovers(self.storage.as_ref(), &self.path, None) {
                tracing::warn!(path = %self.path.display(), error = %e, "base entries left behind");
            }
        }
        Ok(stats)
    }
}

/// Copies the subtree at `ptr` into `sink`, children first.
fn copy(
    snap: &Snapshot,
    sink: &mut PageSink,
    ptr: ChildRef,
    level: u8,
    first_block: u64,
    generation: u64,
) -> Result<ChildRef> {
    let mut p = snap.read_page(ptr, level, first_block, crate::io::Wait::Block)?;
    if let Body::Interior(node) = &mut p.body {
        let span = page::span_blocks(level - 1);
        for (i, c) in node.children.iter_mut().enumerate() {
            if !c.is_none() {
                let first = first_block + (i as u128 * span) as u64;
                *c = copy(snap, sink, *c, level - 1, first, generation)?;
            }
        }
    }
    sink.push(level, first_block, generation, &p.body)
}
