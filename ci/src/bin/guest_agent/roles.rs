//! What the guest does in each of the tests' boots. The harness's side of
//! each step is in `ci/e2e/t-guest-*.sh`; the words it writes on the
//! control disk are the ones waited for here.

use crate::console::say;
use crate::control::Control;
use crate::files::Files;
use crate::verify::Verifier;
use crate::{klog, sys, trim, Params};
use std::io::Write;
use std::time::{Duration, Instant};

/// Where the data disk is mounted.
const DATA: &str = "/data";
/// Size of each fsynced file.
const FILE_BYTES: usize = 64 << 10;
/// The verifier's file: 16 MiB of 4 KiB blocks.
const VERIFY_BLOCKS: u64 = 4096;
/// Verifier writes between two files.
const VERIFY_WRITES_PER_FILE: u64 = 32;
/// The longest the guest waits for the harness at any one point.
const HARNESS_WAIT: Duration = Duration::from_secs(900);
/// Written on the root by the first boot; its clones must have it.
const FIRST_BOOT_MARK: &str = "/first-boot";
/// Written on the root after the snapshot; its clones must not have it.
const AFTER_SNAPSHOT_MARK: &str = "/after-snapshot";

fn files(params: &Params) -> Result<Files, String> {
    Ok(Files::new(&format!("{DATA}/files"), params.number("seed")?, FILE_BYTES))
}

/// Writes `contents` to `path` and fsyncs the file and its directory.
fn write_durably(path: &str, contents: &str) -> Result<(), String> {
    let mut f = std::fs::File::create(path).map_err(|e| format!("creating {path}: {e}"))?;
    f.write_all(contents.as_bytes()).map_err(|e| format!("writing {path}: {e}"))?;
    f.sync_all().map_err(|e| format!("fsync of {path}: {e}"))?;
    let dir = std::path::Path::new(path).parent().unwrap_or(std::path::Path::new("/"));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("fsync of {}: {e}", dir.display()))
}

/// No IO error reached the guest: its kernel log has none and no
/// filesystem turned itself read-only.
fn check_clean(mounts: &[&str]) -> Result<(), String> {
    let trouble = klog::trouble()?;
    if !trouble.is_empty() {
        for line in &trouble {
            say(&format!("kernel: {line}"));
        }
        return Err(format!("{} troubling kernel messages (above)", trouble.len()));
    }
    for m in mounts {
        if sys::read_only(m)? {
            return Err(format!("{m} is mounted read-only"));
        }
    }
    say("clean: no IO error in the kernel log, filesystems writable");
    Ok(())
}

/// First boot: a fresh data disk, fsynced files and the verifier while the
/// harness kills, recovers and upgrades the daemon; then discard.
pub fn main(params: &Params) -> Result<(), String> {
    let ctl = Control::new(params.get("ctl")?);
    let data = params.get("data")?;
    let seed = params.number("seed")?;
    write_durably(FIRST_BOOT_MARK, &format!("seed {seed}\n"))?;
    sys::run("/sbin/mkfs.ext4", &["-q", "-F", data])?;
    sys::mount(data, DATA, "ext4", 0)?;
    say("data-mounted");

    let files = files(params)?;
    let mut verifier = Verifier::new(std::path::Path::new(&format!("{DATA}/verify")), VERIFY_BLOCKS, seed)?;
    let deadline = Instant::now() + HARNESS_WAIT;
    let mut written = 0u64;
    while !ctl.said("stop")? {
        if Instant::now() > deadline {
            return Err(format!("the harness did not say 'stop' within {} s", HARNESS_WAIT.as_secs()));
        }
        files.write(written)?;
        say(&format!("fsynced file={written}"));
        written += 1;
        verifier.write(VERIFY_WRITES_PER_FILE)?;
    }
    say(&format!("stopped files={written} verifier_writes={}", verifier.writes()));
    let blocks = verifier.verify_all()?;
    say(&format!("verified blocks={blocks}"));
    drop(verifier); // it holds its file open: /data must unmount at the end

    snapshot_point(&ctl)?;

    let fill_bytes = params.number("fill_mib")? << 20;
    let fill = format!("{DATA}/fill");
    trim::fill(&fill, fill_bytes, seed ^ 0xF111)?;
    say(&format!("filled bytes={fill_bytes}"));
    ctl.wait_for("delete", HARNESS_WAIT)?;
    let trimmed = trim::delete_and_trim(&fill, DATA)?;
    say(&format!("trimmed fs_bytes={trimmed}"));

    check_clean(&["/", DATA])?;
    sys::umount(DATA)
}

/// The root frozen (as `fsfreeze -f /` or a guest agent's fsfreeze would)
/// while the harness snapshots its disk, then written after the snapshot.
fn snapshot_point(ctl: &Control) -> Result<(), String> {
    sys::freeze("/")?;
    say("frozen");
    let waited = ctl.wait_for("snapshotted", HARNESS_WAIT);
    sys::thaw("/")?;
    waited?;
    write_durably(AFTER_SNAPSHOT_MARK, "written after the snapshot\n")?;
    say("after-snapshot");
    Ok(())
}

/// The first boot's data disk, booted again: every file it fsynced reads
/// back. Leaves the disk mounted on [`DATA`].
fn files_back(params: &Params) -> Result<(), String> {
    sys::mount(params.get("data")?, DATA, "ext4", 0)?;
    let files = files(params)?;
    let expect = params.number("expect")?;
    for i in 0..expect {
        files.check(i)?;
    }
    say(&format!("files-ok checked={expect} present={}", files.count()));
    Ok(())
}

/// A guest booted from a clone of the snapshot: it has what the first
/// boot wrote, not what came after the snapshot, and only its own writes.
/// Given the first boot's data disk too (`casblk.data`), it is that disk's
/// reboot as well: every file fsynced there reads back.
pub fn clone(params: &Params) -> Result<(), String> {
    let ctl = Control::new(params.get("ctl")?);
    let name = params.get("name")?;
    if !std::path::Path::new(FIRST_BOOT_MARK).exists() {
        return Err(format!("{FIRST_BOOT_MARK} is missing from the clone"));
    }
    if std::path::Path::new(AFTER_SNAPSHOT_MARK).exists() {
        return Err(format!("{AFTER_SNAPSHOT_MARK}, written after the snapshot, is in the clone"));
    }
    write_durably(&format!("/clone-{name}"), name)?;
    say(&format!("clone-written name={name}"));
    ctl.wait_for("both-written", HARNESS_WAIT)?;
    let mut marks: Vec<String> = std::fs::read_dir("/")
        .map_err(|e| format!("listing /: {e}"))?
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(String::from))
        .filter(|n| n.starts_with("clone-"))
        .collect();
    marks.sort();
    if marks != [format!("clone-{name}")] {
        return Err(format!("the root holds {marks:?}, not only clone-{name}"));
    }
    say(&format!("clone-ok name={name}"));
    if params.get("data").is_err() {
        return check_clean(&["/"]);
    }
    files_back(params)?;
    check_clean(&["/", DATA])?;
    sys::umount(DATA)
}

/// `ci/demo --guest`: what a guest sees of an image the host filled: the
/// files and bytes under its data disk, mounted read-only.
pub fn demo(params: &Params) -> Result<(), String> {
    sys::mount(params.get("data")?, DATA, "ext4", libc::MS_RDONLY)?;
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut dirs = vec![std::path::PathBuf::from(DATA)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| format!("listing {}: {e}", dir.display()))?.flatten()
        {
            let meta = entry.metadata().map_err(|e| format!("{}: {e}", entry.path().display()))?;
            if meta.is_dir() {
                dirs.push(entry.path());
            } else if meta.is_file() {
                // Read every byte: the guest's reads go through virtio-blk.
                bytes += std::fs::read(entry.path())
                    .map_err(|e| format!("reading {}: {e}", entry.path().display()))?
                    .len() as u64;
                files += 1;
            }
        }
    }
    say(&format!("saw files={files} bytes={bytes}"));
    // Mounted read-only on purpose: only the kernel log is checked.
    check_clean(&[])?;
    sys::umount(DATA)
}
