//! Admission and scheduling for casblk: descriptor snapshots, read bypass,
//! log-capacity waits, per-image IO limits and deficit round robin across
//! images.
//!
//! ```text
//!  queue threads --submit(image, Descriptor)--> [frontier per image]
//!                                                 | ordering contract
//!                                                 | read credits, write slots
//!                                                 | log reservation (Capacity)
//!                                                 v
//!  workers <--next() / next_blocking()-- DRR over images (bytes)
//!  workers --complete(image, request)--> frees credits, slots, order
//!  engine  --capacity_released(image)--> held writes retry now
//! ```
//!
//! The ordering contract is written down in `docs/design.md` ("Admission and
//! ordering"). [`Scheduler`] is single-threaded and deterministic under a
//! [`FakeClock`]; [`SharedScheduler`] wraps it for threads.
#![deny(unsafe_code)]

mod capacity;
mod clock;
mod config;
mod counters;
mod descriptor;
mod error;
mod frontier;
mod rate;
mod scheduler;
mod shared;
mod waits;

pub use capacity::Capacity;
pub use clock::{Clock, FakeClock, MonotonicClock};
pub use config::{Config, DEFAULT_FRONTIER_QUOTA_BYTES, DESCRIPTOR_SLOT_BYTES};
pub use counters::{ImageCounters, LimitCounters};
pub use descriptor::{Descriptor, ImageId, Op, RequestId, Ticket, METADATA_OP_COST_BYTES};
pub use error::Error;
pub use rate::{
    Limits, RateLimit, BURST_MAX_SECONDS, BYTES_PER_SEC_MAX, BYTES_PER_SEC_MIN, IOPS_MAX, IOPS_MIN,
};
pub use scheduler::{Dispatch, InPlace, Scheduler};
pub use shared::{Next, SharedScheduler};
pub use trace::Gate;
pub use waits::GateWaits;
