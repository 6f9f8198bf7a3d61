//! `casblk image import` and `export`: whole images in and out of a store.
//! Offline (nothing serves the store) the command opens the store itself;
//! when a daemon serves it, the command asks the daemon, which runs the
//! same functions on its store with the (absolute) paths it is given. An
//! attached image is not exported (it changes while it is read): export a
//! snapshot of it.
//!
//! Export writes an image as a raw, sparse file: blocks that read as zeros
//! (holes, discarded or zeroed ranges, or data that happens to be zero)
//! are not written; its length is the image's size; it is synced before
//! the command returns.
//!
//! `--format qcow2` exports through `qemu-img convert` from a sparse raw
//! file written beside the output (removed afterwards).
//!
//! Import reads a raw file, a qcow2 file (recognised by its magic, read
//! natively by `qcow2.rs`: only allocated clusters), or stdin (raw, with
//! `--size`) into a new image straight through `cas::Store::import_image`:
//! chunks and manifest, no log. The image exists only once the whole
//! import is durable. On a terminal, stderr shows a progress bar.

use anyhow::{anyhow, bail, Context, Result};
use std::path::Path;
use std::sync::Arc;

const BLOCK_BYTES: usize = cas::units::BLOCK_BYTES as usize;

/// The refusal of offline command `what` on a store a daemon serves.
pub(crate) fn served(dir: &Path, what: &str) -> anyhow::Error {
    anyhow!(
        "store {} is served by a running casblk daemon; {what} works on a store nothing serves \
         (stop its devices first)",
        dir.display()
    )
}

/// Opens (`create`: or creates) the store in `dir` for an offline command
/// (`what`), without background compaction.
fn open_offline(dir: &Path, what: &str, create: bool) -> Result<Arc<cas::Store>> {
    let storage: Arc<dyn cas::storage::Storage> = Arc::new(cas::storage::FsStorage::new());
    let opts = cas::StoreOptions {
        background_compaction: false,
        gc_auto: cas::gc::AutoGcOptions::off(),
        remote: crate::remote::store_remote(dir)?,
        ..cas::StoreOptions::default()
    };
    let store = if create {
        cas::Store::open_or_create(storage, dir, opts)
    } else {
        cas::Store::open(storage, dir, opts)
    };
    store.map_err(|e| match e {
        cas::Error::Unavailable(..) => served(dir, what),
        e => anyhow!("store {}: {e}", dir.display()),
    })
}

/// `casblk image export` on a store nothing serves.
pub fn export(dir: &Path, name: &str, output: &Path, format: &str) -> Result<()> {
    check_format(format)?;
    export_from(&*open_offline(dir, "export", false)?, name, output, format)
}

fn check_format(format: &str) -> Result<()> {
    match format {
        "raw" | "qcow2" => Ok(()),
        _ => bail!("export format {format:?} is not supported; use --format raw or --format qcow2"),
    }
}

/// Exports image `name` of `store` to `output` in `format` (raw or qcow2).
pub fn export_from(store: &cas::Store, name: &str, output: &Path, format: &str) -> Result<()> {
    check_format(format)?;
    if format == "raw" {
        return export_raw(store, name, output);
    }
    let mut tmp = output.as_os_str().to_owned();
    tmp.push(".raw-export");
    let tmp = std::path::PathBuf::from(tmp);
    let converted = export_raw(store, name, &tmp).and_then(|()| qemu_img_to_qcow2(&tmp, output));
    let _ = std::fs::remove_file(&tmp);
    converted
}

/// `qemu-img convert -f raw -O qcow2 RAW OUTPUT`.
fn qemu_img_to_qcow2(raw: &Path, output: &Path) -> Result<()> {
    let out = std::process::Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "qcow2"])
        .arg(raw)
        .arg(output)
        .output()
        .map_err(|e| anyhow!("running qemu-img for the qcow2 export: {e} (install qemu-utils)"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!("qemu-img convert to qcow2 failed: {}", err.trim());
    }
    Ok(())
}

fn export_raw(store: &cas::Store, name: &str, output: &Path) -> Result<()> {
    // A missing image is refused before the output exists.
    store.open_image(name).with_context(|| format!("image {name}"))?;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(output)
        .with_context(|| format!("creating {}", output.display()))?;
    store
        .export_image(name, &file, output, &mut |_| {})
        .with_context(|| format!("exporting image {name}"))?;
    Ok(())
}

/// `casblk image import` on a store nothing serves (created if missing).
/// Prints one summary line.
pub fn import(dir: &Path, name: &str, input: &Path, size: Option<u64>) -> Result<()> {
    let store = open_offline(dir, "import", true)?;
    println!("{}", import_into(&store, name, input, size, true)?);
    Ok(())
}

/// Imports FILE (or stdin, `-`, which needs `size`) as new image `name` of
/// `store`. The size defaults to the guest size of a qcow2 file, else the
/// file's, rounded up to 4 KiB (the tail reads as zeros). With `bar`, on a
/// terminal, stderr shows progress. Returns the summary line.
pub fn import_into(
    store: &cas::Store,
    name: &str,
    input: &Path,
    size: Option<u64>,
    bar: bool,
) -> Result<String> {
    use std::io::IsTerminal;
    let stdin = input == Path::new("-");
    let round_up = |len: u64| len.div_ceil(BLOCK_BYTES as u64) * BLOCK_BYTES as u64;
    let (mut src, guest_bytes): (Box<dyn std::io::Read>, Option<u64>) = if stdin {
        (Box::new(std::io::stdin().lock()), None)
    } else {
        let file = std::fs::File::open(input).with_context(|| format!("opening {}", input.display()))?;
        if crate::qcow2::is_qcow2(&file)? {
            let reader = crate::qcow2::Qcow2Reader::open(input)?;
            let len = reader.size();
            (Box::new(reader), Some(len))
        } else {
            let len = file.metadata().with_context(|| format!("{}", input.display()))?.len();
            (Box::new(file), Some(len))
        }
    };
    let size = match (size, guest_bytes) {
        (Some(s), _) => s,
        (None, None) => bail!("importing from stdin needs --size"),
        (None, Some(0)) => bail!("{} is empty: nothing to import", input.display()),
        (None, Some(len)) => round_up(len),
    };
    let bar = if bar && std::io::stderr().is_terminal() {
        let style = indicatif::ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        indicatif::ProgressBar::new(size).with_style(style).with_message(format!("importing {name}"))
    } else {
        indicatif::ProgressBar::hidden()
    };
    let t0 = std::time::Instant::now();
    let report = store
        .import_image(name, size, &mut src, &mut |done| bar.set_position(done))
        .with_context(|| format!("importing {} as image {name}", input.display()))?;
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64().max(1e-6);
    Ok(format!(
        "imported {name}: {} read in {secs:.1} s ({}/s), {} zero blocks skipped, {} new chunks, {} blocks deduplicated",
        trace::human_bytes(report.bytes_read),
        trace::human_bytes((report.bytes_read as f64 / secs) as u64),
        report.zero_blocks,
        report.new_chunks,
        report.dedup_blocks
    ))
}
