//! The commands that work on a store nothing serves, as a user runs them:
//! `casblk fsck` (exit 0 on a clean store, 1 naming the damaged file and
//! offset, 2 when it cannot run; `--json` parses) and `casblk image export`.

mod common;

use cas::storage::{FsStorage, Storage};
use cas::{Store, StoreOptions};
use common::casblk;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;

/// Serialises the tests of this file. A store's lock is a flock on an
/// open file; a child that another test thread forks inherits that file
/// until it execs, so a store dropped at that moment stays locked for a
/// moment and an open right after fails. One test at a time: no fork
/// overlaps an in-process store.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn opts() -> StoreOptions {
    StoreOptions { background_compaction: false, ..StoreOptions::default() }
}

/// A store with one image of 64 distinct compacted blocks.
fn build(dir: &Path) {
    let storage: Arc<dyn Storage> = Arc::new(FsStorage::new());
    let store = Store::create(storage, dir, opts()).unwrap();
    store.create_image("vm", 1 << 20).unwrap();
    let image = store.open_image("vm").unwrap();
    let data: Vec<u8> = (0..64 * 4096u32).map(|i| (i / 4096 * 7 + i % 251) as u8 | 1).collect();
    image.write(0, &data, false).unwrap();
    image.flush().unwrap();
    store.compact_once(&image).unwrap();
}

#[test]
fn exit_status_says_clean_damaged_or_could_not_run() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    build(&dir);
    let out = casblk(&dir, &["fsck"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(": clean;") && text.contains("64 of 64 chunks verified"), "{text}");

    // A bit flip in slot 3 of the pack.
    let pack = dir.join("chunks/pack-00000001.pack");
    let mut bytes = std::fs::read(&pack).unwrap();
    bytes[4096 + 3 * 4096 + 9] ^= 4;
    std::fs::write(&pack, &bytes).unwrap();
    let out = casblk(&dir, &["fsck"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    let line = format!("problem: chunk-checksum: {} at offset {}", pack.display(), 4096 + 3 * 4096);
    assert!(text.contains(&line), "{text}");
    assert!(text.contains("problem: damaged-block: image vm: ") && text.contains("block 3 "), "{text}");
    let out = casblk(&dir, &["fsck", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("fsck --json prints JSON");
    assert_eq!(v["counts"]["chunks_verified"], 63);
    assert_eq!(v["problems"][0]["kind"], "chunk-checksum");

    // The store open elsewhere (as a daemon holds it): 2, with the reason.
    let storage: Arc<dyn Storage> = Arc::new(FsStorage::new());
    let held = Store::open(storage, &dir, opts()).unwrap();
    let out = casblk(&dir, &["fsck"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.starts_with("casblk: fsck: ") && err.contains("daemon has it open"), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    drop(held);
    let out = casblk(&tmp.path().join("none"), &["fsck"]);
    assert_eq!(out.status.code(), Some(2));
    let out = casblk(&dir, &["fsck", "--image", "../x"]);
    assert_eq!(out.status.code(), Some(2), "a bad image name is refused");
}

#[test]
fn fsck_repair_removes_leftovers_and_leaves_damage_alone() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    build(&dir);
    // Leftovers of interrupted writes: the store's and an image's file
    // that never reached their renames. fsck names them; --repair removes
    // them, and only them.
    let leftovers = [dir.join("STORE.tmp"), dir.join("images/vm/IMAGE.tmp")];
    for f in &leftovers {
        std::fs::write(f, b"half-written").unwrap();
    }
    let stranger = dir.join("notes.txt");
    std::fs::write(&stranger, b"an operator's file").unwrap();
    let out = casblk(&dir, &["fsck"]);
    let text = text_of(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    for f in &leftovers {
        let line = text.lines().find(|l| l.contains(&*f.display().to_string())).unwrap_or("");
        assert!(line.starts_with("problem: orphan-file: "), "{text}");
        assert!(f.exists(), "a dry run removes nothing");
    }
    let out = casblk(&dir, &["fsck", "--repair"]);
    let text = text_of(&out);
    assert_eq!(out.status.code(), Some(0), "repaired, then clean: {text}");
    for f in &leftovers {
        assert!(text.contains(&f.display().to_string()), "--repair says what it removed: {text}");
        assert!(!f.exists(), "{} is still there", f.display());
    }
    assert!(stranger.exists(), "a file casblk does not write is left alone");
    let out = casblk(&dir, &["fsck"]);
    assert_eq!(out.status.code(), Some(0), "{}", text_of(&out));

    // Damage is not repairable: --repair leaves it and still exits 1.
    let pack = dir.join("chunks/pack-00000001.pack");
    let mut bytes = std::fs::read(&pack).unwrap();
    bytes[4096 + 9] ^= 4;
    std::fs::write(&pack, &bytes).unwrap();
    let out = casblk(&dir, &["fsck", "--repair"]);
    assert_eq!(out.status.code(), Some(1), "{}", text_of(&out));
    assert_eq!(std::fs::read(&pack).unwrap(), bytes, "--repair never rewrites a damaged chunk");
}

#[test]
fn export_writes_every_byte_and_leaves_holes_sparse() {
    let _serial = serial();
    use std::os::unix::fs::MetadataExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    build(&dir);
    // Beyond the compacted 64 blocks: a write still in the log, a zeroed
    // range over compacted data, and an unwritten (hole) tail.
    let mut want: Vec<u8> = (0..64 * 4096u32).map(|i| (i / 4096 * 7 + i % 251) as u8 | 1).collect();
    want.resize(1 << 20, 0);
    {
        let storage: Arc<dyn Storage> = Arc::new(FsStorage::new());
        let store = Store::open(storage, &dir, opts()).unwrap();
        let image = store.open_image("vm").unwrap();
        image.write(100 * 4096, &[9u8; 8192], false).unwrap();
        image.write_zeroes(8 * 4096, 4 * 4096, false).unwrap();
        image.flush().unwrap();
    }
    want[100 * 4096..102 * 4096].fill(9);
    want[8 * 4096..12 * 4096].fill(0);
    let out = tmp.path().join("vm.raw");
    let o = casblk(&dir, &["image", "export", "vm", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read(&out).unwrap() == want, "the export differs from what was written");
    let allocated = std::fs::metadata(&out).unwrap().blocks() * 512;
    assert!(allocated < 1 << 20, "the hole tail is not sparse: {allocated} bytes allocated");

    let o = casblk(&dir, &["image", "export", "nope", tmp.path().join("nope.raw").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("image nope"));
    assert!(!tmp.path().join("nope.raw").exists());
    let o = casblk(&dir, &["image", "export", "vm", out.to_str().unwrap(), "--format", "vmdk"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("use --format raw or --format qcow2"));
}

#[test]
fn import_then_export_round_trips_a_raw_image() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("fresh-store");
    // 2 MiB + 100 bytes: data, a zero MiB, data; the size rounds up.
    let mut raw: Vec<u8> = (0..256 * 4096u32).map(|i| (i % 253) as u8 ^ (i / 4096) as u8 | 1).collect();
    raw.extend(vec![0u8; 1 << 20]);
    raw.extend((0..100u8).map(|i| i | 0x80));
    let src = tmp.path().join("disk.raw");
    std::fs::write(&src, &raw).unwrap();
    let o = casblk(&dir, &["image", "import", "vm", src.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&o.stderr));
    assert!(text.contains("imported vm:") && text.contains("256 zero blocks skipped"), "{text}");
    let out = tmp.path().join("back.raw");
    let o = casblk(&dir, &["image", "export", "vm", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    let mut want = raw.clone();
    want.resize(raw.len().div_ceil(4096) * 4096, 0);
    assert!(std::fs::read(&out).unwrap() == want, "the round trip changed the image");
    let o = casblk(&dir, &["fsck"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stdout));

    // From stdin it needs --size; an existing name is refused.
    let o = casblk(&dir, &["image", "import", "vm2", "-"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--size"));
    let o = casblk(&dir, &["image", "import", "vm", src.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already exists"));
    let o = Command::new(env!("CARGO_BIN_EXE_casblk"))
        .arg("--store")
        .arg(&dir)
        .args(["image", "import", "vm2", "-", "--size", "2M"])
        .stdin(std::fs::File::open(&src).unwrap())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("256 blocks deduplicated"));
}

/// What a command printed on stdout, whatever its exit status.
fn text_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn snapshot_clone_info_rollback_and_rm_refusals_from_the_command_line() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    build(&dir);
    assert_eq!(stdout(&casblk(&dir, &["image", "snapshot", "vm", "gold"])).trim(), "vm@gold");
    assert_eq!(stdout(&casblk(&dir, &["image", "clone", "vm@gold", "web"])).trim(), "web");
    let info: serde_json::Value =
        serde_json::from_str(&stdout(&casblk(&dir, &["image", "info", "vm", "--json"]))).unwrap();
    assert_eq!(info["kind"], "image");
    assert_eq!(info["logical_bytes"], 64 * 4096);
    assert_eq!(info["unique_bytes"], 0, "the snapshot and the clone share every chunk: {info}");
    assert_eq!(info["shared_bytes"], 64 * 4096);
    assert_eq!(info["snapshots"], serde_json::json!(["vm@gold"]));
    let snap: serde_json::Value =
        serde_json::from_str(&stdout(&casblk(&dir, &["image", "info", "vm@gold", "--json"]))).unwrap();
    assert_eq!((snap["kind"].as_str(), snap["parent"].as_str()), (Some("snapshot"), Some("vm")));
    assert_eq!(snap["clones"], serde_json::json!(["web"]));
    let text = stdout(&casblk(&dir, &["image", "info", "web"]));
    assert!(text.contains("parent:     vm@gold"), "{text}");
    let list = stdout(&casblk(&dir, &["image", "list"]));
    assert!(list.lines().any(|l| l.starts_with("web ") && l.ends_with("vm@gold")), "{list}");

    let out = casblk(&dir, &["image", "rm", "vm@gold"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("clones depend on it (web)") && !err.contains("panicked"), "{err}");
    let out = casblk(&dir, &["image", "rm", "vm"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("it has snapshots (vm@gold)"));

    // Overwrite vm, roll it back, and compare exports.
    let golden = tmp.path().join("gold.raw");
    stdout(&casblk(&dir, &["image", "export", "vm@gold", golden.to_str().unwrap()]));
    let junk = tmp.path().join("junk.raw");
    std::fs::write(&junk, vec![0xabu8; 1 << 20]).unwrap();
    stdout(&casblk(&dir, &["image", "import", "other", junk.to_str().unwrap()]));
    stdout(&casblk(&dir, &["image", "rollback", "vm", "gold"]));
    let back = tmp.path().join("back.raw");
    stdout(&casblk(&dir, &["image", "export", "vm", back.to_str().unwrap()]));
    assert_eq!(std::fs::read(&back).unwrap(), std::fs::read(&golden).unwrap());
    let out = casblk(&dir, &["fsck"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    let out = casblk(&dir, &["image", "snapshot", "vm", "a@b"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("contains '@'"));
}

fn run(cmd: &str, args: &[&str]) {
    let out =
        Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e} (ci/setup installs it)"));
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn qcow2_imports_natively_and_exports_through_qemu_img() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let q = tmp.path().join("disk.qcow2");
    let qs = q.to_str().unwrap();
    run("qemu-img", &["create", "-q", "-f", "qcow2", qs, "24M"]);
    // Data, a cluster written then zeroed, a write across a cluster edge, one past 16 MiB.
    for cmd in [
        "write -P 0x5a 0 1M",
        "write -P 0x11 2M 128k",
        "write -z 2M 64k",
        "write -P 0x77 4092k 8k",
        "write -P 0x33 17M 4k",
    ] {
        run("qemu-io", &["-f", "qcow2", "-c", cmd, qs]);
    }
    let text = stdout(&casblk(&dir, &["image", "import", "q", qs]));
    assert!(text.contains("imported q: 24.0 MiB read"), "{text}");
    let raw = tmp.path().join("want.raw");
    run("qemu-img", &["convert", "-f", "qcow2", "-O", "raw", qs, raw.to_str().unwrap()]);
    let back = tmp.path().join("back.raw");
    stdout(&casblk(&dir, &["image", "export", "q", back.to_str().unwrap()]));
    assert_eq!(
        std::fs::read(&back).unwrap(),
        std::fs::read(&raw).unwrap(),
        "imported qcow2 differs from qemu-img's reading"
    );
    let out_q = tmp.path().join("back.qcow2");
    stdout(&casblk(&dir, &["image", "export", "q", out_q.to_str().unwrap(), "--format", "qcow2"]));
    run("qemu-img", &["compare", "-q", "-f", "qcow2", "-F", "qcow2", qs, out_q.to_str().unwrap()]);
    assert!(!tmp.path().join("back.qcow2.raw-export").exists(), "the raw intermediate is removed");

    // Compressed clusters are refused in one line, naming the way in.
    let c = tmp.path().join("compressed.qcow2");
    let cs = c.to_str().unwrap();
    run("qemu-img", &["create", "-q", "-f", "qcow2", cs, "4M"]);
    run("qemu-io", &["-f", "qcow2", "-c", "write -c -P 0x42 0 64k", cs]);
    let out = casblk(&dir, &["image", "import", "c", cs]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("compressed clusters") && err.contains("qemu-img convert -O raw"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let listed = stdout(&casblk(&dir, &["image", "list"]));
    assert!(!listed.contains("\nc "), "a refused import leaves no image: {listed}");
}

#[test]
fn resize_grows_and_shrinks_a_detached_image_and_refuses_what_it_cannot_do() {
    let _serial = serial();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    build(&dir);
    let before = tmp.path().join("before.raw");
    stdout(&casblk(&dir, &["image", "export", "vm", before.to_str().unwrap()]));
    assert_eq!(
        stdout(&casblk(&dir, &["image", "resize", "vm", "3M"])).trim(),
        "vm: 1048576 -> 3145728 bytes"
    );
    let list: serde_json::Value =
        serde_json::from_str(&stdout(&casblk(&dir, &["image", "list", "--json"]))).unwrap();
    assert_eq!(list[0]["size_bytes"], 3 << 20, "{list}");
    let after = tmp.path().join("after.raw");
    stdout(&casblk(&dir, &["image", "export", "vm", after.to_str().unwrap()]));
    let (before, after) = (std::fs::read(&before).unwrap(), std::fs::read(&after).unwrap());
    assert_eq!(after.len(), 3 << 20);
    assert!(after[..before.len()] == before[..] && after[before.len()..].iter().all(|&b| b == 0));
    stdout(&casblk(&dir, &["image", "snapshot", "vm", "s"]));
    for (args, says) in [
        (&["image", "resize", "vm", "1M"][..], "resize with --shrink"),
        (&["image", "resize", "vm", "4M", "--shrink"][..], "grow it without --shrink"),
        (&["image", "resize", "vm@s", "1M", "--shrink"][..], "snapshots keep their size"),
        (&["image", "resize", "vm", "4097"][..], "must be a non-zero multiple of 4096"),
        (&["image", "resize", "vm@s", "8M"][..], "snapshots keep their size"),
        (&["image", "resize", "none", "8M"][..], "image none not found"),
        (&["image", "resize", "vm", "2P"][..], "up to"),
        (&["image", "resize", "vm", "ten"][..], "is not a size"),
    ] {
        let out = casblk(&dir, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.code().is_some_and(|c| c != 0), "{args:?} succeeded");
        // One line, but for clap's own usage error (a size it cannot parse).
        let lines = if says == "is not a size" { 3 } else { 1 };
        assert!(
            err.contains(says) && !err.contains("panicked") && err.trim().lines().count() <= lines,
            "{args:?}: {err}"
        );
    }
    // The shrink back: the first MiB as it was, the snapshot untouched.
    assert_eq!(
        stdout(&casblk(&dir, &["image", "resize", "vm", "1M", "--shrink"])).trim(),
        "vm: 3145728 -> 1048576 bytes"
    );
    let shrunk = tmp.path().join("shrunk.raw");
    stdout(&casblk(&dir, &["image", "export", "vm", shrunk.to_str().unwrap()]));
    assert_eq!(std::fs::read(&shrunk).unwrap(), before, "the shrunk image is the original");
    let out = casblk(&dir, &["fsck"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
}
