//! GC epochs and the pins that keep chunks alive while a compaction batch
//! is between `insert_missing` and its manifest commit.
//!
//! The rule GC relies on: every chunk a manifest commit may reference was
//! either referenced by a manifest when GC's mark read it, or inserted (or
//! found as a duplicate) after the current pass cleared the keep bits,
//! which sets its slot's keep bit so the sweep skips it.
//!
//! How: a [`ChunkPin`] records the epoch current when it was taken. GC
//! starts a pass by clearing every keep bit, bumping the epoch to E and
//! then waiting (bounded) until no pin of an older epoch is left: each such
//! pin's manifest commit has then either happened (so the mark, which
//! starts afterwards, sees it) or been abandoned. Every insert sets the
//! keep bits of what it touches, so what a pin of epoch E (or a late pin of
//! E - 1) touches after the clear is kept; the sweep frees only live slots
//! whose keep bit is clear.

use crate::error::{Error, Result};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

struct State {
    epoch: u32,
    /// Live pins by epoch parity: only the current and previous epochs can
    /// have pins, because a pass does not proceed until the previous
    /// epoch's pins are gone.
    pins: [u64; 2],
}

/// Epoch counter and pin counts.
pub(crate) struct Pins {
    state: Mutex<State>,
    drained: Condvar,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Pins {
    /// Epochs start at 1; entries loaded from disk carry epoch 0.
    pub fn new() -> Pins {
        Pins { state: Mutex::new(State { epoch: 1, pins: [0, 0] }), drained: Condvar::new() }
    }

    /// Takes a pin of the current epoch; returns that epoch.
    pub fn acquire(&self) -> u32 {
        let mut st = lock(&self.state);
        let e = st.epoch;
        st.pins[(e % 2) as usize] += 1;
        e
    }

    pub fn release(&self, epoch: u32) {
        let mut st = lock(&self.state);
        let n = &mut st.pins[(epoch % 2) as usize];
        *n = n.checked_sub(1).expect("pin released twice");
        if *n == 0 {
            self.drained.notify_all();
        }
    }

    /// Starts a GC epoch: bumps the epoch and waits up to `wait` for every
    /// pin of the previous epoch to be released. Returns the new epoch.
    pub fn advance(&self, wait: Duration) -> Result<u32> {
        let mut st = lock(&self.state);
        if st.pins[((st.epoch + 1) % 2) as usize] != 0 {
            // Pins from two epochs ago cannot exist: the previous advance
            // waited for them. This is reached only after a timed-out pass.
            return Err(Error::Unavailable(
                "chunk GC".into(),
                "pins from an earlier GC epoch are still held".into(),
            ));
        }
        st.epoch = st.epoch.checked_add(1).expect("GC epoch counter overflow (4 billion passes)");
        let epoch = st.epoch;
        let old = ((epoch - 1) % 2) as usize;
        let deadline = Instant::now() + wait;
        while st.pins[old] != 0 {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Unavailable(
                    "chunk GC".into(),
                    format!(
                        "{} compaction pins of epoch {} were not released within {} ms",
                        st.pins[old],
                        epoch - 1,
                        wait.as_millis()
                    ),
                ));
            }
            st = self.drained.wait_timeout(st, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
        Ok(epoch)
    }
}

/// Keeps the chunks a compaction batch inserts or deduplicates against
/// safe from a concurrent GC until dropped. Hold it from the first
/// `insert_missing` of a batch until the manifest commit that references
/// those chunks has returned (or the batch is abandoned).
pub struct ChunkPin<'a> {
    pub(crate) pins: &'a Pins,
    pub(crate) epoch: u32,
}

impl ChunkPin<'_> {
    /// The GC epoch this pin stamps.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }
}

impl Drop for ChunkPin<'_> {
    fn drop(&mut self) {
        self.pins.release(self.epoch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn advance_waits_for_old_pins() {
        let p = Arc::new(Pins::new());
        let e = p.acquire();
        assert_eq!(e, 1);
        assert!(p.advance(Duration::from_millis(20)).is_err(), "old pin still held");
        let p2 = p.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            p2.release(e);
        });
        // The failed advance left the epoch at 2; pins of 1 drain now.
        let e3 = p.acquire();
        assert_eq!(e3, 2);
        t.join().unwrap();
        p.release(e3);
        assert_eq!(p.advance(Duration::from_secs(5)).unwrap(), 3);
    }
}
