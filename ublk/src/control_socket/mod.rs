//! The daemon's control socket: the server (`casblk daemon`) and the
//! client (every other `casblk` command), over the line protocol whose
//! wire format `trace::stats` owns (requests, the error reply, the request
//! bound). Stats snapshots and daemon commands ride the same framing.
//!
//! At most [`MAX_CLIENTS`] connections are served at once (each on its own
//! thread); more are answered with an error and closed. An idle
//! connection is closed after [`IDLE_TIMEOUT`]. The socket file is mode
//! 0600 from the moment it has its name (bound under a temporary name,
//! chmod-ed, then renamed).

mod client;
mod server;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use client::{query, query_snapshot};
pub use server::Server;

/// Most connections served at once.
pub const MAX_CLIENTS: usize = 8;
/// A connection with no complete request for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on writing one reply to a client that does not read.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
