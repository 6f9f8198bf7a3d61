//! A started device's size, read and changed while it serves: GET_PARAMS
//! for what the kernel shows, UPDATE_SIZE (Linux 6.16+, advertised by
//! `UBLK_F_UPDATE_SIZE`) to grow it, after which the disk's openers see
//! the new capacity at once (the kernel sends a change uevent; a mounted
//! ext4 or XFS can then be grown online).

use super::driver::{ctrl_error, open_device};
use super::params::SECTOR_SHIFT;
use anyhow::{bail, Context, Result};
use libublk::ctrl::UblkCtrl;
use libublk::sys;

/// Whether the driver changes a started device's size.
pub fn has_update_size(features: u64) -> bool {
    features & u64::from(sys::UBLK_F_UPDATE_SIZE) != 0
}

/// The size `ctrl`'s device shows now, in bytes (GET_PARAMS).
pub fn shown_bytes(ctrl: &UblkCtrl) -> Result<u64, libublk::UblkError> {
    let mut params = sys::ublk_params::default();
    ctrl.get_params(&mut params)?;
    Ok(params.basic.dev_sectors << SECTOR_SHIFT)
}

/// Grows device `id` to `size_bytes` (UPDATE_SIZE) if it shows less; only
/// a live device served by process `pid` (a device deleted meanwhile, or
/// its id reused, gets nothing). libublk refuses a device without its
/// disk (ENODEV) before sending: drivers before 7.0 dereference it.
/// Returns the size it showed before.
pub fn grow_served(id: u32, pid: u32, size_bytes: u64) -> Result<u64> {
    let ctrl = open_device(id)?;
    let info = ctrl.dev_info();
    if u32::from(info.state) != sys::UBLK_S_DEV_LIVE || info.ublksrv_pid != pid as i32 {
        bail!(
            "ublk device {id} is {} and served by pid {}, not live in this daemon (pid {pid})",
            super::driver::state_name(info.state),
            info.ublksrv_pid
        );
    }
    let shown = shown_bytes(&ctrl).map_err(|e| ctrl_error(id as i32, e))?;
    if shown < size_bytes {
        ctrl.update_size(size_bytes)
            .map_err(|e| ctrl_error(id as i32, e))
            .with_context(|| format!("/dev/ublkb{id} still shows {shown} bytes"))?;
    }
    Ok(shown)
}
