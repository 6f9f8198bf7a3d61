//! One merge of index runs, run as a store task (`crate::tasks`: a thread
//! of its own in the product, a step the model test chooses under a
//! stepper) so that neither the store's sync (which the compactor's
//! commits wait on) nor inserts wait for it: at 64 M chunks a level-2
//! merge rewrites 16 M entries and took 12.8 s when flushes did it in line.
//!
//! The work is taken by whoever comes first: the task's one step, or the
//! sync that must wait for the merge ([`MergeJob::wait`]) and finds it not
//! started (under a stepper nothing else would run it). A merge that
//! panics finishes with an error, as the thread's join made of it before.
//! The chunk store's close cancels a merge not started and waits for one
//! in progress ([`MergeJob::cancel`]), so the next open never races its
//! writes. The task runs in the normal CPU class, not the store's
//! background class: a sync waits for it under the sync lock once runs
//! pile up.
//!
//! The job only reads its input runs (immutable files) and writes a new
//! run under an id reserved for it; nothing names that run until the
//! caller installs it (a new root, then the index in memory), so a crash
//! or a failure before that leaves an unnamed file that the next open
//! deletes. Whether an entry is still valid is judged against the slot
//! bits as they were durable when the job started (the starting flush's
//! slots file; see `ChunkStore::merge_runs` for why not newer ones): a
//! slot freed later is never used again, so at worst the merged run keeps
//! a stale entry that lookups skip and a later merge drops.

use super::run::Run;
use super::write_merged;
use crate::background::BackgroundCpu;
use crate::error::{Error, Result};
use crate::storage::Storage;
use crate::sync::lock;
use crate::tasks::{Context, Step, Task, TaskHandle, Tasks};
use crate::units::ChunkLoc;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Whether an entry's slot was live when the merge started.
pub(crate) type Valid = Box<dyn Fn(ChunkLoc) -> bool + Send>;

/// What a merge writes, and where.
pub(crate) struct MergeSpec {
    pub storage: Arc<dyn Storage>,
    pub dir: PathBuf,
    pub store_id: u64,
    /// The id reserved for the merged run.
    pub run_id: u64,
    pub level: u32,
    /// Contiguous runs, oldest first.
    pub inputs: Vec<Arc<Run>>,
}

/// Who runs a merge.
#[derive(Clone, Copy)]
pub(crate) enum MergeRunner<'a> {
    /// The caller, before `start` returns (tests that cut the storage at
    /// every operation want that order fixed).
    InLine,
    /// A task of `tasks`.
    Task(&'a Tasks),
}

type Work = Box<dyn FnOnce() -> Result<Option<Run>> + Send>;

/// A merge's progress, shared by its job and its task.
enum Progress {
    NotStarted(Work),
    Running,
    Finished(Result<Option<Run>>, Duration),
    /// The result was taken by `wait`.
    Taken,
}

struct Slot {
    progress: Mutex<Progress>,
    finished: Condvar,
    started: Instant,
}

impl Slot {
    /// Runs the work if nobody has started it; true if this call ran it.
    fn run_if_not_started(&self) -> bool {
        let work = {
            let mut p = lock(&self.progress);
            match std::mem::replace(&mut *p, Progress::Running) {
                Progress::NotStarted(work) => work,
                other => {
                    *p = other;
                    return false;
                }
            }
        };
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|_| {
            Err(Error::io("index merge", std::io::Error::other("the index merge panicked")))
        });
        *lock(&self.progress) = Progress::Finished(result, self.started.elapsed());
        self.finished.notify_all();
        true
    }

    /// The progress, locked, once no thread is running the work (waits
    /// for one that is).
    fn settled(&self) -> MutexGuard<'_, Progress> {
        let mut p = lock(&self.progress);
        while matches!(*p, Progress::Running) {
            p = self.finished.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        p
    }
}

/// The merge as a task: one step runs it (unless `wait` already did).
struct MergeTask(Arc<Slot>);

impl Task for MergeTask {
    fn step(&mut self, _cx: &Context<'_>) -> Step {
        self.0.run_if_not_started();
        Step::Done
    }
}

/// A merge started (as a task, or already done in line).
pub(crate) struct MergeJob {
    /// The id reserved for the merged run (its file is deleted if the
    /// merge fails).
    pub run_id: u64,
    pub inputs: Vec<Arc<Run>>,
    slot: Arc<Slot>,
    /// Declared after `slot`, dropped last: stops (joins) the task.
    _task: Option<TaskHandle>,
}

impl MergeJob {
    /// Starts the merge as `runner` says. Fails only if its thread cannot
    /// be started.
    pub fn start(spec: MergeSpec, valid: Valid, runner: MergeRunner<'_>) -> Result<MergeJob> {
        let (run_id, inputs) = (spec.run_id, spec.inputs.clone());
        let work: Work = Box::new(move || {
            write_merged(
                spec.storage.as_ref(),
                &spec.dir,
                spec.store_id,
                spec.run_id,
                spec.level,
                &spec.inputs,
                &[],
                &*valid,
            )
        });
        let slot = Arc::new(Slot {
            progress: Mutex::new(Progress::NotStarted(work)),
            finished: Condvar::new(),
            started: Instant::now(),
        });
        let task = match runner {
            MergeRunner::InLine => {
                slot.run_if_not_started();
                None
            }
            MergeRunner::Task(tasks) => Some(tasks.try_spawn(
                "casblk-idxmerge",
                BackgroundCpu::Normal,
                Box::new(MergeTask(slot.clone())),
            )?),
        };
        Ok(MergeJob { run_id, inputs, slot, _task: task })
    }

    /// True once the merged run is written (or the merge failed).
    pub fn is_finished(&self) -> bool {
        matches!(*lock(&self.slot.progress), Progress::Finished(..))
    }

    /// Waits for the merge, running it here if its task has not started
    /// it: its run (None when every entry was stale) and how long it took
    /// from `start`.
    pub fn wait(self) -> (Result<Option<Run>>, Duration) {
        self.slot.run_if_not_started();
        match std::mem::replace(&mut *self.slot.settled(), Progress::Taken) {
            Progress::Finished(result, took) => (result, took),
            _ => unreachable!("run above, settled, taken once"),
        }
    }

    /// Gives the merge up (the store is closing): one not started never
    /// runs; one in progress is waited for, so its file is written no more.
    pub fn cancel(self) {
        *self.slot.settled() = Progress::Taken;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dedup::run::{hash_order, Entry};
    use crate::storage::MemStorage;
    use crate::tasks::Stepper;
    use crate::units::ChunkHash;
    use std::path::Path;

    /// Eight level-0 runs of 10 entries each (ids 1..=8) in `/d`, and the
    /// spec of their merge into run 9.
    fn spec() -> (MemStorage, MergeSpec) {
        let s = MemStorage::new();
        s.create_dir_all(Path::new("/d")).unwrap();
        let all = |_: ChunkLoc| true;
        let mut inputs = Vec::new();
        for id in 1..=8u64 {
            let mut entries: Vec<Entry> = (0..10u64)
                .map(|i| {
                    let n = id * 100 + i;
                    Entry {
                        hash: ChunkHash::of(&n.to_le_bytes()),
                        at: ChunkLoc { pack: 1, slot: n as u32, crc: 0 },
                    }
                })
                .collect();
            entries.sort_unstable_by(|a, b| hash_order(&a.hash, &b.hash));
            let run = write_merged(&s, Path::new("/d"), 1, id, 0, &[], &entries, &all).unwrap().unwrap();
            inputs.push(Arc::new(run));
        }
        let storage: Arc<dyn Storage> = Arc::new(s.clone());
        (s, MergeSpec { storage, dir: PathBuf::from("/d"), store_id: 1, run_id: 9, level: 1, inputs })
    }

    /// The merge of `spec()` started as a task of a fresh stepper.
    fn stepped_job() -> (MemStorage, Arc<Stepper>, MergeJob) {
        let (s, spec) = spec();
        let stepper = Stepper::new();
        let job =
            MergeJob::start(spec, Box::new(|_| true), MergeRunner::Task(&Tasks::Stepped(stepper.clone())))
                .unwrap();
        (s, stepper, job)
    }

    /// Whether the merged run's file (run 9) exists.
    fn merged_file_exists(s: &MemStorage) -> bool {
        s.exists(&Path::new("/d").join(super::super::run::run_file_name(9)))
    }

    /// Under a stepper the merge runs when the test steps its task, not
    /// before: the model test decides where it lands among crashes.
    #[test]
    fn a_stepped_merge_runs_when_stepped() {
        let (s, stepper, job) = stepped_job();
        assert!(!job.is_finished());
        assert!(!merged_file_exists(&s));
        assert_eq!(stepper.names(), vec!["casblk-idxmerge".to_string()]);
        assert_eq!(stepper.step_one(0), Some(Step::Done));
        assert!(job.is_finished());
        assert!(stepper.names().is_empty(), "the task ends after its merge");
        let (run, _) = job.wait();
        let run = run.unwrap().expect("80 live entries");
        assert_eq!((run.id, run.level), (9, 1));
    }

    /// A sync that must wait for a merge its task has not started runs it
    /// itself (under a stepper nothing else would); the task then finds
    /// nothing to do, and dropping the job removes it.
    #[test]
    fn waiting_for_a_merge_not_started_runs_it() {
        let (_s, stepper, job) = stepped_job();
        let (run, _) = job.wait();
        assert_eq!(run.unwrap().expect("merged").id, 9);
        assert!(stepper.names().is_empty(), "the job's drop removed its task");
    }

    /// A merge that panics (here: its validity check) finishes with an
    /// error: `wait` returns within a bound instead of waiting for ever.
    #[test]
    fn a_panicking_merge_finishes_with_an_error() {
        let (_s, spec) = spec();
        let job = MergeJob::start(
            spec,
            Box::new(|_| panic!("a merge that panics")),
            MergeRunner::Task(&Tasks::Threads),
        )
        .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(job.wait().0.map(|r| r.map(|r| r.id)));
        });
        let got = rx.recv_timeout(Duration::from_secs(30)).expect("wait returned within 30 s");
        let e = got.expect_err("a panicking merge is an error");
        assert!(e.to_string().contains("the index merge panicked"), "{e}");
    }

    /// Closing the store cancels a merge its task has not started: the
    /// work never runs, no run file appears, and the task is gone.
    #[test]
    fn a_cancelled_merge_never_runs() {
        let (s, stepper, job) = stepped_job();
        job.cancel();
        assert!(stepper.names().is_empty());
        assert!(!merged_file_exists(&s));
    }

    /// On threads, the merge runs on its own and `wait` returns its run.
    #[test]
    fn a_threaded_merge_finishes_on_its_own() {
        let (_s, spec) = spec();
        let job = MergeJob::start(spec, Box::new(|_| true), MergeRunner::Task(&Tasks::Threads)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !job.is_finished() {
            assert!(Instant::now() < deadline, "the merge thread did not finish");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(job.wait().0.unwrap().expect("merged").id, 9);
    }
}
