//! The stats socket: a line protocol over a root-only unix socket.
//!
//! ```text
//!  client                                   server (daemon)
//!  {"cmd":"stats","image":"vm1"}\n   ──>    parse (≤ MAX_REQUEST_BYTES) ─> provider(&Request)
//!                                    <──    {"schema_version":1,...}\n   (or {"error":"..."}\n)
//!  ... more requests on the same connection, or close ...
//! ```
//!
//! One JSON request per line, one JSON reply per line. A malformed request
//! gets `{"error": "..."}` and the connection stays usable; an oversized one
//! (over [`MAX_REQUEST_BYTES`] without a newline) gets an error and the
//! connection is closed, since the stream can no longer be framed. At most
//! [`MAX_CLIENTS`] connections are served at once (each on its own thread);
//! more are answered with an error and closed. An idle connection is closed
//! after [`IDLE_TIMEOUT`]. The socket file is mode 0600 from the moment it
//! has its name (bound under a temporary name, chmod-ed, then renamed).

mod client;
mod server;

use std::time::Duration;

pub use client::{query, query_snapshot, MAX_REPLY_BYTES};
pub use server::{parse_request, Provider, Server};

/// Longest accepted request line, newline included.
pub const MAX_REQUEST_BYTES: usize = 4096;
/// Most connections served at once.
pub const MAX_CLIENTS: usize = 8;
/// A connection with no complete request for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on writing one reply to a client that does not read.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// A request on the stats socket, e.g. `{"cmd":"stats","image":null}`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Request {
    /// The current [`crate::Snapshot`], of one image or (`null`) all.
    Stats {
        #[serde(default)]
        image: Option<String>,
    },
    /// A daemon command (attach a device, manage images, run GC). The
    /// socket only frames it; the daemon's provider interprets `action`
    /// and `args` (in control protocol version `v`; absent in requests of
    /// casblk before versions were sent, which speak version 1) and
    /// answers with a JSON value or `{"error": ...}`.
    Control {
        action: String,
        #[serde(default)]
        args: serde_json::Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        v: Option<u32>,
    },
}

impl Request {
    /// `{"cmd":"stats","image":...}`.
    pub fn stats(image: Option<&str>) -> Request {
        Request::Stats { image: image.map(str::to_owned) }
    }

    /// `{"cmd":"control","action":...,"args":...,"v":...}`.
    pub fn control(action: &str, args: serde_json::Value, v: u32) -> Request {
        Request::Control { action: action.to_owned(), args, v: Some(v) }
    }
}

/// The reply sent for an error: `{"error": message}`.
pub fn error_reply(message: impl std::fmt::Display) -> serde_json::Value {
    serde_json::json!({ "error": message.to_string() })
}
