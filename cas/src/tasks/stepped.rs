//! Running tasks from a test: the test's thread steps them when it chooses,
//! on a clock it moves, so a seeded run takes the same path every time.

use super::{Context, Shared, Step, Task};
use crate::sync::lock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Steps a task takes in one `run_until_idle` at most, so a task that
/// always has more to do cannot hang the test.
const STEPS_PER_RUN_MAX: usize = 64;

struct Entry {
    id: u64,
    name: String,
    shared: Arc<Shared>,
    /// None while the task is being stepped (taken out, so the step may
    /// start or stop other tasks).
    task: Option<Box<dyn Task>>,
    /// Its last step asked to wait, and nothing woke it since.
    idle: bool,
    /// The end of that wait on the stepper's clock (None: until woken).
    due: Option<Instant>,
}

/// The tasks of a store under test, in the order they were started.
pub struct Stepper {
    entries: Mutex<Vec<Entry>>,
    next_id: AtomicU64,
    start: Instant,
    /// How far the test moved the clock.
    offset_ns: AtomicU64,
}

impl Default for Stepper {
    fn default() -> Self {
        Stepper {
            entries: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(0),
            start: Instant::now(),
            offset_ns: AtomicU64::new(0),
        }
    }
}

impl Stepper {
    pub fn new() -> Arc<Stepper> {
        Arc::new(Stepper::default())
    }

    /// The tasks' clock: the time the stepper was made, plus `advance`s.
    pub fn now(&self) -> Instant {
        self.start + Duration::from_nanos(self.offset_ns.load(Ordering::Relaxed))
    }

    /// Moves the tasks' clock forward.
    pub fn advance(&self, by: Duration) {
        self.offset_ns.fetch_add(by.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Names of the running tasks, in start order.
    pub fn names(&self) -> Vec<String> {
        lock(&self.entries).iter().map(|e| e.name.clone()).collect()
    }

    /// Steps the `i`th running task once (wrapping); returns what it asked
    /// for, or None if no task runs.
    pub fn step_one(&self, i: usize) -> Option<Step> {
        let id = {
            let entries = lock(&self.entries);
            if entries.is_empty() {
                return None;
            }
            entries[i % entries.len()].id
        };
        self.step_id(id)
    }

    /// Steps every task, in start order, until each is idle, done, or has
    /// taken `STEPS_PER_RUN_MAX` (64) steps. Returns the steps taken.
    pub fn run_until_idle(&self) -> usize {
        let mut steps = 0;
        let ids: Vec<u64> = lock(&self.entries).iter().map(|e| e.id).collect();
        for id in ids {
            for _ in 0..STEPS_PER_RUN_MAX {
                match self.step_id(id) {
                    Some(Step::Again) => steps += 1,
                    Some(_) => {
                        steps += 1;
                        break;
                    }
                    None => break,
                }
            }
        }
        steps
    }

    /// Steps task `id` once; None if it is gone or idle with no wake-up.
    fn step_id(&self, id: u64) -> Option<Step> {
        let (mut task, shared) = {
            let mut entries = lock(&self.entries);
            let e = entries.iter_mut().find(|e| e.id == id)?;
            if e.shared.take_wake() || e.due.is_some_and(|due| self.now() >= due) {
                e.idle = false;
            }
            if e.idle {
                return None;
            }
            (e.task.take()?, e.shared.clone())
        };
        let step = if shared.stopped() {
            Step::Done
        } else {
            task.step(&Context { blocking: false, now: Some(self.now()), shared: &shared })
        };
        let mut entries = lock(&self.entries);
        if let Some(pos) = entries.iter().position(|e| e.id == id) {
            match step {
                Step::Done => {
                    entries.remove(pos);
                }
                Step::Wait(timeout) => {
                    let e = &mut entries[pos];
                    e.idle = true;
                    e.due = timeout.map(|t| self.now() + t);
                    e.task = Some(task);
                }
                Step::Again => entries[pos].task = Some(task),
            }
        }
        Some(step)
    }

    pub(super) fn add(&self, name: &str, task: Box<dyn Task>, shared: Arc<Shared>) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        lock(&self.entries).push(Entry {
            id,
            name: name.to_string(),
            shared,
            task: Some(task),
            idle: false,
            due: None,
        });
        id
    }

    /// Forgets task `id` (its handle was dropped). A task being stepped is
    /// dropped by the stepper once its step returns.
    pub(super) fn remove(&self, id: u64) {
        let removed = {
            let mut entries = lock(&self.entries);
            entries.iter().position(|e| e.id == id).map(|pos| entries.remove(pos))
        };
        drop(removed); // outside the lock: dropping a task may stop others
    }
}
