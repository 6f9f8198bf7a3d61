//! The store daemon's lifecycle: starting it (store, request path, control
//! socket, signals), what it serves, and when it exits. Attaching and
//! detaching devices (`devices.rs`), the control socket's commands
//! (`commands.rs`), growing an image online (`resize.rs`), changing a
//! device's IO limits online (`limits.rs`), scrubbing (`scrub.rs`), the
//! stats snapshot (`snapshot.rs`) and the watch on the store filesystem's
//! fullness (`space.rs`) are beside it.

mod commands;
mod devices;
mod limits;
mod resize;
mod scrub;
mod snapshot;
mod space;

pub use scrub::DEFAULT_RATE_BYTES_PER_SEC as DEFAULT_SCRUB_RATE_BYTES_PER_SEC;
pub use space::DEFAULT_WARN_PCT as DEFAULT_SPACE_WARN_PCT;

use super::links;
use super::{bridge, Registry, Sched};
use crate::device::launch::Ready;
use anyhow::{anyhow, Context, Result};
use libublk::ctrl::UblkCtrl;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Worker threads executing requests against the store.
const WORKERS: usize = 4;
/// Threads that serve FLUSH and FUA requests (serve/src/syncs.rs).
const SYNC_THREADS: usize = 4;
/// How long attaching a device may take before it is given up.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(90);
/// Where the daemons' control sockets live (root-only).
pub const RUN_DIR: &str = "/run/casblk";

/// What `casblk add --image` asks of the daemon.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AddImageArgs {
    pub image: String,
    pub id: i32,
    /// On the wire as its four fields (`queues`, `depth`, ...).
    #[serde(flatten)]
    pub shape: crate::device::Shape,
    /// Store daemon settings: used if this request starts the daemon,
    /// checked against the running daemon's otherwise.
    #[serde(default)]
    pub settings: super::StoreSettings,
    /// Take over device `id`, whose daemon died, instead of adding one.
    #[serde(default)]
    pub recover: bool,
    /// The device's IO limits (crate::limits). The reply names them back,
    /// so a client learns when an older daemon ignored them.
    #[serde(default, skip_serializing_if = "sched::Limits::is_unlimited")]
    pub limits: sched::Limits,
    /// A new device's options (a device taken over keeps its own).
    #[serde(default, skip_serializing_if = "crate::device::policy::Policy::is_default")]
    pub policy: crate::device::policy::Policy,
}

/// The control socket of the daemon serving `store_dir` (which must be
/// canonical): one per store, named by a hash of the path so any path
/// length fits a socket address.
pub fn socket_path(store_dir: &Path) -> PathBuf {
    PathBuf::from(RUN_DIR).join(format!("store-{}.sock", links::store_id(store_dir)))
}

struct Attached {
    sched_id: sched::ImageId,
    dev_id: Option<u32>,
    path: Option<String>,
}

#[derive(Default)]
struct Table {
    attached: HashMap<String, Attached>,
    shutting_down: bool,
}

struct Daemon {
    store: Arc<cas::Store>,
    /// What the store was opened with (`add`'s settings flags).
    options: cas::StoreOptions,
    /// The flags that gave `options`, recorded in each device's state so a
    /// daemon started to recover it opens the store the same way.
    settings: super::StoreSettings,
    store_dir: PathBuf,
    socket: PathBuf,
    sched: Arc<Sched>,
    registry: Arc<Registry>,
    /// The request path (`serve`): its scheduler and registry are the two
    /// fields above.
    path: Arc<serve::Server<bridge::TagBuffers>>,
    table: Mutex<Table>,
    changed: Condvar,
    next_id: AtomicU32,
    /// A stop signal came: every device is being stopped.
    stop_requested: std::sync::atomic::AtomicBool,
    /// Run by `casblk daemon` for a service manager.
    service: bool,
    /// Images a recovery is taking over (stats show them as `recovering`).
    /// Apart from `table`, whose lock a recovery holds across the log
    /// replay.
    recovering: Mutex<std::collections::BTreeSet<String>>,
    /// Where the metrics endpoint listens, once it does.
    metrics: std::sync::OnceLock<std::net::SocketAddr>,
    /// How full the store's filesystem is (`space.rs` watches it).
    space: Arc<space::SpaceState>,
    /// The scrub under way and the last one's report (`scrub.rs`).
    scrub: scrub::ScrubState,
}

/// How long a daemon's exit waits for the compaction pass under way.
const COMPACTION_STOP_WAIT: Duration = Duration::from_secs(10);

/// Exit status of a service daemon after a handoff (EX_TEMPFAIL): a
/// failure to the service manager, which then restarts it.
const HANDOFF_EXIT_SERVICE: i32 = 75;

/// What a store daemon is started for.
pub enum Serve {
    /// `casblk add` or `recover`: serve this device, and exit once no device
    /// is left.
    First(AddImageArgs),
    /// `casblk daemon`: recover every quiesced device of the store (from
    /// `/run/casblk`), tell the service manager it is ready, and serve until
    /// SIGTERM, with or without devices.
    Service(super::StoreSettings),
}

/// Runs the store daemon of `store_dir`: opens the store, serves the
/// control socket and the devices, as `what` says.
pub fn serve_store(store_dir: PathBuf, what: Serve, ready: Ready) -> Result<()> {
    let settings = match &what {
        Serve::First(first) => first.settings.clone(),
        Serve::Service(settings) => settings.clone(),
    };
    let storage: Arc<dyn cas::storage::Storage> = Arc::new(cas::storage::FsStorage::new());
    let mut options = settings.options()?;
    options.remote = crate::remote::store_remote(&store_dir)?;
    let opened = std::time::Instant::now();
    tracing::info!(store = %store_dir.display(), pid = std::process::id(), "store daemon starting");
    stop_here_for_tests(STOP_AT_STORE_OPEN);
    let store = cas::Store::open(storage, &store_dir, options.clone())
        .with_context(|| format!("opening store {}", store_dir.display()))?;
    let chunks = store.chunks().open_report();
    tracing::info!(
        store = %store_dir.display(),
        ms = opened.elapsed().as_millis() as u64,
        chunks = chunks.entries,
        journal_batches = chunks.journal_batches,
        journal_bytes = chunks.journal_bytes,
        journal_ms = chunks.journal_ms,
        journal_on_cpu_ms = chunks.journal_time.on_cpu_ms,
        journal_runnable_ms = chunks.journal_time.runnable_ms,
        journal_asleep_ms = chunks.journal_time.asleep_ms,
        journal_major_faults = chunks.journal_time.major_faults,
        journal_minor_faults = chunks.journal_time.minor_faults,
        journal_user_ms = chunks.journal_time.user_ms,
        journal_kernel_ms = chunks.journal_time.kernel_ms,
        journal_read_ms = chunks.journal_read_ms,
        journal_puts = chunks.journal_puts,
        journal_removes = chunks.journal_removes,
        journal_frees = chunks.journal_frees,
        index_runs = chunks.runs,
        index_run_entries = chunks.run_entries,
        index_runs_ms = chunks.runs_ms,
        index_migrated = chunks.migrated,
        packs = chunks.packs_checked,
        packs_removed = chunks.packs_removed,
        packs_ms = chunks.packs_ms,
        "store opened"
    );
    let path = Arc::new(
        serve::Server::start(sched::Config::default(), WORKERS, SYNC_THREADS)
            .map_err(|e| anyhow!("scheduler: {e}"))?,
    );
    let socket = socket_path(&store_dir);
    std::fs::create_dir_all(RUN_DIR).with_context(|| format!("creating {RUN_DIR}"))?;
    let space_watch = space::SpaceWatch::spawn(store.clone(), settings.space_warn_pct())
        .context("spawning the space watch")?;
    let daemon = Arc::new(Daemon {
        store,
        options,
        settings,
        store_dir,
        socket: socket.clone(),
        sched: path.sched.clone(),
        registry: path.registry.clone(),
        path: path.clone(),
        table: Mutex::new(Table::default()),
        changed: Condvar::new(),
        next_id: AtomicU32::new(1),
        stop_requested: std::sync::atomic::AtomicBool::new(false),
        service: matches!(what, Serve::Service(_)),
        recovering: Mutex::new(Default::default()),
        metrics: std::sync::OnceLock::new(),
        space: space_watch.state.clone(),
        scrub: scrub::ScrubState::default(),
    });
    if let Some(hours) = daemon.settings.scrub_interval_h {
        daemon.scrub_periodically(Duration::from_secs(hours * 3600)).context("spawning the scrub timer")?;
    }
    // Before the control socket takes requests: an add naming the same
    // address must find it set. Devices held by a dead daemon matter more
    // than metrics: a daemon that recovers any serves without them rather
    // than failing (and being restarted, and failing, with IO held).
    let recovering = match &what {
        Serve::First(a) => a.recover,
        Serve::Service(_) => !daemon.quiesced().is_empty(),
    };
    let metrics = match serve_metrics(&daemon, recovering) {
        Ok(m) => m,
        Err(e) => {
            ready.fail(&e);
            return Err(e);
        }
    };
    let provider = {
        let d = daemon.clone();
        move |req: &trace::stats::Request| d.answer(req)
    };
    let server =
        crate::control_socket::Server::spawn(&socket, provider).context("starting the control socket")?;
    stop_all_on_signals(daemon.clone())?;
    let result = match what {
        Serve::First(first) => {
            let started = daemon.attach(&first);
            match &started {
                Ok(path) => ready.ok(path),
                Err(e) => ready.fail(e),
            }
            if started.is_ok() {
                daemon.wait_until_idle();
            }
            started.map(|_| ())
        }
        Serve::Service(_) => {
            let (recovered, failed) = daemon.recover_quiesced();
            let line = format!(
                "serving store {} ({recovered} devices recovered, {failed} could not be)",
                daemon.store_dir.display()
            );
            tracing::info!("{line}");
            println!("{line}");
            if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
                tracing::warn!("telling the service manager we are ready failed: {e}");
            }
            daemon.wait_until_stopped();
            Ok(())
        }
    };
    drop(server);
    drop(metrics);
    drop(space_watch);
    daemon.scrub_stop();
    path.shutdown();
    // A compaction pass cut short by the exit leaves its manifest.new
    // (harmless: the next open deletes it; fsck reports it meanwhile).
    if !daemon.store.stop_compaction(COMPACTION_STOP_WAIT) {
        tracing::warn!(
            "the compaction pass under way did not end within {COMPACTION_STOP_WAIT:?}; exiting under it"
        );
    }
    // The process exits without dropping the store (threads hold it):
    // chunks that a compaction stopped by the last `del` placed are
    // synced, or the pack they went to would be left with no index entry
    // (fsck: an orphan pack), and a merge of index runs is settled.
    if let Err(e) = daemon.store.chunks().close() {
        tracing::warn!("syncing the chunk store at exit failed (the next open redoes that work): {e}");
    }
    tracing::info!(store = %daemon.store_dir.display(), "daemon exiting");
    result
}

/// Starts the metrics endpoint where the settings ask for one. A daemon
/// started to recover a device serves without it when the address cannot
/// be bound (its devices matter more); otherwise that is an error naming
/// the flag.
fn serve_metrics(daemon: &Arc<Daemon>, recovering: bool) -> Result<Option<crate::metrics::http::Server>> {
    let addr = match daemon.settings.metrics_address() {
        Ok(Some(addr)) => addr,
        Ok(None) => return Ok(None),
        Err(e) if recovering => {
            tracing::error!("serving without metrics: {e:#}");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let d = daemon.clone();
    match crate::metrics::http::Server::spawn(addr, move || crate::metrics::render(&d.snapshot())) {
        Ok(server) => {
            // The address asked for (port 0 included), which a later add
            // repeats, not the port the kernel chose.
            let _ = daemon.metrics.set(addr);
            tracing::info!(asked = %addr, bound = %server.addr(), "metrics endpoint ready");
            Ok(Some(server))
        }
        Err(e) if recovering => {
            tracing::error!("serving without metrics: --metrics-listen {addr}: {e}");
            Ok(None)
        }
        Err(e) => Err(anyhow!("--metrics-listen {addr}: {e}")),
    }
}

/// `CASBLK_TEST_STOP_AT` names a point where the daemon stops itself
/// (SIGSTOP) for a test to act on it there, deterministically instead of by
/// racing a poll against the daemon (t-cas-recover-hard kills a recovering
/// daemon before it opened the store). Unset in production; a value that
/// names no point does nothing.
const STOP_AT_ENV: &str = "CASBLK_TEST_STOP_AT";
/// After "store daemon starting" is logged, before the store opens.
const STOP_AT_STORE_OPEN: &str = "store-open";

fn stop_here_for_tests(point: &str) {
    if std::env::var_os(STOP_AT_ENV).is_some_and(|v| v == point) {
        tracing::warn!(point, "stopping itself for a test ({STOP_AT_ENV})");
        if let Err(e) = signal_hook::low_level::raise(libc::SIGSTOP) {
            tracing::error!("{STOP_AT_ENV}: raising SIGSTOP failed: {e}");
        }
    }
}

fn stop_all_on_signals(daemon: Arc<Daemon>) -> Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .context("installing signal handlers")?;
    std::thread::Builder::new()
        .name("casblk-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                tracing::info!(sig, "stopping every device on signal");
                daemon.stop_requested.store(true, Ordering::Release);
                daemon.changed.notify_all();
                for id in daemon.device_ids() {
                    if let Ok(ctrl) = UblkCtrl::new_simple(id as i32) {
                        let _ = ctrl.kill_dev();
                    }
                }
            }
        })
        .context("spawning the signal thread")?;
    Ok(())
}

impl Daemon {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn device_ids(&self) -> Vec<u32> {
        self.lock().attached.values().filter_map(|a| a.dev_id).collect()
    }

    /// Blocks until a stop signal came and no device is left (service mode:
    /// having no device is no reason to exit), then refuses attachments.
    fn wait_until_stopped(&self) {
        let mut table = self.lock();
        while !(self.stop_requested.load(Ordering::Acquire) && table.attached.is_empty()) {
            table =
                self.changed.wait_timeout(table, Duration::from_secs(1)).unwrap_or_else(|p| p.into_inner()).0;
        }
        table.shutting_down = true;
    }

    /// Blocks until no device is attached, then refuses new attachments.
    fn wait_until_idle(&self) {
        let mut table = self.lock();
        while !table.attached.is_empty() {
            table = self.changed.wait(table).unwrap_or_else(|p| p.into_inner());
        }
        table.shutting_down = true;
    }
}
