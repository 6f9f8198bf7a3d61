//! The thread-safe scheduler the daemon and the benchmark use: a
//! [`Scheduler`] and the [`Capacity`] adapter behind one mutex, with two
//! condition variables.
//!
//! ```text
//!  ublk queue threads            SharedScheduler              worker pool
//!  submit / submit_timeout -->  Mutex{Scheduler, Capacity}  <-- next_blocking(timeout)
//!        (waits on `room`)          |  work: Condvar            (waits on `work`)
//!  engine reclamation:              |  room: Condvar        --> execute in cas
//!  capacity_released -------------->|                       <-- complete
//! ```
//!
//! Every wait is bounded: by the caller's timeout, and for one idle worker
//! (the timer) also by the next retry deadline: a write refused log
//! capacity, or a request an IO limit holds. Only one worker sleeps with
//! the deadline, so a rate-timed admission costs one wake, not one per
//! idle worker; a timer that leaves with a dispatch while a deadline is
//! still pending wakes an idle worker to take the timer over.
//!
//! Wakes are targeted, so that a busy scheduler does not wake every worker
//! on every event: `submit` and a `capacity_released` that finds held
//! writes wake one idle worker; an in-place submission that queues its
//! request wakes one only if some request is admissible now, or a retry
//! deadline has no timer yet; `complete` wakes one only if some image has
//! a candidate afterwards (a completion that frees nothing, the common case
//! of a read, wakes nobody: the completing worker looks for work itself
//! next); a worker that gets a dispatch wakes one more if some image still
//! has a candidate (so a completed FLUSH that frees many requests fans out
//! worker by worker); `shutdown` wakes everyone. A woken worker always tries
//! `next` before it waits again, so no admissible request is left waiting
//! for a wake that went elsewhere.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::capacity::Capacity;
use crate::clock::Clock;
use crate::counters::ImageCounters;
use crate::descriptor::{Descriptor, ImageId, RequestId, Ticket};
use crate::error::Error;
use crate::rate::Limits;
use crate::scheduler::{Dispatch, InPlace, Scheduler};

/// What a worker's [`SharedScheduler::next_blocking`] got.
#[derive(Debug)]
pub enum Next<R> {
    Dispatch(Dispatch<R>),
    /// Nothing admissible within the timeout; call again.
    TimedOut,
    /// [`SharedScheduler::shutdown`] was called: the worker exits.
    Shutdown,
}

struct State<C: Clock, K> {
    sched: Scheduler<C>,
    cap: K,
    shutdown: bool,
    /// Workers waiting on `work` / submitters waiting on `room`.
    idle_workers: usize,
    room_waiters: usize,
    /// Targeted wakes sent to idle workers (`notify_one` on `work`).
    worker_wakes: u64,
    /// The retry deadline an idle worker (the timer) sleeps to, if any
    /// (the scheduler clock's ns).
    timer_at_ns: Option<u64>,
    /// Times the timer worker woke at its deadline.
    timer_wakes: u64,
}

/// See the module documentation.
pub struct SharedScheduler<C: Clock, K: Capacity> {
    state: Mutex<State<C, K>>,
    work: Condvar,
    room: Condvar,
}

impl<C: Clock, K: Capacity> SharedScheduler<C, K> {
    pub fn new(sched: Scheduler<C>, cap: K) -> Self {
        SharedScheduler {
            state: Mutex::new(State {
                sched,
                cap,
                shutdown: false,
                idle_workers: 0,
                room_waiters: 0,
                worker_wakes: 0,
                timer_at_ns: None,
                timer_wakes: 0,
            }),
            work: Condvar::new(),
            room: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<C, K>> {
        self.state.lock().expect("scheduler mutex poisoned: a thread panicked while scheduling")
    }

    pub fn add_image(&self, image: ImageId) -> Result<(), Error> {
        self.lock().sched.add_image(image)
    }

    /// See [`Scheduler::remove_image`].
    pub fn remove_image(&self, image: ImageId) -> Result<Vec<Descriptor>, Error> {
        let removed = self.lock().sched.remove_image(image);
        self.room.notify_all(); // submitters waiting for this image learn it is gone
        removed
    }

    /// Retains a descriptor without waiting; [`Error::Full`] is
    /// back-pressure.
    pub fn submit(&self, image: ImageId, desc: Descriptor) -> Result<Ticket, Error> {
        let mut state = self.lock();
        if state.shutdown {
            return Err(Error::ShuttingDown);
        }
        let ticket = state.sched.submit(image, desc)?;
        let wake = state.idle_workers > 0;
        self.wake_worker_if(state, wake);
        Ok(ticket)
    }

    /// See [`Scheduler::submit_read_in_place`]. A queued read that is
    /// admissible wakes an idle worker.
    pub fn submit_read_in_place(
        &self,
        image: ImageId,
        desc: Descriptor,
    ) -> Result<InPlace<K::Reservation>, Error> {
        self.submit_in_place(|st| st.sched.submit_read_in_place(image, desc))
    }

    /// See [`Scheduler::submit_write_in_place`], with the shared capacity.
    /// A queued write that is admissible wakes an idle worker.
    pub fn submit_write_in_place(
        &self,
        image: ImageId,
        desc: Descriptor,
    ) -> Result<InPlace<K::Reservation>, Error> {
        self.submit_in_place(|st| st.sched.submit_write_in_place(image, desc, &mut st.cap))
    }

    /// Runs an in-place submission under the lock; a request it queued
    /// wakes an idle worker if some request is admissible now, or to be the
    /// timer of a retry deadline nobody sleeps to. One held by a gate (an
    /// IO limit, an overlap, a full log) is not admissible: the event that
    /// frees it wakes a worker (a completion, the timer, a capacity wake),
    /// and waking one now would only have it find nothing and sleep again.
    fn submit_in_place(
        &self,
        submit: impl FnOnce(&mut State<C, K>) -> Result<InPlace<K::Reservation>, Error>,
    ) -> Result<InPlace<K::Reservation>, Error> {
        let mut state = self.lock();
        if state.shutdown {
            return Err(Error::ShuttingDown);
        }
        let got = submit(&mut state)?;
        let wake = matches!(got, InPlace::Queued(_)) && Self::worker_needed(&mut state);
        self.wake_worker_if(state, wake);
        Ok(got)
    }

    /// See [`Scheduler::requeue`]; wakes an idle worker for the read.
    pub fn requeue(&self, image: ImageId, request: RequestId) -> Result<(), Error> {
        let mut state = self.lock();
        state.sched.requeue(image, request)?;
        let wake = state.idle_workers > 0;
        self.wake_worker_if(state, wake);
        Ok(())
    }

    /// Like [`SharedScheduler::submit`], but waits up to `timeout` for room
    /// in a full frontier (a completion makes room).
    pub fn submit_timeout(
        &self,
        image: ImageId,
        desc: Descriptor,
        timeout: Duration,
    ) -> Result<Ticket, Error> {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        loop {
            if state.shutdown {
                return Err(Error::ShuttingDown);
            }
            match state.sched.submit(image, desc) {
                Ok(ticket) => {
                    let wake = state.idle_workers > 0;
                    self.wake_worker_if(state, wake);
                    return Ok(ticket);
                }
                Err(Error::Full { .. }) if Instant::now() < deadline => {
                    let wait = deadline.saturating_duration_since(Instant::now());
                    state.room_waiters += 1;
                    state = self.room.wait_timeout(state, wait).expect("scheduler mutex poisoned").0;
                    state.room_waiters -= 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Blocks up to `timeout` for the next admitted request.
    pub fn next_blocking(&self, timeout: Duration) -> Next<K::Reservation> {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        loop {
            if state.shutdown {
                return Next::Shutdown;
            }
            let State { sched, cap, .. } = &mut *state;
            if let Some(dispatch) = sched.next(cap) {
                let wake = Self::worker_needed(&mut state);
                self.wake_worker_if(state, wake);
                return Next::Dispatch(dispatch);
            }
            let now = Instant::now();
            if now >= deadline {
                return Next::TimedOut;
            }
            let mut wait = deadline - now;
            // A held request is tried again at its deadline even if no wake
            // comes: this worker becomes the timer if no worker sleeps to
            // that deadline or an earlier one. (One beyond its own timeout
            // is still its: it leaves, and is called again.)
            let sched_now_ns = sched.now_ns();
            let timer = match sched.next_retry_at_ns() {
                Some(retry_ns) if state.timer_at_ns.is_none_or(|t| retry_ns < t) => {
                    wait = wait.min(Duration::from_nanos(retry_ns - sched_now_ns));
                    state.timer_at_ns = Some(retry_ns);
                    Some(retry_ns)
                }
                _ => None,
            };
            state.idle_workers += 1;
            let (s, timeout) = self.work.wait_timeout(state, wait).expect("scheduler mutex poisoned");
            state = s;
            state.idle_workers -= 1;
            if let Some(at) = timer {
                // Another worker may have taken an earlier deadline over.
                if state.timer_at_ns == Some(at) {
                    state.timer_at_ns = None;
                }
                state.timer_wakes += u64::from(timeout.timed_out());
            }
        }
    }

    /// Whether to wake an idle worker: a request is admissible now, or a
    /// retry deadline is pending that no worker sleeps to (no timer, or
    /// one sleeping to a later deadline): the woken one becomes the timer.
    fn worker_needed(state: &mut State<C, K>) -> bool {
        if state.idle_workers == 0 {
            return false;
        }
        if state.sched.has_candidate() {
            return true;
        }
        let timer = state.timer_at_ns;
        state.sched.next_retry_at_ns().is_some_and(|r| timer.is_none_or(|t| r < t))
    }

    /// Sets `image`'s IO limits (see [`Scheduler::set_limits`]) and wakes
    /// every idle worker: a raised or removed limit takes effect at once.
    pub fn set_limits(&self, image: ImageId, limits: Limits) -> Result<(), Error> {
        self.lock().sched.set_limits(image, limits)?;
        self.work.notify_all();
        Ok(())
    }

    pub fn limits(&self, image: ImageId) -> Option<Limits> {
        self.lock().sched.limits(image)
    }

    /// Reports a finished request; see [`Scheduler::complete`]. Wakes an
    /// idle worker only if a request is admissible now, or a deadline has
    /// no timer: a completion that frees nothing (most reads) would only
    /// make a worker wake, find nothing and sleep again, while the caller
    /// (a worker) looks for work itself right after.
    pub fn complete(&self, image: ImageId, request: RequestId) -> Result<(), Error> {
        let mut state = self.lock();
        state.sched.complete(image, request)?;
        let wake_room = state.room_waiters > 0;
        let wake_worker = Self::worker_needed(&mut state);
        self.wake_worker_if(state, wake_worker);
        if wake_room {
            self.room.notify_all();
        }
        Ok(())
    }

    /// The engine's reclamation listener. Must not be called while holding
    /// a lock that [`Capacity::try_reserve`] takes.
    pub fn capacity_released(&self, image: ImageId) {
        let mut state = self.lock();
        let released = state.sched.capacity_released(image);
        let wake = (released && state.idle_workers > 0) || Self::worker_needed(&mut state);
        self.wake_worker_if(state, wake);
    }

    /// Releases the lock, then wakes one idle worker if `wake`.
    fn wake_worker_if(&self, mut state: MutexGuard<'_, State<C, K>>, wake: bool) {
        if wake {
            state.worker_wakes += 1;
        }
        drop(state);
        if wake {
            self.work.notify_one();
        }
    }

    /// Workers waiting in [`SharedScheduler::next_blocking`] now.
    pub fn idle_workers(&self) -> usize {
        self.lock().idle_workers
    }

    /// Targeted wakes sent to idle workers so far (each one costs a futex
    /// wake and two context switches; a stat for tuning and tests).
    pub fn worker_wakes(&self) -> u64 {
        self.lock().worker_wakes
    }

    /// Whether an idle worker sleeps to a retry deadline now.
    pub fn timer_armed(&self) -> bool {
        self.lock().timer_at_ns.is_some()
    }

    /// Times the timer worker slept to a retry deadline and woke there.
    pub fn timer_wakes(&self) -> u64 {
        self.lock().timer_wakes
    }

    /// Wakes every waiter; `next_blocking` returns [`Next::Shutdown`] and
    /// submits fail from now on. Completions are still accepted.
    pub fn shutdown(&self) {
        self.lock().shutdown = true;
        self.work.notify_all();
        self.room.notify_all();
    }

    pub fn is_shutdown(&self) -> bool {
        self.lock().shutdown
    }

    pub fn counters(&self, image: ImageId) -> Option<ImageCounters> {
        self.lock().sched.counters(image)
    }

    /// Runs `f` on the capacity adapter under the scheduler lock.
    pub fn with_capacity<T>(&self, f: impl FnOnce(&mut K) -> T) -> T {
        f(&mut self.lock().cap)
    }
}
