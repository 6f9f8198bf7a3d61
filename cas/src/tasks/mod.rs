//! The store's background work as tasks, and who runs them: the log
//! writeback of each image and the compaction service are written as
//! [`Task`]s, stepped either by a thread each (the product) or by a test
//! ([`Stepper`]), which decides when each one runs, so a seed of the model
//! test replays exactly.
//!
//! ```text
//!  Tasks::Threads               Tasks::Stepped(stepper)
//!  one thread per task:         the test's thread, when it calls
//!   loop step(cx):                stepper.run_until_idle() / step_one(i)
//!    Again   -> step again          Again   -> step again (bounded)
//!    Wait(t) -> sleep until         Wait(_) -> the task is idle
//!               woken or t
//!    Done    -> exit                Done    -> dropped
//!  cx.may_block() = true        cx.may_block() = false
//!  cx.now() = Instant::now()    cx.now() = the stepper's clock, moved by
//!                                 the test (`advance`)
//! ```
//!
//! A task may block inside `step` only when its context allows it (a
//! thread waiting on its queue); under a stepper it looks and returns
//! `Wait` instead. Every decision it bases on time takes the time from
//! `cx.now()`, so the stepper's clock decides back-offs and intervals.
//!
//! Dropping a [`TaskHandle`] stops its task: the thread is woken, told to
//! stop before its next step, and joined (unless the drop runs on that
//! thread itself, which then exits after its step); a stepped task is
//! removed.

mod stepped;
mod threads;

pub use stepped::Stepper;

use crate::background::BackgroundCpu;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What a task's step asks of its runner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// It did some work and has more: step again.
    Again,
    /// Nothing to do until woken ([`Wake`]), or until the duration passes.
    Wait(Option<Duration>),
    /// It has finished: never step it again.
    Done,
}

/// A piece of background work, run one step at a time.
pub trait Task: Send {
    fn step(&mut self, cx: &Context<'_>) -> Step;
}

/// What a step may do: block or not, and what time it is.
pub struct Context<'a> {
    blocking: bool,
    /// The stepper's time; None: the real clock, read at each call.
    now: Option<Instant>,
    shared: &'a Shared,
}

impl Context<'_> {
    /// Whether the step may wait for another thread (a queue, a record
    /// completing). A stepped task must not: nothing else would run.
    pub fn may_block(&self) -> bool {
        self.blocking
    }

    /// The time now, for the step's decisions: the real clock on a thread
    /// (read at each call, so a long step sees time pass), the stepper's
    /// clock under a test (fixed for the step).
    pub fn now(&self) -> Instant {
        self.now.unwrap_or_else(Instant::now)
    }

    /// The task's handle was dropped: a long step should return soon.
    pub fn stopping(&self) -> bool {
        self.shared.stopped()
    }
}

/// How a store runs its background tasks.
#[derive(Clone, Default)]
pub enum Tasks {
    /// A thread per task, in the store's background CPU class.
    #[default]
    Threads,
    /// Stepped by a test through the stepper.
    Stepped(Arc<Stepper>),
}

impl Tasks {
    /// Starts `task`, named `name` (a thread name: at most 15 bytes are kept).
    pub fn spawn(&self, name: &str, cpu: BackgroundCpu, task: Box<dyn Task>) -> TaskHandle {
        self.try_spawn(name, cpu, task).expect("spawn a store background thread")
    }

    /// [`Tasks::spawn`], failing (instead of panicking) if its thread
    /// cannot be started.
    pub fn try_spawn(&self, name: &str, cpu: BackgroundCpu, task: Box<dyn Task>) -> Result<TaskHandle> {
        let shared = Arc::new(Shared::default());
        let runner = match self {
            Tasks::Threads => Runner::Thread(
                threads::spawn(name, cpu, task, shared.clone())
                    .map_err(|e| Error::io(name.to_string(), e))?,
            ),
            Tasks::Stepped(stepper) => {
                Runner::Stepped(stepper.clone(), stepper.add(name, task, shared.clone()))
            }
        };
        Ok(TaskHandle { shared, runner: Some(runner) })
    }
}

impl Tasks {
    /// The time background decisions are taken at: the stepper's clock
    /// when a test steps the tasks.
    pub fn now(&self) -> Instant {
        match self {
            Tasks::Threads => Instant::now(),
            Tasks::Stepped(stepper) => stepper.now(),
        }
    }
}

impl PartialEq for Tasks {
    fn eq(&self, other: &Tasks) -> bool {
        match (self, other) {
            (Tasks::Threads, Tasks::Threads) => true,
            (Tasks::Stepped(a), Tasks::Stepped(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for Tasks {}

impl std::fmt::Debug for Tasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Tasks::Threads => "Threads",
            Tasks::Stepped(_) => "Stepped",
        })
    }
}

/// A task's flags, shared by its handle, its wakers and its runner.
#[derive(Default)]
struct Shared {
    woken: Mutex<bool>,
    cond: Condvar,
    stop: AtomicBool,
}

impl Shared {
    fn wake(&self) {
        *crate::sync::lock(&self.woken) = true;
        self.cond.notify_one();
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Sleeps until woken or `timeout` passes; consumes the wake-up.
    fn wait(&self, timeout: Option<Duration>) {
        let mut woken = crate::sync::lock(&self.woken);
        if !*woken && !self.stopped() {
            woken = match timeout {
                Some(t) => self.cond.wait_timeout(woken, t).unwrap_or_else(|p| p.into_inner()).0,
                None => self.cond.wait(woken).unwrap_or_else(|p| p.into_inner()),
            };
        }
        *woken = false;
    }

    /// Takes a pending wake-up, if any.
    fn take_wake(&self) -> bool {
        std::mem::take(&mut *crate::sync::lock(&self.woken))
    }
}

/// Wakes a waiting task (its next step runs at once).
#[derive(Clone)]
pub struct Wake(Arc<Shared>);

impl Wake {
    pub fn wake(&self) {
        self.0.wake()
    }
}

enum Runner {
    Thread(std::thread::JoinHandle<()>),
    Stepped(Arc<Stepper>, u64),
}

/// A running task; dropping it stops the task (after the step in
/// progress). The owner must first unblock a step that may block (close
/// the queue it waits on).
pub struct TaskHandle {
    shared: Arc<Shared>,
    runner: Option<Runner>,
}

impl TaskHandle {
    pub fn waker(&self) -> Wake {
        Wake(self.shared.clone())
    }
}

impl Drop for TaskHandle {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake();
        match self.runner.take() {
            // A task may hold the last reference to its owner during a
            // step (automatic GC upgrades its store), so the owner can be
            // dropped on the task's own thread: that thread must not join
            // itself; it exits after this step (`stop` is set).
            Some(Runner::Thread(t)) if t.thread().id() == std::thread::current().id() => {}
            Some(Runner::Thread(t)) => {
                let _ = t.join();
            }
            Some(Runner::Stepped(stepper, id)) => stepper.remove(id),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    /// Works `work` steps, then waits `wait` (or until woken), forever.
    struct Counter {
        steps: Arc<AtomicU32>,
        work: u32,
        wait: Option<Duration>,
    }

    impl Task for Counter {
        fn step(&mut self, _cx: &Context<'_>) -> Step {
            let n = self.steps.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_multiple_of(self.work + 1) {
                Step::Wait(self.wait)
            } else {
                Step::Again
            }
        }
    }

    fn counter(work: u32, wait: Option<Duration>) -> (Box<dyn Task>, Arc<AtomicU32>) {
        let steps = Arc::new(AtomicU32::new(0));
        (Box::new(Counter { steps: steps.clone(), work, wait }), steps)
    }

    #[test]
    fn a_stepped_task_runs_only_when_stepped_and_waits_on_the_steppers_clock() {
        let stepper = Stepper::new();
        let tasks = Tasks::Stepped(stepper.clone());
        let (task, steps) = counter(2, Some(Duration::from_secs(1)));
        let handle = tasks.spawn("t", BackgroundCpu::Normal, task);
        assert_eq!(steps.load(Ordering::Relaxed), 0, "nothing runs by itself");
        assert_eq!(stepper.run_until_idle(), 3, "two steps of work, then a wait");
        assert_eq!(stepper.run_until_idle(), 0, "waiting: the clock has not moved");
        stepper.advance(Duration::from_millis(999));
        assert_eq!(stepper.run_until_idle(), 0);
        stepper.advance(Duration::from_millis(1));
        assert_eq!(stepper.run_until_idle(), 3, "the wait ended on the stepper's clock");
        handle.waker().wake();
        assert_eq!(stepper.step_one(0), Some(Step::Again), "a wake-up ends the wait");
        assert_eq!(tasks.now(), stepper.now());
        drop(handle);
        assert!(stepper.names().is_empty(), "dropping the handle removes the task");
        assert_eq!(stepper.step_one(0), None);
    }

    #[test]
    fn a_stepped_task_that_never_waits_is_bounded_per_run() {
        let stepper = Stepper::new();
        let tasks = Tasks::Stepped(stepper.clone());
        let (task, _steps) = counter(u32::MAX - 1, None);
        let _handle = tasks.spawn("busy", BackgroundCpu::Normal, task);
        assert_eq!(stepper.run_until_idle(), 64);
    }

    #[test]
    fn a_thread_task_runs_by_itself_and_stops_with_its_handle() {
        let (task, steps) = counter(1, None);
        let handle = Tasks::Threads.spawn("t", BackgroundCpu::Normal, task);
        let deadline = Instant::now() + Duration::from_secs(10);
        while steps.load(Ordering::Relaxed) < 2 {
            assert!(Instant::now() < deadline, "the thread never stepped its task");
            std::thread::yield_now();
        }
        // Waiting until woken: one wake-up, one more round of two steps.
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(steps.load(Ordering::Relaxed), 2);
        handle.waker().wake();
        while steps.load(Ordering::Relaxed) < 4 {
            assert!(Instant::now() < deadline, "a wake-up did not end the wait");
            std::thread::yield_now();
        }
        drop(handle); // joins: returns only once the thread has stopped
        let after = steps.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(steps.load(Ordering::Relaxed), after);
    }

    /// Holds the last reference to the owner of its own handle, and lets it
    /// go once told to: the handle is then dropped on the task's thread.
    struct LastOwner {
        owner: Option<Arc<Mutex<Option<TaskHandle>>>>,
        go: Arc<AtomicBool>,
        released: Arc<AtomicBool>,
    }

    impl Task for LastOwner {
        fn step(&mut self, _cx: &Context<'_>) -> Step {
            if !self.go.load(Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(1));
                return Step::Again;
            }
            drop(self.owner.take());
            self.released.store(true, Ordering::Release);
            Step::Wait(None)
        }
    }

    #[test]
    fn a_thread_that_drops_its_own_handle_does_not_join_itself() {
        let owner: Arc<Mutex<Option<TaskHandle>>> = Arc::default();
        let (go, released) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let task = LastOwner { owner: Some(owner.clone()), go: go.clone(), released: released.clone() };
        let handle = Tasks::Threads.spawn("t", BackgroundCpu::Normal, Box::new(task));
        *crate::sync::lock(&owner) = Some(handle);
        drop(owner);
        // Only now is the task's reference the last one.
        go.store(true, Ordering::Release);
        // Joining itself would fail (EDEADLK) and panic the thread before
        // it records the release.
        let start = Instant::now();
        while !released.load(Ordering::Acquire) {
            assert!(start.elapsed() < Duration::from_secs(10), "the task never got past dropping its handle");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
