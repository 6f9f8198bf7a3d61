//! Online scrub of a store while it serves (issue 48): every stored chunk
//! read from disk and checked against its crc32c and blake3 name (the chunk
//! core's `chunk::scrub`), every index page on the way, and every image's
//! manifest pages; at a bounded rate, so foreground IO keeps its latency.
//!
//! A damaged chunk whose pack the bucket holds is repaired from the
//! bucket's copy (when that copy checks): the slot is rewritten with the
//! chunk's own bytes and synced, and the finding says so.
//!
//! A damaged chunk is named with the image blocks that hold it: after the
//! chunk walk, each image's manifest is walked and its refs matched against
//! the damaged slots (by location, or by tag for a ref without one). Reads
//! of those blocks fail with EIO (the read path checks the crc32c too),
//! never return wrong data, and `casblk fsck` reports the same chunks.
//!
//! `--image NAME` scrubs only what that image holds: its manifest walked,
//! each chunk it references checked where the ref (or the index) puts it.
//!
//! `--bucket` checks the bucket's copies instead: each pack the bucket
//! holds for the store, slot by slot against its slot index, read in
//! ranges (bucket::packs::scrub); a pack or slot index missing from the
//! bucket is damage too. The manifest walk names the blocks as above.

use super::Store;
use crate::bucket::packs::scrub::PackCheck;
use crate::chunk::scrub::{Checked, Expected};
use crate::chunk::{ChunkLoc, CHUNK_BYTES};
use crate::error::Result;
use crate::units::{ChunkRef, ChunkTag};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Damaged chunks a report lists (all are counted).
pub const SCRUB_FINDINGS_MAX: usize = 1000;
/// Image blocks a finding lists (all are counted).
pub const SCRUB_BLOCKS_PER_FINDING_MAX: usize = 64;
/// The most reading a pass may save up by falling behind its rate.
const PACER_BURST: Duration = Duration::from_millis(100);

/// What to scrub, how fast.
#[derive(Clone, Debug)]
pub struct ScrubOptions {
    /// Only the chunks this image references (and its manifest pages).
    pub image: Option<String>,
    /// Chunk bytes read a second, at most.
    pub rate_bytes_per_sec: u64,
    /// Check the bucket's copies instead of the local packs: every pack
    /// the bucket holds for this store, from its own objects
    /// (bucket::packs::scrub); damage is named with the image blocks that
    /// hold it, and never repaired.
    pub bucket: bool,
}

/// One image block that holds a damaged chunk.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DamagedBlock {
    pub image: String,
    /// Image offset / 4096.
    pub block: u64,
}

/// One damaged chunk.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ScrubFinding {
    /// Where, and what is wrong.
    pub detail: String,
    /// Blocks that hold it (at most [`SCRUB_BLOCKS_PER_FINDING_MAX`]).
    pub blocks: Vec<DamagedBlock>,
    pub blocks_total: u64,
    /// Rewritten from the bucket's copy of its pack, which checked.
    #[serde(default)]
    pub repaired: bool,
}

/// What a scrub pass found.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ScrubReport {
    /// "store", or "image NAME".
    pub scope: String,
    pub chunks_checked: u64,
    pub bytes_checked: u64,
    /// Chunks in packs read through the bucket (evicted, or another
    /// store's): not scrubbed here.
    #[serde(default)]
    pub chunks_not_local: u64,
    pub manifest_refs_walked: u64,
    /// Damaged chunks (all of them; `findings` lists the first), and those
    /// of them repaired from the bucket.
    pub damaged_chunks: u64,
    #[serde(default)]
    pub repaired_chunks: u64,
    pub findings: Vec<ScrubFinding>,
    /// Index runs or manifests that could not be read through.
    pub damaged_metadata: Vec<String>,
    pub elapsed_ms: u64,
    /// Stopped before the end (the daemon is exiting).
    pub stopped: bool,
}

impl ScrubReport {
    pub fn is_clean(&self) -> bool {
        self.damaged_chunks == self.repaired_chunks && self.damaged_metadata.is_empty()
    }
}

/// Live figures of the scrub under way, for stats and metrics.
#[derive(Debug, Default)]
pub struct ScrubProgress {
    pub running: AtomicBool,
    pub passes: AtomicU64,
    pub chunks_checked: AtomicU64,
    pub bytes_checked: AtomicU64,
    pub damaged_chunks: AtomicU64,
}

/// Spends at most `rate` bytes a second, sleeping in slices that look at
/// `stop`.
struct Pacer<'a> {
    start: Instant,
    rate_bytes_per_sec: u64,
    bytes: u64,
    stop: &'a AtomicBool,
}

impl Pacer<'_> {
    /// Counts `bytes` read; returns false once `stop` is set. Time not
    /// spent reading is credit for at most [`PACER_BURST`]: a pass never
    /// catches up at full speed after a slow stretch.
    fn spend(&mut self, bytes: u64) -> bool {
        self.bytes += bytes;
        let due = Duration::from_secs_f64(self.bytes as f64 / self.rate_bytes_per_sec as f64);
        let behind = self.start.elapsed().saturating_sub(due);
        if behind > PACER_BURST {
            self.start += behind - PACER_BURST;
        }
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return false;
            }
            let ahead = due.saturating_sub(self.start.elapsed());
            if ahead < Duration::from_millis(1) {
                return true;
            }
            std::thread::sleep(ahead.min(Duration::from_millis(100)));
        }
    }
}

/// Damaged slots found so far, and what matches a manifest ref to them.
#[derive(Default)]
struct Damage {
    findings: Vec<ScrubFinding>,
    /// Every damaged slot, each counted once even past the findings
    /// listed, and even if the walk meets it twice (an index flush or
    /// merge installing shows its entries in two places for a moment).
    damaged: std::collections::HashSet<(u32, u32)>,
    by_loc: HashMap<(u32, u32), usize>,
    by_tag: HashMap<ChunkTag, usize>,
}

impl Damage {
    fn seen(&self, at: ChunkLoc) -> bool {
        self.damaged.contains(&(at.pack, at.slot))
    }

    /// Records damage at `at`; false if it was recorded already.
    fn add(
        &mut self,
        report: &mut ScrubReport,
        tag: ChunkTag,
        at: ChunkLoc,
        detail: String,
        repaired: bool,
    ) -> bool {
        if !self.damaged.insert((at.pack, at.slot)) {
            return false;
        }
        report.damaged_chunks += 1;
        report.repaired_chunks += u64::from(repaired);
        if self.findings.len() >= SCRUB_FINDINGS_MAX {
            return true;
        }
        self.by_loc.insert((at.pack, at.slot), self.findings.len());
        self.by_tag.insert(tag, self.findings.len());
        self.findings.push(ScrubFinding { detail, blocks: Vec::new(), blocks_total: 0, repaired });
        true
    }

    /// Records that `image`'s `block` holds `r`, if `r` is damaged.
    fn name(&mut self, image: &str, block: u64, r: &ChunkRef) {
        let hit = match r.at {
            Some(at) => self.by_loc.get(&(at.pack, at.slot)),
            None => self.by_tag.get(&r.tag),
        };
        if let Some(&i) = hit {
            let f = &mut self.findings[i];
            f.blocks_total += 1;
            if f.blocks.len() < SCRUB_BLOCKS_PER_FINDING_MAX {
                f.blocks.push(DamagedBlock { image: image.to_string(), block });
            }
        }
    }
}

impl Store {
    /// One scrub pass (see the module docs), reporting its figures to
    /// `progress` as it goes; returns early, marked `stopped`, once `stop`
    /// is set.
    pub fn scrub(
        &self,
        opts: &ScrubOptions,
        progress: &ScrubProgress,
        stop: &AtomicBool,
    ) -> Result<ScrubReport> {
        if opts.rate_bytes_per_sec == 0 {
            return Err(crate::Error::InvalidArgument(
                "a scrub rate must be at least 1 byte a second".into(),
            ));
        }
        let begun = Instant::now();
        if opts.bucket && opts.image.is_some() {
            return Err(crate::Error::InvalidArgument(
                "a bucket scrub covers the whole store, not one image".into(),
            ));
        }
        let tier = match (opts.bucket, self.tier()) {
            (false, _) => None,
            (true, Some(tier)) => Some(tier.clone()),
            (true, None) => {
                return Err(crate::Error::InvalidArgument("this store has no bucket (no remote tier)".into()))
            }
        };
        let images: Vec<String> = match &opts.image {
            Some(name) => {
                self.manifest(name)?; // a missing image says so before anything runs
                vec![name.clone()]
            }
            None => self.list_images()?.into_iter().map(|i| i.name).collect(),
        };
        let scope = match (&opts.image, opts.bucket) {
            (_, true) => "bucket".to_string(),
            (Some(n), false) => format!("image {n}"),
            (None, false) => "store".to_string(),
        };
        let mut report = ScrubReport { scope, ..ScrubReport::default() };
        let mut pacer = Pacer { start: begun, rate_bytes_per_sec: opts.rate_bytes_per_sec, bytes: 0, stop };
        let mut damage = Damage::default();
        let mut buf = vec![0u8; CHUNK_BYTES];
        let chunks = self.chunks();
        let local = chunks.local_pack_ids()?;
        // Checks the chunk at `at` once a pass; returns whether it read it.
        let mut checked =
            |report: &mut ScrubReport, damage: &mut Damage, tag: ChunkTag, r: Expected<'_>, at: ChunkLoc| {
                if !local.contains(&at.pack) {
                    report.chunks_not_local += 1;
                    return false;
                }
                if damage.seen(at) {
                    return false;
                }
                report.chunks_checked += 1;
                report.bytes_checked += CHUNK_BYTES as u64;
                progress.chunks_checked.fetch_add(1, Ordering::Relaxed);
                progress.bytes_checked.fetch_add(CHUNK_BYTES as u64, Ordering::Relaxed);
                if let Checked::Damaged(detail) = chunks.scrub_slot(r, at, &mut buf) {
                    let repaired = match chunks.repair_from_bucket(r, at) {
                        Ok(done) => done,
                        Err(e) => {
                            tracing::warn!(%detail, "scrub: repairing from the bucket failed: {e}");
                            false
                        }
                    };
                    tracing::error!(%detail, repaired, "scrub: a damaged chunk");
                    if damage.add(report, tag, at, detail, repaired) {
                        progress.damaged_chunks.fetch_add(1, Ordering::Relaxed);
                    }
                }
                true
            };
        if let Some(tier) = &tier {
            'packs: for id in tier.bucket_pack_ids() {
                let mut spend = |bytes: u64| {
                    progress.bytes_checked.fetch_add(bytes, Ordering::Relaxed);
                    pacer.spend(bytes)
                };
                match tier.scrub_pack(id, &mut spend) {
                    PackCheck::NoIndex(why) => {
                        tracing::error!(pack = id, "bucket scrub: {why}");
                        report.damaged_metadata.push(format!("pack {id:#010x} in the bucket: {why}"));
                    }
                    PackCheck::Checked { slots, bytes, damaged, stopped } => {
                        report.chunks_checked += slots;
                        report.bytes_checked += bytes;
                        progress.chunks_checked.fetch_add(slots, Ordering::Relaxed);
                        for d in damaged {
                            tracing::error!(detail = %d.detail, "bucket scrub: a damaged chunk");
                            let at = ChunkLoc { pack: id, slot: d.slot, crc: d.crc };
                            if damage.add(&mut report, d.hash.tag(), at, d.detail, false) {
                                progress.damaged_chunks.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        if stopped {
                            break 'packs;
                        }
                    }
                }
            }
        } else if opts.image.is_none() {
            let mut damaged_runs = Vec::new();
            chunks.scrub_entries(
                &mut |hash, at| {
                    let read = checked(&mut report, &mut damage, hash.tag(), Expected::Hash(hash), at);
                    !read || pacer.spend(CHUNK_BYTES as u64)
                },
                &mut |why| damaged_runs.push(why),
            )?;
            report.damaged_metadata.extend(damaged_runs);
        }
        // Every image's manifest: its pages read through (checked), each
        // ref named if damaged; with --image, each ref's chunk checked.
        'images: for name in &images {
            let manifest = match self.manifest(name) {
                Ok(m) => m,
                // Removed while the scrub ran.
                Err(crate::Error::NotFound(_)) => continue,
                Err(e) => {
                    report.damaged_metadata.push(format!("image {name}: opening its manifest: {e}"));
                    continue;
                }
            };
            for item in manifest.iter() {
                if stop.load(Ordering::Relaxed) {
                    break 'images;
                }
                let (block, r) = match item {
                    Ok(x) => x,
                    Err(e) => {
                        report.damaged_metadata.push(format!("image {name}: its manifest: {e}"));
                        break;
                    }
                };
                report.manifest_refs_walked += 1;
                if opts.image.is_some() {
                    let at = match r.at {
                        Some(at) => Some(at),
                        None => match chunks.locate(&r.tag) {
                            Ok(at) => at,
                            Err(e) => {
                                report
                                    .damaged_metadata
                                    .push(format!("finding chunk {} in the index: {e}", r.tag));
                                None
                            }
                        },
                    };
                    if let Some(at) = at {
                        let read = checked(&mut report, &mut damage, r.tag, Expected::Tag(&r.tag), at);
                        if read && !pacer.spend(CHUNK_BYTES as u64) {
                            break 'images;
                        }
                    }
                }
                damage.name(name, block, &r);
            }
        }
        report.findings = damage.findings;
        report.stopped = stop.load(Ordering::Relaxed);
        report.elapsed_ms = begun.elapsed().as_millis() as u64;
        progress.passes.fetch_add(1, Ordering::Relaxed);
        Ok(report)
    }
}
