//! Scheduler tunables and their defaults, each with its bound.

use crate::error::Error;

/// Bytes of descriptor metadata one retained request is charged against its
/// image's frontier quota: the entry itself (descriptor, arrival time, gate
/// bookkeeping, about 120 bytes) plus its share of the ordered map and the
/// request-id index. A unit test keeps the entry within this charge.
pub const DESCRIPTOR_SLOT_BYTES: u64 = 216;

/// Descriptor metadata quota per image (frontend), sized like the seed's
/// "about 6 MiB": 6.75 MiB / 216 B = 32,768 retained descriptors.
pub const DEFAULT_FRONTIER_QUOTA_BYTES: u64 = 27 << 18;

/// Configuration shared by all images of one scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Descriptor metadata quota per image; pending and in-flight requests
    /// both count. `submit` refuses with [`Error::Full`] beyond it.
    pub frontier_quota_bytes: u64,
    /// Reads in flight per image, separate from writes.
    pub read_credits: u32,
    /// WRITE / WRITE_ZEROES / DISCARD in flight across all images. The
    /// worker pool must be larger, so that reads always find a worker while
    /// writes are slow: the default (2) leaves 2 of the daemon's 4 workers
    /// to reads. More would not write faster: an image's writes append to
    /// one log segment file, whose writes the filesystem serializes.
    pub write_slots: u32,
    /// Deficit round robin quantum: bytes an image may be served per visit.
    /// Smaller interleaves images more finely: an eligible request of one
    /// image waits at most about one quantum of every other image's work.
    pub quantum_bytes: u64,
    /// How long a capacity-refused write waits before it is retried without
    /// a `capacity_released` wake.
    pub capacity_retry_ns: u64,
    /// How many retained descriptors per image one scheduling visit looks
    /// at (oldest first); bounds the CPU of a `next` call. Requests beyond
    /// the window wait until those ahead of them are dispatched.
    pub scan_window: u32,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            frontier_quota_bytes: DEFAULT_FRONTIER_QUOTA_BYTES,
            read_credits: 8,
            write_slots: 2,
            quantum_bytes: 128 << 10,
            capacity_retry_ns: 50_000_000,
            scan_window: 1024,
        }
    }
}

impl Config {
    /// How many descriptors one image may retain.
    pub fn frontier_limit(&self) -> usize {
        usize::try_from(self.frontier_quota_bytes / DESCRIPTOR_SLOT_BYTES).unwrap_or(usize::MAX)
    }

    pub fn validate(&self) -> Result<(), Error> {
        let bad = |reason| Err(Error::InvalidConfig { reason });
        if self.frontier_limit() == 0 {
            return bad("frontier_quota_bytes holds no descriptor");
        }
        if self.read_credits == 0 {
            return bad("read_credits must be at least 1");
        }
        if self.write_slots == 0 {
            return bad("write_slots must be at least 1");
        }
        if self.quantum_bytes == 0 {
            return bad("quantum_bytes must be at least 1");
        }
        if self.capacity_retry_ns == 0 {
            return bad("capacity_retry_ns must be at least 1");
        }
        if self.scan_window == 0 {
            return bad("scan_window must be at least 1");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_quota_is_32k_descriptors() {
        assert_eq!(Config::default().frontier_limit(), 32_768);
        assert!(Config::default().validate().is_ok());
    }

    #[test]
    fn zero_values_are_refused() {
        for c in [
            Config { read_credits: 0, ..Config::default() },
            Config { write_slots: 0, ..Config::default() },
            Config { frontier_quota_bytes: 10, ..Config::default() },
            Config { scan_window: 0, ..Config::default() },
        ] {
            assert!(matches!(c.validate(), Err(Error::InvalidConfig { .. })));
        }
    }
}
