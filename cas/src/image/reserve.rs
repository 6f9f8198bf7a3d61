//! Reservations that also ask the store's space reserve (cas::space): a
//! request that may roll the log into a new segment takes new space from
//! the store's filesystem, so below the reserve it is held, and once GC
//! cannot free space it gets a refusal that fails it with ENOSPC. A
//! request that fits in the current segment (allocated whole when it was
//! made) never asks.

use super::capacity::CAPACITY_RETRY_MS;
use super::{Image, LogReservation};
use crate::error::{Error, Result};
use crate::space::{SpaceClass, SpacePhase, SpaceVerdict};
use crate::wal::RecordKind;
use std::time::Duration;

/// Why a non-blocking reservation did not get log bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// The image's log quota is used up until compaction reclaims some.
    LogFull,
    /// The write needs a new log segment and the store is below its space
    /// reserve while GC may free room.
    NoSpace,
}

impl Image {
    /// Reserves what a request of `kind` over `len` bytes needs, if it may
    /// go on now; never blocks. Like [`Image::try_reserve`], and a write
    /// that needs a new log segment also asks the store's space reserve
    /// ([`crate::space`]): below it the write is held ([`Held::NoSpace`])
    /// while GC may free room, and gets a refusal that fails it with ENOSPC
    /// once GC cannot.
    pub fn try_reserve_for(&self, kind: RecordKind, len: u64) -> std::result::Result<LogReservation, Held> {
        let bytes = self.log_bytes_needed(kind, len);
        if let Some(why) = self.durability.failed_because() {
            return Ok(self.capacity.refusal(why.into()));
        }
        match self.space_verdict(kind, bytes) {
            SpaceVerdict::Grant => {}
            SpaceVerdict::Wait => return Err(Held::NoSpace),
            SpaceVerdict::Refuse(why) => return Ok(self.capacity.no_space_refusal(why.into())),
        }
        self.capacity.try_reserve(bytes).ok_or(Held::LogFull)
    }

    /// True while the store is below its space reserve.
    pub fn store_space_low(&self) -> bool {
        self.space.phase() != SpacePhase::Ok
    }

    /// Waits (retrying every [`CAPACITY_RETRY_MS`], as the scheduler holds
    /// its writes) until the space reserve lets `bytes` more log for
    /// `kind` go on; fails with ENOSPC once it refuses, or when the image
    /// fails meanwhile.
    pub(super) fn wait_for_space(&self, kind: RecordKind, bytes: u64) -> Result<()> {
        loop {
            self.durability.check()?;
            match self.space_verdict(kind, bytes) {
                SpaceVerdict::Grant => return Ok(()),
                SpaceVerdict::Wait => std::thread::sleep(Duration::from_millis(CAPACITY_RETRY_MS)),
                SpaceVerdict::Refuse(why) => {
                    return Err(Error::NoSpace(format!("image {}: {why}", self.name)))
                }
            }
        }
    }

    /// What the space reserve says of `bytes` more log for `kind`: only a
    /// request that may roll into a new segment asks.
    fn space_verdict(&self, kind: RecordKind, bytes: u64) -> SpaceVerdict {
        if self.capacity.reserved_bytes() + bytes <= self.log.tail_room_bytes() {
            return SpaceVerdict::Grant;
        }
        let class = if kind == RecordKind::Write { SpaceClass::Write } else { SpaceClass::Range };
        self.space.check_with_grace(class, &self.space_grace)
    }
}
