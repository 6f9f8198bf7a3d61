//! `casblk fsck`: runs `cas::fsck` on a store nothing serves and prints
//! what it found. Exit status: 0 clean, 1 problems found, 2 could not run
//! (no store, a daemon has it open, a newer format, bad arguments).

use crate::cli::FsckArgs;
use cas::fsck::{FsckOptions, FsckReport};
use cas::storage::{FsStorage, Storage};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

pub fn run(store: &Path, args: &FsckArgs) -> ExitCode {
    let report = crate::client::store_dir(store, false).and_then(|dir| {
        let storage: Arc<dyn Storage> = Arc::new(FsStorage::new());
        let opts = FsckOptions { image: args.image.clone(), repair: args.repair };
        Ok(cas::fsck::check(storage, &dir, &opts)?)
    });
    let report = match report {
        Ok(r) => r,
        Err(e) => {
            eprintln!("casblk: fsck: {e:#}");
            return ExitCode::from(2);
        }
    };
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("casblk: fsck: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        print_text(&report);
    }
    if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn print_text(r: &FsckReport) {
    for line in &r.repaired {
        println!("repaired: {line}");
    }
    for f in &r.problems {
        println!("problem: {}", f.line());
    }
    if r.problems_unlisted > 0 {
        println!("problem: ... and {} more not listed", r.problems_unlisted);
    }
    for f in &r.notes {
        println!("note: {}", f.line());
    }
    if r.notes_unlisted > 0 {
        println!("note: ... and {} more not listed", r.notes_unlisted);
    }
    let c = &r.counts;
    let scope = r.image.as_ref().map_or(String::new(), |i| format!(" (image {i})"));
    let verdict = if r.is_clean() {
        "clean".to_string()
    } else {
        format!("{} problems", r.problems.len() as u64 + r.problems_unlisted)
    };
    println!(
        "fsck {}{scope}: {verdict}; {} images, {} of {} chunks verified ({}) in {} packs, {} references to {} \
         chunks (at most {} to one, {} unreferenced), {} manifest pages, {} log records in {} segments, {} of \
         torn tail",
        r.store.display(),
        c.images,
        c.chunks_verified,
        c.chunks,
        trace::human_bytes(c.bytes_verified),
        c.packs,
        c.references,
        c.referenced_chunks,
        c.max_references,
        c.unreferenced_chunks,
        c.manifest_pages,
        c.log_records,
        c.log_segments,
        trace::human_bytes(c.torn_tail_bytes),
    );
}
