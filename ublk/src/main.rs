//! `casblk`: a ublk userspace block driver that serves VM disk images.
//!
//! The binary owns the command line (`cli`, `client`, `devices`, offline
//! commands), the device layer every target shares (`device`), and the
//! targets (`targets::raw`, `targets::cas`). Storage lives in the `cas`
//! crate and the request path of CAS mode in `serve`; this crate only moves
//! requests between the kernel and a target.

mod cli;
mod client;
mod control_socket;
mod device;
mod devices;
mod fsck;
mod image_io;
mod limits;
mod logging;
mod metrics;
mod protocol;
mod qcow2;
mod remote;
mod scrub;
mod targets;

use clap::Parser;
use std::process::ExitCode;

/// Sets what SIGPIPE does: the CLI dies quietly when its reader goes away
/// (`casblk stats --json | head`), like other Unix tools; daemons ignore it
/// and see EPIPE, so a client that hangs up cannot kill them.
pub fn set_sigpipe(default: bool) {
    let action = if default { libc::SIG_DFL } else { libc::SIG_IGN };
    // SAFETY: installing SIG_DFL or SIG_IGN runs no handler code; it only
    // changes the disposition of SIGPIPE for this process.
    unsafe { libc::signal(libc::SIGPIPE, action) };
}

fn main() -> ExitCode {
    set_sigpipe(true);
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    logging::init();
    if matches!(cli.command, cli::Command::Daemon(_)) {
        logging::daemon_mode();
    }
    if let cli::Command::Fsck(args) = &cli.command {
        return fsck::run(&cli.store, args);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, whole cause chain: scripts grep it, people read it.
            eprintln!("casblk: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Help and version print as clap formats them; a usage error becomes one
/// line on stderr (like every other casblk error) and exit status 2.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit();
    }
    let text = e.render().to_string();
    let line = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .collect::<Vec<_>>()
        .join(" ");
    eprintln!("casblk: {}", line.strip_prefix("error: ").unwrap_or(&line));
    ExitCode::from(2)
}

fn run(cli: cli::Cli) -> anyhow::Result<()> {
    match cli.command {
        cli::Command::Add(args) => match args.backing.clone() {
            Some(_) if args.limits != limits::LimitArgs::default() => {
                anyhow::bail!("IO limits apply to store images (--image), not to --backing devices")
            }
            Some(backing) => targets::raw::add(args, &backing),
            None => client::add_image(&cli.store, args),
        },
        cli::Command::Image(cmd) => client::image(&cli.store, cmd),
        cli::Command::Stats(args) => client::stats(&cli.store, &args),
        cli::Command::Gc { json } => client::gc(&cli.store, json),
        cli::Command::Scrub(args) => scrub::run(&cli.store, &args),
        cli::Command::Remote(cmd) => remote::command(&cli.store, cmd),
        cli::Command::Del(args) => devices::del(&args),
        cli::Command::Recover(args) => devices::recover(&args),
        cli::Command::Upgrade(args) => devices::upgrade(&args),
        cli::Command::Daemon(args) => client::service(&cli.store, args.store_settings),
        cli::Command::List(args) => devices::list(&args),
        cli::Command::Features => devices::features(),
        cli::Command::Fsck(_) => unreachable!("fsck returns its own exit status"),
    }
}
