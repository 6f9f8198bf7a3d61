//! The store daemon: one process per store serves every attached image.
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
mod device;
mod links;
mod queue;
mod settings;
mod syncs;
mod worker;

pub use control::{serve_store, socket_path, AddImageArgs, Serve};
pub use settings::StoreSettings;

use device::DeviceCore;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// The scheduler shared by every device of the daemon.
pub type Sched = sched::SharedScheduler<sched::MonotonicClock, EngineCapacity>;

/// The scheduler's view of log capacity: each image's non-blocking
/// reservation.
#[derive(Default)]
pub struct EngineCapacity {
    images: HashMap<sched::ImageId, Arc<cas::image::Image>>,
}

impl sched::Capacity for EngineCapacity {
    type Reservation = cas::image::LogReservation;

    fn try_reserve(
        &mut self,
        image: sched::ImageId,
        op: sched::Op,
        len_bytes: u64,
    ) -> Option<Self::Reservation> {
        let img = self.images.get(&image)?;
        let kind = match op {
            sched::Op::Write => cas::wal::RecordKind::Write,
            sched::Op::WriteZeroes => cas::wal::RecordKind::WriteZeroes,
            sched::Op::Discard => cas::wal::RecordKind::Discard,
            sched::Op::Read | sched::Op::Flush => unreachable!("sched reserves only for write kinds"),
        };
        img.try_reserve(img.log_bytes_needed(kind, len_bytes))
    }
}

/// Attached devices by scheduler id, for the workers.
#[derive(Default)]
pub struct Registry {
    devices: RwLock<HashMap<sched::ImageId, Arc<DeviceCore>>>,
}

impl Registry {
    pub fn get(&self, id: sched::ImageId) -> Option<Arc<DeviceCore>> {
        self.devices.read().unwrap_or_else(|p| p.into_inner()).get(&id).cloned()
    }

    fn insert(&self, core: Arc<DeviceCore>) {
        self.devices.write().unwrap_or_else(|p| p.into_inner()).insert(core.sched_id, core);
    }

    fn remove(&self, id: sched::ImageId) {
        self.devices.write().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }

    fn all(&self) -> Vec<Arc<DeviceCore>> {
        self.devices.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }
}
