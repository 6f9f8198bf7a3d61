//! The two arms that run on the daemon's request path (`serve`, driven by
//! `casblk_ci::frontend`): `cas`, the engine, and `raw`, a plain file per
//! image standing in for it (`serve::FileStandIn`: one `pread`/`pwrite`
//! per request, `fdatasync` per FLUSH, as raw mode does). Everything else
//! (scheduler, 4 workers, reads in place, tracing, completions) is the
//! same, so the difference is the engine's work.
//!
//! Each arm has a read image and a write image of the span, both filled
//! with distinct 4 KiB blocks (block numbers in their first 8 bytes, which
//! reads check). The cas arm's are flushed and compacted before any job:
//! a read goes overlay (empty), manifest, chunk cache or pack file. A
//! write job ends with a FLUSH and, for cas, compaction caught up, inside
//! the CPU measurement: a write's cost includes moving it into chunks (not
//! GC reclaiming what it overwrote: automatic GC is off, so no pass lands
//! in another job's measurement).

use std::sync::Arc;

use cas::storage::{FsStorage, OpenMode, Storage, StorageFile};
use cas::StoreOptions;
use casblk_ci::compaction_data::block_content;
use casblk_ci::engine::{filled_mib, Engine};
use casblk_ci::frontend::{block_pattern, run_arm, Stream, Tracing};
use casblk_ci::Scratch;
use sched::{Config, ImageId};
use serve::FileStandIn;

use crate::jobs::Job;
use crate::Figures;

/// The daemon's worker pool (ublk/src/targets/cas/control/mod.rs).
const WORKERS: usize = 4;
const READ_IMAGE: ImageId = ImageId(1);
const WRITE_IMAGE: ImageId = ImageId(2);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Raw,
    Cas,
}

pub struct EngineArm {
    kind: Kind,
    span_bytes: u64,
    /// Raw only: the read and the write image's files.
    files: Option<(Arc<dyn StorageFile>, Arc<dyn StorageFile>)>,
    /// The raw arm's engine is never written: its devices need an image
    /// for their size and log capacity.
    engine: Engine,
    _files_dir: Option<Scratch>,
}

/// Block `offset`'s content in image `image`: distinct across both images,
/// its number in the first 8 bytes.
fn fill(image: ImageId, offset_bytes: u64, block: &mut [u8]) {
    block_content((u64::from(image.0) << 40) | (offset_bytes / 4096), block);
    block[..8].copy_from_slice(&block_pattern(offset_bytes));
}

impl EngineArm {
    pub fn new(kind: Kind, span_bytes: u64) -> EngineArm {
        let name = match kind {
            Kind::Raw => "path-raw",
            Kind::Cas => "path-cas",
        };
        let images = [(READ_IMAGE, "r", span_bytes), (WRITE_IMAGE, "w", span_bytes)];
        // Automatic GC off: a pass that one job's overwrites start would
        // be billed to whichever job or pair segment runs next (raw's half
        // of the time). A write's cost here is logging and compaction, not
        // reclaiming what it overwrote.
        let opts = StoreOptions { gc_auto: cas::gc::AutoGcOptions::off(), ..StoreOptions::default() };
        let engine = Engine::create(name, opts, &images);
        let (files, files_dir) = match kind {
            Kind::Cas => {
                for (id, _, _) in images {
                    engine.seed(id, span_bytes, |offset, block| fill(id, offset, block));
                }
                (None, None)
            }
            Kind::Raw => {
                let dir = Scratch::new("path-raw-files");
                let open = |id: ImageId| {
                    let file = FsStorage::new()
                        .open(&dir.0.join(format!("{}.img", id.0)), OpenMode::Create)
                        .expect("create a raw image file");
                    filled_mib(
                        span_bytes,
                        |offset, block| fill(id, offset, block),
                        |offset, data| file.write_all_at(data, offset).expect("fill a raw image file"),
                    );
                    file.sync_data().expect("sync a raw image file");
                    file
                };
                (Some((open(READ_IMAGE), open(WRITE_IMAGE))), Some(dir))
            }
        };
        EngineArm { kind, span_bytes, files, engine, _files_dir: files_dir }
    }

    /// Runs `job` for `secs` and measures it.
    pub fn run(&self, job: &Job, secs: f64) -> Figures {
        let image = if job.writes() { WRITE_IMAGE } else { READ_IMAGE };
        let stream = Stream {
            image,
            op: job.op,
            block_bytes: job.block_bytes,
            queue_depth: job.queue_depth,
            queues: job.threads,
            span_bytes: self.span_bytes,
            pattern: job.pattern,
        };
        let file = self.files.as_ref().map(|(r, w)| if job.writes() { w.clone() } else { r.clone() });
        let configure = |_: &Stream, core: &mut serve::DeviceCore<serve::HeapBuffers>| {
            core.file_stand_in = file.clone().map(FileStandIn::new);
        };
        let before = self.engine.mark();
        let cpu = casblk_ci::process_cpu_ns();
        let result =
            run_arm(&self.engine, Config::default(), WORKERS, &[stream], secs, Tracing::On, &configure);
        if job.writes() {
            match &file {
                Some(file) => file.sync_data().expect("flush a raw image file"),
                None => self.engine.settle(image),
            }
        }
        let cpu_ns = casblk_ci::process_cpu_ns() - cpu;
        let delta = before.delta(&self.engine.mark());
        let s = &result.streams[0];
        assert_eq!(s.errors, 0, "{:?} {}: {} requests failed", self.kind, job.name(), s.errors);
        assert!(s.requests > 0, "{:?} {}: no request completed in {secs} s", self.kind, job.name());
        match self.kind {
            Kind::Cas if !job.writes() => {
                assert_eq!(
                    delta.read_log_bytes,
                    0,
                    "{}: a compacted image's reads went to its log",
                    job.name()
                );
                let lookups = (delta.cache_hits + delta.cache_misses).max(1);
                println!(
                    "  cas {}: chunk cache hits {:.1}%",
                    job.name(),
                    100.0 * delta.cache_hits as f64 / lookups as f64
                );
            }
            Kind::Raw => assert_eq!(
                delta.read_bytes + delta.payload_bytes_written,
                0,
                "the raw arm's engine served IO"
            ),
            Kind::Cas => {}
        }
        Figures::new(
            s.requests as f64 / result.secs,
            &s.latency_ns,
            cpu_ns as f64 / 1000.0 / s.requests as f64,
        )
    }
}
