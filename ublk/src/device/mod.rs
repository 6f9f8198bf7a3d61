//! The device layer every target shares: a ublk device's shape, its
//! lifecycle from ADD (or START_USER_RECOVERY) to its deletion, and the
//! pieces around it: the driver (`driver`, and `ctrl_cmd` for the control
//! commands casblk sends itself), what a new device asks for (`policy`),
//! device parameters (`params`), the per-queue ring (`ring`), launching a
//! daemon (`launch`), who holds a device open (`openers`), a started
//! device's size (`resize`), starting a device recovered from FAIL_IO
//! (`fail_io`), and what a device leaves in /run for recovery (`state`,
//! `recovering`).
//!
//! ```text
//!  Device::create(id, shape, start, ..)      ADD_DEV sent by casblk with the policy's
//!        │                                   flags, then taken over by libublk by id;
//!        │                                   or START_USER_RECOVERY; state file saved
//!  Device::serve(setup, queue_fn, ready)     params + target JSON, one thread per
//!        │                                   queue (the target's queue_fn), START_DEV
//!        │                                   (END_USER_RECOVERY), ready(path)
//!        v                                   ... until the device is stopped ...
//!  queues gone: the device deleted, its state file removed
//! ```
//!
//! A target (`targets::raw`, `targets::cas`) provides the device's size,
//! capabilities and queue threads; everything else is here.

pub mod ctrl_cmd;
pub mod driver;
mod fail_io;
pub mod launch;
pub mod openers;
pub mod params;
pub mod policy;
pub mod recovering;
pub mod resize;
pub mod ring;
pub mod state;

use anyhow::{bail, Context, Result};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::UblkDev;
use libublk::UblkFlags;
use std::os::fd::RawFd;
use std::path::Path;
use std::time::{Duration, Instant};

/// Largest queue depth and queue count the ublk driver accepts.
const MAX_DEPTH: u16 = 4096;
const MAX_QUEUES: u16 = 64;
/// How long START_DEV may take to show the block device node.
const NODE_WAIT: Duration = Duration::from_secs(10);

/// A device's queues and buffers, as `add` gives them and its state file
/// keeps them for recovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shape {
    pub queues: u16,
    pub depth: u16,
    /// Largest request, and the size of each tag's buffer.
    pub io_buf_bytes: u32,
    /// Busy-poll budget of a queue thread before it sleeps in its ring.
    pub poll_us: u64,
}

impl Shape {
    /// Refuses a shape the driver would refuse, with the reason.
    pub fn validate(&self) -> Result<()> {
        let Shape { queues, depth, io_buf_bytes, .. } = *self;
        if queues == 0 || queues > MAX_QUEUES {
            bail!("queues must be between 1 and {MAX_QUEUES}, got {queues}");
        }
        if depth == 0 || depth > MAX_DEPTH {
            bail!("depth must be between 1 and {MAX_DEPTH}, got {depth}");
        }
        if !(4096..=4 << 20).contains(&io_buf_bytes) || !io_buf_bytes.is_multiple_of(4096) {
            bail!("io-buf-bytes must be a multiple of 4096 between 4 KiB and 4 MiB, got {io_buf_bytes}");
        }
        Ok(())
    }

    pub fn spin(&self) -> Duration {
        Duration::from_micros(self.poll_us)
    }
}

/// How a device comes to be served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// A new device, with user recovery where the driver has it.
    Add,
    /// An existing device whose daemon died (QUIESCED): serve it again.
    Recover,
}

/// What a target tells the device layer about the device it serves.
pub struct Setup {
    pub size_bytes: u64,
    /// The target serves DISCARD.
    pub discard: bool,
    /// The kernel refuses writes before they reach the target.
    pub read_only: bool,
    /// The target data `casblk list` shows (`{"raw": ...}`, `{"cas": ...}`).
    pub target_json: serde_json::Value,
    /// A file the queue rings register as fixed file 1 (fixed file 0 is the
    /// ublk char device).
    pub fixed_file: Option<RawFd>,
}

/// A ublk device, added or taken over, not yet started.
pub struct Device {
    ctrl: UblkCtrl,
    start: Start,
    shape: Shape,
    /// The device was taken over in the FAIL_IO state, which libublk
    /// cannot finish recovering: `serve` starts it itself.
    from_fail_io: bool,
    /// Deletes a device this process added if it is never served.
    added: Option<Added>,
}

/// A device this process added and has not yet served: deleted, with its
/// state file, if it is dropped that way (a failed take-over, a target
/// that fails before serving), so no never-started device is left behind.
struct Added(u32);

impl Drop for Added {
    fn drop(&mut self) {
        if let Err(e) = ctrl_cmd::del_dev(self.0) {
            tracing::warn!(dev = self.0, "deleting the device that was never served: {e:#}");
        }
        remove_own_json(self.0);
        let _ = state::DeviceState::remove(self.0);
    }
}

impl Device {
    /// Adds device `id` (-1: the driver picks) for `target` (the name the
    /// driver shows), with the flags `policy` asks for on this driver, or
    /// takes it over for recovery; then records it in its state file, so
    /// `casblk recover` can serve it again if this daemon dies.
    /// `user_copy`: a new device asks for user copy where the driver has
    /// it (the target's queue threads then pass request data through the
    /// char device); one taken over keeps what it has.
    ///
    /// casblk sends ADD_DEV itself (libublk refuses flags newer than it)
    /// and libublk takes the new device over by id, as for a recovery.
    pub fn create(
        target: &str,
        id: i32,
        shape: Shape,
        start: Start,
        state: state::Target,
        flags: (policy::Policy, bool),
    ) -> Result<Device> {
        let (policy, user_copy) = flags;
        let (id, shape, added, from_fail_io) = match start {
            Start::Add => {
                let add_flags = policy.add_flags(driver::driver_features().ok(), user_copy)?;
                let info = ctrl_cmd::add_dev(id, &shape, add_flags)?;
                let added = Added(info.dev_id);
                // The kernel clamps the queues to the CPUs it has.
                let shape = Shape { queues: info.nr_hw_queues, depth: info.queue_depth, ..shape };
                forget_stale_json(info.dev_id);
                (info.dev_id as i32, shape, Some(added), false)
            }
            Start::Recover => {
                let waited_in = driver::begin_recovery(id)?;
                (id, shape, None, waited_in == libublk::sys::UBLK_S_DEV_FAIL_IO)
            }
        };
        let ctrl = UblkCtrlBuilder::default()
            .name(target)
            .id(id)
            .nr_queues(shape.queues)
            .depth(shape.depth)
            .io_buf_bytes(shape.io_buf_bytes)
            .dev_flags(UblkFlags::UBLK_DEV_F_RECOVER_DEV)
            .build()
            .map_err(|e| driver::ctrl_error(id, e))?;
        let info = ctrl.dev_info();
        state::DeviceState {
            id: info.dev_id,
            shape,
            recovery: info.flags & u64::from(libublk::sys::UBLK_F_USER_RECOVERY) != 0,
            target: state,
        }
        .save()?;
        Ok(Device { ctrl, start, shape, from_fail_io, added })
    }

    pub fn id(&self) -> u32 {
        self.ctrl.dev_info().dev_id
    }

    /// Serves the device until it is stopped (`del`, a signal, or a failed
    /// start): one thread per queue runs `queue_fn`; once the block device
    /// node exists, `ready` gets its path (or the error, and the device is
    /// stopped). Afterwards nothing is left to recover: the device is
    /// deleted here, then `stopped` undoes what the target made for it
    /// (links), and last its state file is removed, so a daemon dying on
    /// the way leaves the file that names what to clean up.
    pub fn serve<Q>(
        self,
        setup: Setup,
        queue_fn: Q,
        ready: impl FnOnce(Result<String>) + Send + Sync + 'static,
        stopped: impl FnOnce(),
    ) -> Result<()>
    where
        Q: FnOnce(u16, &UblkDev) + Send + Sync + Clone + 'static,
    {
        let Device { ctrl, start, shape, from_fail_io, added } = self;
        // From here the device is deleted below, whatever happens.
        std::mem::forget(added);
        let dev_id = ctrl.dev_info().dev_id;
        let Setup { size_bytes, discard, read_only, target_json, fixed_file } = setup;
        let tgt_init = move |dev: &mut UblkDev| {
            let tgt = &mut dev.tgt;
            if let Some(fd) = fixed_file {
                tgt.fds[tgt.nr_fds as usize] = fd;
                tgt.nr_fds += 1;
            }
            tgt.dev_size = size_bytes;
            tgt.params = params::device_params(size_bytes, shape.io_buf_bytes, discard, read_only);
            dev.set_target_json(target_json);
            Ok(())
        };
        let on_started = move |c: &UblkCtrl| {
            let path = c.get_bdev_path();
            match wait_for_node(&path) {
                Ok(()) => {
                    tracing::info!(dev = %path, "device live");
                    ready(Ok(path));
                }
                Err(e) => {
                    ready(Err(e));
                    let _ = c.kill_dev();
                }
            }
        };
        let served = if from_fail_io {
            fail_io::serve_recovered(&ctrl, json_path(dev_id), tgt_init, queue_fn, on_started)
        } else {
            ctrl.run_target(tgt_init, queue_fn, on_started)
                .map(|_| ())
                .map_err(|e| driver::ctrl_error(dev_id as i32, e))
        };
        drop(ctrl);
        if let Err(e) = ctrl_cmd::del_dev(dev_id) {
            // ENODEV: `casblk del` deleted it already.
            tracing::debug!(dev = dev_id, start = ?start, "{e:#}");
        }
        remove_own_json(dev_id);
        stopped();
        state::DeviceState::remove(dev_id)?;
        served
    }
}

/// libublk's JSON file of device `id`, in its run directory.
fn json_path(id: u32) -> std::path::PathBuf {
    Path::new(&UblkCtrl::run_dir()).join(format!("{id:04}.json"))
}

/// The daemon pid device `id`'s JSON file records (libublk writes the
/// device's info into it), if it can be read.
fn json_pid(id: u32) -> Option<i32> {
    let text = std::fs::read_to_string(json_path(id)).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["dev_info"]["ublksrv_pid"].as_i64().and_then(|p| i32::try_from(p).ok())
}

/// Removes device `id`'s JSON file once the device is gone (libublk
/// removes it only for a device it added itself), if `owned(pid)` says
/// the daemon it names is one whose file this caller may remove: the id
/// may already be a new device's, whose file must stay.
pub(crate) fn remove_json_if(id: u32, owned: impl Fn(i32) -> bool) {
    if json_pid(id).is_some_and(owned) {
        let _ = std::fs::remove_file(json_path(id));
    }
}

/// Removes this daemon's JSON file of device `id`.
fn remove_own_json(id: u32) {
    remove_json_if(id, |pid| pid == std::process::id() as i32);
}

/// Replaces a JSON file left in libublk's run directory by an earlier
/// device with the same id with an empty one, which libublk's take-over
/// reads quietly and then fills from scratch (a stale file's target data
/// would be kept).
fn forget_stale_json(id: u32) {
    let _ = std::fs::create_dir_all(UblkCtrl::run_dir());
    if let Err(e) = std::fs::write(json_path(id), "{}") {
        tracing::debug!(dev = id, "writing an empty device JSON: {e}");
    }
}

/// Waits (bounded) for the block device node the driver creates on START_DEV.
fn wait_for_node(path: &str) -> Result<()> {
    let deadline = Instant::now() + NODE_WAIT;
    while !Path::new(path).exists() {
        if Instant::now() > deadline {
            bail!("{path} did not appear after the device started");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Stops device `id` on SIGTERM, SIGINT or SIGHUP, so its daemon unwinds
/// through the normal path and deletes the device.
pub fn stop_on_signals(id: u32) -> Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .context("installing signal handlers")?;
    std::thread::Builder::new()
        .name("casblk-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                tracing::info!(dev = id, sig, "stopping device on signal");
                if let Ok(ctrl) = UblkCtrl::new_simple(id as i32) {
                    let _ = ctrl.kill_dev();
                }
            }
        })
        .context("spawning the signal thread")?;
    Ok(())
}
