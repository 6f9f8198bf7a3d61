//! The command line, following ublksrv's and rublk's conventions
//! (`add`, `del -n N | -a`, `list`, `features`).

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "casblk", version, about = "ublk block devices backed by a content-addressed store")]
pub struct Cli {
    /// Store directory holding images and the shared chunk store.
    #[arg(long, global = true, default_value = "/var/lib/casblk")]
    pub store: PathBuf,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create /dev/ublkbN and serve it; returns once the device is usable.
    Add(AddArgs),
    /// Stop and delete devices.
    Del(DelArgs),
    /// List ublk devices.
    List(ListArgs),
    /// Print the features the running ublk driver advertises.
    Features,
}

#[derive(Args, Debug)]
pub struct AddArgs {
    /// Device id to ask for; -1 lets the driver choose.
    #[arg(short = 'n', long = "number", default_value_t = -1, allow_hyphen_values = true)]
    pub id: i32,

    /// Raw passthrough: serve this file or block device as the device.
    #[arg(long, value_name = "FILE")]
    pub backing: PathBuf,

    /// Number of hardware queues (one io thread and io_uring each).
    #[arg(short = 'q', long = "queues", default_value_t = 1)]
    pub queues: u16,

    /// Queue depth: in-flight requests per queue.
    #[arg(short = 'd', long = "depth", default_value_t = 128)]
    pub depth: u16,

    /// Largest single request in bytes (the io buffer per tag).
    #[arg(long, default_value_t = 512 * 1024)]
    pub io_buf_bytes: u32,

    /// Busy-poll the queue's ring this many microseconds before sleeping.
    #[arg(long, default_value_t = 0)]
    pub poll_us: u64,

    /// Stay in the foreground instead of daemonizing.
    #[arg(long)]
    pub foreground: bool,
}

#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
pub struct DelArgs {
    /// Device id to delete.
    #[arg(short = 'n', long = "number")]
    pub id: Option<u32>,

    /// Delete every ublk device.
    #[arg(short = 'a', long = "all")]
    pub all: bool,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}
