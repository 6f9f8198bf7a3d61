//! The request path of casblk's store daemon, from a tag's descriptor to
//! its completion, without ublk: a frontend (the `casblk` binary's ublk
//! queue threads, or a benchmark's load generator) feeds it requests and
//! commits the results it posts back.
//!
//! ```text
//!  frontend queue thread              serve                                    cas
//!  put_job(qid, tag, Job) ──────────> SharedScheduler (sched) <──next── worker pool ──> Image
//!  submit / submit_*_in_place         read_in_place, write_in_place               │ FLUSH, FUA
//!       ^                             (on the queue thread, data in memory)   sync threads
//!       └──── Completions (eventfd) <── Done { tag, result, trace } ──────────┘
//! ```
//!
//! What it owns, one concept per file:
//! - `server.rs`: the running path (scheduler, registry, threads) and
//!   attaching and detaching a device;
//! - `capacity.rs`: the scheduler's view of each image's log capacity;
//! - `registry.rs`: the attached images by scheduler id;
//! - `submit.rs`: a delivered request checked, recorded and submitted
//!   (in place when it can be);
//! - `device.rs`: one attached image: its per-tag jobs (one table per
//!   queue), tracer, tag buffers and completion mailboxes;
//! - `buffers.rs`: the per-tag payload buffers a frontend provides;
//! - `completions.rs`: results on their way back to their queue thread;
//! - `worker.rs`: the worker pool and requests served in place;
//! - `syncs.rs`: the sync threads that FLUSH and FUA requests run on;
//! - `failure_log.rs`: the bound on log lines for failing requests;
//! - `file_stand_in.rs`: a plain file in the engine's place, for a
//!   benchmark's baseline.
//!
//! On kernels before 6.16 only a queue's own thread may commit its tags,
//! so every result goes back to that thread through its [`Completions`].

mod buffers;
mod capacity;
mod completions;
mod device;
pub mod failure_log;
mod file_stand_in;
pub mod process_memory;
mod registry;
mod server;
mod submit;
mod syncs;
pub mod worker;

pub use buffers::{HeapBuffers, TagBuffers};
pub use capacity::EngineCapacity;
pub use completions::{Completions, Done};
pub use device::{request_id, split_request, tag_buffer_bytes, DeviceCore, Job, QueueShared, ReadStandIn};
pub use file_stand_in::FileStandIn;
pub use registry::Registry;
pub use server::Server;
pub use submit::{finish, submit, Request, Submitted, WRITE_IN_PLACE_MAX_BYTES};

/// The scheduler shared by every device of a daemon.
pub type Sched = sched::SharedScheduler<sched::MonotonicClock, EngineCapacity>;
