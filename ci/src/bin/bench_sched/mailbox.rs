//! Where workers post finished requests for their queue thread: a list
//! behind a mutex and a condition variable that is signalled only while the
//! queue thread sleeps. The daemon's counterpart is `bridge::Completions`
//! (a list plus an eventfd the queue thread's io_uring waits on); like it,
//! this one never spins, so the load generator's queue thread uses no CPU
//! while it waits (a spinning channel would take CPU from the workers and
//! the compactor on a small machine).
//!
//! ```text
//!  worker:       lock, push, (sleeper? notify_one), unlock
//!  queue thread: lock, while empty { sleeping = true; wait }, take all
//! ```
//!
//! Bounded by its users: a stream has at most `queue_depth` requests in
//! flight, so the list never holds more.

use std::sync::{Condvar, Mutex};
use std::time::Instant;

struct Inner<T> {
    items: Vec<T>,
    sleeping: bool,
}

pub struct Mailbox<T> {
    inner: Mutex<Inner<T>>,
    wake: Condvar,
}

impl<T> Mailbox<T> {
    pub fn new(capacity: usize) -> Self {
        Mailbox {
            inner: Mutex::new(Inner { items: Vec::with_capacity(capacity), sleeping: false }),
            wake: Condvar::new(),
        }
    }

    pub fn post(&self, item: T) {
        let mut inner = self.inner.lock().expect("mailbox lock");
        inner.items.push(item);
        let wake = std::mem::take(&mut inner.sleeping);
        drop(inner);
        if wake {
            self.wake.notify_one();
        }
    }

    /// Moves everything posted into `out` (empty on entry), waiting until
    /// something is posted or `deadline` passes. Returns false on timeout.
    pub fn take_all(&self, out: &mut Vec<T>, deadline: Instant) -> bool {
        let mut inner = self.inner.lock().expect("mailbox lock");
        while inner.items.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            inner.sleeping = true;
            inner = self.wake.wait_timeout(inner, deadline - now).expect("mailbox lock").0;
        }
        inner.sleeping = false;
        std::mem::swap(out, &mut inner.items);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_post_wakes_the_sleeping_taker() {
        let mb = Arc::new(Mailbox::new(4));
        let poster = {
            let mb = mb.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                mb.post(7u32);
            })
        };
        let mut out = Vec::new();
        assert!(mb.take_all(&mut out, Instant::now() + Duration::from_secs(10)));
        assert_eq!(out, [7]);
        poster.join().unwrap();
        out.clear();
        assert!(!mb.take_all(&mut out, Instant::now() + Duration::from_millis(10)), "nothing was posted");
    }
}
