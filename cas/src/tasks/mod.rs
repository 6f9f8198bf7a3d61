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
//! stop before its next step, and joined; a stepped task is removed.

mod stepped;
mod threads;

pub use stepped::Stepper;

use crate::background::BackgroundCpu;
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
    now: Instant,
    shared: &'a Shared,
}

impl Context<'_> {
    /// Whether the step may wait for another thread (a queue, a record
    /// completing). A stepped task must not: nothing else would run.
    pub fn may_block(&self) -> bool {
        self.blocking
    }

    /// The time decisions of this step are taken at.
    pub fn now(&self) -> Instant {
        self.now
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
        let shared = Arc::new(Shared::default());
        let runner = match self {
            Tasks::Threads => Runner::Thread(threads::spawn(name, cpu, task, shared.clone())),
            Tasks::Stepped(stepper) => {
                Runner::Stepped(stepper.clone(), stepper.add(name, task, shared.clone()))
            }
        };
        TaskHandle { shared, runner: Some(runner) }
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
            Some(Runner::Thread(t)) => {
                let _ = t.join();
            }
            Some(Runner::Stepped(stepper, id)) => stepper.remove(id),
            None => {}
        }
    }
}
