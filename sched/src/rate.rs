//! Per-image IO limits: token buckets, one per class (reads; writes, write
//! zeroes and discards) and kind (requests per second, bytes per second).
//! FLUSH is never limited: it moves no data and the log needs it.
//!
//! Each bucket is a GCRA (generic cell rate algorithm) in integer
//! nanoseconds. It keeps `tat_ns`, the theoretical arrival time: when the
//! bucket would be full again. A request of cost `c` costs `inc(c) =
//! ceil(c * 1e9 / rate)` ns of it, and the burst is `tau = burst * 1e9 /
//! rate` ns of credit:
//!
//! ```text
//!   ready_at(c) = tat                  if inc(c) > tau (it passes a full bucket, then pays)
//!               = tat + inc(c) - tau   otherwise
//!   admit at now >= ready_at(c):  tat = max(tat, now) + inc(c)
//! ```
//!
//! So exactly `burst` unit requests pass at once after idle, over T seconds
//! at most `rate * T + burst + 1` pass, and the time the next one conforms
//! is exact: a waiting worker sleeps until it, never polls. A wake that
//! comes late (up to `tau - inc`) loses no tokens.

use serde::{Deserialize, Serialize};

use crate::descriptor::Op;
use crate::error::Error;

const NS_PER_SEC: u128 = 1_000_000_000;
/// Bounds of an IOPS limit.
pub const IOPS_MIN: u64 = 1;
pub const IOPS_MAX: u64 = 10_000_000;
/// Bounds of a bytes-per-second limit: below 1 MiB/s the largest request
/// (4 MiB) would wait more than 4 s.
pub const BYTES_PER_SEC_MIN: u64 = 1 << 20;
pub const BYTES_PER_SEC_MAX: u64 = 1 << 40;
/// A burst holds at most this many seconds of the rate.
pub const BURST_MAX_SECONDS: u64 = 60;

/// One limit: `per_sec` requests or bytes a second, `burst` of them at once
/// after idle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    pub per_sec: u64,
    pub burst: u64,
}

impl RateLimit {
    /// `per_sec` with the default burst: a tenth of a second of the rate
    /// (QEMU's throttle default), at least 1.
    pub fn new(per_sec: u64) -> Self {
        RateLimit { per_sec, burst: per_sec.div_ceil(10).max(1) }
    }
}

/// An image's limits; `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_iops: Option<RateLimit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_bytes_per_sec: Option<RateLimit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_iops: Option<RateLimit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_bytes_per_sec: Option<RateLimit>,
}

impl Limits {
    pub fn is_unlimited(&self) -> bool {
        *self == Limits::default()
    }

    /// The four limits with their names, in a fixed order.
    pub fn named(&self) -> [(&'static str, Option<RateLimit>); 4] {
        [
            ("read_iops", self.read_iops),
            ("read_bytes_per_sec", self.read_bytes_per_sec),
            ("write_iops", self.write_iops),
            ("write_bytes_per_sec", self.write_bytes_per_sec),
        ]
    }

    pub fn validate(&self) -> Result<(), Error> {
        for (name, limit) in self.named() {
            let Some(l) = limit else { continue };
            let (min, max) = if name.ends_with("iops") {
                (IOPS_MIN, IOPS_MAX)
            } else {
                (BYTES_PER_SEC_MIN, BYTES_PER_SEC_MAX)
            };
            let reason = if l.per_sec < min {
                Some(if name.ends_with("iops") {
                    "must be at least 1 a second"
                } else {
                    "must be at least 1 MiB a second"
                })
            } else if l.per_sec > max {
                Some(if name.ends_with("iops") {
                    "must be at most 10,000,000 a second"
                } else {
                    "must be at most 1 TiB a second"
                })
            } else if l.burst == 0 {
                Some("burst must be at least 1")
            } else if l.burst > l.per_sec.saturating_mul(BURST_MAX_SECONDS) {
                Some("burst must be at most 60 seconds of the rate")
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(Error::InvalidLimit { limit: name, reason });
            }
        }
        Ok(())
    }
}

/// One token bucket (see the module documentation).
#[derive(Clone, Copy, Debug)]
struct Bucket {
    limit: RateLimit,
    tat_ns: u64,
}

impl Bucket {
    fn full(limit: RateLimit) -> Self {
        Bucket { limit, tat_ns: 0 }
    }

    fn ns_for(&self, amount: u64) -> u64 {
        let ns = (u128::from(amount) * NS_PER_SEC).div_ceil(u128::from(self.limit.per_sec));
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    fn tau_ns(&self) -> u64 {
        self.ns_for(self.limit.burst)
    }

    fn ready_at_ns(&self, cost: u64) -> u64 {
        let (inc, tau) = (self.ns_for(cost), self.tau_ns());
        if inc > tau {
            self.tat_ns
        } else {
            (self.tat_ns.saturating_add(inc)).saturating_sub(tau)
        }
    }

    fn charge(&mut self, cost: u64, now_ns: u64) {
        self.tat_ns = self.tat_ns.max(now_ns).saturating_add(self.ns_for(cost));
    }

    /// The same debt in tokens under `limit`, but never more than its
    /// burst: a change gives no free burst, and forgives only debt beyond
    /// one burst of the new rate.
    fn changed(self, limit: RateLimit, now_ns: u64) -> Self {
        if limit == self.limit {
            return self;
        }
        let mut b = Bucket { limit, tat_ns: 0 };
        if self.tat_ns > now_ns {
            let debt_ns = u128::from(self.tat_ns - now_ns);
            let scaled = debt_ns * u128::from(self.limit.per_sec) / u128::from(limit.per_sec);
            let scaled = u64::try_from(scaled).unwrap_or(u64::MAX).min(b.tau_ns());
            b.tat_ns = now_ns.saturating_add(scaled);
        }
        b
    }
}

/// The requests-per-second and bytes-per-second buckets of one class.
#[derive(Clone, Copy, Debug, Default)]
struct Class {
    iops: Option<Bucket>,
    bytes: Option<Bucket>,
}

impl Class {
    fn set(&mut self, iops: Option<RateLimit>, bytes: Option<RateLimit>, now_ns: u64) {
        let change = |old: Option<Bucket>, new: Option<RateLimit>| match (old, new) {
            (_, None) => None,
            (None, Some(l)) => Some(Bucket::full(l)),
            (Some(b), Some(l)) => Some(b.changed(l, now_ns)),
        };
        self.iops = change(self.iops, iops);
        self.bytes = change(self.bytes, bytes);
    }

    fn ready_at_ns(&self, cost_bytes: u64) -> Option<u64> {
        let iops = self.iops.map(|b| b.ready_at_ns(1));
        let bytes = self.bytes.map(|b| b.ready_at_ns(cost_bytes));
        iops.max(bytes)
    }

    fn charge(&mut self, cost_bytes: u64, now_ns: u64) {
        if let Some(b) = &mut self.iops {
            b.charge(1, now_ns);
        }
        if let Some(b) = &mut self.bytes {
            b.charge(cost_bytes, now_ns);
        }
    }
}

/// An image's buckets.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Limiter {
    limits: Limits,
    read: Class,
    write: Class,
}

impl Limiter {
    pub(crate) fn limits(&self) -> Limits {
        self.limits
    }

    /// Applies new limits from `now_ns` (see [`Bucket::changed`]); a newly
    /// limited class starts full.
    pub(crate) fn set(&mut self, limits: Limits, now_ns: u64) {
        self.read.set(limits.read_iops, limits.read_bytes_per_sec, now_ns);
        self.write.set(limits.write_iops, limits.write_bytes_per_sec, now_ns);
        self.limits = limits;
    }

    fn class(&self, op: Op) -> Option<&Class> {
        match op {
            Op::Flush => None,
            Op::Read => Some(&self.read),
            Op::Write | Op::WriteZeroes | Op::Discard => Some(&self.write),
        }
    }

    /// When a request of `op` and `cost_bytes` conforms; `None` if its class
    /// is unlimited.
    pub(crate) fn ready_at_ns(&self, op: Op, cost_bytes: u64) -> Option<u64> {
        self.class(op)?.ready_at_ns(cost_bytes)
    }

    pub(crate) fn charge(&mut self, op: Op, cost_bytes: u64, now_ns: u64) {
        let class = match op {
            Op::Flush => return,
            Op::Read => &mut self.read,
            Op::Write | Op::WriteZeroes | Op::Discard => &mut self.write,
        };
        class.charge(cost_bytes, now_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn iops(per_sec: u64, burst: u64) -> Limits {
        Limits { read_iops: Some(RateLimit { per_sec, burst }), ..Limits::default() }
    }

    /// Admits reads of `cost` as fast as the limiter allows from `start`
    /// for `for_ns`; returns the admission times.
    fn run(l: &mut Limiter, cost: u64, start_ns: u64, for_ns: u64) -> Vec<u64> {
        let mut now = start_ns;
        let mut at = Vec::new();
        while now < start_ns + for_ns {
            let ready = l.ready_at_ns(Op::Read, cost).unwrap();
            now = now.max(ready);
            if now >= start_ns + for_ns {
                break;
            }
            l.charge(Op::Read, cost, now);
            at.push(now);
        }
        at
    }

    #[test]
    fn a_full_bucket_passes_the_burst_at_once_then_the_rate() {
        let mut l = Limiter::default();
        l.set(iops(500, 50), 0);
        let at = run(&mut l, 4096, 10_000 * MS, 10_000 * MS);
        assert_eq!(at.iter().filter(|&&t| t == 10_000 * MS).count(), 50, "the burst at once");
        assert!((5000..=5000 + 50 + 1).contains(&at.len()), "{} in 10 s", at.len());
        // After the burst, one every 2 ms exactly.
        assert_eq!(at[60] - at[59], 2 * MS);
    }

    #[test]
    fn bytes_cap_a_request_larger_than_the_burst_passes_a_full_bucket_and_pays() {
        let mut l = Limiter::default();
        let mib = 1 << 20;
        l.set(
            Limits {
                read_bytes_per_sec: Some(RateLimit { per_sec: 20 * mib, burst: mib }),
                ..Limits::default()
            },
            0,
        );
        assert_eq!(l.ready_at_ns(Op::Read, 4 * mib), Some(0));
        l.charge(Op::Read, 4 * mib, 0);
        assert_eq!(l.ready_at_ns(Op::Read, 4096), Some(150 * MS + 195_313));
        let at = run(&mut l, 64 << 10, 0, 10_000 * MS);
        let bytes = (at.len() as u64) * (64 << 10) + 4 * mib;
        assert!(bytes <= 200 * mib + mib + (64 << 10), "{bytes}");
        assert!(bytes >= 199 * mib, "{bytes}");
    }

    #[test]
    fn flush_is_never_limited_and_writes_are_their_own_class() {
        let mut l = Limiter::default();
        l.set(iops(1, 1), 0);
        l.charge(Op::Read, 4096, 0);
        assert_eq!(l.ready_at_ns(Op::Flush, 0), None);
        assert_eq!(l.ready_at_ns(Op::Write, 4096), None);
        assert_eq!(l.ready_at_ns(Op::Read, 4096), Some(1000 * MS));
    }

    #[test]
    fn a_change_keeps_the_debt_and_gives_no_free_burst() {
        let mut l = Limiter::default();
        l.set(iops(100, 1), 0);
        for _ in 0..10 {
            l.charge(Op::Read, 4096, 0); // 100 ms of debt
        }
        l.set(iops(1000, 1), 0); // the same 10 requests of debt: 10 ms, clamped to the 1 ms burst
        assert_eq!(l.ready_at_ns(Op::Read, 4096), Some(MS));
        l.set(iops(10, 1), MS / 2); // half a request of debt at 1000/s is 50 ms at 10/s
        assert_eq!(l.ready_at_ns(Op::Read, 4096), Some(MS / 2 + 50 * MS));
        l.set(Limits::default(), MS);
        assert_eq!(l.ready_at_ns(Op::Read, 4096), None);
        l.set(iops(10, 1), MS); // newly limited: full
        assert_eq!(l.ready_at_ns(Op::Read, 4096), Some(0));
    }

    #[test]
    fn bad_limits_are_refused_by_name() {
        let bad = |l: Limits| l.validate().unwrap_err().to_string();
        assert!(bad(iops(0, 1)).contains("read_iops"), "{}", bad(iops(0, 1)));
        assert!(bad(iops(5, 0)).contains("burst"));
        assert!(bad(iops(5, 301)).contains("60 seconds"));
        assert!(bad(iops(IOPS_MAX + 1, 1)).contains("at most"));
        let low = Limits { write_bytes_per_sec: Some(RateLimit::new(100)), ..Limits::default() };
        assert!(bad(low).contains("write_bytes_per_sec"));
        assert!(iops(5, 300).validate().is_ok());
        assert_eq!(RateLimit::new(500).burst, 50);
        assert_eq!(RateLimit::new(1).burst, 1);
    }

    #[test]
    fn huge_costs_saturate_instead_of_overflowing() {
        let mut l = Limiter::default();
        l.set(
            Limits {
                read_bytes_per_sec: Some(RateLimit { per_sec: BYTES_PER_SEC_MIN, burst: 1 }),
                ..Limits::default()
            },
            0,
        );
        l.charge(Op::Read, u64::MAX, u64::MAX - 5);
        assert_eq!(l.ready_at_ns(Op::Read, u64::MAX), Some(u64::MAX));
    }
}
