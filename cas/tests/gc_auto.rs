//! Automatic GC (cas::gc::auto): overwritten data is given back without
//! an operator once the store has grown past the threshold (or dropped
//! that many block mappings without growing), not before,
//! not more often than the minimum interval (counted from the open too),
//! and at once (after that interval) when an image is removed or a
//! compaction found the filesystem full; what a pass did survives a power
//! cut. Run on a `Stepper`, so the tasks see exactly the clock the test
//! moves.

use cas::gc::AutoGcOptions;
use cas::image::Image;
use cas::storage::{CrashMode, Fault, FaultOp, MemStorage, Storage};
use cas::tasks::{Stepper, Tasks};
use cas::{Store, StoreOptions};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const BLOCKS: u64 = 512;
const TICK: Duration = Duration::from_millis(100);
const CHECK: Duration = Duration::from_millis(1000);
const MIN_INTERVAL: Duration = Duration::from_secs(30);

fn options(stepper: &Arc<Stepper>) -> StoreOptions {
    StoreOptions {
        log_segment_bytes: 1 << 20,
        log_quota_bytes: 64 << 20,
        compaction_interval_ms: 200,
        gc_auto: AutoGcOptions {
            enabled: true,
            check_interval_ms: CHECK.as_millis() as u64,
            min_interval_ms: MIN_INTERVAL.as_millis() as u64,
            min_new_chunks: 256,
            growth_percent: 25,
        },
        tasks: Tasks::Stepped(stepper.clone()),
        ..StoreOptions::default()
    }
}

/// Block `i`'s content in round `round`: distinct for every (round, i).
fn block(round: u64, i: u64) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    for (k, w) in b.chunks_mut(8).enumerate() {
        w.copy_from_slice(&(round << 48 | i << 16 | k as u64).to_le_bytes());
    }
    b
}

/// Writes blocks `0..n` of round `round`, durably.
fn write_round(image: &Image, round: u64, n: u64) {
    for i in 0..n {
        image.write(i * 4096, &block(round, i), false).unwrap();
    }
    image.flush().unwrap();
}

fn check_round(image: &Image, round: u64, n: u64) {
    let mut got = vec![0u8; 4096];
    for i in 0..n {
        image.read(i * 4096, &mut got).unwrap();
        assert!(got == block(round, i), "block {i} does not read round {round}'s data");
    }
}

/// Moves the clock one tick and runs the background tasks until idle.
fn tick(stepper: &Stepper) {
    stepper.advance(TICK);
    stepper.run_until_idle();
}

/// `n` ticks of the clock, the tasks run after each.
fn idle(stepper: &Stepper, n: u64) {
    for _ in 0..n {
        tick(stepper);
    }
}

fn auto_passes(store: &Store) -> u64 {
    store.space_stats().unwrap().gc_auto_passes
}

/// Ticks until the durable log is compacted.
fn until_compacted(stepper: &Stepper, store: &Store, image: &Image) {
    for _ in 0..600 {
        let s = store.image_stats(image);
        if s.covered_seq >= s.durable_seq {
            return;
        }
        tick(stepper);
    }
    panic!("compaction did not catch up");
}

/// Ticks until an automatic pass beyond `passes` finishes.
fn until_auto_pass(stepper: &Stepper, store: &Store, passes: u64, limit: u64) {
    for _ in 0..limit {
        if auto_passes(store) > passes {
            return;
        }
        tick(stepper);
    }
    panic!("no automatic GC pass within {limit} ticks");
}

fn ticks(d: Duration) -> u64 {
    (d.as_millis() / TICK.as_millis()) as u64
}

#[test]
fn overwritten_data_is_reclaimed_without_an_operator_and_stays_reclaimed_after_a_crash() {
    let stepper = Stepper::new();
    let mem = MemStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    let store = Store::create(storage.clone(), Path::new("/store"), options(&stepper)).unwrap();
    store.create_image("vm", 64 << 20).unwrap();
    let image = store.open_image("vm").unwrap();

    // Filling: BLOCKS new chunks are past the 256-chunk floor; the first
    // pass waits the interval from the store's open.
    write_round(&image, 0, BLOCKS);
    until_compacted(&stepper, &store, &image);
    idle(&stepper, ticks(MIN_INTERVAL) / 2);
    assert_eq!(auto_passes(&store), 0, "a pass ran within the interval after the open");
    until_auto_pass(&stepper, &store, 0, ticks(MIN_INTERVAL + CHECK) + 2);
    assert_eq!(store.chunk_stats().chunks, BLOCKS, "nothing was garbage yet");

    // Overwriting every block leaves BLOCKS dead chunks; the pass after the
    // minimum interval sweeps them.
    write_round(&image, 1, BLOCKS);
    until_compacted(&stepper, &store, &image);
    assert_eq!(store.chunk_stats().chunks, 2 * BLOCKS, "both rounds stored before GC");
    until_auto_pass(&stepper, &store, 1, ticks(MIN_INTERVAL + CHECK) + 2);
    assert_eq!(store.chunk_stats().chunks, BLOCKS, "the overwritten round was swept");
    check_round(&image, 1, BLOCKS);
    let space = store.space_stats().unwrap();
    assert_eq!((space.gc_passes, space.gc_auto_passes, space.gc_auto_failures), (2, 2, 0));

    // Power cut: what the pass swept stays swept, the data stays.
    drop(image);
    drop(store);
    mem.crash(CrashMode::LoseUnsynced);
    let store = Store::open(storage, Path::new("/store"), options(&stepper)).unwrap();
    assert_eq!(store.chunk_stats().chunks, BLOCKS, "the sweep was durable");
    let image = store.open_image("vm").unwrap();
    check_round(&image, 1, BLOCKS);
}

/// A store on a stepper whose image "vm" holds round 0's `BLOCKS`
/// blocks, compacted, after the first automatic pass (growth from empty).
fn filled() -> (Arc<Stepper>, Arc<Store>, Arc<Image>) {
    let stepper = Stepper::new();
    let storage: Arc<dyn Storage> = Arc::new(MemStorage::new());
    let store = Store::create(storage, Path::new("/store"), options(&stepper)).unwrap();
    store.create_image("vm", 64 << 20).unwrap();
    let image = store.open_image("vm").unwrap();
    write_round(&image, 0, BLOCKS);
    until_compacted(&stepper, &store, &image);
    until_auto_pass(&stepper, &store, 0, ticks(MIN_INTERVAL + CHECK) + 2);
    (stepper, store, image)
}

#[test]
fn no_pass_below_the_threshold_nor_within_the_interval_and_a_removal_nudges_one() {
    let (stepper, store, image) = filled();
    store.create_image("scratch", 64 << 20).unwrap();

    // Growth of less than the floor: no pass, however long the store waits.
    write_round(&image, 1, 200);
    until_compacted(&stepper, &store, &image);
    idle(&stepper, ticks(2 * MIN_INTERVAL));
    assert_eq!(auto_passes(&store), 1, "200 new chunks are below the 256-chunk floor");
    assert_eq!(store.chunk_stats().chunks, BLOCKS + 200, "the overwritten 200 wait for a pass");

    // A manual pass restarts the interval: growth right after it waits.
    store.gc().unwrap();
    assert_eq!(store.chunk_stats().chunks, BLOCKS);
    write_round(&image, 2, BLOCKS);
    until_compacted(&stepper, &store, &image);
    idle(&stepper, ticks(MIN_INTERVAL) / 2);
    assert_eq!(auto_passes(&store), 1, "a pass ran within the interval after the manual one");
    until_auto_pass(&stepper, &store, 1, ticks(MIN_INTERVAL + CHECK) + 2);
    assert_eq!(store.chunk_stats().chunks, BLOCKS);
    check_round(&image, 2, BLOCKS);

    // Removing an image nudges a pass once the interval has passed, without
    // any growth. Its blocks are written through a second image.
    let scratch = store.open_image("scratch").unwrap();
    write_round(&scratch, 3, 100);
    until_compacted(&stepper, &store, &scratch);
    drop(scratch);
    idle(&stepper, ticks(MIN_INTERVAL + CHECK));
    assert_eq!(auto_passes(&store), 2, "100 new chunks alone start no pass");
    // The removal wakes the task: the pass runs without the clock moving.
    store.remove_image("scratch").unwrap();
    stepper.run_until_idle();
    assert_eq!(auto_passes(&store), 3, "the removal did not start a pass at once");
    assert_eq!(store.chunk_stats().chunks, BLOCKS, "the removed image's chunks were swept");
    check_round(&image, 2, BLOCKS);
}

/// Garbage made without growth: overwrites with content the store already
/// holds, and a guest's fstrim (DISCARD), drop block mappings but store no
/// chunk. Below the threshold they start no pass; past it, one runs (after
/// the interval) and sweeps what they left.
#[test]
fn deduplicated_overwrites_and_discards_start_a_pass_without_growth() {
    let (stepper, store, image) = filled();
    assert_eq!(store.chunk_stats().chunks, BLOCKS);

    // Blocks 0..200 take the content of blocks 300..500: no new chunk, 200
    // dropped mappings, below the 256 threshold.
    for i in 0..200 {
        image.write(i * 4096, &block(0, 300 + i), false).unwrap();
    }
    image.flush().unwrap();
    until_compacted(&stepper, &store, &image);
    idle(&stepper, ticks(2 * MIN_INTERVAL));
    assert_eq!(auto_passes(&store), 1, "200 dropped mappings are below the threshold");
    assert_eq!(store.chunk_stats().chunks, BLOCKS, "no chunk stored, none swept");

    // fstrim of blocks 200..300: 300 dropped in all, past the threshold.
    image.discard(200 * 4096, 100 * 4096).unwrap();
    image.flush().unwrap();
    until_compacted(&stepper, &store, &image);
    assert_eq!(store.image_stats(&image).compaction.refs_dropped, 300);
    until_auto_pass(&stepper, &store, 1, ticks(CHECK) + 2);
    assert_eq!(store.chunk_stats().chunks, BLOCKS - 300, "the overwritten and trimmed chunks were swept");
    let mut got = vec![0u8; 4096];
    for i in 0..BLOCKS {
        image.read(i * 4096, &mut got).unwrap();
        let want = match i {
            0..200 => block(0, 300 + i),
            200..300 => vec![0u8; 4096],
            _ => block(0, i),
        };
        assert!(got == want, "block {i} reads wrong after the pass");
    }
}

#[test]
fn a_compaction_that_finds_the_filesystem_full_starts_a_pass() {
    let stepper = Stepper::new();
    let mem = MemStorage::new();
    let storage: Arc<dyn Storage> = Arc::new(mem.clone());
    let store = Store::create(storage, Path::new("/store"), options(&stepper)).unwrap();
    store.create_image("vm", 64 << 20).unwrap();
    let image = store.open_image("vm").unwrap();
    write_round(&image, 0, BLOCKS);
    until_compacted(&stepper, &store, &image);
    until_auto_pass(&stepper, &store, 0, ticks(MIN_INTERVAL + CHECK) + 2);

    // 100 overwritten blocks: below the growth threshold. The first pack
    // write of their compaction finds no room.
    mem.inject(Fault {
        op: FaultOp::Write,
        path_contains: Some("pack".into()),
        skip: 0,
        errno: libc::ENOSPC,
        sticky: false,
    });
    write_round(&image, 1, 100);
    for _ in 0..ticks(10 * CHECK) {
        if store.image_stats(&image).compaction.errors > 0 {
            break;
        }
        tick(&stepper);
    }
    assert_eq!(store.image_stats(&image).compaction.errors, 1, "the pack write did not fail");
    // The retried compaction stores the 100; the pass the full filesystem
    // asked for sweeps the blocks they replaced.
    until_compacted(&stepper, &store, &image);
    until_auto_pass(&stepper, &store, 1, ticks(MIN_INTERVAL + CHECK) + 2);
    assert_eq!(store.chunk_stats().chunks, BLOCKS, "the replaced blocks were swept");
    let mut got = vec![0u8; 4096];
    for i in 0..BLOCKS {
        image.read(i * 4096, &mut got).unwrap();
        assert!(got == block(u64::from(i < 100), i), "block {i} reads wrong");
    }
}
