//! What the scheduler knows about a request: a descriptor snapshot taken
//! when the request arrives. It names the request and its byte range; it
//! never holds the write payload, which stays in the request's own buffer
//! (the ublk io buffer in the daemon) until a worker executes it.

use std::fmt;

use crate::error::Error;

/// An image (one block device) registered with the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct ImageId(pub u32);

impl fmt::Display for ImageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The caller's name for a request, unique among the image's outstanding
/// requests (the daemon packs queue id and tag into it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// A block operation, as ublk delivers it: the one `Op` of the request
/// path, defined by `trace` (the lowest crate) and shared with it.
pub use trace::Op;

/// The arrival order of a request within its image (0, 1, 2, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Ticket(pub u64);

/// A descriptor snapshot: everything the scheduler needs to order a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    pub request: RequestId,
    pub op: Op,
    /// Byte offset on the device; ignored for FLUSH.
    pub offset_bytes: u64,
    /// Byte length; 0 for FLUSH, at least 1 for every other op.
    pub len_bytes: u64,
}

/// What DRR charges for an op that moves no payload (FLUSH, WRITE_ZEROES,
/// DISCARD): one block, so a 1 GiB discard is not starved by its size.
pub const METADATA_OP_COST_BYTES: u64 = 4096;

impl Descriptor {
    pub fn read(request: u64, offset_bytes: u64, len_bytes: u64) -> Self {
        Descriptor { request: RequestId(request), op: Op::Read, offset_bytes, len_bytes }
    }

    pub fn write(request: u64, offset_bytes: u64, len_bytes: u64) -> Self {
        Descriptor { request: RequestId(request), op: Op::Write, offset_bytes, len_bytes }
    }

    pub fn flush(request: u64) -> Self {
        Descriptor { request: RequestId(request), op: Op::Flush, offset_bytes: 0, len_bytes: 0 }
    }

    /// Refuses descriptors no block request can have.
    pub fn validate(&self) -> Result<(), Error> {
        if self.op == Op::Flush {
            return Ok(());
        }
        if self.len_bytes == 0 {
            return Err(Error::InvalidDescriptor { reason: "a data request must have a length" });
        }
        if self.offset_bytes.checked_add(self.len_bytes).is_none() {
            return Err(Error::InvalidDescriptor { reason: "offset + length overflows u64" });
        }
        Ok(())
    }

    /// Half-open byte range `[offset, offset + len)`; FLUSH has none.
    pub(crate) fn range(&self) -> Option<(u64, u64)> {
        (self.op != Op::Flush).then(|| (self.offset_bytes, self.offset_bytes + self.len_bytes))
    }

    /// DRR cost in bytes: the payload moved.
    pub(crate) fn cost_bytes(&self) -> u64 {
        match self.op {
            Op::Read | Op::Write => self.len_bytes,
            Op::WriteZeroes | Op::Discard | Op::Flush => METADATA_OP_COST_BYTES,
        }
    }
}

/// True when two half-open ranges share a byte.
pub(crate) fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_refuses_empty_and_overflowing_ranges() {
        assert!(Descriptor::read(1, 0, 0).validate().is_err());
        assert!(Descriptor::write(1, u64::MAX, 2).validate().is_err());
        assert!(Descriptor::flush(1).validate().is_ok());
        assert!(Descriptor::read(1, 4096, 4096).validate().is_ok());
    }

    #[test]
    fn ranges_overlap_only_when_sharing_a_byte() {
        assert!(!overlaps((0, 4096), (4096, 8192)));
        assert!(overlaps((0, 4097), (4096, 8192)));
        assert!(overlaps((100, 200), (0, 1 << 20)));
    }

    #[test]
    fn cost_is_the_payload_and_metadata_ops_are_cheap() {
        let discard = Descriptor { op: Op::Discard, ..Descriptor::write(1, 0, 1 << 30) };
        assert_eq!(discard.cost_bytes(), METADATA_OP_COST_BYTES);
        assert_eq!(Descriptor::write(1, 0, 8 << 20).cost_bytes(), 8 << 20);
        assert_eq!(Descriptor::read(1, 0, 4096).cost_bytes(), 4096);
    }
}
