//! Log capacity: the per-image quota, reservations, and the wake-ups when
//! space comes back.
//!
//! ```text
//!   quota_bytes  >=  consumed_bytes + reserved_bytes
//!                    |                |
//!                    |                +-- granted to writes not yet placed
//!                    +-- closed segments whole + the current segment's
//!                        write position (unused segment tails included)
//! ```
//!
//! - [`Image::log_bytes_needed`] bounds what one request may take.
//! - [`Capacity::try_reserve`] never blocks: it grants the bytes or says
//!   no (and remembers that someone was refused).
//! - Placing a record converts reserved bytes into consumed bytes; what a
//!   write did not use returns when its [`LogReservation`] drops.
//! - Reclamation returns consumed bytes ([`Capacity::release_consumed`]).
//! - Whenever bytes return while someone had been refused, the capacity
//!   listener is called (outside every lock) and blocked writers wake.
//!   Blocked writers also retry every [`CAPACITY_RETRY_MS`] on their own,
//!   so a missed wake-up costs a bounded delay, never a hang or an error.
//!
//! - The compactor registers a *pressure* listener: it is called (outside
//!   every lock, at most once until the compactor re-arms it) when a
//!   reservation is refused or when consumed bytes reach its threshold.
//!
//! Because the log can always hold what was reserved, the number of
//! segment files never exceeds `quota / segment_bytes + 1` (plus, briefly,
//! one more when the compactor rolls a wholly covered segment to free it).

use super::Image;
use crate::units::SECTOR_BYTES;
use crate::wal::segment::{SEGMENT_BYTES_MIN, SEGMENT_HEADER_BYTES};
use crate::wal::{RecordKind, RECORD_HEADER_BYTES};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

impl Image {
    /// Log bytes a request of `kind` over `len` bytes may need: an upper
    /// bound (record headers, splits at segment ends, the unused tail of a
    /// segment it rolls past). What a write does not use returns to the
    /// quota when it completes.
    pub fn log_bytes_needed(&self, kind: RecordKind, len: u64) -> u64 {
        match kind {
            RecordKind::Write => {
                // Every segment but the first absorbs more than half a
                // minimal segment of this request before the next roll.
                let rolls = 2 + len / (SEGMENT_BYTES_MIN / 2);
                let records = rolls + 1;
                // The unused tail (< one record header + sector) and the
                // next segment's header.
                let roll_waste = RECORD_HEADER_BYTES as u64 + SECTOR_BYTES + SEGMENT_HEADER_BYTES as u64;
                len + records * RECORD_HEADER_BYTES as u64 + rolls * roll_waste
            }
            // Range records have no payload, so a roll leaves no tail (record
            // positions are multiples of 64) but may start a segment.
            RecordKind::WriteZeroes | RecordKind::Discard => {
                RECORD_HEADER_BYTES as u64 + SEGMENT_HEADER_BYTES as u64
            }
            RecordKind::Pad => 0,
        }
    }
}

/// Period of a blocked writer's own retry.
pub const CAPACITY_RETRY_MS: u64 = 100;

/// Called when log space is released after a refusal.
pub type CapacityListener = Arc<dyn Fn() + Send + Sync>;

struct CapState {
    consumed_bytes: u64,
    reserved_bytes: u64,
    /// Someone was refused since the last release.
    refused: bool,
    /// Why space can no longer come back (see [`Capacity::close`]).
    closed: Option<Arc<str>>,
}

/// The quota accounting of one image's log.
pub struct Capacity {
    quota_bytes: u64,
    state: Mutex<CapState>,
    cond: Condvar,
    listener: Mutex<Option<CapacityListener>>,
    pressure: Mutex<Option<CapacityListener>>,
    /// Consumed bytes at which the pressure listener fires (u64::MAX: never).
    pressure_bytes: AtomicU64,
    /// The pressure listener fired and was not re-armed yet.
    pressure_sent: AtomicBool,
}

use crate::sync::lock;

/// Log bytes granted to one write (or a batch) by the quota. Dropping it
/// returns whatever was not used.
///
/// A *refusal* grants nothing: it is what a write gets instead of waiting
/// when the log's space can no longer come back (the image failed, or its
/// compaction keeps failing); the write that carries it fails with that
/// reason, so a waiter turns into an error within one retry period.
pub struct LogReservation {
    bytes: u64,
    cap: Arc<Capacity>,
    refusal: Option<Arc<str>>,
    /// The refusal is for lack of space in the store (ENOSPC), not a
    /// failed image or a closed log (EIO).
    no_space: bool,
}

impl std::fmt::Debug for LogReservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogReservation").field("bytes", &self.bytes).finish()
    }
}

impl LogReservation {
    /// Bytes still reserved.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Why the write must fail instead of waiting, for a refusal.
    pub fn refusal(&self) -> Option<&str> {
        self.refusal.as_deref()
    }

    /// True for a refusal for lack of space in the store.
    pub fn is_no_space(&self) -> bool {
        self.no_space
    }

    pub(crate) fn belongs_to(&self, cap: &Arc<Capacity>) -> bool {
        Arc::ptr_eq(&self.cap, cap)
    }

    /// Moves `bytes` of this reservation into the log's consumed bytes.
    pub(crate) fn consume(&mut self, bytes: u64) {
        assert!(bytes <= self.bytes, "placing {bytes} log bytes on a reservation of {}", self.bytes);
        self.bytes -= bytes;
        let consumed = {
            let mut st = lock(&self.cap.state);
            st.reserved_bytes -= bytes;
            st.consumed_bytes += bytes;
            st.consumed_bytes
        };
        if consumed >= self.cap.pressure_bytes.load(Ordering::Relaxed) {
            self.cap.signal_pressure();
        }
    }
}

impl Drop for LogReservation {
    fn drop(&mut self) {
        if self.bytes > 0 {
            let notify = {
                let mut st = lock(&self.cap.state);
                st.reserved_bytes -= self.bytes;
                std::mem::take(&mut st.refused)
            };
            self.bytes = 0;
            if notify {
                self.cap.notify();
            }
        }
    }
}

impl Capacity {
    pub fn new(quota_bytes: u64, consumed_bytes: u64) -> Arc<Capacity> {
        Arc::new(Capacity {
            quota_bytes,
            state: Mutex::new(CapState { consumed_bytes, reserved_bytes: 0, refused: false, closed: None }),
            cond: Condvar::new(),
            listener: Mutex::new(None),
            pressure: Mutex::new(None),
            pressure_bytes: AtomicU64::new(u64::MAX),
            pressure_sent: AtomicBool::new(false),
        })
    }

    /// Registers the compactor's pressure listener and its threshold.
    pub fn set_pressure_listener(&self, threshold_bytes: u64, f: CapacityListener) {
        *lock(&self.pressure) = Some(f);
        self.pressure_bytes.store(threshold_bytes, Ordering::Relaxed);
        self.pressure_sent.store(false, Ordering::Release);
    }

    /// Lets the pressure listener fire again (the compactor calls this
    /// before it looks at the log's state, so no signal is lost).
    pub fn rearm_pressure(&self) {
        self.pressure_sent.store(false, Ordering::Release);
    }

    fn signal_pressure(&self) {
        if self.pressure_sent.swap(true, Ordering::AcqRel) {
            return;
        }
        let f = lock(&self.pressure).clone();
        if let Some(f) = f {
            f();
        }
    }

    /// True if a reservation was refused since space was last released:
    /// a writer may be waiting.
    pub fn refused(&self) -> bool {
        lock(&self.state).refused
    }

    /// Counts `bytes` more as consumed without a reservation (the compactor
    /// rolling a covered segment; the reclamation right after returns more).
    pub fn add_consumed(&self, bytes: u64) {
        lock(&self.state).consumed_bytes += bytes;
    }

    pub fn quota_bytes(&self) -> u64 {
        self.quota_bytes
    }

    pub fn consumed_bytes(&self) -> u64 {
        lock(&self.state).consumed_bytes
    }

    pub fn reserved_bytes(&self) -> u64 {
        lock(&self.state).reserved_bytes
    }

    /// Grants `bytes` if they fit under the quota now; never blocks. When
    /// they do not fit and the log is closed, hands out a refusal instead.
    pub fn try_reserve(self: &Arc<Self>, bytes: u64) -> Option<LogReservation> {
        {
            let mut st = lock(&self.state);
            if st.consumed_bytes + st.reserved_bytes + bytes <= self.quota_bytes {
                st.reserved_bytes += bytes;
                return Some(LogReservation { bytes, cap: self.clone(), refusal: None, no_space: false });
            }
            if let Some(why) = &st.closed {
                return Some(self.refusal(why.clone()));
            }
            st.refused = true;
        }
        self.signal_pressure();
        None
    }

    /// A reservation of nothing that makes its write fail with `why`.
    pub fn refusal(self: &Arc<Self>, why: Arc<str>) -> LogReservation {
        LogReservation { bytes: 0, cap: self.clone(), refusal: Some(why), no_space: false }
    }

    /// A reservation of nothing that makes its write fail with ENOSPC.
    pub fn no_space_refusal(self: &Arc<Self>, why: Arc<str>) -> LogReservation {
        LogReservation { bytes: 0, cap: self.clone(), refusal: Some(why), no_space: true }
    }

    /// Declares that space will not come back (reclamation keeps failing):
    /// from now on a reservation that does not fit gets a refusal instead
    /// of waiting, and the writers waiting now are woken to get theirs.
    /// Reservations that fit are still granted.
    pub fn close(&self, why: &str) {
        {
            let mut st = lock(&self.state);
            if st.closed.is_some() {
                return;
            }
            st.closed = Some(why.into());
        }
        self.notify();
    }

    /// Undoes [`Capacity::close`] (reclamation works again).
    pub fn reopen(&self) {
        lock(&self.state).closed = None;
    }

    /// Why the log is closed, if it is.
    pub fn closed(&self) -> Option<String> {
        lock(&self.state).closed.as_deref().map(str::to_owned)
    }

    /// Waits until `bytes` fit. Retries every [`CAPACITY_RETRY_MS`] even
    /// without a wake-up; `check` runs before each try and may end the wait
    /// with an error (the image failed or closed). `on_wait` runs once if
    /// the first try is refused.
    pub fn reserve_blocking<E>(
        self: &Arc<Self>,
        bytes: u64,
        mut check: impl FnMut() -> Result<(), E>,
        on_wait: impl FnOnce(),
    ) -> Result<LogReservation, E> {
        assert!(bytes <= self.quota_bytes, "a reservation larger than the quota can never be granted");
        check()?;
        if let Some(r) = self.try_reserve(bytes) {
            return Ok(r);
        }
        on_wait();
        loop {
            {
                let st = lock(&self.state);
                if st.consumed_bytes + st.reserved_bytes + bytes > self.quota_bytes {
                    let timeout = Duration::from_millis(CAPACITY_RETRY_MS);
                    let _ = self.cond.wait_timeout(st, timeout).unwrap_or_else(|p| p.into_inner());
                }
            }
            check()?;
            if let Some(r) = self.try_reserve(bytes) {
                return Ok(r);
            }
        }
    }

    /// Returns `bytes` of consumed log space (reclamation) and wakes waiters.
    pub fn release_consumed(&self, bytes: u64) {
        {
            let mut st = lock(&self.state);
            assert!(bytes <= st.consumed_bytes, "releasing more log bytes than are in use");
            st.consumed_bytes -= bytes;
            if bytes > 0 {
                st.refused = false;
            }
        }
        if bytes > 0 {
            self.notify();
        }
    }

    pub fn set_listener(&self, f: CapacityListener) {
        *lock(&self.listener) = Some(f);
    }

    /// Wakes blocked writers and calls the listener (outside all locks).
    pub fn notify(&self) {
        self.cond.notify_all();
        let f = lock(&self.listener).clone();
        if let Some(f) = f {
            f();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn reservations_respect_the_quota_and_return_unused_bytes() {
        let cap = Capacity::new(1000, 100);
        let calls = Arc::new(AtomicU64::new(0));
        let c = calls.clone();
        cap.set_listener(Arc::new(move || {
            c.fetch_add(1, Ordering::SeqCst);
        }));
        let mut a = cap.try_reserve(600).unwrap();
        assert!(cap.try_reserve(301).is_none());
        let b = cap.try_reserve(300).unwrap();
        a.consume(400);
        assert_eq!(cap.consumed_bytes(), 500);
        drop(a); // returns 200, after a refusal: listener fires
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(cap.reserved_bytes(), 300);
        drop(b); // nobody refused since: no call
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        cap.release_consumed(500);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(cap.consumed_bytes(), 0);
    }

    #[test]
    fn blocked_reservation_wakes_on_release() {
        let cap = Capacity::new(100, 100);
        let c2 = cap.clone();
        let t = std::thread::spawn(move || {
            let r = c2.reserve_blocking::<()>(50, || Ok(()), || {}).unwrap();
            r.bytes()
        });
        std::thread::sleep(Duration::from_millis(20));
        cap.release_consumed(60);
        assert_eq!(t.join().unwrap(), 50);
    }

    #[test]
    fn blocked_reservation_ends_when_check_fails() {
        let cap = Capacity::new(100, 100);
        let mut n = 0;
        let r = cap.reserve_blocking(
            10,
            || {
                n += 1;
                if n > 2 {
                    Err("closed")
                } else {
                    Ok(())
                }
            },
            || {},
        );
        assert_eq!(r.unwrap_err(), "closed");
    }
}
