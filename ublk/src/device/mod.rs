//! The device layer every target shares: a ublk device's shape, its
//! lifecycle from ADD (or START_USER_RECOVERY) to its deletion, and the
//! pieces around it: the driver (`driver`, and `ctrl_cmd` for the control
//! commands libublk does not send), device parameters (`params`),
//! the per-queue ring (`ring`), launching a daemon (`launch`), who holds a
//! device open (`openers`), a started device's size (`resize`), and what a device leaves in /run for recovery
//! (`state`, `recovering`).
//!
//! ```text
//!  Device::create(id, shape, start, ..)      ADD_DEV with user recovery (and user
//!        │                                   copy, if asked), or START_USER_RECOVERY;
//!        │                                   state file saved
//!  Device::serve(setup, queue_fn, ready)     params + target JSON, one thread per
//!        │                                   queue (the target's queue_fn), START_DEV
//!        │                                   (END_USER_RECOVERY), ready(path)
//!        v                                   ... until the device is stopped ...
//!  queues gone: a recovered device deleted, its state file removed
//! ```
//!
//! A target (`targets::raw`, `targets::cas`) provides the device's size,
//! capabilities and queue threads; everything else is here.

pub mod ctrl_cmd;
pub mod driver;
pub mod launch;
pub mod openers;
pub mod params;
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
}

impl Device {
    /// Adds device `id` (-1: the driver picks) for `target` (the name the
    /// driver shows), or takes it over for recovery; then records it in its
    /// state file, so `casblk recover` can serve it again if this daemon dies.
    /// `user_copy`: a new device asks for user copy where the driver has
    /// it (the target's queue threads then pass request data through the
    /// char device); one taken over keeps what it has.
    pub fn create(
        target: &str,
        id: i32,
        shape: Shape,
        start: Start,
        state: state::Target,
        user_copy: bool,
    ) -> Result<Device> {
        let builder = UblkCtrlBuilder::default()
            .name(target)
            .id(id)
            .nr_queues(shape.queues)
            .depth(shape.depth)
            .io_buf_bytes(shape.io_buf_bytes);
        let ctrl = match start {
            Start::Add => builder
                .ctrl_flags(driver::recovery_flags() | if user_copy { driver::user_copy_flag() } else { 0 })
                .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
                .build()
                .map_err(|e| driver::ctrl_error(id, e))?,
            Start::Recover => {
                driver::begin_recovery(id)?;
                builder
                    .dev_flags(UblkFlags::UBLK_DEV_F_RECOVER_DEV)
                    .build()
                    .map_err(|e| driver::ctrl_error(id, e))?
            }
        };
        let info = ctrl.dev_info();
        state::DeviceState {
            id: info.dev_id,
            shape,
            recovery: info.flags & u64::from(libublk::sys::UBLK_F_USER_RECOVERY) != 0,
            target: state,
        }
        .save()?;
        Ok(Device { ctrl, start, shape })
    }

    pub fn id(&self) -> u32 {
        self.ctrl.dev_info().dev_id
    }

    /// Serves the device until it is stopped (`del`, a signal, or a failed
    /// start): one thread per queue runs `queue_fn`; once the block device
    /// node exists, `ready` gets its path (or the error, and the device is
    /// stopped). Afterwards nothing is left to recover: a device taken over
    /// is deleted here (libublk deletes only one it added), then `stopped`
    /// undoes what the target made for it (links), and last its state file
    /// is removed, so a daemon dying on the way leaves the file that names
    /// what to clean up.
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
        let (dev_id, start, io_buf_bytes) = (self.id(), self.start, self.shape.io_buf_bytes);
        let Setup { size_bytes, discard, read_only, target_json, fixed_file } = setup;
        let tgt_init = move |dev: &mut UblkDev| {
            let tgt = &mut dev.tgt;
            if let Some(fd) = fixed_file {
                tgt.fds[tgt.nr_fds as usize] = fd;
                tgt.nr_fds += 1;
            }
            tgt.dev_size = size_bytes;
            tgt.params = params::device_params(size_bytes, io_buf_bytes, discard, read_only);
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
        let served = self.ctrl.run_target(tgt_init, queue_fn, on_started);
        drop(self.ctrl);
        if start == Start::Recover {
            if let Ok(ctrl) = UblkCtrl::new_simple(dev_id as i32) {
                let _ = ctrl.del_dev();
            }
        }
        stopped();
        state::DeviceState::remove(dev_id)?;
        served.map_err(|e| driver::ctrl_error(dev_id as i32, e))?;
        Ok(())
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
