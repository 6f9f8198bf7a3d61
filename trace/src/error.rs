//! The crate's error type.

use std::io;

/// Errors from the stats socket, the snapshot schema and counter attachment.
///
/// `trace` never fails a block request: recording cannot fail. These errors
/// reach the daemon's setup code and the `casblk stats` CLI.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O error on the stats socket, with what was being done.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// A reply or snapshot that is not the JSON we expect.
    #[error("malformed stats JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The peer broke the line protocol (no reply, oversized line, ...).
    #[error("stats protocol: {0}")]
    Protocol(String),
    /// The server answered `{"error": ...}`.
    #[error("stats server: {0}")]
    Remote(String),
    /// No reply within the client's timeout.
    #[error("stats server did not reply within {timeout_ms} ms")]
    Timeout { timeout_ms: u64 },
    /// A snapshot written by a newer daemon than this reader understands.
    #[error("stats schema version {found} is newer than supported version {supported}; upgrade casblk")]
    UnsupportedSchema { found: u32, supported: u32 },
    /// Counters that are not a JSON object of numbers.
    #[error("counters from {source_name}: {reason}")]
    Counters { source_name: String, reason: String },
    /// A stats request names an image that the snapshot does not have.
    #[error("no image named {0:?}")]
    NoSuchImage(String),
}

impl Error {
    /// An I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }

    /// The negative errno this error maps to (for callers that must report
    /// one; no block request ever fails because of tracing).
    pub fn errno(&self) -> i32 {
        match self {
            Error::Io { source, .. } => -source.raw_os_error().unwrap_or(libc::EIO),
            Error::Timeout { .. } => -libc::ETIMEDOUT,
            Error::NoSuchImage(_) => -libc::ENOENT,
            Error::Json(_) | Error::Protocol(_) | Error::Remote(_) => -libc::EPROTO,
            Error::UnsupportedSchema { .. } | Error::Counters { .. } => -libc::EINVAL,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
