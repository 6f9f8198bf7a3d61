//! Which records are complete, which are durable, and group commit.
//!
//! ```text
//!   seq:   1 .......... durable ......... watermark ... max_completed
//!          |  synced    |  written, not   |  some done, |
//!          |            |  yet synced     |  some still in flight
//! ```
//!
//! - A record is *complete* once its bytes were written into its slot (or
//!   the slot was voided with PAD). The *watermark* is the highest seq
//!   with every seq at or below it complete.
//! - A record is *durable* once a sync that started after it completed has
//!   returned. `durable` only ever takes a watermark value, so the durable
//!   records are always a prefix of the log: recovery, which keeps a
//!   prefix, can never lose a durable record behind a torn one.
//! - Making seq `t` durable ([`Durability::make_durable`]) waits until the
//!   watermark reaches `t` (writes already in flight finish; none waits on
//!   capacity), then either joins the sync in progress or starts one. A
//!   sync covers every record complete when it started, so the flushers
//!   that arrive during one sync share the next one: group commit.
//! - A failed sync fails the image for good (after an fsync error the
//!   kernel may have dropped the dirty pages; nothing written since the
//!   last good sync can be trusted). So does a write whose slot could not
//!   be voided. Reopening the image recovers from the log on disk.
//!
//! Bound: `done_above` holds only records in flight out of order, at most
//! one per concurrent writer.

use crate::error::{Error, Result};
use std::collections::BTreeSet;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How often a waiting flusher re-checks on its own (a safety net; it is
/// normally woken by the event it waits for).
const RECHECK_MS: u64 = 100;

struct DurState {
    watermark: u64,
    done_above: BTreeSet<u64>,
    max_completed: u64,
    durable: u64,
    syncing: bool,
    waiters: u32,
    failed: Option<String>,
}

impl DurState {
    /// Some(true) once every record through `seq` is complete, Some(false)
    /// once the image failed, None while records are in flight.
    fn completed(&self, seq: u64) -> Option<bool> {
        if self.failed.is_some() {
            Some(false)
        } else {
            (self.watermark >= seq).then_some(true)
        }
    }
}

/// Completion and durability tracking for one image's log.
pub struct Durability {
    what: String,
    state: Mutex<DurState>,
    cond: Condvar,
}

use crate::sync::lock;

/// What one call to `make_durable` did, for the counters.
#[derive(Debug, Default, Clone, Copy)]
pub struct SyncWork {
    /// Group-commit rounds this caller ran itself.
    pub rounds: u64,
    /// Files it synced.
    pub files: u64,
}

impl Durability {
    /// Starts with every record through `durable_seq` complete and durable.
    pub fn new(what: String, durable_seq: u64) -> Durability {
        Durability {
            what,
            state: Mutex::new(DurState {
                watermark: durable_seq,
                done_above: BTreeSet::new(),
                max_completed: durable_seq,
                durable: durable_seq,
                syncing: false,
                waiters: 0,
                failed: None,
            }),
            cond: Condvar::new(),
        }
    }

    fn failure(&self, why: &str) -> Error {
        Error::Unavailable(self.what.clone(), why.to_string())
    }

    /// Fails if the image failed earlier.
    pub fn check(&self) -> Result<()> {
        match &lock(&self.state).failed {
            Some(why) => Err(self.failure(why)),
            None => Ok(()),
        }
    }

    /// Why the image failed, if it did.
    pub fn failed_because(&self) -> Option<String> {
        lock(&self.state).failed.clone()
    }

    pub fn durable_seq(&self) -> u64 {
        lock(&self.state).durable
    }

    /// The highest seq with every seq at or below it complete.
    pub fn watermark(&self) -> u64 {
        lock(&self.state).watermark
    }

    /// The highest seq completed so far: every visible write is at or
    /// below it.
    pub fn max_completed(&self) -> u64 {
        lock(&self.state).max_completed
    }

    /// Marks record `seq` complete (written or voided).
    pub fn complete(&self, seq: u64) {
        let mut st = lock(&self.state);
        assert!(seq > st.watermark && !st.done_above.contains(&seq), "record {seq} completed twice");
        st.max_completed = st.max_completed.max(seq);
        if seq == st.watermark + 1 {
            st.watermark = seq;
            while st.done_above.first() == Some(&(st.watermark + 1)) {
                st.done_above.pop_first();
                st.watermark += 1;
            }
        } else {
            st.done_above.insert(seq);
        }
        if st.waiters > 0 {
            self.cond.notify_all();
        }
    }

    /// Waits for a change (a completion, a sync, a failure), at most
    /// [`RECHECK_MS`].
    fn wait<'a>(&self, mut st: MutexGuard<'a, DurState>) -> MutexGuard<'a, DurState> {
        st.waiters += 1;
        st = self
            .cond
            .wait_timeout(st, Duration::from_millis(RECHECK_MS))
            .unwrap_or_else(|p| p.into_inner())
            .0;
        st.waiters -= 1;
        st
    }

    /// Waits until every record through `seq` is complete; false if the
    /// image failed first. Bounded by the writes in flight.
    pub fn wait_complete(&self, seq: u64) -> bool {
        let mut st = lock(&self.state);
        loop {
            if let Some(complete) = st.completed(seq) {
                return complete;
            }
            st = self.wait(st);
        }
    }

    /// [`Durability::wait_complete`] without waiting: None while records
    /// through `seq` are still in flight.
    pub fn completed(&self, seq: u64) -> Option<bool> {
        lock(&self.state).completed(seq)
    }

    /// Fails the image: every later write, flush and wait gets an error.
    pub fn fail(&self, why: String) {
        let mut st = lock(&self.state);
        if st.failed.is_none() {
            st.failed = Some(why);
        }
        self.cond.notify_all();
    }

    /// Returns once every record through `target` is durable, sharing
    /// syncs with concurrent callers. `sync` syncs the log's files for a
    /// round covering records through the given seq and returns how many
    /// files it synced.
    pub fn make_durable(&self, target: u64, sync: &dyn Fn(u64) -> Result<u64>) -> Result<SyncWork> {
        let mut work = SyncWork::default();
        let mut st = lock(&self.state);
        loop {
            if let Some(why) = &st.failed {
                return Err(self.failure(why));
            }
            if st.durable >= target {
                return Ok(work);
            }
            if !st.syncing && st.watermark >= target {
                st.syncing = true;
                let upto = st.watermark;
                drop(st);
                let result = sync(upto);
                st = lock(&self.state);
                st.syncing = false;
                work.rounds += 1;
                match result {
                    Ok(files) => {
                        work.files += files;
                        st.durable = st.durable.max(upto);
                    }
                    Err(e) => {
                        let why = format!("a log sync failed, so unflushed writes may be lost: {e}");
                        st.failed.get_or_insert(why);
                        self.cond.notify_all();
                        return Err(e);
                    }
                }
                self.cond.notify_all();
                continue;
            }
            st = self.wait(st);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    #[test]
    fn watermark_follows_out_of_order_completion() {
        let d = Durability::new("t".into(), 0);
        d.complete(2);
        d.complete(3);
        assert_eq!(d.max_completed(), 3);
        assert_eq!(lock(&d.state).watermark, 0);
        d.complete(1);
        assert_eq!(lock(&d.state).watermark, 3);
    }

    #[test]
    fn concurrent_flushers_share_syncs() {
        let d = Arc::new(Durability::new("t".into(), 0));
        let syncs = Arc::new(AtomicU64::new(0));
        let next = Arc::new(AtomicU64::new(0));
        let mut threads = vec![];
        for _ in 0..16u64 {
            let (d, syncs, next) = (d.clone(), syncs.clone(), next.clone());
            threads.push(std::thread::spawn(move || {
                for _ in 0..50u64 {
                    let seq = next.fetch_add(1, Ordering::SeqCst) + 1;
                    d.complete(seq);
                    let target = seq;
                    let s = syncs.clone();
                    d.make_durable(target, &move |_| {
                        s.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_micros(300));
                        Ok(1)
                    })
                    .unwrap();
                }
            }));
        }
        for t in threads {
            t.join().unwrap();
        }
        let n = syncs.load(Ordering::SeqCst);
        assert!(n < 800, "16 threads x 50 flushes took {n} syncs: no sharing");
        assert_eq!(d.durable_seq(), 800);
    }

    #[test]
    fn a_failed_sync_fails_everything_after() {
        let d = Durability::new("img".into(), 0);
        d.complete(1);
        let e = d.make_durable(1, &|_| Err(Error::InvalidArgument("boom".into()))).unwrap_err();
        assert!(e.to_string().contains("boom"));
        let e = d.make_durable(1, &|_| Ok(1)).unwrap_err();
        assert!(matches!(e, Error::Unavailable(..)), "{e}");
        assert!(d.check().is_err());
    }
}
