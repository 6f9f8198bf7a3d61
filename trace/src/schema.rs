//! The stats snapshot: the JSON that `casblk stats --json` prints and the
//! stats socket returns. Every field is documented in
//! `docs/stats-schema.md`; a test keeps the two in step.
//!
//! ```text
//! Snapshot { schema_version, clock_ms, counters{source{name: number}},
//!   images[ { name, since_ms, counters{...},
//!             ops { read|write|flush|discard|write_zeroes:
//!                   { count, errors, bytes, latency{LatencyStats},
//!                     phases{ admission|dispatch|io_*|execute|complete: LatencyStats },
//!                     gates{ log_capacity|...: GateStats } } },
//!             slowest_reads[ SlowRequest ] } ] }
//! ```
//!
//! Units are last in names (`latency_us_p99`, `wait_ms_max`, `total_ns`).
//! Readers refuse a `schema_version` newer than [`SCHEMA_VERSION`]; fields
//! are only ever added within a version, and unknown fields are ignored.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::counters::Counters;
use crate::{Error, Op, Result};

/// Version of the snapshot layout. Bump it when a field changes meaning or
/// disappears.
pub const SCHEMA_VERSION: u32 = 1;

/// The whole daemon's stats at one moment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub schema_version: u32,
    /// When the snapshot was taken, in ms since the daemon's trace epoch.
    pub clock_ms: f64,
    /// One entry per served image, in the daemon's order.
    pub images: Vec<ImageStats>,
    /// Daemon-wide counter sources (shared chunk store, chunk cache, ...).
    #[serde(default)]
    pub counters: BTreeMap<String, Counters>,
    /// The upper bounds, in µs, of every op's `latency_buckets` (empty from
    /// a daemon that sends no buckets).
    #[serde(default)]
    pub latency_bucket_bounds_us: Vec<f64>,
}

/// The values of [`ImageStats::state`].
pub mod image_state {
    /// The image works.
    pub const LIVE: &str = "live";
    /// A sync or a write's voiding failed: writes and flushes get EIO.
    pub const FAILED: &str = "failed";
    /// Compaction kept failing: writes that do not fit in the log get EIO.
    pub const LOG_CLOSED: &str = "log_closed";
    /// A daemon is taking the device over and replaying its log.
    pub const RECOVERING: &str = "recovering";
    pub const ALL: [&str; 4] = [LIVE, FAILED, LOG_CLOSED, RECOVERING];

    /// The state a `failure` text gives (an older daemon sends no state).
    pub fn of_failure(failure: &str) -> &'static str {
        if failure.is_empty() {
            LIVE
        } else if failure.starts_with("log closed") {
            LOG_CLOSED
        } else {
            FAILED
        }
    }
}

/// One image's stats since tracing began (or was reset).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImageStats {
    pub name: String,
    /// Empty while the image works; otherwise why it does not (it failed:
    /// writes and flushes get EIO, reads go on; or its log is closed to
    /// waiting). Set by the daemon.
    #[serde(default)]
    pub failure: String,
    /// `live`, `failed`, `log_closed` (see `failure`) or `recovering` (a
    /// daemon is taking the device over and replaying its log). Set by the
    /// daemon; empty from an older one.
    #[serde(default)]
    pub state: String,
    /// When this image's statistics start, in ms since the trace epoch.
    pub since_ms: f64,
    pub ops: OpsStats,
    /// The slowest completed reads, slowest first (at most 32 by default).
    pub slowest_reads: Vec<SlowRequest>,
    /// Per-image counter sources (`sched`, `cas`, ...).
    #[serde(default)]
    pub counters: BTreeMap<String, Counters>,
}

/// Per-op statistics of one image.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OpsStats {
    pub read: OpStats,
    pub write: OpStats,
    pub flush: OpStats,
    pub discard: OpStats,
    pub write_zeroes: OpStats,
}

impl OpsStats {
    pub fn get(&self, op: Op) -> &OpStats {
        match op {
            Op::Read => &self.read,
            Op::Write => &self.write,
            Op::Flush => &self.flush,
            Op::Discard => &self.discard,
            Op::WriteZeroes => &self.write_zeroes,
        }
    }

    pub fn get_mut(&mut self, op: Op) -> &mut OpStats {
        match op {
            Op::Read => &mut self.read,
            Op::Write => &mut self.write,
            Op::Flush => &mut self.flush,
            Op::Discard => &mut self.discard,
            Op::WriteZeroes => &mut self.write_zeroes,
        }
    }
}

/// Completed requests of one op.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OpStats {
    /// Completed requests (successful or not).
    pub count: u64,
    /// Completed with a negative result.
    pub errors: u64,
    /// Sum of request lengths.
    pub bytes: u64,
    /// Total latency: seen -> completed.
    pub latency: LatencyStats,
    /// Exact sum of the total latencies.
    #[serde(default)]
    pub latency_us_total: f64,
    /// Requests whose total latency is at most each bound of the snapshot's
    /// `latency_bucket_bounds_us` (cumulative, as Prometheus histograms are).
    #[serde(default)]
    pub latency_buckets: Vec<u64>,
    pub phases: PhasesStats,
    /// Keyed by gate name; every gate is present.
    pub gates: BTreeMap<String, GateStats>,
}

/// Distribution of one duration. All zeros when `count` is 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyStats {
    pub count: u64,
    pub latency_us_mean: f64,
    pub latency_us_p50: f64,
    pub latency_us_p99: f64,
    pub latency_us_p999: f64,
    pub latency_us_max: f64,
}

/// Per-phase distributions (see [`crate::Phase`]). An I/O phase counts only
/// the requests that had a span of that source.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PhasesStats {
    pub admission: LatencyStats,
    pub dispatch: LatencyStats,
    pub io_cache: LatencyStats,
    pub io_log: LatencyStats,
    pub io_manifest: LatencyStats,
    pub io_chunk: LatencyStats,
    pub execute: LatencyStats,
    pub complete: LatencyStats,
}

impl PhasesStats {
    pub fn get_mut(&mut self, phase: crate::Phase) -> &mut LatencyStats {
        use crate::Phase::*;
        match phase {
            Admission => &mut self.admission,
            Dispatch => &mut self.dispatch,
            IoCache => &mut self.io_cache,
            IoLog => &mut self.io_log,
            IoManifest => &mut self.io_manifest,
            IoChunk => &mut self.io_chunk,
            Execute => &mut self.execute,
            Complete => &mut self.complete,
        }
    }
}

/// Waits of one op's requests on one gate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GateStats {
    /// Requests that waited on the gate at least once.
    pub requests: u64,
    /// Separate wait episodes.
    pub waits: u64,
    /// Sum of all waits.
    pub wait_ms_total: f64,
    /// Longest total wait of one request on this gate.
    pub wait_ms_max: f64,
}

/// A retained slow request with its full breakdown. The phases add up to
/// `total_ns` exactly.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SlowRequest {
    pub op: String,
    pub queue: u16,
    pub tag: u16,
    pub offset_bytes: u64,
    pub len_bytes: u32,
    /// 0, or the negative errno it completed with.
    pub result: i32,
    /// When the daemon saw the tag, ns since the trace epoch.
    pub seen_ns: u64,
    pub total_ns: u64,
    pub phases: PhaseDurationsNs,
    /// Gates it waited on (only those with waits), longest wait first.
    pub gates: Vec<GateWait>,
    /// Its stored I/O spans, in recording order.
    pub io: Vec<IoSpanStats>,
    /// Spans folded into stored ones (see `RequestTrace::io_span`).
    pub io_spans_merged: u32,
}

/// One request's phases in ns; they sum to its `total_ns`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseDurationsNs {
    pub admission_ns: u64,
    pub dispatch_ns: u64,
    pub io_cache_ns: u64,
    pub io_log_ns: u64,
    pub io_manifest_ns: u64,
    pub io_chunk_ns: u64,
    pub execute_ns: u64,
    pub complete_ns: u64,
}

impl PhaseDurationsNs {
    pub fn sum_ns(&self) -> u64 {
        self.admission_ns
            + self.dispatch_ns
            + self.io_cache_ns
            + self.io_log_ns
            + self.io_manifest_ns
            + self.io_chunk_ns
            + self.execute_ns
            + self.complete_ns
    }
}

/// One request's waits on one gate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GateWait {
    pub gate: String,
    pub waits: u32,
    pub wait_ns: u64,
}

/// One I/O span of a retained request.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IoSpanStats {
    pub source: String,
    /// Start relative to `seen_ns` (clipped to the request's execution).
    pub start_ns: u64,
    pub duration_ns: u64,
}

impl Snapshot {
    /// A snapshot of `images` taken now.
    pub fn new(images: Vec<ImageStats>) -> Snapshot {
        Snapshot {
            schema_version: SCHEMA_VERSION,
            clock_ms: crate::clock::ns_to_ms(crate::now_ns()),
            images,
            counters: BTreeMap::new(),
            latency_bucket_bounds_us: crate::hist::LATENCY_BUCKET_BOUNDS_US.to_vec(),
        }
    }

    /// Adds a daemon-wide counter source (replacing one of the same name).
    pub fn attach(&mut self, source: impl Into<String>, counters: Counters) {
        self.counters.insert(source.into(), counters);
    }

    pub fn image(&self, name: &str) -> Option<&ImageStats> {
        self.images.iter().find(|i| i.name == name)
    }

    /// Keeps only the image `name` (all images for `None`).
    pub fn select(mut self, name: Option<&str>) -> Result<Snapshot> {
        if let Some(name) = name {
            self.images.retain(|i| i.name == name);
            if self.images.is_empty() {
                return Err(Error::NoSuchImage(name.into()));
            }
        }
        Ok(self)
    }

    /// Parses a snapshot, refusing one from a newer schema.
    pub fn from_value(value: Value) -> Result<Snapshot> {
        let found = value
            .get("schema_version")
            .and_then(Value::as_u64)
            .ok_or_else(|| Error::Protocol("snapshot has no numeric schema_version".into()))?;
        let found = u32::try_from(found).unwrap_or(u32::MAX);
        if found > SCHEMA_VERSION {
            return Err(Error::UnsupportedSchema { found, supported: SCHEMA_VERSION });
        }
        Ok(serde_json::from_value(value)?)
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("snapshot serializes (string keys, finite numbers)")
    }
}

impl ImageStats {
    /// Adds a per-image counter source (replacing one of the same name).
    pub fn attach(&mut self, source: impl Into<String>, counters: Counters) {
        self.counters.insert(source.into(), counters);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newer_schema_is_refused_with_a_message() {
        let mut v = Snapshot::new(vec![]).to_value();
        v["schema_version"] = Value::from(SCHEMA_VERSION + 1);
        let e = Snapshot::from_value(v).unwrap_err();
        assert!(matches!(e, Error::UnsupportedSchema { .. }));
        assert!(e.to_string().contains("upgrade"), "{e}");
        assert!(Snapshot::from_value(serde_json::json!({"images": []})).is_err());
    }

    #[test]
    fn select_keeps_one_image_or_errors() {
        let img = |n: &str| ImageStats { name: n.into(), ..Default::default() };
        let s = Snapshot::new(vec![img("a"), img("b")]);
        assert_eq!(s.clone().select(None).unwrap().images.len(), 2);
        let b = s.clone().select(Some("b")).unwrap();
        assert_eq!(b.images.len(), 1);
        assert_eq!(b.images[0].name, "b");
        assert!(matches!(s.select(Some("c")), Err(Error::NoSuchImage(_))));
    }
}
