//! The scheduler's one error type. Every variant is bad input or a refused
//! request, never corruption or I/O (sched touches no storage); each maps to
//! the negative errno a ublk completion returns.

use crate::descriptor::{ImageId, RequestId};

/// Errors from [`crate::Scheduler`] and [`crate::SharedScheduler`].
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The image was never added, or has been removed.
    #[error("image {0} is not registered with the scheduler")]
    UnknownImage(ImageId),
    /// `add_image` for an image that is already registered.
    #[error("image {0} is already registered with the scheduler")]
    ImageExists(ImageId),
    /// Back-pressure: the image's frontier holds its quota of descriptors.
    /// The caller keeps the request and submits it again after a completion.
    #[error("frontier of image {image} is full ({limit} descriptors); retry after a completion")]
    Full { image: ImageId, limit: usize },
    /// A request id that is already outstanding on this image.
    #[error("request {request} is already outstanding on image {image}")]
    DuplicateRequest { image: ImageId, request: RequestId },
    /// `complete` for a request this image does not hold.
    #[error("request {request} is not outstanding on image {image}")]
    UnknownRequest { image: ImageId, request: RequestId },
    /// `complete` for a request that was submitted but never dispatched.
    #[error("request {request} on image {image} was never dispatched")]
    NotDispatched { image: ImageId, request: RequestId },
    /// An in-place call (`submit_read_in_place`, `requeue`) for a request
    /// that is not a READ.
    #[error("request {request} on image {image} is not a read")]
    NotARead { image: ImageId, request: RequestId },
    /// `submit_write_in_place` for a request that is not a WRITE,
    /// WRITE_ZEROES or DISCARD.
    #[error("request {request} on image {image} is not a write")]
    NotAWrite { image: ImageId, request: RequestId },
    /// `remove_image` while requests are still being executed.
    #[error("image {image} still has {inflight} requests in flight")]
    ImageBusy { image: ImageId, inflight: usize },
    /// A descriptor that cannot describe a block request.
    #[error("invalid descriptor: {reason}")]
    InvalidDescriptor { reason: &'static str },
    /// A configuration value out of its range.
    #[error("invalid scheduler configuration: {reason}")]
    InvalidConfig { reason: &'static str },
    /// An IO limit out of its range.
    #[error("{limit} {reason}")]
    InvalidLimit { limit: &'static str, reason: &'static str },
    /// The shared scheduler was shut down.
    #[error("the scheduler is shutting down")]
    ShuttingDown,
}

impl Error {
    /// The negative errno a ublk completion reports for this error.
    pub fn errno(&self) -> i32 {
        -match self {
            Error::UnknownImage(_) => libc::ENODEV,
            Error::ImageExists(_) => libc::EEXIST,
            Error::Full { .. } => libc::EBUSY,
            Error::DuplicateRequest { .. } => libc::EEXIST,
            Error::UnknownRequest { .. }
            | Error::NotDispatched { .. }
            | Error::NotARead { .. }
            | Error::NotAWrite { .. } => libc::EINVAL,
            Error::ImageBusy { .. } => libc::EBUSY,
            Error::InvalidDescriptor { .. } | Error::InvalidConfig { .. } | Error::InvalidLimit { .. } => {
                libc::EINVAL
            }
            Error::ShuttingDown => libc::ESHUTDOWN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each variant's position. The match has no wildcard arm, so a new
    /// variant does not compile until it gets a number here, and the test
    /// below then fails until an example of it is in its list.
    fn variant_index(e: &Error) -> usize {
        match e {
            Error::UnknownImage(_) => 0,
            Error::ImageExists(_) => 1,
            Error::Full { .. } => 2,
            Error::DuplicateRequest { .. } => 3,
            Error::UnknownRequest { .. } => 4,
            Error::NotDispatched { .. } => 5,
            Error::NotARead { .. } => 6,
            Error::ImageBusy { .. } => 7,
            Error::InvalidDescriptor { .. } => 8,
            Error::InvalidConfig { .. } => 9,
            Error::ShuttingDown => 10,
            Error::NotAWrite { .. } => 11,
            Error::InvalidLimit { .. } => 12,
        }
    }
    const VARIANTS: usize = 13;

    #[test]
    fn every_variant_maps_to_a_negative_errno() {
        let (image, request) = (ImageId(1), RequestId(2));
        let all = [
            Error::UnknownImage(image),
            Error::ImageExists(image),
            Error::Full { image, limit: 4 },
            Error::DuplicateRequest { image, request },
            Error::UnknownRequest { image, request },
            Error::NotDispatched { image, request },
            Error::NotARead { image, request },
            Error::ImageBusy { image, inflight: 3 },
            Error::InvalidDescriptor { reason: "x" },
            Error::InvalidConfig { reason: "x" },
            Error::ShuttingDown,
            Error::NotAWrite { image, request },
            Error::InvalidLimit { limit: "read_iops", reason: "x" },
        ];
        let mut seen = [false; VARIANTS];
        for e in &all {
            seen[variant_index(e)] = true;
            assert!(e.errno() < 0, "{e} maps to {}", e.errno());
        }
        let missing: Vec<usize> = (0..VARIANTS).filter(|&i| !seen[i]).collect();
        assert!(missing.is_empty(), "no example of variants {missing:?}");
    }
}
