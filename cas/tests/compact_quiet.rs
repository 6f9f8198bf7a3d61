//! The background compactor below its trigger waits for a pause in an
//! image's writes: a burst that fits the log is not slowed by a pass
//! competing for the CPU, a stream that never pauses is still compacted
//! after `QUIET_WAIT_MAX_INTERVALS` intervals, and a quiet image one
//! interval after its last write. Run on a `Stepper`, so the service sees
//! exactly the clock the test moves.

use cas::compact::QUIET_WAIT_MAX_INTERVALS;
use cas::image::Image;
use cas::storage::{MemStorage, Storage};
use cas::tasks::{Stepper, Tasks};
use cas::{Store, StoreOptions};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const INTERVAL: Duration = Duration::from_millis(1000);
const TICK: Duration = Duration::from_millis(100);

fn setup() -> (Arc<Stepper>, Arc<Store>, Arc<Image>) {
    let stepper = Stepper::new();
    let storage: Arc<dyn Storage> = Arc::new(MemStorage::new());
    let opts = StoreOptions {
        gc_auto: cas::gc::AutoGcOptions::off(),
        log_segment_bytes: 1 << 20,
        log_quota_bytes: 64 << 20,
        compaction_interval_ms: INTERVAL.as_millis() as u64,
        tasks: Tasks::Stepped(stepper.clone()),
        ..StoreOptions::default()
    };
    let store = Store::create(storage, Path::new("/store"), opts).unwrap();
    store.create_image("img", 64 << 20).unwrap();
    let image = store.open_image("img").unwrap();
    (stepper, store, image)
}

/// One durable 4 KiB write at block `i`.
fn write(image: &Image, i: u64) {
    image.write((i % 4096) * 4096, &[i as u8 + 1; 4096], false).unwrap();
    image.flush().unwrap();
}

fn passes(store: &Store, image: &Image) -> u64 {
    store.image_stats(image).compaction.passes
}

/// Moves the clock one tick and runs the background tasks until idle.
fn tick(stepper: &Stepper) {
    stepper.advance(TICK);
    stepper.run_until_idle();
}

#[test]
fn a_steady_stream_is_compacted_only_after_the_longest_wait() {
    let (stepper, store, image) = setup();
    let ticks_per_interval = (INTERVAL.as_millis() / TICK.as_millis()) as u64;
    let longest = ticks_per_interval * u64::from(QUIET_WAIT_MAX_INTERVALS);
    // The tick of each pass: the longest wait counts again from each one.
    let mut pass_ticks = Vec::new();
    for i in 0..2 * longest + 4 * ticks_per_interval {
        write(&image, i);
        tick(&stepper);
        if passes(&store, &image) > pass_ticks.len() as u64 {
            pass_ticks.push(i);
        }
    }
    assert!(pass_ticks.len() >= 2, "a stream that never pauses is compacted: passes at {pass_ticks:?}");
    let first = pass_ticks[0];
    assert!(
        first + 1 >= longest,
        "the first pass after {first} ticks of writes, before the longest wait ({longest})"
    );
    assert!(first <= longest + 2 * ticks_per_interval, "first pass only after {first} ticks");
    let gap = pass_ticks[1] - first;
    assert!(
        gap + 1 >= longest,
        "the second pass {gap} ticks after the first, before the longest wait ({longest})"
    );
}

#[test]
fn a_quiet_image_is_compacted_an_interval_after_its_last_write() {
    let (stepper, store, image) = setup();
    for i in 0..20 {
        write(&image, i);
        tick(&stepper);
    }
    assert_eq!(passes(&store, &image), 0, "no pass while the writes go on");
    let ticks_per_interval = INTERVAL.as_millis() / TICK.as_millis();
    let mut quiet_ticks = 0;
    while passes(&store, &image) == 0 {
        tick(&stepper);
        quiet_ticks += 1;
        assert!(quiet_ticks <= 2 * ticks_per_interval, "no pass after {quiet_ticks} quiet ticks");
    }
    assert!(quiet_ticks >= ticks_per_interval - 1, "a pass after only {quiet_ticks} quiet ticks");
    let s = store.image_stats(&image);
    assert_eq!(s.covered_seq, s.durable_seq, "the pass covered every durable write");
}
