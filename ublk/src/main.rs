//! `casblk`: a ublk userspace block driver that serves VM disk images.
//!
//! The binary owns the command line, the device lifecycle (add, del, list,
//! features) and the per-queue io threads. Storage lives in the `cas`
//! crate; this crate only moves requests between the kernel and a target.

mod cli;
mod control;
mod launch;
mod params;
mod raw;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    // Logs go through `tracing`, filtered by RUST_LOG (default: warnings).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, whole cause chain: scripts grep it, people read it.
            eprintln!("casblk: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: cli::Cli) -> anyhow::Result<()> {
    match cli.command {
        cli::Command::Add(args) => raw::add(args),
        cli::Command::Del(args) => control::del(&args),
        cli::Command::List(args) => control::list(&args),
        cli::Command::Features => control::features(),
    }
}
