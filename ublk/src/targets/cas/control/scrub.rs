//! `casblk scrub` in the store daemon: one scrub pass at a time
//! (`cas::Store::scrub`) on its own thread, `casblk-scrub`, in the store's
//! background CPU class, at a bounded rate; every `--scrub-interval` hours
//! a pass over the whole store starts by itself. Progress is in the stats
//! (source `scrub`) and the metrics; the last pass's report is kept for
//! `casblk scrub --status`, and every damaged chunk is logged with the
//! blocks that hold it.

use super::Daemon;
use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The rate of `casblk scrub` when not given, and of the periodic scrub:
/// chunk bytes read a second.
pub const DEFAULT_RATE_BYTES_PER_SEC: u64 = 64 << 20;

/// The daemon's scrub: what runs, how far it got, what the last pass found.
#[derive(Default)]
pub struct ScrubState {
    pub progress: cas::ScrubProgress,
    last: Mutex<Option<cas::ScrubReport>>,
    /// What the pass under way scrubs ("store", "image NAME").
    running: Mutex<Option<String>>,
    /// Set when the daemon exits: the pass under way stops.
    pub stop: AtomicBool,
}

impl ScrubState {
    /// The figures of the stats source `scrub`.
    pub fn counters(&self) -> Value {
        let p = &self.progress;
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        json!({
            "running": u64::from(self.running.lock().unwrap_or_else(|e| e.into_inner()).is_some()),
            "passes": p.passes.load(Ordering::Relaxed),
            "chunks_checked": p.chunks_checked.load(Ordering::Relaxed),
            "bytes_checked": p.bytes_checked.load(Ordering::Relaxed),
            "damaged_chunks_found": p.damaged_chunks.load(Ordering::Relaxed),
            "last_damaged_chunks": last.as_ref().map_or(0, |r| r.damaged_chunks - r.repaired_chunks),
            "last_damaged_metadata": last.as_ref().map_or(0, |r| r.damaged_metadata.len() as u64),
        })
    }
}

impl Daemon {
    /// Starts a pass; refused while one runs.
    pub(super) fn scrub_start(self: &Arc<Self>, opts: cas::ScrubOptions) -> Result<Value> {
        if opts.rate_bytes_per_sec == 0 {
            bail!("a scrub rate must be at least 1 byte a second");
        }
        if let Some(name) = &opts.image {
            self.store.image_info(name)?;
        }
        if opts.bucket && self.store.tier().is_none() {
            bail!("store {} has no bucket (no remote tier) to scrub", self.store_dir.display());
        }
        let scope = match (&opts.image, opts.bucket) {
            (_, true) => "bucket".to_string(),
            (Some(n), false) => format!("image {n}"),
            (None, false) => "store".to_string(),
        };
        // Read before the pass can end: a follower waits for one more.
        let passes = {
            let mut running = self.scrub.running.lock().unwrap_or_else(|e| e.into_inner());
            if self.scrub.stop.load(Ordering::Relaxed) {
                bail!("the store daemon is exiting");
            }
            if let Some(what) = &*running {
                bail!("a scrub of the {what} is running; see casblk scrub --status");
            }
            *running = Some(scope.clone());
            self.scrub.progress.passes.load(Ordering::Relaxed)
        };
        let daemon = self.clone();
        let rate_bytes_per_sec = opts.rate_bytes_per_sec;
        let spawned =
            std::thread::Builder::new().name("casblk-scrub".into()).spawn(move || daemon.scrub_pass(&opts));
        if let Err(e) = spawned {
            *self.scrub.running.lock().unwrap_or_else(|e| e.into_inner()) = None;
            bail!("spawning the scrub thread: {e}");
        }
        tracing::info!(scope, rate_bytes_per_sec, "scrub started");
        Ok(json!({ "started": scope, "passes": passes }))
    }

    fn scrub_pass(&self, opts: &cas::ScrubOptions) {
        self.options.background_cpu.apply_to_current_thread();
        let s = &self.scrub;
        match self.store.scrub(opts, &s.progress, &s.stop) {
            Ok(report) => {
                for f in &report.findings {
                    let blocks: Vec<String> =
                        f.blocks.iter().map(|b| format!("{}:{}", b.image, b.block)).collect();
                    tracing::error!(detail = %f.detail, blocks = %blocks.join(" "), blocks_total = f.blocks_total, "scrub: damaged chunk");
                }
                for m in &report.damaged_metadata {
                    tracing::error!(detail = %m, "scrub: damaged metadata");
                }
                tracing::info!(
                    scope = %report.scope,
                    chunks = report.chunks_checked,
                    damaged = report.damaged_chunks,
                    ms = report.elapsed_ms,
                    stopped = report.stopped,
                    "scrub finished"
                );
                *s.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(report);
            }
            Err(e) => tracing::error!("scrub failed: {e}"),
        }
        *s.running.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// At exit: stops the pass under way and waits for it (bounded: the
    /// pass looks at the stop flag after every chunk and every 100 ms of
    /// pacing).
    pub(super) fn scrub_stop(&self) {
        self.scrub.stop.store(true, Ordering::Relaxed);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.scrub.running.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
            if std::time::Instant::now() > deadline {
                tracing::warn!("the scrub did not stop within 10 s; exiting anyway");
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(super) fn scrub_status(&self) -> Value {
        let s = &self.scrub;
        json!({
            "running": *s.running.lock().unwrap_or_else(|e| e.into_inner()),
            "progress": s.counters(),
            "last": *s.last.lock().unwrap_or_else(|e| e.into_inner()),
        })
    }

    /// Every `interval`, a pass over the whole store (skipped while one
    /// runs); ends when the daemon stops.
    pub(super) fn scrub_periodically(self: &Arc<Self>, interval: Duration) -> std::io::Result<()> {
        let daemon = self.clone();
        std::thread::Builder::new().name("casblk-scrub-timer".into()).spawn(move || loop {
            let until = std::time::Instant::now() + interval;
            while std::time::Instant::now() < until {
                if daemon.scrub.stop.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            let opts = cas::ScrubOptions {
                image: None,
                rate_bytes_per_sec: DEFAULT_RATE_BYTES_PER_SEC,
                bucket: false,
            };
            if let Err(e) = daemon.scrub_start(opts) {
                tracing::info!("periodic scrub skipped: {e:#}");
            }
        })?;
        Ok(())
    }
}
