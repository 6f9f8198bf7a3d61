//! The cache of decoded manifest pages that lookups go through: one per
//! store, shared by every image the store opens, so that its memory is
//! one bound however many images are open (each manifest had its own
//! 8 MiB, so 100 open images could hold 800 MiB of pages). A manifest
//! opened on its own (fsck, tests) gets a private one; an import or a
//! fetch goes through its store's.
//!
//! Entries are keyed by `(file_id, page)`. File ids come from the cache,
//! so no two files that share it (one per manifest, and a new one after
//! each rewrite or first commit) ever use the same id.

use super::page::{Page, PAGE_BYTES};
use crate::cache::ClockCache;
use rustc_hash::FxBuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Lock shards of the page cache.
const SHARDS: usize = 16;

/// Decoded pages by `(file_id, page number)`, at most `capacity_pages`.
pub struct PageCache {
    pages: ClockCache<(u64, u64), Arc<Page>, FxBuildHasher>,
    capacity_pages: usize,
    next_file_id: AtomicU64,
}

impl PageCache {
    /// A cache of at most `bytes` of pages (whole pages: `PAGE_BYTES` each).
    pub fn new(bytes: u64) -> Arc<PageCache> {
        let capacity_pages = (bytes / PAGE_BYTES as u64) as usize;
        Arc::new(PageCache {
            pages: ClockCache::new(capacity_pages, SHARDS),
            capacity_pages,
            next_file_id: AtomicU64::new(1),
        })
    }

    /// Pages it holds at most.
    pub fn capacity_pages(&self) -> usize {
        self.capacity_pages
    }

    /// Pages it holds now.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// An id no other file of any manifest sharing this cache has had.
    pub(crate) fn new_file_id(&self) -> u64 {
        self.next_file_id.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn get(&self, file_id: u64, page: u64) -> Option<Arc<Page>> {
        self.pages.get(&(file_id, page))
    }

    pub(crate) fn insert(&self, file_id: u64, page: u64, p: Arc<Page>) {
        self.pages.insert((file_id, page), p);
    }
}

impl std::fmt::Debug for PageCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageCache")
            .field("capacity_pages", &self.capacity_pages)
            .field("len", &self.len())
            .finish()
    }
}
