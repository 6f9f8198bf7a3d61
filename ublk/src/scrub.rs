//! `casblk scrub`: one scrub pass over a store (or one image's chunks, or
//! the bucket's copies of its packs with `--bucket`).
//! With a daemon serving the store the pass runs in the daemon, in the
//! background, and this command follows it until it ends (`--no-wait`
//! returns at once; `--status` shows it); without one it runs here. Exit 0
//! clean (or every damaged chunk repaired from the bucket), 1 with damage
//! left (named, with the image blocks that hold it).

use crate::cli::ScrubArgs;
use crate::client::{control, open_store, running_daemon, store_dir, QUERY_TIMEOUT};
use crate::protocol::Command;
use crate::targets::cas::DEFAULT_SCRUB_RATE_BYTES_PER_SEC;
use anyhow::{anyhow, bail, Result};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// How often a following client asks the daemon how far the pass got.
const POLL: Duration = Duration::from_secs(1);

pub fn run(store: &Path, args: &ScrubArgs) -> Result<()> {
    let dir = store_dir(store, false)?;
    let rate = args.rate.unwrap_or(DEFAULT_SCRUB_RATE_BYTES_PER_SEC);
    let Some(socket) = running_daemon(&dir) else {
        if args.status || args.no_wait {
            bail!("no daemon serves store {}: --status and --no-wait need one", dir.display());
        }
        let opts =
            cas::ScrubOptions { image: args.image.clone(), rate_bytes_per_sec: rate, bucket: args.bucket };
        let report =
            open_store(&dir, false)?.scrub(&opts, &cas::ScrubProgress::default(), &AtomicBool::new(false))?;
        return finish(&report, args.json);
    };
    if args.status {
        let status = control(&socket, Command::ScrubStatus {}, QUERY_TIMEOUT)?;
        println!("{}", serde_json::to_string_pretty(&status)?);
        return Ok(());
    }
    let started = control(
        &socket,
        Command::Scrub { image: args.image.clone(), rate_bytes_per_sec: rate, bucket: args.bucket },
        QUERY_TIMEOUT,
    )?;
    let passes_before = started["passes"].as_u64().unwrap_or(0);
    if args.no_wait {
        println!("scrub of the {} started in the store's daemon", started["started"].as_str().unwrap_or("?"));
        return Ok(());
    }
    loop {
        std::thread::sleep(POLL);
        let status = control(&socket, Command::ScrubStatus {}, QUERY_TIMEOUT)?;
        let passes = status["progress"]["passes"].as_u64().unwrap_or(0);
        if status["running"].is_null() && passes > passes_before {
            let report: cas::ScrubReport = serde_json::from_value(status["last"].clone())
                .map_err(|e| anyhow!("malformed scrub report ({e}): {status}"))?;
            return finish(&report, args.json);
        }
        if status["running"].is_null() {
            bail!("the daemon's scrub ended without a report (see its log)");
        }
    }
}

/// Prints the report; an error (exit 1) if it found damage.
fn finish(r: &cas::ScrubReport, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(r)?);
    } else {
        for f in &r.findings {
            let blocks: Vec<String> =
                f.blocks.iter().map(|b| format!("{} block {}", b.image, b.block)).collect();
            let more = f.blocks_total.saturating_sub(f.blocks.len() as u64);
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            let held = if blocks.is_empty() { "no image block".to_string() } else { blocks.join(", ") };
            let fixed = if f.repaired { "; repaired from the bucket's copy" } else { "" };
            println!("damaged: {} (held by {held}{more}){fixed}", f.detail);
        }
        for m in &r.damaged_metadata {
            println!("damaged: {m}");
        }
        println!(
            "scrub of the {}: {} chunks ({}) checked, {} manifest refs walked, {} damaged chunks ({} repaired), \
             {} damaged metadata, in {:.1} s{}",
            r.scope,
            r.chunks_checked,
            trace::human_bytes(r.bytes_checked),
            r.manifest_refs_walked,
            r.damaged_chunks,
            r.repaired_chunks,
            r.damaged_metadata.len(),
            r.elapsed_ms as f64 / 1000.0,
            if r.stopped { " (stopped before the end)" } else { "" }
        );
    }
    if !r.is_clean() {
        bail!(
            "scrub found {} damaged chunks ({} repaired) and {} damaged metadata in the {}",
            r.damaged_chunks,
            r.repaired_chunks,
            r.damaged_metadata.len(),
            r.scope
        );
    }
    Ok(())
}
