//! The store's GC passes (`crate::gc` does the marking and sweeping):
//! over every image's manifest, one at a time under `maint`, each recorded
//! in the history automatic GC decides from (`crate::gc::auto`, whose
//! task runs `gc_auto_pass` through the closure the store hands it).

use super::Store;
use crate::error::Result;
use crate::gc::{GcOptions, GcReport};
use crate::manifest::Manifest;
use crate::sync::lock;
use std::sync::atomic::Ordering;

impl Store {
    /// Runs one chunk GC pass over the manifests of every image, open or
    /// not (cas::gc), while IO and compaction go on: compaction batches pin
    /// the chunks they insert until their commit, and image creation and
    /// removal wait for the pass.
    pub fn gc(&self) -> Result<GcReport> {
        self.gc_with(&GcOptions::default())
    }

    /// `gc` with explicit options.
    pub fn gc_with(&self, opts: &GcOptions) -> Result<GcReport> {
        self.gc_run(opts, false)
    }

    /// An automatic pass (cas::gc::auto), with the default options.
    pub(crate) fn gc_auto_pass(&self) -> Result<GcReport> {
        self.gc_run(&GcOptions::default(), true)
    }

    /// One pass, recorded in the GC history (the tasks' clock dates it)
    /// before `maint` is released: a removal waiting for the pass nudges
    /// the next one after this record, so its nudge is not lost.
    fn gc_run(&self, opts: &GcOptions, auto: bool) -> Result<GcReport> {
        let _maint = lock(&self.maint);
        // Read before the mark: mappings dropped during the pass may hold
        // chunks it does not sweep, so they count toward the next one.
        let dropped = self.gc.refs_dropped.load(Ordering::Relaxed);
        let started = std::time::Instant::now();
        let result = self.gc_marked_and_swept(opts);
        // Below the space reserve, a pass that freed nothing (or failed)
        // tells waiting writes to fail with ENOSPC (cas::space).
        let freed = result.as_ref().map_or(0, |r| {
            r.bytes_reclaimed.max(0) as u64 + r.manifest_pages_reclaimed * crate::manifest::PAGE_BYTES as u64
        });
        self.space.gc_finished(started, dropped, freed);
        let (now, chunks) = (self.opts.tasks.now(), self.chunks.len());
        // The pass's mark sets are freed: hand their pages back.
        crate::heap::PROCESS.release_free(now);
        let mut history = lock(&self.gc.history);
        match &result {
            Ok(report) => history.finished(report, chunks, dropped, now, auto),
            Err(_) if auto => history.failed(now),
            Err(_) => {}
        }
        result
    }

    /// The pass itself; the caller holds `maint`.
    fn gc_marked_and_swept(&self, opts: &GcOptions) -> Result<GcReport> {
        let mut manifests = Vec::new();
        for info in self.list_images()? {
            manifests.push(self.manifest(&info.name)?);
        }
        let refs: Vec<&Manifest> = manifests.iter().map(|m| &**m).collect();
        crate::gc::run(&self.chunks, &refs, opts)
    }
}
