//! The space reserve (cas::space) through the store: below it, a write
//! that needs a new log segment is held (never failed, never half
//! written) while GC runs at once; once a GC pass that began after the
//! store went low freed nothing, such writes fail with ENOSPC while writes
//! into the current segment, flushes and reads go on and no image fails;
//! new garbage (a trim) makes writes wait for GC again, and space coming
//! back lets them through. Flushed data survives a power cut at any of
//! these points. The filesystem's free space is the figure `MemStorage`
//! reports (`set_space`); the tasks run on a `Stepper`. A last test shows
//! on a real filesystem that log segments are allocated whole.

use cas::gc::AutoGcOptions;
use cas::image::{Held, Image};
use cas::storage::{CrashMode, FsSpace, FsStorage, MemStorage, Storage};
use cas::tasks::{Stepper, Tasks};
use cas::wal::RecordKind;
use cas::{Store, StoreOptions};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const RESERVE: u64 = 16 * MIB;
const TICK: Duration = Duration::from_millis(100);
/// More than a segment, so a write of it always needs a new one.
const BIG: u64 = 2 * MIB;

fn options(stepper: &Arc<Stepper>, wait_ms: u64) -> StoreOptions {
    StoreOptions {
        log_segment_bytes: MIB,
        log_quota_bytes: 64 * MIB,
        compaction_interval_ms: 200,
        gc_auto: AutoGcOptions {
            enabled: true,
            check_interval_ms: 1000,
            min_interval_ms: 60_000,
            min_new_chunks: 1 << 20,
            growth_percent: 1000,
        },
        space_reserve_bytes: Some(RESERVE),
        space_wait_ms: wait_ms,
        tasks: Tasks::Stepped(stepper.clone()),
        ..StoreOptions::default()
    }
}

fn free(mem: &MemStorage, avail_bytes: u64) {
    mem.set_space(Some(FsSpace { size_bytes: 1 << 30, avail_bytes }));
}

fn pattern(seed: u64, len: u64) -> Vec<u8> {
    let mut b = vec![0u8; len as usize];
    for (k, w) in b.chunks_mut(8).enumerate() {
        w.copy_from_slice(&(seed << 40 | k as u64).to_le_bytes());
    }
    b
}

fn read(image: &Image, offset: u64, len: u64) -> Vec<u8> {
    let mut got = vec![0u8; len as usize];
    image.read(offset, &mut got).unwrap();
    got
}

fn run_for(stepper: &Stepper, d: Duration) {
    for _ in 0..(d.as_millis() / TICK.as_millis()) {
        stepper.advance(TICK);
        stepper.run_until_idle();
    }
}

fn state(store: &Store) -> u8 {
    store.space_stats().unwrap().space_state
}

fn until_compacted(stepper: &Stepper, store: &Store, image: &Image) {
    for _ in 0..600 {
        let s = store.image_stats(image);
        if s.covered_seq >= s.durable_seq {
            return;
        }
        stepper.advance(TICK);
        stepper.run_until_idle();
    }
    panic!("compaction did not catch up");
}

#[test]
fn writes_wait_below_the_reserve_fail_with_enospc_when_gc_cannot_free_and_resume_when_space_returns() {
    let stepper = Stepper::new();
    let mem = MemStorage::new();
    free(&mem, 512 * MIB);
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    let store = Store::create(storage.clone(), Path::new("/store"), options(&stepper, 600_000)).unwrap();
    store.create_image("a", 64 * MIB).unwrap();
    store.create_image("b", 64 * MIB).unwrap();
    let (a, b) = (store.open_image("a").unwrap(), store.open_image("b").unwrap());
    a.write(0, &pattern(1, 4 * MIB), false).unwrap();
    a.flush().unwrap();
    b.write(0, &pattern(2, MIB / 2), false).unwrap();
    b.flush().unwrap();
    until_compacted(&stepper, &store, &a);
    assert_eq!(b.try_reserve_for(RecordKind::Write, BIG).map(|r| r.bytes() > 0), Ok(true));
    let space = store.space_stats().unwrap();
    assert_eq!((space.space_reserve_bytes, space.space_state), (RESERVE, 0));

    // Below the reserve: a write that needs a new segment is held; one
    // that fits in the current segment, a flush and reads go on.
    free(&mem, RESERVE - MIB);
    std::thread::sleep(Duration::from_millis(cas::space::PROBE_MAX_AGE_MS));
    // The first such write of each image is its grace roll (above half the
    // reserve); the next one waits.
    let grace = b.try_reserve_for(RecordKind::Write, BIG).expect("b's grace roll");
    assert!(grace.bytes() > 0 && grace.refusal().is_none());
    drop(grace);
    assert_eq!(b.try_reserve_for(RecordKind::Write, BIG).err(), Some(Held::NoSpace));
    assert_eq!(state(&store), 1);
    assert_eq!(store.space_stats().unwrap().space_graces, 1);
    b.write(MIB, &pattern(3, 4096), false).unwrap();
    b.flush().unwrap();
    assert_eq!(read(&b, MIB, 4096), pattern(3, 4096));

    // The low state wakes GC (after the 5 s urgent gap from the open, not
    // the minute of min_interval); nothing is dead, so the pass frees
    // nothing and such writes now fail with ENOSPC, without failing b.
    let passes = store.space_stats().unwrap().gc_auto_passes;
    run_for(&stepper, Duration::from_secs(6));
    assert_eq!(store.space_stats().unwrap().gc_auto_passes, passes + 1, "the low state ran a pass");
    assert_eq!(state(&store), 2, "a fruitless pass exhausts the reserve");
    let r = b.try_reserve_for(RecordKind::Write, BIG).expect("an exhausted store refuses, not holds");
    assert!(r.is_no_space());
    let e = b.write_reserved(Default::default(), r, 4 * MIB, &pattern(4, BIG), false).unwrap_err();
    assert_eq!(e.errno(), -libc::ENOSPC, "{e}");
    let e = b.write(4 * MIB, &pattern(4, BIG), false).unwrap_err();
    assert!(e.is_no_space() && e.to_string().contains("space reserve"), "{e}");
    assert_eq!((a.failure(), b.failure()), (None, None), "no image failed");
    b.flush().unwrap();
    assert!(store.space_stats().unwrap().space_refusals >= 2);

    // a trims, without a flush: below the reserve the compactor makes the
    // trim durable and compacts it at once, and the new garbage makes
    // writes wait for GC again (the trim itself is a range record in the
    // current segment and goes through).
    a.discard(0, 4 * MIB).unwrap();
    run_for(&stepper, Duration::from_secs(1));
    let s = store.image_stats(&a);
    assert!(s.covered_seq >= a.completed_seq(), "the unflushed trim was compacted");
    assert_eq!(state(&store), 1, "new garbage: writes wait for GC again");
    assert_eq!(b.try_reserve_for(RecordKind::Write, BIG).err(), Some(Held::NoSpace));
    run_for(&stepper, Duration::from_secs(5));
    assert!(store.space_stats().unwrap().gc_auto_passes > passes + 1, "the trim's garbage ran a pass");

    // GC gave the space back: the held write goes through.
    free(&mem, 512 * MIB);
    std::thread::sleep(Duration::from_millis(cas::space::PROBE_MAX_AGE_MS));
    b.write(4 * MIB, &pattern(5, BIG), false).unwrap();
    b.flush().unwrap();
    assert_eq!(state(&store), 0);
    assert_eq!(read(&a, 0, 4096), vec![0u8; 4096], "the trim holds");

    // Power cut: every flushed write reads back.
    drop((a, b));
    drop(store);
    mem.crash(CrashMode::LoseUnsynced);
    let store = Store::open(storage, Path::new("/store"), options(&stepper, 600_000)).unwrap();
    let b = store.open_image("b").unwrap();
    assert_eq!(read(&b, 0, MIB / 2), pattern(2, MIB / 2));
    assert_eq!(read(&b, MIB, 4096), pattern(3, 4096));
    assert_eq!(read(&b, 4 * MIB, BIG), pattern(5, BIG));
}

#[test]
fn a_blocked_write_turns_into_enospc_within_the_wait_bound_without_gc() {
    let stepper = Stepper::new();
    let mem = MemStorage::new();
    free(&mem, 512 * MIB);
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    let opts = StoreOptions { gc_auto: AutoGcOptions::off(), ..options(&stepper, 300) };
    let store = Store::create(storage, Path::new("/store"), opts).unwrap();
    store.create_image("a", 64 * MIB).unwrap();
    let a = store.open_image("a").unwrap();
    a.write(0, &pattern(1, 4096), false).unwrap();
    a.flush().unwrap();
    free(&mem, MIB);
    std::thread::sleep(Duration::from_millis(cas::space::PROBE_MAX_AGE_MS));
    let t0 = Instant::now();
    let e = a.write(MIB, &pattern(2, BIG), false).unwrap_err();
    let waited = t0.elapsed();
    assert!(e.is_no_space(), "{e}");
    assert!(waited >= Duration::from_millis(250), "it waited first: {waited:?}");
    assert!(waited < Duration::from_secs(5), "bounded: {waited:?}");
    assert_eq!(a.failure(), None);
    assert_eq!(read(&a, 0, 4096), pattern(1, 4096));
}

#[test]
fn a_reserve_of_zero_holds_nothing() {
    let stepper = Stepper::new();
    let mem = MemStorage::new();
    free(&mem, MIB);
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    let opts = StoreOptions { space_reserve_bytes: Some(0), ..options(&stepper, 300) };
    let store = Store::create(storage, Path::new("/store"), opts).unwrap();
    store.create_image("a", 64 * MIB).unwrap();
    let a = store.open_image("a").unwrap();
    a.write(0, &pattern(1, BIG), false).unwrap();
    let s = store.space_stats().unwrap();
    assert_eq!((s.space_reserve_bytes, s.space_state, s.space_waits), (0, 0, 0));
}

/// On a real filesystem a log segment holds its blocks from its creation,
/// so no record written into it can meet ENOSPC.
#[test]
fn log_segments_are_allocated_whole_on_a_real_filesystem() {
    use std::os::unix::fs::MetadataExt;
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-tmp");
    std::fs::create_dir_all(&base).unwrap();
    let tmp = tempfile::tempdir_in(&base).unwrap();
    let dir = tmp.path().join("store");
    let opts = StoreOptions {
        log_segment_bytes: MIB,
        background_compaction: false,
        gc_auto: AutoGcOptions::off(),
        ..StoreOptions::default()
    };
    let store = Store::create(Arc::new(FsStorage::new()), &dir, opts).unwrap();
    store.create_image("a", 64 * MIB).unwrap();
    let a = store.open_image("a").unwrap();
    a.write(0, &pattern(1, BIG), false).unwrap();
    a.flush().unwrap();
    let wal = dir.join("images/a/wal");
    let mut segments = 0;
    for entry in std::fs::read_dir(&wal).unwrap() {
        let meta = entry.unwrap().metadata().unwrap();
        segments += 1;
        // st_blocks counts 512-byte units; tmpfs and ext4 both preallocate.
        assert!(meta.blocks() * 512 >= MIB, "a segment of {} allocated bytes", meta.blocks() * 512);
    }
    assert!(segments >= 3, "the write rolled: {segments} segments");
}
