//! Prometheus metrics: the store daemon's stats snapshot as Prometheus
//! text (format 0.0.4, which Prometheus and OpenMetrics scrapers read),
//! served over HTTP by `--metrics-listen` and printed once by
//! `casblk stats --openmetrics`. Both go through [`render`], so they are
//! the same text. What each metric means: docs/metrics.md; the names:
//! [`families::FAMILIES`].
//!
//! Presentation only: it reads the public `trace::Snapshot` and nothing
//! below imports it.

pub mod exposition;
pub mod families;
pub mod http;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;

/// The exposition of `snap`.
pub fn render(snap: &trace::Snapshot) -> Result<String, String> {
    exposition::encode(&exposition::families_of(snap))
}

/// Why `addr` may not be listened on: the endpoint has no authentication
/// and names every image, so an address other hosts can reach needs
/// `--metrics-allow-remote`.
pub fn check_address(addr: SocketAddr, allow_remote: bool) -> Result<(), String> {
    if addr.ip().is_loopback() || allow_remote {
        return Ok(());
    }
    Err(format!(
        "--metrics-listen {addr}: not a loopback address; the metrics endpoint has no authentication and \
         names every image, so listening where other hosts reach it needs --metrics-allow-remote"
    ))
}
