//! The process's log: `tracing` to stderr, filtered by RUST_LOG. Commands
//! log warnings by default; a daemon (started by `add`, `recover` or
//! `daemon`) says what happens to its devices at info: attaches, recoveries
//! with the records replayed and the time taken, failures and detaches.

use std::sync::OnceLock;
use tracing_subscriber::{filter::EnvFilter, layer::SubscriberExt, reload, util::SubscriberInitExt};

static RELOAD: OnceLock<reload::Handle<EnvFilter, tracing_subscriber::Registry>> = OnceLock::new();

/// Installs the subscriber: RUST_LOG if set, else warnings only.
pub fn init() {
    let (filter, handle) = reload::Layer::new(filter_or("warn"));
    tracing_subscriber::registry()
        .with(filter)
        .with(
            // A daemon's stderr becomes its log file after this: no colour codes.
            tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(false),
        )
        .init();
    let _ = RELOAD.set(handle);
}

/// This process now is a daemon: log at info unless RUST_LOG says otherwise.
pub fn daemon_mode() {
    if let Some(handle) = RELOAD.get() {
        let _ = handle.reload(filter_or("info"));
    }
}

fn filter_or(default: &str) -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| default.into())
}
