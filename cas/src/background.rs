//! The CPU policy of the store's background threads: the compactor (and
//! the threads of each pass, which inherit it) and every image's log
//! writeback thread.
//!
//! Background work must not take latency from the request path. Under
//! Linux's fair scheduler a woken thread may preempt the one running on
//! its CPU; the compaction commit thread and the log writeback thread
//! wake hundreds of times a second (each sync's completion), and every
//! such preemption of a queue thread delays all the requests it holds.
//! `SCHED_BATCH` keeps the thread's fair share of CPU (compaction must
//! keep up with the writers) but drops its wakeup preemption: it waits
//! for the running thread's slice instead. `SCHED_IDLE` runs it only on
//! otherwise idle CPUs (a host that prefers reads over write throughput).
//! The same choice as RocksDB's lowered compaction thread priority.
//!
//! Lowering a thread's own policy needs no privilege; a refusal (seccomp,
//! an odd kernel) is logged and the thread runs on as it is.
#![allow(unsafe_code)] // sched_setscheduler on the calling thread

/// Scheduling class of the background threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackgroundCpu {
    /// `SCHED_OTHER`, like the request path.
    Normal,
    /// `SCHED_BATCH`: a fair share, no wakeup preemption (the default).
    #[default]
    Batch,
    /// `SCHED_IDLE`: only CPU time nothing else wants.
    Idle,
}

impl BackgroundCpu {
    /// Every class, in the order flags and messages list them.
    pub const ALL: [BackgroundCpu; 3] = [BackgroundCpu::Normal, BackgroundCpu::Batch, BackgroundCpu::Idle];

    /// The policy's name, as `parse` takes it.
    pub fn name(self) -> &'static str {
        match self {
            BackgroundCpu::Normal => "normal",
            BackgroundCpu::Batch => "batch",
            BackgroundCpu::Idle => "idle",
        }
    }

    /// The class named `s`, or a message listing the names.
    pub fn parse(s: &str) -> Result<BackgroundCpu, String> {
        Self::ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            let names: Vec<_> = Self::ALL.iter().map(|c| c.name()).collect();
            format!("'{s}' is not a background CPU class ({})", names.join(", "))
        })
    }

    fn linux_policy(self) -> libc::c_int {
        match self {
            BackgroundCpu::Normal => libc::SCHED_OTHER,
            BackgroundCpu::Batch => libc::SCHED_BATCH,
            BackgroundCpu::Idle => libc::SCHED_IDLE,
        }
    }

    /// Puts the calling thread in this class; threads it spawns inherit it.
    pub fn apply_to_current_thread(self) {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: pid 0 is the calling thread; `param` outlives the call.
        let rc = unsafe { libc::sched_setscheduler(0, self.linux_policy(), &param) };
        if rc != 0 {
            tracing::warn!(
                policy = self.name(),
                error = %std::io::Error::last_os_error(),
                "could not set a background thread's CPU policy; it runs as it was"
            );
        }
    }
}

/// The calling thread's scheduling policy as Linux reports it.
pub fn current_thread_policy() -> Option<BackgroundCpu> {
    // SAFETY: no arguments; reads the calling thread's policy.
    let p = unsafe { libc::sched_getscheduler(0) };
    BackgroundCpu::ALL.into_iter().find(|c| c.linux_policy() == p)
}
