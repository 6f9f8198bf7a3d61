//! The stats socket's wire format: a line protocol over a root-only unix
//! socket. The server and the client (`casblk`'s control socket) live in
//! the daemon (`ublk/src/control_socket/`); this module owns what both
//! speak: the [`Request`], its decoder ([`parse_request`], also the fuzz
//! target's entry), the error reply and the request bound.
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
//! connection is closed, since the stream can no longer be framed.

/// Longest accepted request line, newline included.
pub const MAX_REQUEST_BYTES: usize = 4096;

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

/// Decodes one request line as the socket does (also the fuzz target's
/// entry point): a request, or why the line is not one.
pub fn parse_request(line: &[u8]) -> std::result::Result<Request, String> {
    serde_json::from_slice(line).map_err(|e| format!("malformed request: {e}"))
}
