//! The scheduler's view of log capacity: each attached image's
//! non-blocking reservation.

use std::collections::HashMap;
use std::sync::Arc;

/// Log capacity of the attached images, for [`crate::Sched`].
#[derive(Default)]
pub struct EngineCapacity {
    images: HashMap<sched::ImageId, Arc<cas::image::Image>>,
}

impl EngineCapacity {
    /// Makes `image` reservable as scheduler image `id`.
    pub fn insert(&mut self, id: sched::ImageId, image: Arc<cas::image::Image>) {
        self.images.insert(id, image);
    }

    /// Forgets scheduler image `id`.
    pub fn remove(&mut self, id: sched::ImageId) {
        self.images.remove(&id);
    }
}

impl sched::Capacity for EngineCapacity {
    type Reservation = cas::image::LogReservation;

    fn try_reserve(
        &mut self,
        image: sched::ImageId,
        op: sched::Op,
        len_bytes: u64,
    ) -> Result<Self::Reservation, sched::Gate> {
        // A device that went away: its writes wait until they are dropped.
        let img = self.images.get(&image).ok_or(sched::Gate::LogCapacity)?;
        let kind = match op {
            sched::Op::Write => cas::wal::RecordKind::Write,
            sched::Op::WriteZeroes => cas::wal::RecordKind::WriteZeroes,
            sched::Op::Discard => cas::wal::RecordKind::Discard,
            sched::Op::Read | sched::Op::Flush => unreachable!("sched reserves only for write kinds"),
        };
        img.try_reserve_for(kind, len_bytes).map_err(|held| match held {
            cas::image::Held::LogFull => sched::Gate::LogCapacity,
            cas::image::Held::NoSpace => sched::Gate::StoreSpace,
        })
    }
}
