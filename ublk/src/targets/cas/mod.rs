//! The store daemon: one process per store serves every attached image.
//! The request path itself (scheduler, workers, in-place serving) is the
//! `serve` crate; this module is its ublk frontend and control plane.
//!
//! ```text
//!   casblk add --image A ──┐ control socket (line JSON, 0600)
//!   casblk stats ──────────┤
//!                          v
//!   Daemon ── Store (cas) ── Image A, Image B ...
//!     │                        ^ blocking engine calls
//!     ├─ per device: ublk queue threads ──submit──> SharedScheduler <──next── worker pool
//!     │        ^                                                       │ FLUSH, FUA
//!     │        │                                                  sync threads
//!     │        └────────── eventfd + result ───────────────────────────┘
//!     └─ stats: per-image Tracer + sched and cas counters
//! ```
//!
//! The first `add` of a store starts the daemon; later ones reach it over
//! its socket. The daemon exits when its last device is deleted, after
//! flushing every image, or on SIGTERM/SIGINT (which stops every device).

mod bridge;
mod control;
mod links;
mod queue;
mod settings;
mod staging;

pub use control::{serve_store, socket_path, AddImageArgs, Serve, DEFAULT_SCRUB_RATE_BYTES_PER_SEC};
pub use settings::StoreSettings;

use serve::Sched;

/// An attached image as this daemon serves it: the request path's device
/// (`serve`) with libublk's tag buffers.
type DeviceCore = serve::DeviceCore<bridge::TagBuffers>;
/// The attached images, for the workers.
type Registry = serve::Registry<bridge::TagBuffers>;
