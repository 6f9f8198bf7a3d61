//! The uploaders, as tasks (`crate::tasks`): each takes queued packs one
//! at a time; a failed upload goes to the back of the queue and its task
//! backs off (100 ms doubling to 5 s). `upload_threads` of them run (0:
//! none, uploads happen only on callers' threads, `PackTier::upload_sealed`);
//! each is stopped by the tier's `stop` (an upload under way finishes or
//! fails first).

use super::PackTier;
use crate::tasks::{Context, Step, Task};
use std::sync::Weak;
use std::time::Duration;

/// One uploader.
pub(super) struct UploadTask {
    pub tier: Weak<PackTier>,
    /// Failed uploads in a row: the back-off grows with them.
    pub failures: u32,
}

impl Task for UploadTask {
    fn step(&mut self, _cx: &Context<'_>) -> Step {
        let Some(tier) = self.tier.upgrade() else { return Step::Done };
        let job = {
            let mut s = tier.state();
            if s.stop {
                return Step::Done;
            }
            match s.queue.pop_front() {
                Some(j) => j,
                None => return Step::Wait(None),
            }
        };
        match tier.upload_one(&job) {
            Ok(()) => {
                self.failures = 0;
                Step::Again
            }
            Err(_) => {
                tier.state().queue.push_back(job);
                self.failures = self.failures.saturating_add(1);
                Step::Wait(Some(
                    Duration::from_millis(100u64 << self.failures.min(6)).min(Duration::from_secs(5)),
                ))
            }
        }
    }
}
