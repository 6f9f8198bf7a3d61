//! `casblk fsck`: an offline check of a whole store, or of one image.
//!
//! It owns no format of its own: every part is judged by the code that
//! opens it for service, run through a [`DryRun`] storage so nothing on
//! disk changes, and then checked further than an open does:
//!
//! ```text
//!  STORE            crc32c and version
//!  chunks/index     every batch's crc32c (journal replay); a torn tail is a note
//!  chunks/pack-*    every referenced pack's header; every chunk's bytes against
//!                   its crc32c and its blake3 name; packs nothing references
//!  images/N/IMAGE   crc32c and version
//!  images/N/manifest both roots, every page's crc32c (each pointer carries its
//!                   child's), every mapped block's chunk in the index and intact,
//!                   page and block counts against the root
//!  images/N/wal/    WAL recovery's rules: every record's crc32c, no hole in the
//!                   durable part of the log (a torn tail is a note)
//!  leftovers        *.tmp, manifest.new, image directories without IMAGE
//! ```
//!
//! Reference counts: the store keeps none on disk (GC marks from the
//! manifests), so fsck counts, per chunk, the manifest blocks that name it:
//! a reference to a chunk the index lacks, or whose bytes are bad, is a
//! problem naming the image and block; a chunk nothing references is
//! garbage GC will sweep (counted, not a problem).
//!
//! Problems make `casblk fsck` exit 1. `--repair` ([`FsckOptions::repair`])
//! makes only the changes the dry run recorded for repairable findings —
//! the changes an open would make itself: delete leftovers of interrupted
//! operations and orphan packs, cut torn tails (never synced, so never
//! acknowledged) — and checks again. It never rewrites or drops data a
//! manifest, an index entry or a durable log record points at.
//!
//! fsck holds the store's lock, so it refuses a store a daemon serves.

pub use crate::report::{describe, Finding, FsckCounts, FsckReport, LISTED_MAX};

use crate::chunk::check::{ChunkState, IndexCheck};
use crate::error::{Error, Result};
use crate::image::WAL_DIR;
use crate::manifest::{Manifest, ManifestOptions};
use crate::storage::{Change, DryRun, Storage};
use crate::store::{
    check_image_dir_name, files, ImageHeader, IMAGE_FILE, LOCK_FILE, MANIFEST_FILE, STORE_FILE,
};
use crate::units::BLOCK_BYTES;
use crate::wal::recovery::recover_log;
use std::path::Path;
use std::sync::Arc;

/// What to check and whether to repair.
#[derive(Clone, Debug, Default)]
pub struct FsckOptions {
    /// Check only this image: its manifest, its log and the chunks it
    /// references (store-wide findings such as orphan packs are skipped).
    pub image: Option<String>,
    /// Make the repairable findings' changes, then check again.
    pub repair: bool,
}

/// Checks the store in `dir`. `Err` only when the check could not run
/// (no store there, its lock held by a daemon, a newer format); every
/// damage found is in the report.
pub fn check(storage: Arc<dyn Storage>, dir: &Path, opts: &FsckOptions) -> Result<FsckReport> {
    if !storage.exists(&dir.join(STORE_FILE)) {
        return Err(Error::NotFound(format!("casblk store at {} (no {STORE_FILE} file)", dir.display())));
    }
    let _held = storage.lock_exclusive(&dir.join(LOCK_FILE)).map_err(|e| match e {
        Error::Unavailable(..) => Error::Unavailable(
            format!("store {}", dir.display()),
            "a casblk daemon has it open; fsck checks a store nothing serves (stop its devices first)".into(),
        ),
        e => e,
    })?;
    if let Some(name) = &opts.image {
        check_image_dir_name(name)?;
        if !storage.exists(&dir.join("images").join(name).join(IMAGE_FILE)) {
            return Err(Error::NotFound(format!("image {name}")));
        }
    }
    let first = check_locked(&storage, dir, opts)?;
    if !opts.repair {
        return Ok(first);
    }
    let mut repaired = Vec::new();
    for f in first.problems.iter().chain(&first.notes) {
        if let Some(c) = &f.repair {
            c.apply(&*storage)?;
            repaired.push(describe(c));
        }
    }
    let mut again = check_locked(&storage, dir, opts)?;
    again.repaired = repaired;
    Ok(again)
}

fn check_locked(storage: &Arc<dyn Storage>, dir: &Path, opts: &FsckOptions) -> Result<FsckReport> {
    let dry = Arc::new(DryRun::new(storage.clone()));
    let dry_dyn: Arc<dyn Storage> = dry.clone();
    let mut report =
        FsckReport { store: dir.to_path_buf(), image: opts.image.clone(), ..FsckReport::default() };
    let whole = opts.image.is_none();
    match files::read_store(&*dry, &dir.join(STORE_FILE)) {
        Err(e @ Error::UnsupportedVersion { .. }) => return Err(e),
        Err(e) => report.problem(Finding::from_error("store-header", None, &dir.join(STORE_FILE), &e)),
        Ok(_) => {}
    }
    if whole {
        check_top_level(&dry, dir, &mut report)?;
    }
    let chunks_dir = dir.join("chunks");
    let mut index =
        IndexCheck::load(&*dry, &chunks_dir, &mut report, &crate::bucket::packs::check::TIER_CHECK);
    take_changes(&dry, None, &mut report);
    if !whole {
        // Store-wide findings belong to a whole-store check.
        report.problems.retain(|f| f.kind != "orphan-pack");
    }

    let images_dir = dir.join("images");
    let names = match &opts.image {
        Some(n) => vec![n.clone()],
        None => dry.list_dir(&images_dir)?,
    };
    let mut manifests = Vec::new();
    for name in names {
        let idir = images_dir.join(&name);
        if check_image_dir_name(&name).is_err() {
            let f = Finding::new("unknown-file", None, &idir, "not an image name; left alone");
            report.note(f);
            continue;
        }
        if !dry.exists(&idir.join(IMAGE_FILE)) {
            let detail = "an image directory without IMAGE (a create or remove a crash cut short)";
            let f = Finding::new("orphan-image-dir", Some(&name), &idir, detail)
                .repair(Change::RemoveDir { path: idir.clone() });
            report.problem(f);
            continue;
        }
        report.counts.images += 1;
        if let Some(m) = check_image(&dry_dyn, &idir, &name, &mut report)? {
            manifests.push((name.clone(), m));
        }
        take_changes(&dry, Some(&name), &mut report);
    }

    let Some(index) = index.as_mut() else {
        let f = Finding::new(
            "references-unchecked",
            None,
            &chunks_dir,
            "the chunk index could not be read, so no manifest reference could be checked",
        );
        report.note(f);
        return Ok(report);
    };
    // Count references, then read the chunks, then name the blocks that
    // lost theirs.
    for (name, m) in &manifests {
        count_references(&*dry, m, name, index, &mut report);
    }
    index.verify(&*dry, !whole, &mut report);
    let refs: Vec<u64> = index.entries.iter().map(|e| u64::from(e.refs)).collect();
    report.counts.referenced_chunks = refs.iter().filter(|&&r| r > 0).count() as u64;
    report.counts.max_references = refs.iter().copied().max().unwrap_or(0);
    if whole {
        report.counts.unreferenced_chunks = report.counts.chunks - report.counts.referenced_chunks;
    }
    if index.entries.iter().any(|e| e.refs > 0 && matches!(e.state, ChunkState::Damaged | ChunkState::Lost)) {
        for (name, m) in &manifests {
            name_damaged_blocks(m, name, index, &mut report);
        }
    }
    take_changes(&dry, None, &mut report);
    Ok(report)
}

/// Leftovers and strangers at the top of the store directory.
fn check_top_level(dry: &DryRun, dir: &Path, report: &mut FsckReport) -> Result<()> {
    for name in dry.list_dir(dir)? {
        let path = dir.join(&name);
        match name.as_str() {
            n if n == STORE_FILE || n == LOCK_FILE || n == "chunks" || n == "images" => {}
            _ if path == files::tmp_path(dir, STORE_FILE) => {
                let detail = "a store creation that never reached its rename";
                report.problem(
                    Finding::new("orphan-file", None, &path, detail).repair(Change::Remove { path }),
                );
            }
            _ => {
                report.note(Finding::new("unknown-file", None, &path, "not a file casblk writes; left alone"))
            }
        }
    }
    for sub in ["chunks", "images"] {
        if !dry.exists(&dir.join(sub)) {
            report.problem(Finding::new(
                "missing-dir",
                None,
                &dir.join(sub),
                "the store has no such directory",
            ));
        }
    }
    Ok(())
}

/// Checks one image's header, manifest and log; returns its manifest (the
/// reference walk comes later) if it opened.
fn check_image(
    dry: &Arc<dyn Storage>,
    idir: &Path,
    name: &str,
    report: &mut FsckReport,
) -> Result<Option<Manifest>> {
    let header = match ImageHeader::read(&**dry, &idir.join(IMAGE_FILE)) {
        Ok(h) => h,
        Err(e @ Error::UnsupportedVersion { .. }) => return Err(e),
        Err(e) => {
            report.problem(Finding::from_error("image-header", Some(name), &idir.join(IMAGE_FILE), &e));
            return Ok(None);
        }
    };
    let tmp = files::tmp_path(idir, IMAGE_FILE);
    if dry.exists(&tmp) {
        let detail = "an IMAGE write that never reached its rename";
        report.problem(
            Finding::new("orphan-file", Some(name), &tmp, detail).repair(Change::Remove { path: tmp }),
        );
    }
    let mpath = idir.join(MANIFEST_FILE);
    let manifest = match Manifest::open(dry.clone(), &mpath, ManifestOptions::default()) {
        Ok(m) => Some(m),
        Err(e @ Error::UnsupportedVersion { .. }) => return Err(e),
        Err(e) => {
            report.problem(Finding::from_error("manifest", Some(name), &mpath, &e));
            None
        }
    };
    // The log: replayed above what the manifest covers, as an open does.
    // Without a manifest, a covered seq is unknown; the whole log is read.
    let covered = manifest.as_ref().map_or(0, Manifest::covered);
    let wal = idir.join(WAL_DIR);
    let size_bytes = header.size_bytes;
    let mut beyond = None;
    match recover_log(&**dry, &wal, header.log_id, covered, &mut |seg, pos, h| {
        if h.offset_bytes.saturating_add(h.len_bytes) > size_bytes && beyond.is_none() {
            beyond = Some((seg.path().to_path_buf(), pos, h.seq));
        }
    }) {
        Ok(r) => {
            report.counts.log_segments += r.report.segments;
            report.counts.log_records += r.report.records;
            report.counts.torn_tail_bytes += r.report.torn_tail_bytes;
        }
        Err(e @ Error::UnsupportedVersion { .. }) => return Err(e),
        Err(e) => report.problem(Finding::from_error("log", Some(name), &wal, &e)),
    }
    if let Some((path, pos, seq)) = beyond {
        let detail = format!("record seq {seq} writes past the image's {size_bytes} bytes");
        report.problem(Finding::new("log", Some(name), &path, detail).at(pos));
    }
    Ok(manifest)
}

/// Walks `m`, counting each mapped block against its chunk's entry, and
/// reports damaged pages, references to chunks the index lacks, and counts
/// that disagree with the root.
fn count_references(
    storage: &dyn Storage,
    m: &Manifest,
    name: &str,
    index: &mut IndexCheck,
    report: &mut FsckReport,
) {
    let path = m.path().to_path_buf();
    let mut missing = Vec::new();
    let mut wrong_crc = Vec::new();
    let mut wrong_place = Vec::new();
    let mut damaged = Vec::new();
    let live_packs = index.referenced_packs.clone();
    let foreign = index.foreign_packs.clone();
    let mut foreign_refs = 0u64;
    let counts = m.check_tree(
        &mut |block, r| {
            let is_foreign = r.at.is_some_and(|at| foreign.binary_search(&at.pack).is_ok());
            foreign_refs += u64::from(is_foreign);
            match index.find(&r.tag) {
                // Another store's chunk the index does not hold (an import cut short).
                None if is_foreign => {}
                Some(e) => {
                    e.refs = e.refs.saturating_add(1);
                    if let Some(at) = r.at {
                        if at.crc != e.crc {
                            wrong_crc.push((block, *r, e.crc));
                        } else if live_packs.binary_search(&at.pack).is_ok()
                            && (at.pack, at.slot) != (e.pack, e.slot)
                        {
                            // Reads go to a pack that exists: it must be where the chunk is.
                            wrong_place.push((block, *r, e.pack, e.slot));
                        }
                    }
                }
                None => missing.push((block, r.tag)),
            }
        },
        &mut |e, first, span| {
            damaged.push((Finding::from_error("manifest-page", Some(name), &path, e), first, span))
        },
    );
    report.counts.manifest_pages += counts.pages;
    report.counts.references += counts.mapped_blocks;
    report.counts.foreign_references += foreign_refs;
    for (mut f, first, span) in damaged {
        f.detail += &format!(" (blocks {first}..{} are unreadable)", u128::from(first) + span);
        report.problem(f);
    }
    for (block, tag) in missing {
        let detail = format!(
            "block {block} (byte {}) maps chunk {tag}, which the chunk index does not have",
            block * BLOCK_BYTES,
        );
        report.problem(Finding::new("missing-chunk", Some(name), &path, detail));
    }
    for (block, r, crc) in wrong_crc {
        let at = r.at.expect("only located refs disagree");
        let detail = format!(
            "block {block} (byte {}) maps chunk {} at pack {} slot {} with crc32c {:#010x}; the chunk index says {crc:#010x}",
            block * BLOCK_BYTES,
            r.tag,
            at.pack,
            at.slot,
            at.crc
        );
        report.problem(Finding::new("ref-checksum", Some(name), &path, detail));
    }
    for (block, r, pack, slot) in wrong_place {
        let at = r.at.expect("only located refs are misplaced");
        // A chunk GC was moving when the store stopped is still in its old
        // slot: reads are right until the pass that finishes the move.
        if index.slot_crc(storage, at.pack, at.slot) == Some(at.crc) {
            continue;
        }
        let detail = format!(
            "block {block} (byte {}) maps chunk {} at pack {} slot {}; the chunk index has it at pack {pack} slot {slot}",
            block * BLOCK_BYTES,
            r.tag,
            at.pack,
            at.slot,
        );
        report.problem(Finding::new("ref-location", Some(name), &path, detail));
    }
    let stats = m.stats();
    if counts.damaged_pages == 0
        && (counts.pages != stats.live_pages || counts.mapped_blocks != stats.mapped_blocks)
    {
        let detail = format!(
            "the root records {} live pages and {} mapped blocks; the tree holds {} and {}",
            stats.live_pages, stats.mapped_blocks, counts.pages, counts.mapped_blocks
        );
        report.problem(Finding::new("manifest-counts", Some(name), &path, detail));
    }
}

/// Names every block of `m` whose chunk is damaged or lost.
fn name_damaged_blocks(m: &Manifest, name: &str, index: &mut IndexCheck, report: &mut FsckReport) {
    let path = m.path().to_path_buf();
    let mut found = Vec::new();
    m.check_tree(
        &mut |block, r| {
            if let Some(e) = index.find(&r.tag) {
                if matches!(e.state, ChunkState::Damaged | ChunkState::Lost) {
                    found.push((block, *e));
                }
            }
        },
        &mut |_, _, _| {},
    );
    for (block, e) in found {
        let (pack, offset) = index.location(&e);
        let detail = format!(
            "block {block} (byte {}) maps chunk {}, whose bytes at {} offset {offset} are {}",
            block * BLOCK_BYTES,
            e.hash,
            pack.display(),
            if e.state == ChunkState::Lost { "lost" } else { "damaged" }
        );
        report.problem(Finding::new("damaged-block", Some(name), &path, detail));
    }
}

/// Turns what the dry run recorded into findings: the cleanups an open
/// would have made.
fn take_changes(dry: &DryRun, image: Option<&str>, report: &mut FsckReport) {
    for c in dry.take_changes() {
        let path = c.path().to_path_buf();
        let f = match &c {
            Change::Truncate { len_bytes, was_bytes, .. } => {
                let cut = was_bytes.saturating_sub(*len_bytes);
                if path.extension().is_none_or(|e| e != "wal") {
                    // WAL recovery counts its own torn tails.
                    report.counts.torn_tail_bytes += cut;
                }
                let detail =
                    format!("torn tail: {cut} bytes after offset {len_bytes} were never made durable; an open cuts them");
                report.note(Finding::new("torn-tail", image, &path, detail).at(*len_bytes).repair(c));
                continue;
            }
            Change::Remove { .. } if path.extension().is_some_and(|e| e == "wal") => {
                let detail = "a segment an open deletes (a torn tail, or covered by the manifest)";
                Finding::new("stale-segment", image, &path, detail).repair(c)
            }
            Change::Remove { .. } => {
                let detail = "left by an operation a crash cut short (an open deletes it)";
                Finding::new("orphan-file", image, &path, detail).repair(c)
            }
            Change::RemoveDir { .. } | Change::Other { .. } => {
                let detail = format!("an open would make this change: {}", describe(&c));
                Finding::new("open-change", image, &path, detail)
            }
        };
        if f.kind == "stale-segment" {
            report.note(f);
        } else {
            report.problem(f);
        }
    }
}
