//! Device control outside the io path: probing the driver, `features`,
//! `list` and `del`.

use crate::cli::{DelArgs, ListArgs, RecoverArgs, UpgradeArgs};
use anyhow::{bail, Context, Result};
use libublk::ctrl::UblkCtrl;
use serde::Serialize;
use std::path::Path;
use std::time::{Duration, Instant};

pub const CONTROL_NODE: &str = "/dev/ublk-control";

/// Names of the driver feature bits, indexed by bit number
/// (include/uapi/linux/ublk_cmd.h).
const FEATURE_NAMES: &[&str] = &[
    "SUPPORT_ZERO_COPY",
    "URING_CMD_COMP_IN_TASK",
    "NEED_GET_DATA",
    "USER_RECOVERY",
    "USER_RECOVERY_REISSUE",
    "UNPRIVILEGED_DEV",
    "CMD_IOCTL_ENCODE",
    "USER_COPY",
    "ZONED",
    "USER_RECOVERY_FAIL_IO",
    "UPDATE_SIZE",
    "AUTO_BUF_REG",
    "QUIESCE",
    "PER_IO_DAEMON",
    "BUF_REG_OFF_DAEMON",
    "BATCH_IO",
    "INTEGRITY",
    "SAFE_STOP_DEV",
    "NO_AUTO_PART_SCAN",
    "SHMEM_ZC",
];

/// Fails with a clear message when the ublk driver is not loaded.
pub fn require_driver() -> Result<()> {
    if !Path::new(CONTROL_NODE).exists() {
        bail!("ublk driver not available: {CONTROL_NODE} is missing (load it with `modprobe ublk_drv`)");
    }
    Ok(())
}

/// Refuses an explicit device id that is taken. Checked before ADD because
/// libublk's control handle, when ADD fails with EEXIST, deletes the device
/// with that id on drop: it would remove the device that is in the way.
pub fn require_free_id(id: i32) -> Result<()> {
    if id >= 0 && Path::new(&format!("/sys/class/ublk-char/ublkc{id}")).exists() {
        bail!("ublk device {id} already exists");
    }
    Ok(())
}

/// The control flags that make a new device survive its daemon: user
/// recovery with reissue, when the driver has both (Linux 6.1+ and 6.2+).
/// Without them a daemon crash fails the device's IO, as before; that is
/// said once, and the device is added anyway.
pub fn recovery_flags() -> u64 {
    let want = u64::from(libublk::sys::UBLK_F_USER_RECOVERY | libublk::sys::UBLK_F_USER_RECOVERY_REISSUE);
    match driver_features() {
        Ok(mask) if mask & want == want => want,
        Ok(_) | Err(_) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    "this ublk driver has no user recovery with reissue: if the daemon dies, its devices' IO fails"
                )
            });
            0
        }
    }
}

/// Takes over device `id`, whose daemon died, for a new daemon
/// (START_USER_RECOVERY). The device must be QUIESCED: added with user
/// recovery, and its daemon gone.
pub fn begin_recovery(id: i32) -> Result<()> {
    let mut ctrl = UblkCtrl::new_simple(id).with_context(|| format!("ublk device {id}"))?;
    let mut info = ctrl.dev_info();
    if info.flags & u64::from(libublk::sys::UBLK_F_USER_RECOVERY) == 0 {
        bail!("ublk device {id} was added without user recovery: it cannot be recovered");
    }
    // Just after its daemon died the driver may not have quiesced it yet.
    let deadline = Instant::now() + QUIESCE_WAIT;
    while u32::from(info.state) == libublk::sys::UBLK_S_DEV_LIVE
        && !process_exists(info.ublksrv_pid)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
        ctrl = UblkCtrl::new_simple(id).with_context(|| format!("ublk device {id}"))?;
        info = ctrl.dev_info();
    }
    match u32::from(info.state) {
        libublk::sys::UBLK_S_DEV_QUIESCED => {}
        libublk::sys::UBLK_S_DEV_LIVE => {
            bail!("ublk device {id} is live: its daemon (pid {}) still serves it", info.ublksrv_pid)
        }
        _ => bail!("ublk device {id} is {}, not quiesced: nothing to recover", state_name(info.state)),
    }
    ctrl.start_user_recover().map_err(|e| match e {
        // Older drivers (6.12's among them) refuse a second
        // START_USER_RECOVERY when the daemon that sent the first died
        // before its queues were up: nothing can serve the device again.
        libublk::UblkError::UringIOError(code) if code == -libc::EINVAL => anyhow::anyhow!(
            "ublk device {id} cannot be taken over: the driver refuses START_USER_RECOVERY (EINVAL), as \
             older drivers do after a recovery that died before its queues were up; \
             `casblk del -n {id}` fails its held IO"
        ),
        other => anyhow::anyhow!("START_USER_RECOVERY of device {id} failed: {other}"),
    })?;
    Ok(())
}

/// How long `recover` waits for the driver to quiesce a device whose
/// daemon is gone.
const QUIESCE_WAIT: Duration = Duration::from_secs(10);

/// Whether device `id` waits, quiesced, for a daemon.
pub fn is_quiesced(id: u32) -> bool {
    open_device(id).is_ok_and(|c| u32::from(c.dev_info().state) == libublk::sys::UBLK_S_DEV_QUIESCED)
}

/// Whether process `pid` still runs: a zombie (exited, not yet reaped by
/// its parent, which for a daemon may be an init that never reaps) has
/// closed its files and counts as gone.
pub fn process_exists(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesized command name.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// The driver's feature mask (kernel 6.5+ answers GET_FEATURES).
pub fn driver_features() -> Result<u64> {
    require_driver()?;
    UblkCtrl::get_features().context("the ublk driver did not answer GET_FEATURES (needs Linux 6.5+)")
}

pub fn feature_names(mask: u64) -> Vec<String> {
    (0..64)
        .filter(|bit| mask & (1u64 << bit) != 0)
        .map(|bit| match FEATURE_NAMES.get(bit) {
            Some(name) => (*name).to_string(),
            None => format!("BIT{bit}"),
        })
        .collect()
}

pub fn features() -> Result<()> {
    let mask = driver_features()?;
    println!("{:<24} {:#x}", "UBLK_FEATURES", mask);
    for (bit, name) in (0..64).filter(|b| mask & (1u64 << b) != 0).zip(feature_names(mask)) {
        println!("{:<24} {:#x}", name, 1u64 << bit);
    }
    Ok(())
}

/// Opens an existing device by id, mapping "no such device" to a clear error.
fn open_device(id: u32) -> Result<UblkCtrl> {
    // Checked first: libublk prints to stderr when asked for a device that
    // does not exist.
    if !Path::new(&format!("/sys/class/ublk-char/ublkc{id}")).exists() {
        bail!("no ublk device {id}");
    }
    let id = i32::try_from(id).with_context(|| format!("device id {id} is out of range"))?;
    UblkCtrl::new_simple(id).map_err(|e| match e {
        libublk::UblkError::UringIOError(code) if code == -libc::ENODEV || code == -libc::ENOENT => {
            anyhow::anyhow!("no ublk device {id}")
        }
        other => anyhow::anyhow!("cannot open ublk device {id}: {other}"),
    })
}

/// The target data a device's daemon exported (e.g. `{"cas": {...}}`).
pub fn target_data(id: u32) -> Result<serde_json::Value> {
    require_driver()?;
    open_device(id)?
        .get_target_data_from_json()
        .with_context(|| format!("ublk device {id} exported no target data"))
}

fn device_ids() -> Vec<u32> {
    let mut ids = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/sys/class/ublk-char") {
        for entry in entries.flatten() {
            let name = entry.file_name();
            if let Some(id) = name.to_str().and_then(|n| n.strip_prefix("ublkc")).and_then(|n| n.parse().ok())
            {
                ids.push(id);
            }
        }
    }
    ids.sort_unstable();
    ids
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

fn delete(id: u32) -> Result<()> {
    // The kernel's DEL waits until nobody holds the disk, so deleting a
    // mounted device would hang: refuse it with the reason instead.
    if let Some(mnt) = mount_point(id) {
        bail!("/dev/ublkb{id} is mounted at {mnt}; unmount it first");
    }
    let held = holders(id);
    if !held.is_empty() {
        bail!("/dev/ublkb{id} is in use by {}; remove those first", held.join(", "));
    }
    let ctrl = open_device(id)?;
    // STOP first so the serving daemon sees its queues go down; then the
    // asynchronous DEL, so an opener we cannot see (a VM holding the disk)
    // cannot make this command hang. Then wait, bounded, for it to go.
    // A refused DEL is not yet a failure: the serving daemon, seeing its
    // queues stop, may be removing the device itself (the VM suite saw
    // "io_uring IO failure" here once while the device went away anyway).
    let _ = ctrl.kill_dev();
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
    crate::recovering::forget(id);
    crate::state::DeviceState::remove(id)
}

pub fn del(args: &DelArgs) -> Result<()> {
    require_driver()?;
    if args.all {
        let mut failed = Vec::new();
        for id in device_ids() {
            if let Err(e) = delete(id) {
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
        Some(id) => delete(id),
        None => bail!("del needs -n ID or -a"),
    }
}

/// `casblk recover -n ID | -a`: serves again each device whose daemon
/// died, from its state file, keeping its /dev/ublkbN.
pub fn recover(args: &RecoverArgs) -> Result<()> {
    require_driver()?;
    let ids = if args.all {
        crate::state::DeviceState::ids().into_iter().filter(|&id| is_quiesced(id)).collect()
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
        None => crate::state::DeviceState::ids(),
    };
    let mut by_daemon: std::collections::BTreeMap<i32, Vec<crate::state::DeviceState>> = Default::default();
    for id in ids {
        let state = crate::state::DeviceState::load(id)?;
        let pid = open_device(id)?.dev_info().ublksrv_pid;
        if !state.recovery {
            bail!("ublk device {id} was added without user recovery: it cannot be handed over");
        }
        by_daemon.entry(pid).or_default().push(state);
    }
    for (pid, states) in by_daemon {
        let started = Instant::now();
        let (service, states) = match &states[0].target {
            crate::state::Target::Cas { store, .. } => {
                let service = crate::client::handoff(store)?;
                // The store's daemon hands over every device it serves.
                let all: Vec<_> = crate::state::DeviceState::ids()
                    .into_iter()
                    .filter_map(|id| crate::state::DeviceState::load(id).ok())
                    .filter(|s| matches!(&s.target, crate::state::Target::Cas { store: other, .. } if other == store))
                    .collect();
                (service, all)
            }
            crate::state::Target::Raw { .. } => {
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
    let state = crate::state::DeviceState::load(id)?;
    let _mark = crate::recovering::RecoveringMark::new(id);
    match &state.target {
        crate::state::Target::Raw { backing } => crate::raw::recover(&state, backing, foreground),
        crate::state::Target::Cas { .. } => crate::client::recover_image(&state, foreground),
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
    target: Option<serde_json::Value>,
}

fn state_name(state: u16) -> &'static str {
    match u32::from(state) {
        libublk::sys::UBLK_S_DEV_DEAD => "dead",
        libublk::sys::UBLK_S_DEV_LIVE => "live",
        libublk::sys::UBLK_S_DEV_QUIESCED => "quiesced",
        3 => "fail_io",
        _ => "unknown",
    }
}

fn describe(id: u32) -> Result<DeviceRow> {
    let ctrl = open_device(id)?;
    let info = ctrl.dev_info();
    let mut params = libublk::sys::ublk_params::default();
    let size_bytes = match ctrl.get_params(&mut params) {
        Ok(_) => params.basic.dev_sectors << 9,
        Err(_) => 0,
    };
    Ok(DeviceRow {
        id,
        bdev: ctrl.get_bdev_path(),
        state: match state_name(info.state) {
            "quiesced" if crate::recovering::recovering_pid(id).is_some() => "recovering",
            name => name,
        },
        queues: info.nr_hw_queues,
        depth: info.queue_depth,
        size_bytes,
        max_io_bytes: info.max_io_buf_bytes,
        daemon_pid: info.ublksrv_pid,
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
