//! Every metric casblk exposes: its name, type, help and labels. The only
//! place a metric is named; docs/metrics.md and the tests check against it.

/// A metric family's Prometheus type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric family.
#[derive(Clone, Copy, Debug)]
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    pub labels: &'static [&'static str],
}

const fn family(
    name: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    help: &'static str,
) -> Family {
    Family { name, kind, help, labels }
}

use Kind::{Counter, Gauge, Histogram};

const IMAGE: &[&str] = &["image"];
const IMAGE_OP: &[&str] = &["image", "op"];
const IMAGE_OP_GATE: &[&str] = &["image", "op", "gate"];
const IMAGE_CLASS: &[&str] = &["image", "class"];
const NONE: &[&str] = &[];

/// Every family, in exposition order.
pub const FAMILIES: &[Family] = &[
    family("casblk_image_requests_total", Counter, IMAGE_OP, "Requests completed, successful or not."),
    family("casblk_image_request_bytes_total", Counter, IMAGE_OP, "Bytes of the requests completed."),
    family("casblk_image_request_errors_total", Counter, IMAGE_OP, "Requests completed with an error."),
    family(
        "casblk_image_request_duration_seconds",
        Histogram,
        IMAGE_OP,
        "Request latency, from the daemon seeing the request to its completion.",
    ),
    family(
        "casblk_image_gate_waits_total",
        Counter,
        IMAGE_OP_GATE,
        "Times requests waited at a gate (log capacity, overlap, flush barrier, read credits, scheduler turn, rate limit).",
    ),
    family(
        "casblk_image_gate_wait_seconds_total",
        Counter,
        IMAGE_OP_GATE,
        "Time requests spent waiting at a gate.",
    ),
    family(
        "casblk_image_state",
        Gauge,
        &["image", "state"],
        "1 for the image's state (live, failed, log_closed, recovering), 0 for the others.",
    ),
    family("casblk_image_size_bytes", Gauge, IMAGE, "The image's size (what the guest sees)."),
    family(
        "casblk_image_limit_iops",
        Gauge,
        IMAGE_CLASS,
        "The device's IO limit in requests a second, by class (read, write); no sample: unlimited.",
    ),
    family(
        "casblk_image_limit_bytes_per_second",
        Gauge,
        IMAGE_CLASS,
        "The device's IO limit in bytes a second, by class (read, write); no sample: unlimited.",
    ),
    family(
        "casblk_image_rate_limited_requests_total",
        Counter,
        IMAGE,
        "Requests the image's IO limits held before admitting them.",
    ),
    family("casblk_image_log_used_bytes", Gauge, IMAGE, "Write-ahead log bytes in use."),
    family(
        "casblk_image_log_quota_bytes",
        Gauge,
        IMAGE,
        "Write-ahead log quota; writes wait when it is full.",
    ),
    family(
        "casblk_image_log_capacity_waits_total",
        Counter,
        IMAGE,
        "Writes that waited for log capacity (each counted once).",
    ),
    family(
        "casblk_image_compaction_backlog_records",
        Gauge,
        IMAGE,
        "Log records written and not yet compacted into shared chunks.",
    ),
    family("casblk_image_compaction_passes_total", Counter, IMAGE, "Compaction passes finished."),
    family("casblk_image_compaction_errors_total", Counter, IMAGE, "Compaction passes that failed."),
    family(
        "casblk_image_compaction_input_bytes_total",
        Counter,
        IMAGE,
        "Log payload bytes compaction moved into chunks.",
    ),
    family(
        "casblk_image_unpublished_seconds",
        Gauge,
        IMAGE,
        "Age of the oldest compacted change not yet published to the bucket (0 without a bucket).",
    ),
    family("casblk_store_images", Gauge, NONE, "Images in the store."),
    family(
        "casblk_store_logical_bytes",
        Gauge,
        NONE,
        "Bytes the images' manifests map to chunks (compacted data).",
    ),
    family("casblk_store_unique_bytes", Gauge, NONE, "Bytes of the distinct chunks stored."),
    family("casblk_store_stored_bytes", Gauge, NONE, "Pack file bytes, headers and dead slots included."),
    family("casblk_store_chunks", Gauge, NONE, "Distinct chunks stored."),
    family("casblk_store_dedup_ratio", Gauge, NONE, "Mapped blocks per stored chunk."),
    family("casblk_store_fs_size_bytes", Gauge, NONE, "Size of the filesystem the store is on."),
    family(
        "casblk_store_fs_avail_bytes",
        Gauge,
        NONE,
        "Free bytes left on the store's filesystem (statvfs f_bavail: without the root reserve).",
    ),
    family(
        "casblk_store_provisioned_bytes",
        Gauge,
        NONE,
        "Sum of the writable images' sizes: what the guests were promised.",
    ),
    family(
        "casblk_store_overcommit_ratio",
        Gauge,
        NONE,
        "Provisioned bytes over the filesystem's size (above 1: thin provisioning overcommits).",
    ),
    family(
        "casblk_store_space_warning",
        Gauge,
        NONE,
        "1 while the store's filesystem is at least --space-warn percent full.",
    ),
    family(
        "casblk_store_space_reserve_bytes",
        Gauge,
        NONE,
        "Free space guest writes may not take: compaction and GC keep it to free space (0: none).",
    ),
    family(
        "casblk_store_space_state",
        Gauge,
        NONE,
        "0 above the space reserve; 1 below it (writes that need new space wait for GC); 2 full (they fail with ENOSPC).",
    ),
    family(
        "casblk_store_space_refusals_total",
        Counter,
        NONE,
        "Writes failed with ENOSPC because the store was full and GC could not free space.",
    ),
    family(
        "casblk_store_space_low_episodes_total",
        Counter,
        NONE,
        "Times the store went below its space reserve.",
    ),
    family(
        "casblk_store_chunk_cache_hits_total",
        Counter,
        NONE,
        "Chunk reads served by the clean chunk cache.",
    ),
    family(
        "casblk_store_chunk_cache_misses_total",
        Counter,
        NONE,
        "Chunk reads the clean chunk cache missed.",
    ),
    family("casblk_store_gc_passes_total", Counter, NONE, "GC passes finished (manual and automatic)."),
    family("casblk_store_gc_auto_failures_total", Counter, NONE, "Automatic GC passes that failed."),
    family(
        "casblk_store_gc_reclaimed_bytes_total",
        Counter,
        NONE,
        "Pack bytes the finished GC passes gave back.",
    ),
    family(
        "casblk_store_remote_upload_pending_bytes",
        Gauge,
        NONE,
        "Bytes of sealed packs not yet uploaded to the bucket (0 without a bucket).",
    ),
    family(
        "casblk_store_remote_upload_pending_packs",
        Gauge,
        NONE,
        "Sealed packs not yet uploaded to the bucket (0 without a bucket).",
    ),
    family("casblk_store_remote_uploaded_bytes_total", Counter, NONE, "Bytes uploaded to the bucket."),
    family(
        "casblk_store_remote_upload_errors_total",
        Counter,
        NONE,
        "Failed upload attempts (each is retried).",
    ),
    family("casblk_store_scrub_running", Gauge, NONE, "1 while a scrub pass runs."),
    family("casblk_store_scrub_passes_total", Counter, NONE, "Scrub passes finished."),
    family("casblk_store_scrub_checked_bytes_total", Counter, NONE, "Chunk bytes scrubs read back and checked."),
    family(
        "casblk_store_scrub_damaged_chunks",
        Gauge,
        NONE,
        "Damaged chunks the last scrub pass found (0 before the first).",
    ),
    family("casblk_daemon_resident_memory_bytes", Gauge, NONE, "The store daemon's resident memory."),
    family("casblk_daemon_threads", Gauge, NONE, "The store daemon's threads."),
];

/// Per-image families read straight off a counter source:
/// (family, source, counter, scale to the family's unit).
pub const IMAGE_COUNTERS: &[(&str, &str, &str, f64)] = &[
    ("casblk_image_size_bytes", "cas", "size_bytes", 1.0),
    ("casblk_image_rate_limited_requests_total", "sched", "rate_limited_admissions", 1.0),
    ("casblk_image_log_used_bytes", "cas", "log_used_bytes", 1.0),
    ("casblk_image_log_quota_bytes", "cas", "log_quota_bytes", 1.0),
    ("casblk_image_log_capacity_waits_total", "cas", "capacity_waits", 1.0),
    ("casblk_image_compaction_passes_total", "cas", "compaction.passes", 1.0),
    ("casblk_image_compaction_errors_total", "cas", "compaction.errors", 1.0),
    ("casblk_image_compaction_input_bytes_total", "cas", "compaction.input_bytes", 1.0),
    ("casblk_image_unpublished_seconds", "cas", "remote.unpublished_ms", 1e-3),
];

/// Store families read straight off a counter source, as above. A
/// `remote` counter is 0 where the store has no bucket.
pub const STORE_COUNTERS: &[(&str, &str, &str, f64)] = &[
    ("casblk_store_images", "store", "images", 1.0),
    ("casblk_store_logical_bytes", "store", "mapped_bytes", 1.0),
    ("casblk_store_unique_bytes", "store", "unique_bytes", 1.0),
    ("casblk_store_stored_bytes", "store", "stored_bytes", 1.0),
    ("casblk_store_chunks", "store", "chunks", 1.0),
    ("casblk_store_dedup_ratio", "store", "dedup_ratio", 1.0),
    ("casblk_store_fs_size_bytes", "store", "fs_size_bytes", 1.0),
    ("casblk_store_fs_avail_bytes", "store", "fs_avail_bytes", 1.0),
    ("casblk_store_provisioned_bytes", "store", "provisioned_bytes", 1.0),
    ("casblk_store_overcommit_ratio", "store", "overcommit_ratio", 1.0),
    ("casblk_store_space_warning", "space", "warning", 1.0),
    ("casblk_store_space_reserve_bytes", "store", "space_reserve_bytes", 1.0),
    ("casblk_store_space_state", "store", "space_state", 1.0),
    ("casblk_store_space_refusals_total", "store", "space_refusals", 1.0),
    ("casblk_store_space_low_episodes_total", "store", "space_low_episodes", 1.0),
    ("casblk_store_chunk_cache_hits_total", "chunks", "cache_hits", 1.0),
    ("casblk_store_chunk_cache_misses_total", "chunks", "cache_misses", 1.0),
    ("casblk_store_gc_passes_total", "store", "gc_passes", 1.0),
    ("casblk_store_gc_auto_failures_total", "store", "gc_auto_failures", 1.0),
    ("casblk_store_gc_reclaimed_bytes_total", "store", "gc_reclaimed_bytes", 1.0),
    ("casblk_store_remote_upload_pending_bytes", "remote", "pending_upload_bytes", 1.0),
    ("casblk_store_remote_upload_pending_packs", "remote", "sealed_packs", 1.0),
    ("casblk_store_remote_uploaded_bytes_total", "remote", "uploaded_bytes", 1.0),
    ("casblk_store_remote_upload_errors_total", "remote", "upload_errors", 1.0),
    ("casblk_store_scrub_running", "scrub", "running", 1.0),
    ("casblk_store_scrub_passes_total", "scrub", "passes", 1.0),
    ("casblk_store_scrub_checked_bytes_total", "scrub", "bytes_checked", 1.0),
    ("casblk_store_scrub_damaged_chunks", "scrub", "last_damaged_chunks", 1.0),
    ("casblk_daemon_resident_memory_bytes", "process", "resident_bytes", 1.0),
    ("casblk_daemon_threads", "process", "threads", 1.0),
];

/// The family named `name`.
pub fn find(name: &str) -> Option<&'static Family> {
    FAMILIES.iter().find(|f| f.name == name)
}
