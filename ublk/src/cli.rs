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
    /// Stop and delete devices. A device that is mounted, used by another
    /// block device, or held open by a process (QEMU with a guest's disk,
    /// fio, ...) is refused, naming who holds it; --force stops one held
    /// open anyway, and its holder's IO then fails with EIO. Flushed data
    /// is never lost: a store daemon flushes each image it detaches. Where
    /// the ublk driver has safe stop (Linux 7.0+) the driver itself refuses
    /// a device anyone has open, so a holder no scan can see (one that
    /// opens it during del, a memory mapping) keeps it too; on older
    /// kernels del sees only processes, mounts and stacked devices.
    Del(DelArgs),
    /// Serve again devices whose daemon died (kill -9, a crash): the same
    /// /dev/ublkbN, with its mounts and open handles; IO in flight is reissued.
    Recover(RecoverArgs),
    /// Swap the daemons serving devices for this binary (after installing a
    /// new casblk): each hands its devices over and exits, this binary
    /// recovers them; their users pause, they do not fail.
    Upgrade(UpgradeArgs),
    /// Run the store's daemon in the foreground, for a service manager:
    /// recover the store's quiesced devices, notify readiness, serve until
    /// SIGTERM (which stops every device).
    Daemon(DaemonArgs),
    /// List ublk devices.
    List(ListArgs),
    /// Print the features the running ublk driver advertises.
    Features,
    /// Manage the images of the store.
    #[command(subcommand)]
    Image(ImageCommand),
    /// Per-request latency, gate waits and engine counters from a running daemon.
    Stats(StatsArgs),
    /// Reclaim chunks no image references (safe while devices run).
    Gc {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Read back every stored chunk (or one image's) and check it, on a
    /// store being served or not: damaged chunks are named with the image
    /// blocks that hold them. Exit 0 clean, 1 damage found.
    Scrub(ScrubArgs),
    /// Check a store nothing serves: every checksum, every manifest-to-chunk
    /// reference, the logs, leftovers. Exit 0 clean, 1 problems, 2 could not run.
    Fsck(FsckArgs),
    /// The store's bucket on an S3 object store (Garage): chunks and
    /// published manifests go there, so another store can fetch images.
    #[command(subcommand)]
    Remote(RemoteCommand),
}

#[derive(Subcommand, Debug)]
pub enum RemoteCommand {
    /// Record the store's bucket (it is reached first: a wrong setting fails
    /// with one line). The secret is never stored: it is read from the key
    /// file (key id on line 1, secret on line 2) each time the store opens.
    Set {
        /// http(s)://HOST:PORT of a node serving the bucket; repeat or
        /// separate with commas for failover.
        #[arg(long, required = true)]
        endpoint: Vec<String>,
        #[arg(long)]
        bucket: String,
        /// Key prefix inside the bucket (empty, or ending in '/').
        #[arg(long, default_value = "")]
        prefix: String,
        #[arg(long, default_value = "garage")]
        region: String,
        /// File with the key id and the secret (else the AWS_ACCESS_KEY_ID and
        /// AWS_SECRET_ACCESS_KEY environment variables).
        #[arg(long)]
        key_file: Option<PathBuf>,
    },
    /// Print the store's bucket settings.
    Show {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args, Debug)]
pub struct ScrubArgs {
    /// Only the chunks this image references.
    #[arg(long, value_name = "NAME")]
    pub image: Option<String>,
    /// Chunk bytes read a second at most [default: 64M].
    #[arg(long, value_name = "SIZE", value_parser = parse_scrub_rate)]
    pub rate: Option<u64>,
    /// Show the running daemon's scrub (progress, the last pass's report)
    /// instead of starting one.
    #[arg(long, conflicts_with_all = ["image", "rate", "no_wait"])]
    pub status: bool,
    /// Start the pass in the daemon and return at once.
    #[arg(long)]
    pub no_wait: bool,
    /// Check the bucket's copies of the store's packs (a store with a
    /// remote) instead of the local ones: each pack read in ranges of at
    /// most 1 MiB, at --rate, every live slot checked against its slot
    /// index; damage names the image blocks it affects.
    #[arg(long, conflicts_with = "image")]
    pub bucket: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

fn parse_scrub_rate(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err("a scrub rate must be at least 1 byte a second".into()),
        n => Ok(n),
    }
}

#[derive(Args, Debug)]
pub struct FsckArgs {
    /// Check only this image (its manifest, log and chunks).
    #[arg(long, value_name = "NAME")]
    pub image: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Remove leftovers nothing durable references (orphan packs, files of
    /// interrupted operations) and cut torn tails, then check again. Never
    /// touches data a manifest, the chunk index or a flushed log record holds.
    #[arg(long)]
    pub repair: bool,
}

#[derive(Subcommand, Debug)]
pub enum ImageCommand {
    /// Create an image (creates the store if it does not exist yet).
    Create {
        /// 1-128 letters, digits, '.', '_', '-' or ':'; not starting with '.' or '-'.
        name: String,
        /// Size in bytes, or with a binary suffix: 512M, 10G, 1T.
        #[arg(long, value_parser = parse_size)]
        size: u64,
    },
    /// Grow an image, or shrink a detached one with --shrink. An attached
    /// image grows online where the driver has UPDATE_SIZE (Linux 6.16+):
    /// its device shows the new size at once (grow the filesystem on it
    /// then, e.g. resize2fs). Elsewhere delete its device first. Snapshots
    /// keep their size.
    Resize {
        /// The image.
        name: String,
        /// The new size, in bytes or with a binary suffix: 512M, 10G, 1T.
        #[arg(value_parser = parse_size)]
        size: u64,
        /// Shrink a detached image: the bytes past the new end are dropped
        /// (shrink the filesystem on it first), and GC frees what only
        /// they held. Interrupted, the image keeps its size with those
        /// bytes read as zeros; run it again.
        #[arg(long)]
        shrink: bool,
    },
    /// Show or change the IO limits of an attached image's device, online:
    /// a change holds from the next request and stays with the device
    /// (recover and upgrade keep it; del ends it).
    Limits {
        /// The image.
        name: String,
        /// Remove every limit (then apply any limit flags given).
        #[arg(long)]
        clear: bool,
        /// Print the limits as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        limits: crate::limits::LimitArgs,
    },
    /// List the store's images.
    List {
        /// Print JSON (sizes in bytes) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Snapshot IMAGE as IMAGE@SNAP: read-only, instant, allowed while the
    /// image is attached (it holds every write completed before the command).
    Snapshot {
        /// The image to snapshot.
        image: String,
        /// The snapshot's name (same rules as an image's).
        snap: String,
    },
    /// Create a writable image NEW sharing every chunk of the snapshot
    /// IMAGE@SNAP (instant).
    Clone {
        /// The snapshot, as IMAGE@SNAP.
        snapshot: String,
        /// The new image.
        new: String,
    },
    /// Return a detached IMAGE to its snapshot IMAGE@SNAP, size included;
    /// every write since is discarded.
    Rollback {
        /// The image.
        image: String,
        /// The snapshot's name (without IMAGE@).
        snap: String,
    },
    /// Size, logical, unique and shared bytes, snapshots and parent of an image.
    Info {
        /// The image (or snapshot, IMAGE@SNAP).
        name: String,
        /// Print JSON (bytes) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Make image NAME here from its newest published root in the store's
    /// bucket (from a store nothing serves): writable, under this store's
    /// lease (the store that wrote it must have stopped, or its lease run
    /// out), or --read-only, as of that root.
    Fetch {
        /// The image, as another store published it.
        name: String,
        /// A read-only replica; takes no lease.
        #[arg(long)]
        read_only: bool,
    },
    /// Remove an image and its data (refused while it is attached, while it
    /// has snapshots, and for a snapshot while clones of it exist).
    Rm {
        /// The image to remove.
        name: String,
        /// Also remove it from the store's bucket (its roots and page
        /// ranges; under its lease, so refused while another store holds
        /// it). From a store nothing serves.
        #[arg(long)]
        bucket: bool,
    },
    /// Create image NAME from a raw or qcow2 disk image (from a store
    /// nothing serves): straight into chunks, zero blocks skipped.
    Import {
        /// The new image.
        name: String,
        /// A raw or qcow2 image file (qcow2 is recognised by its header),
        /// or - for raw data on stdin (then --size is needed).
        file: PathBuf,
        /// Image size (default: the file's, rounded up to 4 KiB).
        #[arg(long, value_parser = parse_size)]
        size: Option<u64>,
    },
    /// Write an image's contents to FILE, raw and sparse (from a store
    /// nothing serves).
    Export {
        /// The image to export.
        name: String,
        /// The file to write (created or truncated).
        file: PathBuf,
        /// Output format: raw (sparse), or qcow2 (through qemu-img).
        #[arg(long, default_value = "raw")]
        format: String,
    },
}

#[derive(Args, Debug)]
pub struct StatsArgs {
    /// Only the image attached as device ID.
    #[arg(short = 'n', long = "number")]
    pub id: Option<u32>,
    /// Print JSON (schema: docs/stats-schema.md) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Refresh every SECS seconds, like iostat, until interrupted.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "2")]
    pub watch: Option<u64>,
    /// Print the Prometheus text that `--metrics-listen` serves, once
    /// (metrics: docs/metrics.md).
    #[arg(long, conflicts_with_all = ["json", "watch"])]
    pub openmetrics: bool,
}

/// Parses "4096", "512M", "10G", "1T" (binary units) into bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s)
        .map_err(|e| format!("{s:?} is not a size ({e}); use bytes or a suffix like 512M, 10G"))
}

#[derive(Args, Debug)]
pub struct AddArgs {
    /// Device id to ask for; -1 lets the driver choose.
    #[arg(short = 'n', long = "number", default_value_t = -1, allow_hyphen_values = true)]
    pub id: i32,

    /// Serve this image of the store (content-addressed mode).
    #[arg(long, value_name = "NAME", conflicts_with = "backing", required_unless_present = "backing")]
    pub image: Option<String>,

    /// Raw passthrough: serve this file or block device as the device.
    #[arg(long, value_name = "FILE")]
    pub backing: Option<PathBuf>,

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

    /// What the device's IO does while no daemon serves it (the daemon
    /// died, or `upgrade` hands it over): queue waits for the next daemon,
    /// which serves it again; fail fails it at once, until a daemon takes
    /// the device over (Linux 6.13+).
    #[arg(long, value_enum, value_name = "queue|fail", default_value = "queue")]
    pub on_daemon_loss: crate::device::policy::DaemonLoss,

    /// Let the host scan the device for partitions, activating a guest's
    /// partition table (and what udev finds in it, LVM or RAID). Without
    /// it the host leaves the device alone where the driver can (Linux
    /// 7.0+); older drivers always scan.
    #[arg(long)]
    pub partitions: bool,

    #[command(flatten)]
    pub store_settings: StoreSettings,

    #[command(flatten)]
    pub limits: crate::limits::LimitArgs,
}

impl AddArgs {
    pub fn policy(&self) -> crate::device::policy::Policy {
        crate::device::policy::Policy { on_daemon_loss: self.on_daemon_loss, partitions: self.partitions }
    }

    pub fn shape(&self) -> crate::device::Shape {
        crate::device::Shape {
            queues: self.queues,
            depth: self.depth,
            io_buf_bytes: self.io_buf_bytes,
            poll_us: self.poll_us,
        }
    }
}

/// Settings of the store daemon (content-addressed mode). They take effect
/// when this `add` starts the store's daemon; an `add` that reaches a
/// running daemon is refused if it asks for a different value. The same
/// struct travels to the daemon in the add request (`daemon::settings`
/// turns it into store options). `None` keeps the default, or for a
/// running daemon whatever it runs with.
#[derive(Args, Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[command(next_help_heading = "Store daemon settings (--image or daemon; applied when the daemon starts)")]
pub struct StoreSettings {
    /// Clean chunk cache on the read path, shared by all images [default: 16M].
    #[arg(long = "chunk-cache", value_name = "SIZE", value_parser = parse_size, conflicts_with = "backing")]
    pub chunk_cache_bytes: Option<u64>,

    /// Decoded manifest pages kept for lookups, shared by all images [default: 8M].
    #[arg(long = "manifest-cache", value_name = "SIZE", value_parser = parse_size, conflicts_with = "backing")]
    pub manifest_cache_bytes: Option<u64>,

    /// Write-ahead log quota per image; writes wait when it is full [default: 256M].
    #[arg(long = "log-quota", value_name = "SIZE", value_parser = parse_size, conflicts_with = "backing")]
    pub log_quota_bytes: Option<u64>,

    /// Memory for the chunk index plus compaction buffers; beyond it new
    /// chunks are refused rather than the daemon running out of memory [default: 1G].
    #[arg(long = "memory-budget", value_name = "SIZE", value_parser = parse_size, conflicts_with = "backing")]
    pub memory_budget_bytes: Option<u64>,

    /// Threads per compaction pass (1, 2 or 3) [default: 3].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=3), conflicts_with = "backing")]
    pub compaction_threads: Option<u64>,

    /// Scheduling class of compaction and log writeback: batch keeps them
    /// from preempting request threads on wakeup, idle runs them only on
    /// spare CPU, normal as the request path [default: batch].
    #[arg(long, value_name = "CLASS", value_parser = clap::builder::PossibleValuesParser::new(cas::BackgroundCpu::ALL.map(cas::BackgroundCpu::name)), conflicts_with = "backing")]
    pub background_cpu: Option<String>,

    /// Whether the daemon runs GC passes by itself when the store has grown
    /// or blocks were dropped; with off, space comes back only through
    /// `casblk gc` [default: on].
    #[arg(long = "gc-auto", value_name = "on|off", value_parser = ["on", "off"], conflicts_with = "backing")]
    pub gc_auto: Option<String>,

    /// The shortest time from one GC pass to the next automatic one; the
    /// daemon looks at the store every quarter of it, at most every 10 s
    /// [default: 60].
    #[arg(long = "gc-auto-interval", value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=86_400), conflicts_with = "backing")]
    pub gc_auto_interval_s: Option<u64>,

    /// Warn (in the log, the stats and the metrics) when the store's
    /// filesystem is at least PCT percent full [default: 90].
    #[arg(long = "space-warn", value_name = "PCT", value_parser = clap::value_parser!(u64).range(1..=100), conflicts_with = "backing")]
    pub space_warn_pct: Option<u64>,

    /// Free space of the store's filesystem that guest writes may not
    /// take, kept for compaction and GC to free space on a full store:
    /// below it, writes that need new log space wait while GC runs, and
    /// fail with ENOSPC once GC cannot free any. 0 turns it off
    /// [default: 1% of the filesystem, 256M to 4G, at most a tenth of it].
    #[arg(long = "space-reserve", value_name = "SIZE", value_parser = parse_size, conflicts_with = "backing")]
    pub space_reserve_bytes: Option<u64>,

    /// Scrub the whole store every HOURS hours (every chunk read back and
    /// checked, 64 MiB/s at most, in the background CPU class); off
    /// unless given (`casblk scrub` runs one pass).
    #[arg(long = "scrub-interval", value_name = "HOURS", value_parser = clap::value_parser!(u64).range(1..=8760), conflicts_with = "backing")]
    pub scrub_interval_h: Option<u64>,

    /// Serve Prometheus metrics over HTTP at ADDR (`127.0.0.1:9465`, path
    /// /metrics); off unless given. A daemon started to recover a device
    /// listens at the same address.
    #[arg(long = "metrics-listen", value_name = "ADDR", conflicts_with = "backing")]
    pub metrics_listen: Option<std::net::SocketAddr>,

    /// Let --metrics-listen take an address other hosts can reach (the
    /// endpoint has no authentication and names every image).
    #[arg(long = "metrics-allow-remote", requires = "metrics_listen")]
    #[serde(default)]
    pub metrics_allow_remote: bool,
}

#[derive(Args, Debug)]
#[group(skip)]
#[command(group(clap::ArgGroup::new("which").required(true).multiple(false)))]
pub struct RecoverArgs {
    /// Device id to recover.
    #[arg(short = 'n', long = "number", group = "which")]
    pub id: Option<u32>,

    /// Recover every quiesced device that casblk added.
    #[arg(short = 'a', long = "all", group = "which")]
    pub all: bool,

    /// Serve in the foreground instead of daemonizing (one device only).
    #[arg(long, requires = "id", conflicts_with = "all")]
    pub foreground: bool,
}

#[derive(Args, Debug)]
#[group(skip)]
#[command(group(clap::ArgGroup::new("which").required(true).multiple(false)))]
pub struct UpgradeArgs {
    /// Only the daemon serving device ID (a store daemon hands over all of
    /// its devices).
    #[arg(short = 'n', long = "number", group = "which")]
    pub id: Option<u32>,

    /// Every daemon that serves a device casblk added.
    #[arg(short = 'a', long = "all", group = "which")]
    pub all: bool,

    /// Hand over devices added with --on-daemon-loss fail too: their IO
    /// fails while no daemon serves them, for the handoff's length.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct DaemonArgs {
    #[command(flatten)]
    pub store_settings: StoreSettings,
}

#[derive(Args, Debug)]
#[group(skip)]
#[command(group(clap::ArgGroup::new("which").required(true).multiple(false)))]
pub struct DelArgs {
    /// Device id to delete.
    #[arg(short = 'n', long = "number", group = "which")]
    pub id: Option<u32>,

    /// Delete every ublk device.
    #[arg(short = 'a', long = "all", group = "which")]
    pub all: bool,

    /// Delete a device even while a process holds it open (its IO then
    /// fails with EIO); a mounted device is still refused.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use super::{Cli, Command};
    use clap::Parser;

    fn del(args: &[&str]) -> Result<(Option<u32>, bool, bool), clap::Error> {
        let cli = Cli::try_parse_from([&["casblk", "del"], args].concat())?;
        match cli.command {
            Command::Del(d) => Ok((d.id, d.all, d.force)),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn del_takes_one_of_number_or_all_and_force_with_either() {
        assert_eq!(del(&["-n", "3"]).unwrap(), (Some(3), false, false));
        assert_eq!(del(&["-n", "3", "--force"]).unwrap(), (Some(3), false, true));
        assert_eq!(del(&["-a", "--force"]).unwrap(), (None, true, true));
        assert!(del(&[]).is_err(), "a device or -a is needed");
        assert!(del(&["--force"]).is_err(), "--force alone names no device");
        assert!(del(&["-n", "1", "-a"]).is_err(), "one device or all, not both");
    }

    #[test]
    fn recover_takes_one_of_number_or_all_and_foreground_with_a_number() {
        let parse =
            |args: &[&str]| match Cli::try_parse_from([&["casblk", "recover"], args].concat())?.command {
                Command::Recover(r) => Ok::<_, clap::Error>((r.id, r.all, r.foreground)),
                other => panic!("parsed as {other:?}"),
            };
        assert_eq!(parse(&["-n", "2", "--foreground"]).unwrap(), (Some(2), false, true));
        assert_eq!(parse(&["-a"]).unwrap(), (None, true, false));
        assert!(parse(&["-a", "--foreground"]).is_err(), "--foreground needs one device");
        assert!(parse(&[]).is_err());
    }
}
