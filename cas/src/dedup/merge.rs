//! One merge of index runs, run on its own thread so that neither the
//! store's sync (which the compactor's commits wait on) nor inserts wait
//! for it: at 64 M chunks a level-2 merge rewrites 16 M entries and took
//! 12.8 s when flushes did it in line.
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
use crate::error::{Error, Result};
use crate::storage::Storage;
use crate::units::ChunkLoc;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
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

/// A merge started (on a thread, or already done in line).
pub(crate) struct MergeJob {
    /// The id reserved for the merged run (its file is deleted if the
    /// merge fails).
    pub run_id: u64,
    pub inputs: Vec<Arc<Run>>,
    started: Instant,
    state: State,
}

enum State {
    Running(JoinHandle<Result<Option<Run>>>),
    Done(Result<Option<Run>>, Duration),
}

impl MergeJob {
    /// Starts the merge on a thread of its own (`background`) or runs it
    /// now. Fails only if the thread cannot be started.
    pub fn start(spec: MergeSpec, valid: Valid, background: bool) -> Result<MergeJob> {
        let (run_id, inputs, started) = (spec.run_id, spec.inputs.clone(), Instant::now());
        let work = move || {
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
        };
        let state = if background {
            let handle = std::thread::Builder::new()
                .name("casblk-index-merge".into())
                .spawn(work)
                .map_err(|e| Error::Io { path: PathBuf::from("index merge thread"), source: e })?;
            State::Running(handle)
        } else {
            State::Done(work(), started.elapsed())
        };
        Ok(MergeJob { run_id, inputs, started, state })
    }

    /// True once the merged run is written (or the merge failed).
    pub fn is_finished(&self) -> bool {
        match &self.state {
            State::Running(h) => h.is_finished(),
            State::Done(..) => true,
        }
    }

    /// Waits for the merge: its run (None when every entry was stale) and
    /// how long it took.
    pub fn wait(self) -> (Result<Option<Run>>, Duration) {
        match self.state {
            State::Running(h) => {
                let result = h.join().unwrap_or_else(|_| {
                    Err(Error::Io {
                        path: PathBuf::from("index merge thread"),
                        source: std::io::Error::other("the index merge thread panicked"),
                    })
                });
                (result, self.started.elapsed())
            }
            State::Done(result, took) => (result, took),
        }
    }
}
