//! Attaching an image as a ublk device (or taking one over in user
//! recovery), serving it until it stops, and detaching it.

use super::{AddImageArgs, Attached, Daemon, ATTACH_TIMEOUT};
use crate::device::{Device, Setup, Start};
use crate::targets::cas::{bridge, links, queue, DeviceCore};
use anyhow::{anyhow, bail, Context, Result};
use libublk::io::UblkDev;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};

/// How long a detach waits for an image's writes to reach the bucket.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

impl Daemon {
    /// The devices of this store that wait for a daemon (quiesced, or
    /// failing IO) and have a state file: their ids, states and images.
    pub(super) fn quiesced(&self) -> Vec<(u32, crate::device::state::DeviceState, String)> {
        let mut out = Vec::new();
        for id in crate::device::state::DeviceState::ids() {
            let Ok(state) = crate::device::state::DeviceState::load(id) else { continue };
            let crate::device::state::Target::Cas { store, image, .. } = &state.target else { continue };
            if store.canonicalize().ok().as_deref() != Some(self.store_dir.as_path()) {
                continue;
            }
            if !crate::device::driver::awaits_daemon(id) {
                continue;
            }
            let image = image.clone();
            out.push((id, state, image));
        }
        out
    }

    /// Serves again every device of this store that waits for a daemon
    /// and has a state file; returns how many were recovered and how many failed.
    pub(super) fn recover_quiesced(self: &Arc<Self>) -> (usize, usize) {
        let (mut recovered, mut failed) = (0, 0);
        for (id, state, image) in self.quiesced() {
            let args = AddImageArgs {
                image: image.clone(),
                id: id as i32,
                shape: state.shape,
                settings: self.settings.clone(),
                recover: true,
                limits: match &state.target {
                    crate::device::state::Target::Cas { limits, .. } => *limits,
                    crate::device::state::Target::Raw { .. } => sched::Limits::default(),
                },
                policy: Default::default(),
            };
            // attach logs the recovery, with the time it took.
            let _mark = crate::device::recovering::RecoveringMark::new(id);
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

    /// Attaches an image as a new ublk device; returns its path once usable.
    pub(super) fn attach(self: &Arc<Self>, args: &AddImageArgs) -> Result<String> {
        args.shape.validate()?;
        args.limits.validate()?;
        // A recovered device joins whatever daemon serves its store now:
        // the settings are the store's, not the device's.
        if !args.recover {
            if let Some(why) = args.settings.conflict(
                &self.options,
                self.metrics.get().copied(),
                self.space.warn_pct.load(Ordering::Relaxed),
                self.settings.scrub_interval_h,
            ) {
                bail!(why);
            }
            crate::device::driver::require_free_id(args.id)?;
        }
        let frontier = sched::Config::default().frontier_limit();
        if usize::from(args.shape.queues) * usize::from(args.shape.depth) > frontier {
            bail!("queues x depth must be at most {frontier} (the scheduler's descriptor quota)");
        }
        let _recovering = args.recover.then(|| Recovering::mark(self, &args.image));
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
        let buffer_bytes =
            serve::tag_buffer_bytes(args.shape.queues, args.shape.depth, args.shape.io_buf_bytes);
        let buffers = self.store.lend_memory(
            buffer_bytes,
            &format!(
                "the tag buffers of image {} ({} queues x depth {} x --io-buf-bytes {})",
                args.image, args.shape.queues, args.shape.depth, args.shape.io_buf_bytes
            ),
        )?;
        let sched_id = sched::ImageId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let log_dir = self.store.log_dir(&args.image)?;
        let log_in_memory = std::fs::File::open(&log_dir).is_ok_and(|d| cas::storage::is_memory_fs(&d));
        let bufs = (0..args.shape.queues)
            .map(|qid| {
                bridge::TagBuffers::new(qid, usize::from(args.shape.depth), args.shape.io_buf_bytes as usize)
            })
            .collect();
        let core = Arc::new(
            DeviceCore::new(
                sched_id,
                &args.image,
                image.clone(),
                log_in_memory,
                bufs,
                args.shape.depth,
                args.shape.io_buf_bytes,
                buffers,
            )
            .context("creating a queue eventfd")?,
        );
        self.path.attach(core.clone()).map_err(|e| anyhow!("scheduler: {e}"))?;
        if let Err(e) = self.path.sched.set_limits(sched_id, args.limits) {
            self.path.detach(&core).ok();
            bail!("IO limits: {e}");
        }
        table.attached.insert(args.image.clone(), Attached { sched_id, dev_id: None, path: None });
        drop(table);

        let (tx, rx) = mpsc::channel::<Result<(u32, String)>>();
        let (d, a, c) = (self.clone(), args.clone(), core.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("casblk-dev-{}", args.image))
            .spawn(move || d.run_device(c, &a, tx));
        if let Err(e) = spawned {
            // Nothing serves the image: take it back out of the request path.
            self.detach(&core);
            return Err(anyhow!("spawning the device thread for image {}: {e}", args.image));
        }
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
    pub(super) fn run_device(
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

    pub(super) fn serve_device(
        &self,
        core: &Arc<DeviceCore>,
        args: &AddImageArgs,
        ready: mpsc::Sender<Result<(u32, String)>>,
    ) -> Result<()> {
        let start = if args.recover { Start::Recover } else { Start::Add };
        let state = crate::device::state::Target::Cas {
            store: self.store_dir.clone(),
            image: core.name.clone(),
            settings: Box::new(self.settings.clone()),
            limits: args.limits,
        };
        // User copy: a write's data stays in the kernel until it executes.
        let device = Device::create("casblk", args.id, args.shape, start, state, (args.policy, true))?;
        let dev_id = device.id();
        let setup = Setup {
            size_bytes: core.image.size_bytes(),
            // The store serves DISCARD and WRITE_ZEROES as log records.
            discard: true,
            // A snapshot: the kernel refuses writes before they reach us.
            read_only: core.image.is_read_only(),
            target_json: json!({ "cas": {
                "store": self.store_dir.display().to_string(),
                "image": core.name,
                "socket": self.socket.display().to_string(),
            }}),
            fixed_file: None,
        };
        let (qcore, qsched, spin) = (core.clone(), self.sched.clone(), args.shape.spin());
        let queue_fn = move |qid: u16, dev: &UblkDev| queue::queue_thread(qid, dev, &qcore, &qsched, spin);
        let ready = move |r: Result<String>| {
            let _ = ready.send(r.map(|path| (dev_id, path)));
        };
        device.serve(setup, queue_fn, ready, || {
            links::remove(&self.store_dir, &core.name, &format!("/dev/ublkb{dev_id}"))
        })
    }

    /// After the device stopped: make everything durable (and, with a
    /// bucket, published), and forget it.
    pub(super) fn detach(&self, core: &DeviceCore) {
        if let Err(e) = core.image.flush() {
            tracing::error!(image = %core.name, "flush at detach failed: {e}");
        } else if self.store.publish_stats(&core.name).is_some() {
            // A store with a bucket: hand every write over, so a store that
            // takes the image over sees them all (cas::bucket::manifests, the window).
            match self.store.drain_to_bucket(&core.image, DRAIN_TIMEOUT) {
                Ok(g) => tracing::info!(image = %core.name, generation = g, "published at detach"),
                Err(e) => tracing::warn!(
                    image = %core.name,
                    "publishing at detach failed ({e}); the newest writes stay in its log until it is opened again"
                ),
            }
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
}

/// Marks an image as being recovered while it lives: from before its log
/// replay until its device serves or the recovery fails.
struct Recovering<'a> {
    daemon: &'a Daemon,
    image: String,
}

impl<'a> Recovering<'a> {
    fn mark(daemon: &'a Daemon, image: &str) -> Recovering<'a> {
        daemon.recovering.lock().unwrap_or_else(|p| p.into_inner()).insert(image.to_owned());
        Recovering { daemon, image: image.to_owned() }
    }
}

impl Drop for Recovering<'_> {
    fn drop(&mut self) {
        self.daemon.recovering.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.image);
    }
}
