//! The daemon's lifecycle and its control socket: attaching and detaching
//! devices, image management, and stats.

use super::links;
use super::{bridge, queue, DeviceCore, Registry, Sched};
use crate::launch::Ready;
use crate::params::device_params;
use crate::protocol::Command;
use crate::raw;
use anyhow::{anyhow, bail, Context, Result};
use libublk::ctrl::UblkCtrl;
use libublk::io::UblkDev;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;

/// Worker threads executing requests against the store.
const WORKERS: usize = 4;
/// Threads that serve FLUSH and FUA requests (daemon/syncs.rs).
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
    pub queues: u16,
    pub depth: u16,
    pub io_buf_bytes: u32,
    pub poll_us: u64,
    /// Store daemon settings: used if this request starts the daemon,
    /// checked against the running daemon's otherwise.
    #[serde(default)]
    pub settings: super::StoreSettings,
    /// Take over device `id`, whose daemon died, instead of adding one.
    #[serde(default)]
    pub recover: bool,
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
}

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
    let options = settings.options()?;
    let opened = std::time::Instant::now();
    tracing::info!(store = %store_dir.display(), pid = std::process::id(), "store daemon starting");
    stop_here_for_tests(STOP_AT_STORE_OPEN);
    let store = cas::Store::open(storage, &store_dir, options.clone())
        .with_context(|| format!("opening store {}", store_dir.display()))?;
    tracing::info!(store = %store_dir.display(), ms = opened.elapsed().as_millis() as u64, "store opened");
    let path = Arc::new(
        serve::Server::start(sched::Config::default(), WORKERS, SYNC_THREADS)
            .map_err(|e| anyhow!("scheduler: {e}"))?,
    );
    let socket = socket_path(&store_dir);
    std::fs::create_dir_all(RUN_DIR).with_context(|| format!("creating {RUN_DIR}"))?;
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
    });
    let provider = {
        let d = daemon.clone();
        move |req: &trace::stats::Request| d.answer(req)
    };
    let server = trace::stats::Server::spawn(&socket, provider).context("starting the control socket")?;
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
    path.shutdown();
    tracing::info!(store = %daemon.store_dir.display(), "daemon exiting");
    result
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

    /// Serves again every quiesced device of this store that has a state
    /// file; returns how many were recovered and how many failed.
    fn recover_quiesced(self: &Arc<Self>) -> (usize, usize) {
        let (mut recovered, mut failed) = (0, 0);
        for id in crate::state::DeviceState::ids() {
            let Ok(state) = crate::state::DeviceState::load(id) else { continue };
            let crate::state::Target::Cas { store, image, .. } = &state.target else { continue };
            if store.canonicalize().ok().as_deref() != Some(self.store_dir.as_path()) {
                continue;
            }
            if !crate::control::is_quiesced(id) {
                continue;
            }
            let args = AddImageArgs {
                image: image.clone(),
                id: id as i32,
                queues: state.queues,
                depth: state.depth,
                io_buf_bytes: state.io_buf_bytes,
                poll_us: state.poll_us,
                settings: self.settings.clone(),
                recover: true,
            };
            // attach logs the recovery, with the time it took.
            let _mark = crate::recovering::RecoveringMark::new(id);
            match self.attach(&args) {
                Ok(_) => recovered += 1,
                Err(e) => {
                    failed += 1;
                    tracing::error!(image = %image, dev = id, "recovery failed: {e:#}");
                }
            }
        }
        (recovered, failed)
    }

    /// Blocks until no device is attached, then refuses new attachments.
    fn wait_until_idle(&self) {
        let mut table = self.lock();
        while !table.attached.is_empty() {
            table = self.changed.wait(table).unwrap_or_else(|p| p.into_inner());
        }
        table.shutting_down = true;
    }

    /// Attaches an image as a new ublk device; returns its path once usable.
    fn attach(self: &Arc<Self>, args: &AddImageArgs) -> Result<String> {
        raw::validate_queue_args(args.queues, args.depth, args.io_buf_bytes)?;
        // A recovered device joins whatever daemon serves its store now:
        // the settings are the store's, not the device's.
        if !args.recover {
            if let Some(why) = args.settings.conflict(&self.options) {
                bail!(why);
            }
            crate::control::require_free_id(args.id)?;
        }
        let frontier = sched::Config::default().frontier_limit();
        if usize::from(args.queues) * usize::from(args.depth) > frontier {
            bail!("queues x depth must be at most {frontier} (the scheduler's descriptor quota)");
        }
        let mut table = self.lock();
        if table.shutting_down {
            bail!("the store daemon is shutting down; retry");
        }
        if let Some(a) = table.attached.get(&args.image) {
            let at = a.path.clone().unwrap_or_else(|| "a device being attached".into());
            bail!("image {} is already attached as {at}", args.image);
        }
        let opening = std::time::Instant::now();
        let image =
            self.store.open_image(&args.image).with_context(|| format!("opening image {}", args.image))?;
        let replay = image.recovery();
        tracing::info!(
            image = %args.image,
            records_replayed = replay.replayed_records,
            segments = replay.segments,
            torn_tail_bytes = replay.torn_tail_bytes,
            ms = opening.elapsed().as_millis() as u64,
            "image opened"
        );
        let buffer_bytes = serve::tag_buffer_bytes(args.queues, args.depth, args.io_buf_bytes);
        let buffers = self.store.lend_memory(
            buffer_bytes,
            &format!(
                "the tag buffers of image {} ({} queues x depth {} x --io-buf-bytes {})",
                args.image, args.queues, args.depth, args.io_buf_bytes
            ),
        )?;
        let sched_id = sched::ImageId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let log_dir = self.store.log_dir(&args.image)?;
        let log_in_memory = std::fs::File::open(&log_dir).is_ok_and(|d| cas::storage::is_memory_fs(&d));
        let bufs = (0..args.queues)
            .map(|_| bridge::TagBuffers::new(usize::from(args.depth), args.io_buf_bytes as usize))
            .collect();
        let core = Arc::new(
            DeviceCore::new(
                sched_id,
                &args.image,
                image.clone(),
                log_in_memory,
                bufs,
                args.depth,
                args.io_buf_bytes,
                buffers,
            )
            .context("creating a queue eventfd")?,
        );
        self.path.attach(core.clone()).map_err(|e| anyhow!("scheduler: {e}"))?;
        table.attached.insert(args.image.clone(), Attached { sched_id, dev_id: None, path: None });
        drop(table);

        let (tx, rx) = mpsc::channel::<Result<(u32, String)>>();
        let (d, a) = (self.clone(), args.clone());
        std::thread::Builder::new()
            .name(format!("casblk-dev-{}", args.image))
            .spawn(move || d.run_device(core, &a, tx))
            .context("spawning the device thread")?;
        let (dev_id, path) = match rx.recv_timeout(ATTACH_TIMEOUT) {
            Ok(r) => r?,
            Err(_) => bail!("the device for image {} did not start within {:?}", args.image, ATTACH_TIMEOUT),
        };
        if let Some(a) = self.lock().attached.get_mut(&args.image) {
            a.dev_id = Some(dev_id);
            a.path = Some(path.clone());
        }
        links::make(&self.store_dir, &args.image, &path);
        let how = if args.recover { "recovered" } else { "attached" };
        tracing::info!(image = %args.image, dev = %path, ms = opening.elapsed().as_millis() as u64, "{how}");
        Ok(path)
    }

    /// The device thread: serves the device until it is stopped, then
    /// detaches the image. Reports start-up through `ready`.
    fn run_device(
        self: Arc<Self>,
        core: Arc<DeviceCore>,
        args: &AddImageArgs,
        ready: mpsc::Sender<Result<(u32, String)>>,
    ) {
        let served = self.serve_device(&core, args, ready.clone());
        if let Err(e) = served {
            let _ = ready.send(Err(e));
        }
        self.detach(&core);
    }

    fn serve_device(
        &self,
        core: &Arc<DeviceCore>,
        args: &AddImageArgs,
        ready: mpsc::Sender<Result<(u32, String)>>,
    ) -> Result<()> {
        let start = if args.recover { raw::Start::Recover } else { raw::Start::Add };
        let ctrl = raw::new_device("casblk", args.id, args.queues, args.depth, args.io_buf_bytes, start)?;
        let dev_id = ctrl.dev_info().dev_id;
        raw::save_state(
            &ctrl,
            (args.queues, args.depth, args.io_buf_bytes, args.poll_us),
            crate::state::Target::Cas {
                store: self.store_dir.clone(),
                image: core.name.clone(),
                settings: self.settings.clone(),
            },
        )?;
        let size = core.image.size_bytes();
        // A snapshot: the kernel refuses writes before they reach us.
        let read_only = core.image.is_read_only();
        let io_buf_bytes = args.io_buf_bytes;
        let target_json = json!({ "cas": {
            "store": self.store_dir.display().to_string(),
            "image": core.name,
            "socket": self.socket.display().to_string(),
        }});
        let tgt_init = move |dev: &mut UblkDev| {
            dev.tgt.dev_size = size;
            // The store serves DISCARD and WRITE_ZEROES as log records.
            dev.tgt.params = device_params(size, io_buf_bytes, true, read_only);
            dev.set_target_json(target_json);
            Ok(())
        };
        let (qcore, qsched, spin) = (core.clone(), self.sched.clone(), Duration::from_micros(args.poll_us));
        let queue_fn = move |qid: u16, dev: &UblkDev| queue::queue_thread(qid, dev, &qcore, &qsched, spin);
        let on_started = move |c: &UblkCtrl| {
            let path = c.get_bdev_path();
            match raw::wait_for_node(&path) {
                Ok(()) => {
                    let _ = ready.send(Ok((dev_id, path)));
                }
                Err(e) => {
                    let _ = ready.send(Err(e));
                    let _ = c.kill_dev();
                }
            }
        };
        let served = ctrl.run_target(tgt_init, queue_fn, on_started);
        // The device stopped (deleted, or failed to start): nothing to recover.
        drop(ctrl);
        raw::delete_if_recovered(dev_id, start);
        links::remove(&self.store_dir, &core.name, &format!("/dev/ublkb{dev_id}"));
        crate::state::DeviceState::remove(dev_id)?;
        served.map_err(|e| raw::ctrl_error(dev_id as i32, e))?;
        Ok(())
    }

    /// After the device stopped: make everything durable, and forget it.
    fn detach(&self, core: &DeviceCore) {
        if let Err(e) = core.image.flush() {
            tracing::error!(image = %core.name, "flush at detach failed: {e}");
        }
        if let Err(e) = self.path.detach(core) {
            tracing::error!(image = %core.name, "removing the image from the scheduler failed: {e}");
        }
        let mut table = self.lock();
        if table.attached.get(&core.name).is_some_and(|a| a.sched_id == core.sched_id) {
            table.attached.remove(&core.name);
        }
        self.changed.notify_all();
        tracing::info!(image = %core.name, "detached");
    }

    fn answer(self: &Arc<Self>, req: &trace::stats::Request) -> trace::Result<Value> {
        match req {
            trace::stats::Request::Stats { image } => {
                Ok(self.snapshot().select(image.as_deref())?.to_value())
            }
            trace::stats::Request::Control { action, args, v } => {
                let reply = match Command::decode(action, args, *v) {
                    Ok(cmd) => self.control(cmd),
                    Err(e) => Err(anyhow!(e)),
                };
                Ok(reply.unwrap_or_else(|e| trace::stats::error_reply(format!("{e:#}"))))
            }
            _ => Ok(trace::stats::error_reply("unsupported request")),
        }
    }

    fn control(self: &Arc<Self>, cmd: Command) -> Result<Value> {
        match cmd {
            Command::Ping {} => Ok(json!({ "store": self.store_dir.display().to_string() })),
            Command::Add(add) => Ok(json!({ "device": self.attach(&add)? })),
            Command::ImageCreate { name, size_bytes } => {
                self.store.create_image(&name, size_bytes)?;
                Ok(json!({ "created": name }))
            }
            Command::ImageRemove { name } => {
                if self.lock().attached.contains_key(&name) {
                    bail!("image {name} is attached; delete its device first");
                }
                self.store.remove_image(&name)?;
                Ok(json!({ "removed": name }))
            }
            Command::ImageList {} => Ok(self.image_list()?),
            Command::ImageSnapshot { image, snap } => {
                Ok(json!({ "snapshot": self.store.snapshot_image(&image, &snap)? }))
            }
            Command::ImageClone { snapshot, name } => {
                self.store.clone_image(&snapshot, &name)?;
                Ok(json!({ "cloned": name }))
            }
            Command::ImageRollback { image, snap } => {
                if self.lock().attached.contains_key(&image) {
                    bail!("image {image} is attached; delete its device before a rollback");
                }
                self.store.rollback_image(&image, &snap)?;
                Ok(json!({ "rolled_back": image }))
            }
            Command::ImageImport { name, path, size_bytes } => {
                let summary =
                    crate::image_io::import_into(&self.store, &name, Path::new(&path), size_bytes, false)?;
                Ok(json!({ "imported": name, "summary": summary }))
            }
            Command::ImageExport { name, path, format } => {
                if self.lock().attached.contains_key(&name) {
                    bail!("image {name} is attached and changes while it is read; export a snapshot of it");
                }
                crate::image_io::export_from(&self.store, &name, Path::new(&path), &format)?;
                Ok(json!({ "exported": name }))
            }
            Command::ImageInfo { name } => {
                let mut info = serde_json::to_value(self.store.image_info(&name)?)?;
                let device = self.lock().attached.get(&name).and_then(|a| a.path.clone());
                info["device"] = json!(device);
                Ok(info)
            }
            Command::Gc {} => Ok(serde_json::to_value(self.store.gc()?)?),
            Command::Handoff {} => self.handoff(),
        }
    }

    /// Live upgrade, the old daemon's half: make every image durable (less
    /// log to replay), then exit without stopping the devices, so the driver
    /// quiesces them and holds their IO for the new binary's `recover`. The
    /// reply goes out first. Under a service manager (`casblk daemon`) the
    /// exit status is 75, a failure, so `Restart=on-failure` starts the new
    /// binary, which recovers the devices itself.
    fn handoff(self: &Arc<Self>) -> Result<Value> {
        let devices = self.device_ids();
        for core in self.registry.all() {
            if let Err(e) = core.image.flush() {
                bail!("handoff refused: flushing image {} failed: {e}", core.name);
            }
        }
        let service = self.service;
        tracing::info!(?devices, service, "handing the devices over to a new daemon; exiting");
        std::thread::spawn(move || {
            // Let the control socket send the reply, then leave without
            // running destructors: those would delete the devices.
            std::thread::sleep(Duration::from_millis(200));
            std::process::exit(if service { HANDOFF_EXIT_SERVICE } else { 0 });
        });
        Ok(json!({ "devices": devices, "service": service, "pid": std::process::id() }))
    }

    fn image_list(&self) -> Result<Value> {
        let table = self.lock();
        let rows: Vec<Value> = self
            .store
            .list_images()?
            .into_iter()
            .map(|i| {
                let device = table.attached.get(&i.name).and_then(|a| a.path.clone());
                json!({
                    "name": i.name,
                    "size_bytes": i.size_bytes,
                    "device": device,
                    "kind": i.kind,
                    "origin": i.origin,
                })
            })
            .collect();
        Ok(Value::Array(rows))
    }

    fn snapshot(&self) -> trace::Snapshot {
        let mut images = Vec::new();
        for core in self.registry.all() {
            let mut stats = core.tracer.snapshot();
            stats.failure = core.image.failure().unwrap_or_default();
            match trace::counters_from("cas", &core.image.stats()) {
                Ok(c) => stats.attach("cas", c),
                Err(e) => tracing::warn!("cas counters: {e}"),
            }
            if let Some(sc) = self.sched.counters(core.sched_id) {
                match trace::counters_from("sched", &sc) {
                    Ok(c) => stats.attach("sched", c),
                    Err(e) => tracing::warn!("sched counters: {e}"),
                }
            }
            images.push(stats);
        }
        images.sort_by(|a, b| a.name.cmp(&b.name));
        let mut snap = trace::Snapshot::new(images);
        match self.store.space_stats() {
            Ok(space) => match trace::counters_from("store", &space) {
                Ok(c) => snap.attach("store", c),
                Err(e) => tracing::warn!("store counters: {e}"),
            },
            Err(e) => tracing::warn!("store space stats: {e}"),
        }
        match trace::counters_from("chunks", &self.store.chunk_stats()) {
            Ok(c) => snap.attach("chunks", c),
            Err(e) => tracing::warn!("chunk counters: {e}"),
        }
        match trace::counters_from("settings", &self.options) {
            Ok(c) => snap.attach("settings", c),
            Err(e) => tracing::warn!("settings: {e}"),
        }
        snap
    }
}
