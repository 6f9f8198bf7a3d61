//! Deleting an image's published objects once nothing needs them: the
//! bucket keeps the newest root and the page ranges it lists, plus what
//! was superseded less than a grace period ago.
//!
//! ```text
//!  round publishes root (epoch, g) of series S, ranges L
//!    superseded now:  the previous root this holder published;
//!                     ranges of S merged away (in the old list, not in L);
//!                     every range of the previous series (a rewritten file)
//!  first round of a holder (every open starts a series), with leases:
//!    every root and range under images/<name>/ that is not its own
//!  each round: DELETE what was superseded at least `grace` ago, checking
//!    before each that the lease still holds
//! ```
//!
//! **Why a grace period.** Another store fetching the image reads the
//! newest root, then GETs its ranges one by one; an object it needs can be
//! superseded meanwhile, and stays readable for `grace` (fetch starts
//! again from the newest root when one is gone all the same).
//!
//! **Why it is safe.** Only the lease holder deletes, only after its newer
//! root is in the bucket, only while its lease holds (checked before each
//! DELETE: a listing that returned after a take-over may name the new
//! holder's objects), and only objects that root does not list; range
//! keys are never written again once merged away (a series only grows at
//! its end), and every open starts a new random series. Without leases
//! (a store alone on its bucket, or a test) there is no sweep: two stores
//! writing one image would each take the other's series for leftovers;
//! only what the holder itself superseded goes, and a previous open's
//! series stays. A crash or a
//! failed DELETE leaves objects behind, never a root without its ranges:
//! the queue is not kept, and the next holder's first round finds what
//! is left.
//!
//! **Bounds.** The queue holds at most [`MAX_QUEUED`] keys; past that a
//! key is left for the next holder's first round.

use super::ranges::Ranges;
use super::root_object::{pages_key, pages_prefix, parse_root_key, roots_prefix, series_prefix};
use crate::error::Result;
use crate::objects::{list_all, Objects};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Keys waiting for their grace period, at most.
pub const MAX_QUEUED: usize = 100_000;

/// What one holder of an image has published, and what of it is superseded.
#[derive(Default)]
pub struct Superseded {
    /// Keys, with when they were superseded, oldest first.
    queue: VecDeque<(Instant, String)>,
    /// The holder's first root is in the bucket and older objects are queued.
    swept: bool,
    /// The newest root this holder published (its key).
    last_root: Option<String>,
    /// Deleted so far.
    pub deleted: u64,
}

/// What a round published.
pub struct Published<'a> {
    pub series: u64,
    pub ranges: &'a Ranges,
    pub root_key: &'a str,
}

impl Superseded {
    /// Keys waiting for their grace period.
    pub fn pending(&self) -> u64 {
        self.queue.len() as u64
    }

    fn push(&mut self, at: Instant, key: String) {
        if self.queue.len() < MAX_QUEUED {
            self.queue.push_back((at, key));
        }
    }

    /// Queues what the round that published `new` superseded (`old`: the
    /// series and ranges of this holder's previous root, None before its
    /// first). With `sweep` (leases are on), the holder's first round
    /// lists the image's roots and ranges and queues every one not its own
    /// (`new` is in the bucket: one LIST per open; a failed LIST is tried
    /// again next round).
    pub fn published(
        &mut self,
        objects: &dyn Objects,
        name: &str,
        old: Option<(u64, &Ranges)>,
        new: Published<'_>,
        sweep: bool,
    ) {
        let now = Instant::now();
        if let Some(prev) = self.last_root.replace(new.root_key.to_string()) {
            if prev != new.root_key {
                self.push(now, prev);
            }
        }
        if let Some((series, ranges)) = old {
            for &r in &ranges.list {
                if series != new.series || !new.ranges.list.contains(&r) {
                    self.push(now, pages_key(name, series, r.0, r.1));
                }
            }
        }
        if sweep && !self.swept {
            match self.sweep(objects, name, &new, now) {
                Ok(()) => self.swept = true,
                Err(e) => {
                    tracing::debug!(image = name, error = %e, "listing superseded objects failed; retried")
                }
            }
        }
    }

    /// Queues every root and range of `name` that is not the holder's.
    fn sweep(&mut self, objects: &dyn Objects, name: &str, new: &Published<'_>, now: Instant) -> Result<()> {
        let own_series = series_prefix(name, new.series);
        let newest = parse_root_key(new.root_key);
        for key in list_all(objects, &roots_prefix(name))? {
            // Roots above the holder's own cannot be (its lease holds).
            if key != new.root_key && parse_root_key(&key).is_some_and(|k| Some(k) < newest) {
                self.push(now, key);
            }
        }
        for key in list_all(objects, &pages_prefix(name))? {
            if !key.starts_with(&own_series) {
                self.push(now, key);
            }
        }
        Ok(())
    }

    /// DELETEs every key superseded at least `grace` ago while `held`
    /// (the lease holds); a failure stops the round's deletions (the key
    /// is tried again next round).
    pub fn delete_due(&mut self, objects: &dyn Objects, grace: Duration, held: &dyn Fn() -> bool) {
        while let Some((at, key)) = self.queue.front() {
            if at.elapsed() < grace || !held() {
                return;
            }
            if let Err(e) = objects.delete(key) {
                tracing::debug!(key = %key, error = %e, "deleting a superseded object failed; retried");
                return;
            }
            self.deleted += 1;
            self.queue.pop_front();
        }
    }
}
