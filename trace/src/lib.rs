//! casblk request tracing: where each request's time went, and why.
//!
//! * [`RequestTrace`] — a fixed-size value carried with one request: phase
//!   timestamps (seen, admitted, dispatched, I/O spans by source, executed),
//!   and the [`Gate`]s it waited on with their durations.
//! * [`Tracer`] — one per image; [`Tracer::finish`] folds a completed trace
//!   into sharded latency histograms (total and per [`Phase`], per [`Op`]),
//!   gate-wait sums, and the 32 slowest reads with their breakdown.
//! * [`Snapshot`] — the serde schema of `casblk stats --json`
//!   (`docs/stats-schema.md`), with named counter sources from other crates
//!   attached as [`Counters`].
//! * [`stats`] — the root-only unix socket server and client, and
//!   [`render_table`] for the CLI, in the human units of [`human_bytes`]
//!   and friends.
//!
//! `trace` depends on none of `sched`, `cas` or `ublk`; they record into it.
#![deny(unsafe_code)]

mod clock;
mod counters;
mod error;
mod gate;
mod hist;
mod phases;
mod render;
mod request;
mod schema;
mod slowest;
pub mod stats;
mod tracer;
mod units;

pub use clock::now_ns;
pub use counters::{counters_from, counters_from_value, CounterValue, Counters};
pub use error::{Error, Result};
pub use gate::Gate;
pub use hist::LATENCY_BUCKET_BOUNDS_US;
pub use phases::{Phase, PhaseDurations};
pub use render::{render_table, render_table_since};
pub use request::{IoSource, IoSpan, IoSpanId, Op, RequestTrace, MAX_IO_SPANS};
pub use schema::{
    image_state, GateStats, GateWait, ImageStats, IoSpanStats, LatencyStats, OpStats, OpsStats,
    PhaseDurationsNs, PhasesStats, SlowRequest, Snapshot, SCHEMA_VERSION,
};
pub use tracer::{Tracer, TracerConfig, MAX_SHARDS, SLOWEST_READS};
pub use units::{human_bytes, human_count, human_ms, human_ns, human_rate, human_us};
