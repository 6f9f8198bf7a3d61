//! The commands about devices rather than images: `features`, `list`,
//! `del`, `recover` and `upgrade`, for every target.

use crate::cli::{DelArgs, ListArgs, RecoverArgs, UpgradeArgs};
use crate::device::driver::{
    awaits_daemon, device_ids, driver_features, feature_names, open_device, process_exists, require_driver,
    state_name, QUIESCE_WAIT,
};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};

/// What casblk does with driver feature bit `bit` (`casblk features`).
fn feature_use(bit: u32) -> &'static str {
    use libublk::sys as u;
    match 1u32.checked_shl(bit).unwrap_or(0) {
        f if f == u::UBLK_F_USER_RECOVERY => "asked for: a device outlives its daemon (recover, upgrade)",
        f if f == u::UBLK_F_USER_RECOVERY_REISSUE => {
            "asked for unless add --on-daemon-loss fail: IO waits for the next daemon, which reissues it"
        }
        f if f == u::UBLK_F_USER_COPY => "asked for by cas images: the daemon copies request data itself",
        f if f == u::UBLK_F_URING_CMD_COMP_IN_TASK
            || f == u::UBLK_F_CMD_IOCTL_ENCODE
            || f == u::UBLK_F_PER_IO_DAEMON
            || f == u::UBLK_F_BUF_REG_OFF_DAEMON =>
        {
            "set by the kernel on every device"
        }
        f if f == u::UBLK_F_UPDATE_SIZE => "used by image resize: an attached image grows online",
        f if f == u::UBLK_F_SAFE_STOP_DEV => {
            "set by the kernel on every device; del stops through it (TRY_STOP_DEV)"
        }
        f if f == u::UBLK_F_USER_RECOVERY_FAIL_IO => {
            "on request (add --on-daemon-loss fail): IO fails at once while no daemon serves the device"
        }
        f if f == u::UBLK_F_NO_AUTO_PART_SCAN => {
            "asked for unless add --partitions: the host does not scan a guest's partition table"
        }
        _ => "not used",
    }
}

/// `casblk features`: every flag the driver offers, by name, and whether
/// casblk uses it.
pub fn features() -> Result<()> {
    let mask = driver_features()?;
    println!("{:<24} {:#x}", "UBLK_FEATURES", mask);
    for (bit, name) in (0..64u32).filter(|b| mask & (1u64 << b) != 0).zip(feature_names(mask)) {
        println!("{:<24} {:<10} {}", name, format!("{:#x}", 1u64 << bit), feature_use(bit));
    }
    Ok(())
}

/// The target data a device's daemon exported (e.g. `{"cas": {...}}`).
pub fn target_data(id: u32) -> Result<serde_json::Value> {
    require_driver()?;
    open_device(id)?
        .get_target_data_from_json()
        .with_context(|| format!("ublk device {id} exported no target data"))
}

/// Where block device `ublkb{id}` is mounted, if anywhere.
fn mount_point(id: u32) -> Option<String> {
    let devno = std::fs::read_to_string(format!("/sys/class/block/ublkb{id}/dev")).ok()?;
    let devno = devno.trim();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        let mut fields = line.split(' ');
        let (_id, _parent, dev, _root, mnt) =
            (fields.next()?, fields.next()?, fields.next()?, fields.next()?, fields.next()?);
        (dev == devno).then(|| mnt.to_string())
    })
}

/// Kernel holders of `ublkb{id}` (device-mapper, md, ...).
fn holders(id: u32) -> Vec<String> {
    std::fs::read_dir(format!("/sys/class/block/ublkb{id}/holders"))
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str().map(String::from)).collect())
        .unwrap_or_default()
}

/// How long `del` waits for a stopped device to go away.
const DEL_WAIT: Duration = Duration::from_secs(10);

/// The refusal of an unforced del of a device processes hold open.
fn held_open(id: u32, open: &[crate::device::openers::Opener]) -> anyhow::Error {
    anyhow::anyhow!(
        "/dev/ublkb{id} is open in {}; stop them first, or --force to fail their IO",
        crate::device::openers::describe(open)
    )
}

fn delete(id: u32, force: bool) -> Result<()> {
    // The kernel's DEL waits until nobody holds the disk, so deleting a
    // mounted device would hang: refuse it with the reason instead.
    if let Some(mnt) = mount_point(id) {
        bail!("/dev/ublkb{id} is mounted at {mnt}; unmount it first");
    }
    let held = holders(id);
    if !held.is_empty() {
        bail!("/dev/ublkb{id} is in use by {}; remove those first", held.join(", "));
    }
    // A process holding it (a VM's disk) would see its IO fail: refused
    // unless forced, naming who holds it.
    if !force {
        let open = crate::device::openers::openers(id);
        if !open.is_empty() {
            return Err(held_open(id, &open));
        }
    }
    let ctrl = open_device(id)?;
    // STOP first so the serving daemon sees its queues go down; then the
    // asynchronous DEL, so an opener we cannot see (a VM holding the disk)
    // cannot make this command hang. Then wait, bounded, for it to go.
    // A refused DEL is not yet a failure: the serving daemon, seeing its
    // queues stop, may be removing the device itself (the VM suite saw
    // "io_uring IO failure" here once while the device went away anyway).
    //
    // Where the driver has safe stop (7.0+), an unforced stop is the
    // driver's TRY_STOP_DEV: it refuses while anyone has the disk open,
    // deciding under the disk's open mutex, so an opener that came after
    // the scan above, or that no process file shows (a memory mapping),
    // keeps its device. Elsewhere the scan is all there is.
    if !force && driver_features().is_ok_and(crate::device::ctrl_cmd::has_try_stop) {
        safe_stop(id)?;
    } else {
        let _ = ctrl.kill_dev();
    }
    let del_error = ctrl.del_dev_async().err().and_then(|_| ctrl.del_dev().err());
    let deadline = Instant::now() + DEL_WAIT;
    while Path::new(&format!("/sys/class/ublk-char/ublkc{id}")).exists() {
        if Instant::now() > deadline {
            if let Some(e) = del_error {
                bail!("deleting ublk device {id} failed: {e}");
            }
            bail!("ublk device {id} is stopped but still open elsewhere; it is removed when its last user closes it");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    crate::device::recovering::forget(id);
    // The JSON of a daemon that is gone (killed, or it never removed it);
    // a live daemon removes its own.
    crate::device::remove_json_if(id, |pid| !process_exists(pid));
    crate::device::state::DeviceState::remove(id)
}

/// How long an unforced del retries a safe stop the driver refuses while
/// no process holds the device: a short-lived kernel-side opener (udev's
/// probe after an add or after a writer closes the device) goes away.
const SAFE_STOP_RETRY: Duration = Duration::from_secs(3);

/// Stops device `id` with the driver's TRY_STOP_DEV, which refuses while
/// anyone has the disk open (see `delete`). A refusal names the processes
/// holding it; with none to name, it is retried for `SAFE_STOP_RETRY`.
/// No disk to stop (never started, or stopped already) is not an error:
/// DEL still removes the device. Any other error stops the del, rather
/// than falling back to a stop that would fail a holder's IO.
fn safe_stop(id: u32) -> Result<()> {
    use crate::device::ctrl_cmd::{try_stop, TryStop};
    let deadline = Instant::now() + SAFE_STOP_RETRY;
    loop {
        match try_stop(id)? {
            TryStop::Stopped => return Ok(()),
            TryStop::Other(errno) if errno == libc::ENODEV => return Ok(()),
            TryStop::Other(errno) => {
                bail!(
                    "the driver's safe stop of ublk device {id} failed: {}",
                    std::io::Error::from_raw_os_error(errno)
                )
            }
            TryStop::Busy => {
                let open = crate::device::openers::openers(id);
                if !open.is_empty() {
                    return Err(held_open(id, &open));
                }
                if Instant::now() > deadline {
                    bail!(
                        "/dev/ublkb{id} is open (the driver refuses to stop it; no process has it as a file: \
                         a memory mapping or a kernel user holds it); close it first, or --force to fail its IO"
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

pub fn del(args: &DelArgs) -> Result<()> {
    require_driver()?;
    if args.all {
        let mut failed = Vec::new();
        for id in device_ids() {
            if let Err(e) = delete(id, args.force) {
                eprintln!("casblk: {e:#}");
                failed.push(id);
            }
        }
        if !failed.is_empty() {
            bail!("could not delete devices {failed:?}");
        }
        return Ok(());
    }
    match args.id {
        Some(id) => delete(id, args.force),
        None => bail!("del needs -n ID or -a"),
    }
}

/// `casblk recover -n ID | -a`: serves again each device whose daemon
/// died, from its state file, keeping its /dev/ublkbN.
pub fn recover(args: &RecoverArgs) -> Result<()> {
    require_driver()?;
    let ids = if args.all {
        crate::device::state::DeviceState::ids().into_iter().filter(|&id| awaits_daemon(id)).collect()
    } else {
        vec![args.id.ok_or_else(|| anyhow::anyhow!("recover needs -n ID or -a"))?]
    };
    let mut failed = Vec::new();
    for id in ids {
        let started = std::time::Instant::now();
        match recover_one(id, args.foreground) {
            Ok(()) => tracing::info!(dev = id, ms = started.elapsed().as_millis() as u64, "recovered"),
            Err(e) if args.all => {
                eprintln!("casblk: {e:#}");
                failed.push(id);
            }
            Err(e) => return Err(e),
        }
    }
    if !failed.is_empty() {
        bail!("could not recover devices {failed:?}");
    }
    Ok(())
}

/// `casblk upgrade -n ID | -a`: each daemon serving the chosen devices
/// hands them over and exits (a store daemon flushes its images first; a
/// raw daemon, which buffers nothing, is killed), then this binary recovers
/// them. A service daemon is restarted by its service manager instead,
/// and recovers its devices itself; this waits for them.
pub fn upgrade(args: &UpgradeArgs) -> Result<()> {
    require_driver()?;
    let ids: Vec<u32> = match args.id {
        Some(id) => vec![id],
        None => crate::device::state::DeviceState::existing_ids(),
    };
    let mut by_daemon: std::collections::BTreeMap<i32, Vec<crate::device::state::DeviceState>> =
        Default::default();
    for id in ids {
        let state = crate::device::state::DeviceState::load(id)?;
        let info = open_device(id)?.dev_info();
        let pid = info.ublksrv_pid;
        if !state.recovery {
            bail!("ublk device {id} was added without user recovery: it cannot be handed over");
        }
        if crate::device::policy::fails_io_without_daemon(info.flags) && !args.force {
            bail!(
                "ublk device {id} was added with --on-daemon-loss fail: its IO would fail during the handoff; \
                 --force to hand it over anyway"
            );
        }
        by_daemon.entry(pid).or_default().push(state);
    }
    for (pid, states) in by_daemon {
        let started = Instant::now();
        let (service, states) = match &states[0].target {
            crate::device::state::Target::Cas { store, .. } => {
                let service = crate::client::handoff(store)?;
                // The store's daemon hands over every device it serves.
                let all: Vec<_> = crate::device::state::DeviceState::existing_ids()
                    .into_iter()
                    .filter_map(|id| crate::device::state::DeviceState::load(id).ok())
                    .filter(|s| matches!(&s.target, crate::device::state::Target::Cas { store: other, .. } if other == store))
                    .collect();
                (service, all)
            }
            crate::device::state::Target::Raw { .. } => {
                // SAFETY: kill(2) with a pid and a signal number has no
                // memory effects in this process.
                if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
                    bail!(
                        "stopping the daemon (pid {pid}) of device {}: {}",
                        states[0].id,
                        std::io::Error::last_os_error()
                    );
                }
                (false, states)
            }
        };
        let deadline = Instant::now() + QUIESCE_WAIT;
        while process_exists(pid) {
            if Instant::now() > deadline {
                bail!(
                    "the daemon (pid {pid}) did not exit within {} s of the handoff",
                    QUIESCE_WAIT.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for state in &states {
            if service {
                wait_live(state.id)?;
                println!("/dev/ublkb{}", state.id);
            } else {
                recover_one(state.id, false)?;
            }
        }
        tracing::info!(pid, ms = started.elapsed().as_millis() as u64, "daemon upgraded");
    }
    Ok(())
}

/// Waits (bounded) until device `id` is live again.
fn wait_live(id: u32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !open_device(id).is_ok_and(|c| u32::from(c.dev_info().state) == libublk::sys::UBLK_S_DEV_LIVE) {
        if Instant::now() > deadline {
            bail!("ublk device {id} was not served again within 60 s of the handoff");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Prints the device's path once it is served again.
fn recover_one(id: u32, foreground: bool) -> Result<()> {
    let state = crate::device::state::DeviceState::load(id)?;
    let _mark = crate::device::recovering::RecoveringMark::new(id);
    match &state.target {
        crate::device::state::Target::Raw { backing } => {
            crate::targets::raw::recover(&state, backing, foreground)
        }
        crate::device::state::Target::Cas { .. } => crate::client::recover_image(&state, foreground),
    }
}

#[derive(Serialize)]
struct DeviceRow {
    id: u32,
    bdev: String,
    state: &'static str,
    queues: u16,
    depth: u16,
    size_bytes: u64,
    max_io_bytes: u32,
    daemon_pid: i32,
    /// The driver flags the device was added with (`USER_RECOVERY`,
    /// `USER_COPY`, ...), named as `casblk features` names them.
    flags: Vec<String>,
    target: Option<serde_json::Value>,
}

fn describe(id: u32) -> Result<DeviceRow> {
    let ctrl = open_device(id)?;
    let info = ctrl.dev_info();
    let size_bytes = crate::device::resize::shown_bytes(&ctrl).unwrap_or(0);
    Ok(DeviceRow {
        id,
        bdev: ctrl.get_bdev_path(),
        state: match state_name(info.state) {
            "quiesced" | "fail_io" if crate::device::recovering::recovering_pid(id).is_some() => "recovering",
            name => name,
        },
        queues: info.nr_hw_queues,
        depth: info.queue_depth,
        size_bytes,
        max_io_bytes: info.max_io_buf_bytes,
        daemon_pid: info.ublksrv_pid,
        flags: feature_names(info.flags),
        target: ctrl.get_target_data_from_json(),
    })
}

pub fn list(args: &ListArgs) -> Result<()> {
    require_driver()?;
    let rows: Vec<DeviceRow> = device_ids().into_iter().filter_map(|id| describe(id).ok()).collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{:<4} {:<14} {:<9} {:>6} {:>6} {:>14} {:>8}  TARGET",
        "ID", "DEVICE", "STATE", "QUEUES", "DEPTH", "SIZE", "PID"
    );
    for r in rows {
        let target = r.target.map(|t| t.to_string()).unwrap_or_default();
        println!(
            "{:<4} {:<14} {:<9} {:>6} {:>6} {:>14} {:>8}  {}",
            r.id, r.bdev, r.state, r.queues, r.depth, r.size_bytes, r.daemon_pid, target
        );
    }
    Ok(())
}
