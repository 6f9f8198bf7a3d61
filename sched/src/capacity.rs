//! The scheduler's view of an image's write-ahead log: a non-blocking
//! reservation. sched does not depend on the engine; the daemon adapts the
//! engine (`log_bytes_needed(kind, len)` then `try_reserve(bytes)`) to this
//! trait, and tests use a fake.

use crate::descriptor::{ImageId, Op};
use trace::Gate;

/// Log capacity for write-kind requests (WRITE, WRITE_ZEROES, DISCARD).
///
/// FLUSH and READ never reserve: a FLUSH must always be able to make the
/// log durable, because the compactor only reclaims durable log, so a FLUSH
/// that waited for capacity could wait forever.
///
/// Lock order: the scheduler calls `try_reserve` while holding its own lock,
/// so the engine must not call `capacity_released` while holding a lock that
/// `try_reserve` takes.
pub trait Capacity {
    /// Proof of a reservation, handed to the worker that writes the request.
    type Reservation: Send;

    /// Reserves what `op` of `len_bytes` needs in `image`'s log, or names
    /// the gate that holds it: [`Gate::LogCapacity`] when the log is full,
    /// [`Gate::StoreSpace`] when the store is below its space reserve.
    /// Never blocks. A refusal is not an error: the request waits until
    /// `capacity_released` or the periodic retry.
    fn try_reserve(&mut self, image: ImageId, op: Op, len_bytes: u64) -> Result<Self::Reservation, Gate>;
}
