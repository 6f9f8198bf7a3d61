//! The ublk driver as every target meets it: whether it is loaded, what
//! it offers (GET_FEATURES), device ids and states, and taking over a
//! device whose daemon died (START_USER_RECOVERY).

use anyhow::{bail, Context, Result};
use libublk::ctrl::UblkCtrl;
use libublk::UblkError;
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
    "IO_DESC_SIZE",
];

/// Fails with a clear message when the ublk driver is not loaded.
pub fn require_driver() -> Result<()> {
    if !Path::new(CONTROL_NODE).exists() {
        bail!("ublk driver not available: {CONTROL_NODE} is missing (load it with `modprobe ublk_drv`)");
    }
    Ok(())
}

/// Refuses an explicit device id that is taken, before a daemon is
/// started for it (ADD_DEV would refuse it too, with EEXIST, later).
pub fn require_free_id(id: i32) -> Result<()> {
    if id >= 0 && Path::new(&format!("/sys/class/ublk-char/ublkc{id}")).exists() {
        bail!("ublk device {id} already exists");
    }
    Ok(())
}

/// Takes over device `id`, whose daemon died, for a new daemon
/// (START_USER_RECOVERY). The device must wait for a daemon: added with
/// user recovery, and its daemon gone. Returns the state it waited in:
/// QUIESCED (its IO held) or FAIL_IO (its IO failed meanwhile), which
/// libublk cannot finish recovering (`Device::serve` does it itself).
pub fn begin_recovery(id: i32) -> Result<u32> {
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
    let state = u32::from(info.state);
    match state {
        libublk::sys::UBLK_S_DEV_QUIESCED | libublk::sys::UBLK_S_DEV_FAIL_IO => {}
        libublk::sys::UBLK_S_DEV_LIVE => {
            bail!("ublk device {id} is live: its daemon (pid {}) still serves it", info.ublksrv_pid)
        }
        _ => bail!(
            "ublk device {id} is {}, not waiting for a daemon: nothing to recover",
            state_name(info.state)
        ),
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
    Ok(state)
}

/// How long `recover` waits for the driver to quiesce a device whose
/// daemon is gone.
pub const QUIESCE_WAIT: Duration = Duration::from_secs(10);

/// Whether device `id` waits for a daemon: quiesced (its IO held), or
/// failing its IO (added with `--on-daemon-loss fail`).
pub fn awaits_daemon(id: u32) -> bool {
    open_device(id).is_ok_and(|c| {
        matches!(
            u32::from(c.dev_info().state),
            libublk::sys::UBLK_S_DEV_QUIESCED | libublk::sys::UBLK_S_DEV_FAIL_IO
        )
    })
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
/// Opens an existing device by id, mapping "no such device" to a clear error.
pub fn open_device(id: u32) -> Result<UblkCtrl> {
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

pub fn device_ids() -> Vec<u32> {
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

pub fn state_name(state: u16) -> &'static str {
    match u32::from(state) {
        libublk::sys::UBLK_S_DEV_DEAD => "dead",
        libublk::sys::UBLK_S_DEV_LIVE => "live",
        libublk::sys::UBLK_S_DEV_QUIESCED => "quiesced",
        libublk::sys::UBLK_S_DEV_FAIL_IO => "fail_io",
        _ => "unknown",
    }
}

/// Maps a control-path error to a message that names the device.
pub fn ctrl_error(id: i32, e: UblkError) -> anyhow::Error {
    match e {
        UblkError::UringIOError(code) if code == -libc::EEXIST => {
            anyhow::anyhow!("ublk device {id} already exists")
        }
        UblkError::UringIOError(code) => {
            anyhow::anyhow!("ublk control command failed: {}", std::io::Error::from_raw_os_error(-code))
        }
        other => anyhow::anyhow!("ublk control command failed: {other}"),
    }
}
