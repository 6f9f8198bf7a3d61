//! A started device's size, read and changed while it serves: GET_PARAMS
//! for what the kernel shows, UPDATE_SIZE (Linux 6.16+, advertised by
//! `UBLK_F_UPDATE_SIZE`) to grow it, after which the disk's openers see
//! the new capacity at once (the kernel sends a change uevent; a mounted
//! ext4 or XFS can then be grown online).

use super::driver::{ctrl_error, open_device};
use super::params::SECTOR_SHIFT;
use anyhow::Result;
use libublk::sys;

/// Whether the driver changes a started device's size.
pub fn has_update_size(features: u64) -> bool {
    features & u64::from(sys::UBLK_F_UPDATE_SIZE) != 0
}

/// Fails unless device `id` is live and served by process `pid` (a
/// device deleted meanwhile, or its id reused, gets no UPDATE_SIZE).
pub fn check_served_by(id: u32, pid: u32) -> Result<()> {
    let ctrl = open_device(id)?;
    let info = ctrl.dev_info();
    if u32::from(info.state) != sys::UBLK_S_DEV_LIVE || info.ublksrv_pid != pid as i32 {
        anyhow::bail!(
            "ublk device {id} is {} and served by pid {}, not live in this daemon (pid {pid})",
            super::driver::state_name(info.state),
            info.ublksrv_pid
        );
    }
    Ok(())
}

/// The size device `id` shows now, in bytes.
pub fn shown_bytes(id: u32) -> Result<u64> {
    let ctrl = open_device(id)?;
    let mut params = sys::ublk_params::default();
    ctrl.get_params(&mut params).map_err(|e| ctrl_error(id as i32, e))?;
    Ok(params.basic.dev_sectors << SECTOR_SHIFT)
}

/// Sets device `id`'s capacity to `size_bytes` (UPDATE_SIZE). libublk
/// refuses a device without its disk (ENODEV) before sending: drivers
/// before 7.0 dereference the missing disk.
pub fn update_size(id: u32, size_bytes: u64) -> Result<()> {
    let ctrl = open_device(id)?;
    ctrl.update_size(size_bytes).map_err(|e| ctrl_error(id as i32, e))?;
    Ok(())
}
