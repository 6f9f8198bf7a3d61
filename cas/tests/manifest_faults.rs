//! Manifest commits under injected EIO / ENOSPC: each gives an error,
//! never a damaged manifest. Failures before anything could reach the
//! root leave the manifest usable; failures after (a sync, the root write,
//! the directory sync after the rename) poison it until reopened, and the
//! reopened manifest is the old tree or the new one.

use cas::chunk::{ChunkHash, ChunkRef};
use cas::manifest::{Manifest, ManifestOptions};
use cas::storage::{CrashMode, Fault, FaultOp, MemStorage, Storage};
use cas::Error;
use std::path::Path;
use std::sync::Arc;

const PATH: &str = "/img/manifest";

fn setup() -> MemStorage {
    let s = MemStorage::new();
    s.create_dir_all(Path::new("/img")).unwrap();
    s.sync_dir(Path::new("/")).unwrap();
    s
}

fn open(s: &MemStorage) -> Manifest {
    Manifest::open(Arc::new(s.clone()), Path::new(PATH), ManifestOptions::default()).unwrap()
}

fn h(tag: u8) -> ChunkRef {
    ChunkHash::from_bytes([tag; 32]).into()
}

fn commit(m: &Manifest, tag: u8, covered: u64) -> cas::Result<()> {
    let mut e = m.begin();
    for b in 0..500 {
        e.set(b, Some(h(tag)));
    }
    e.commit(covered).map(|_| ())
}

fn assert_all(m: &Manifest, tag: u8) {
    for b in (0..500).step_by(37) {
        assert_eq!(m.lookup(b).unwrap(), Some(h(tag)), "block {b}");
    }
}

fn fault(op: FaultOp, path: &str, errno: i32, skip: u64) -> Fault {
    Fault { op, path_contains: Some(path.into()), skip, errno, sticky: false }
}

#[test]
fn failures_before_the_root_leave_the_manifest_usable() {
    let s = setup();
    let m = open(&s);
    // First commit: the new file cannot be created, written or renamed.
    for f in [
        fault(FaultOp::Open, "manifest.new", libc::ENOSPC, 0),
        fault(FaultOp::Write, "manifest.new", libc::ENOSPC, 0),
        fault(FaultOp::Sync, "manifest.new", libc::EIO, 0),
        fault(FaultOp::Namespace, "manifest.new", libc::EIO, 0),
    ] {
        s.inject(f.clone());
        assert!(commit(&m, 1, 1).is_err(), "{f:?}");
        s.clear_faults();
        assert_eq!(m.lookup(0).unwrap(), None);
        assert!(!s.exists(Path::new("/img/manifest.new")), "{f:?}: tmp file left behind");
    }
    commit(&m, 1, 1).unwrap();
    // In place: page writes fail (ENOSPC) before any sync.
    s.inject(fault(FaultOp::Write, PATH, libc::ENOSPC, 0));
    let e = commit(&m, 2, 2).unwrap_err();
    assert!(e.is_no_space(), "{e}");
    assert_all(&m, 1);
    commit(&m, 3, 3).unwrap();
    assert_all(&m, 3);
    s.crash(CrashMode::LoseUnsynced);
    let m = open(&s);
    assert_all(&m, 3);
    assert_eq!(m.covered(), 3);
}

#[test]
fn failures_after_the_pages_poison_until_reopen() {
    // (operation, skip): the page sync, the root write, the root sync.
    for (op, skip) in [(FaultOp::Sync, 0), (FaultOp::Write, 1), (FaultOp::Sync, 1)] {
        let s = setup();
        let m = open(&s);
        commit(&m, 1, 1).unwrap();
        s.inject(fault(op, PATH, libc::EIO, skip));
        let e = commit(&m, 2, 2).unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{op:?}/{skip}: {e}");
        assert!(matches!(commit(&m, 3, 3), Err(Error::Unavailable(..))), "{op:?}/{skip}: not poisoned");
        assert_all(&m, 1); // lookups continue on the old tree
        s.clear_faults();
        for mode in [CrashMode::LoseUnsynced, CrashMode::Torn { seed: skip }] {
            s.crash(mode);
            let m = open(&s);
            match m.covered() {
                1 => assert_all(&m, 1),
                2 => assert_all(&m, 2),
                c => panic!("{op:?}/{skip}: covered {c}"),
            }
        }
        let m = open(&s);
        commit(&m, 4, 4).unwrap();
        assert_all(&m, 4);
    }
}

#[test]
fn a_failed_directory_sync_after_the_rename_poisons() {
    let s = setup();
    let m = open(&s);
    s.inject(fault(FaultOp::Namespace, "img", libc::EIO, 1)); // the rename passes, sync_dir fails
    assert!(commit(&m, 1, 1).is_err());
    assert!(matches!(commit(&m, 2, 2), Err(Error::Unavailable(..))));
    s.clear_faults();
    s.crash(CrashMode::LoseUnsynced);
    let m = open(&s);
    assert!(m.covered() == 0 || m.covered() == 1);
    commit(&m, 5, 5).unwrap();
    assert_all(&m, 5);
}
