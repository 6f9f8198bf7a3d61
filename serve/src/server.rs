//! The request path of one daemon: the scheduler every attached image
//! shares, the registry of attached images, the worker pool and the sync
//! threads; attaching and detaching a device's core.
//!
//! ```text
//!  start(config, workers, syncs)   scheduler + registry + threads
//!  attach(core)                    scheduler image, log capacity, the image's
//!                                  capacity listener -> capacity_released,
//!                                  registry entry
//!  detach(core)                    the same, undone (the frontend flushes first)
//!  shutdown()                      the scheduler stops; threads joined
//! ```

use crate::{worker, DeviceCore, EngineCapacity, Registry, Sched, TagBuffers};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long `detach` waits for a device's executing requests to finish.
/// A request executes for at most a capacity wait bounded by the log's
/// closing after repeated compaction failures (about 5 s) plus one I/O.
pub const DETACH_DRAIN: Duration = Duration::from_secs(30);

/// A running request path; see the module docs.
pub struct Server<B> {
    pub sched: Arc<Sched>,
    pub registry: Arc<Registry<B>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl<B: TagBuffers> Server<B> {
    /// A scheduler of `config` with `workers` workers and `syncs` sync
    /// threads (0: workers serve FLUSH and FUA themselves).
    pub fn start(config: sched::Config, workers: usize, syncs: usize) -> Result<Server<B>, sched::Error> {
        let scheduler = sched::Scheduler::new(config, sched::MonotonicClock::new())?;
        let sched = Arc::new(sched::SharedScheduler::new(scheduler, EngineCapacity::default()));
        let registry = Arc::new(Registry::default());
        let threads = worker::spawn(workers, syncs, &sched, &registry);
        Ok(Server { sched, registry, threads: Mutex::new(threads) })
    }

    /// Starts serving `core`'s requests: its image joins the scheduler and
    /// its log's capacity, and reclamation in the image wakes the writers
    /// the scheduler holds for capacity.
    pub fn attach(&self, core: Arc<DeviceCore<B>>) -> Result<(), sched::Error> {
        let id = core.sched_id;
        self.sched.add_image(id)?;
        self.sched.with_capacity(|k| k.insert(id, core.image.clone()));
        let weak = Arc::downgrade(&self.sched);
        core.image.set_capacity_listener(Arc::new(move || {
            if let Some(s) = weak.upgrade() {
                s.capacity_released(id);
            }
        }));
        self.registry.insert(core);
        Ok(())
    }

    /// Stops serving `core` (its queues stopped; the frontend flushes the
    /// image). Requests still executing are waited for, up to
    /// `DETACH_DRAIN` (30 s; their workers need the registry entry and the
    /// image's capacity to finish); then everything is undone, even if the
    /// scheduler still refuses. Returns the requests that were still
    /// waiting (the scheduler's `remove_image`).
    pub fn detach(&self, core: &DeviceCore<B>) -> Result<Vec<sched::Descriptor>, sched::Error> {
        core.image.set_capacity_listener(Arc::new(|| {}));
        let deadline = Instant::now() + DETACH_DRAIN;
        let removed = loop {
            match self.sched.remove_image(core.sched_id) {
                Err(sched::Error::ImageBusy { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                other => break other,
            }
        };
        self.sched.with_capacity(|k| k.remove(core.sched_id));
        self.registry.remove(core.sched_id);
        removed
    }

    /// Stops the scheduler and joins the workers and sync threads.
    pub fn shutdown(&self) {
        self.sched.shutdown();
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for t in threads {
            let _ = t.join();
        }
    }
}
