//! The one error type of the `cas` crate.
//!
//! Corruption and checksum failures are kept apart from plain I/O errors:
//! the first mean the bytes on disk are wrong, the second that the disk (or
//! the filesystem) refused an operation. Bugs are assertions, not errors.

use std::path::PathBuf;

/// Result alias for the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The storage refused an operation.
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Bytes on disk do not decode as what they claim to be.
    #[error("corruption in {path} at offset {offset}: {detail}")]
    Corruption { path: PathBuf, offset: u64, detail: String },

    /// A checksummed object's checksum does not match its bytes.
    #[error(
        "checksum mismatch in {path} at offset {offset}: expected {expected:#010x}, found {actual:#010x}"
    )]
    ChecksumMismatch { path: PathBuf, offset: u64, expected: u32, actual: u32 },

    /// An on-disk object carries a format version this build cannot read.
    #[error(
        "{what} has format version {found}, this casblk reads up to {supported}: upgrade casblk to open it"
    )]
    UnsupportedVersion { what: String, found: u32, supported: u32 },

    /// A caller passed something the store cannot accept.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    #[error("{0} not found")]
    NotFound(String),

    #[error("{0} already exists")]
    AlreadyExists(String),

    /// A configured memory budget would be exceeded; the caller should back
    /// off and retry later (back-pressure), not treat the store as broken.
    #[error("memory budget exceeded: {0}")]
    MemoryBudget(String),

    /// The store or image was shut down or failed earlier and refuses work.
    #[error("{0} is unavailable: {1}")]
    Unavailable(String, String),

    /// A change was asked of something that only reads (a snapshot).
    #[error("{0}: it is read-only")]
    ReadOnly(String),

    /// A read with [`Wait::Never`](crate::io::Wait::Never) would have waited for
    /// the device; nothing was returned. The caller retries where it may
    /// block.
    #[error("the read would block")]
    WouldBlock,

    /// A write needed new space and the store is below its space reserve
    /// with nothing left for GC to free (`cas::space`).
    #[error("{0}")]
    NoSpace(String),
}

impl Error {
    /// Wraps an I/O error with the path it happened on.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io { path: path.into(), source }
    }

    /// The negative errno a ublk completion returns for this error.
    pub fn errno(&self) -> i32 {
        let code = match self {
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::Corruption { .. } | Error::ChecksumMismatch { .. } => libc::EIO,
            Error::UnsupportedVersion { .. } => libc::EIO,
            Error::InvalidArgument(_) => libc::EINVAL,
            Error::NotFound(_) => libc::ENOENT,
            Error::AlreadyExists(_) => libc::EEXIST,
            Error::MemoryBudget(_) => libc::ENOMEM,
            Error::Unavailable(..) => libc::EIO,
            Error::WouldBlock => libc::EAGAIN,
            Error::ReadOnly(_) => libc::EROFS,
            Error::NoSpace(_) => libc::ENOSPC,
        };
        -code
    }

    /// True when the error says the device ran out of space.
    pub fn is_no_space(&self) -> bool {
        match self {
            Error::Io { source, .. } => source.raw_os_error() == Some(libc::ENOSPC),
            Error::NoSpace(_) => true,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        let e = Error::io("/x", std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(e.errno(), -libc::ENOSPC);
        assert!(e.is_no_space());
        let c = Error::ChecksumMismatch { path: "/x".into(), offset: 0, expected: 1, actual: 2 };
        assert_eq!(c.errno(), -libc::EIO);
        assert_eq!(Error::InvalidArgument("x".into()).errno(), -libc::EINVAL);
    }
}
