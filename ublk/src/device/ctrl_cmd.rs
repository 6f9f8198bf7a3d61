//! Control commands that libublk 0.4.8 does not send, or sends only with
//! what it knows, sent here one at a time on a ring of their own to
//! /dev/ublk-control (libublk's ring is a private thread-local):
//!
//! - ADD_DEV with any flags the driver offers: libublk refuses the flags
//!   newer than it (FAIL_IO, NO_AUTO_PART_SCAN); casblk adds every device
//!   itself, then libublk takes it over by id as for a recovery;
//! - DEL_DEV, for a device casblk added;
//! - END_USER_RECOVERY, for a device libublk cannot recover (FAIL_IO);
//! - TRY_STOP_DEV (Linux 7.0+, advertised by `UBLK_F_SAFE_STOP_DEV`),
//!   which stops a device only if nobody has it open, deciding under the
//!   disk's open mutex, so no opener can slip in between a check and the
//!   stop.

use super::driver::{feature_names, CONTROL_NODE};
use super::Shape;
use anyhow::{bail, Context, Result};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use libublk::sys;
use std::os::fd::AsRawFd;

/// What TRY_STOP_DEV did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryStop {
    /// Stopped: nobody had the disk open.
    Stopped,
    /// Refused: the disk has openers (a process, a mount, a mapping, a
    /// device stacked on it); the device runs on untouched.
    Busy,
    /// Not stopped for another reason (the kernel's errno): no disk (its
    /// daemon never started it, or it is stopped already), or a driver
    /// without the command.
    Other(i32),
}

/// Whether the driver offers TRY_STOP_DEV.
pub fn has_try_stop(features: u64) -> bool {
    features & u64::from(sys::UBLK_F_SAFE_STOP_DEV) != 0
}

/// Sends TRY_STOP_DEV for device `id`.
pub fn try_stop(id: u32) -> Result<TryStop> {
    let res = send(sys::UBLK_U_CMD_TRY_STOP_DEV, id, 0).context("TRY_STOP_DEV")?;
    Ok(match res {
        0 => TryStop::Stopped,
        r if r == -libc::EBUSY => TryStop::Busy,
        r => TryStop::Other(-r),
    })
}

/// Adds a device with exactly `flags` (ADD_DEV): id `id`, or any free id
/// for -1. Returns what the driver made of it (its id, queues clamped to
/// the CPUs, the flags it keeps). A flag the driver dropped is an error,
/// and the device is deleted again.
pub fn add_dev(id: i32, shape: &Shape, flags: u64) -> Result<sys::ublksrv_ctrl_dev_info> {
    let dev_id = u32::try_from(id).unwrap_or(u32::MAX);
    let mut info = Box::new(sys::ublksrv_ctrl_dev_info {
        nr_hw_queues: shape.queues,
        queue_depth: shape.depth,
        max_io_buf_bytes: shape.io_buf_bytes,
        dev_id,
        ublksrv_pid: std::process::id() as i32,
        flags,
        ..Default::default()
    });
    let len = std::mem::size_of::<sys::ublksrv_ctrl_dev_info>() as u16;
    let addr = (&mut *info as *mut sys::ublksrv_ctrl_dev_info) as u64;
    // The driver reads the info from `addr` and writes the device's back
    // there before the command completes. If the wait for that completion
    // failed, the driver may still write: the buffer is leaked (64 bytes)
    // rather than freed under it.
    let res = match send_buf(sys::UBLK_U_CMD_ADD_DEV, dev_id, addr, len, 0) {
        Ok(res) => res,
        Err(e) => {
            Box::leak(info);
            return Err(e.context("ADD_DEV"));
        }
    };
    match res {
        0 => {}
        r if r == -libc::EEXIST => bail!("ublk device {id} already exists"),
        r => bail!("adding a ublk device failed: {}", std::io::Error::from_raw_os_error(-r)),
    }
    let dropped = flags & !info.flags;
    if dropped != 0 {
        let _ = del_dev(info.dev_id);
        bail!(
            "the ublk driver dropped the flags {} that casblk asked for",
            feature_names(dropped).join(", ")
        );
    }
    Ok(*info)
}

/// Deletes device `id` (DEL_DEV), waiting until the driver lets it go:
/// only for a device none of this process's handles keeps open. The
/// kernel's errno is returned as an error (ENODEV: it is gone already).
pub fn del_dev(id: u32) -> Result<()> {
    match send(sys::UBLK_U_CMD_DEL_DEV, id, 0).context("DEL_DEV")? {
        0 => Ok(()),
        r => Err(std::io::Error::from_raw_os_error(-r)).with_context(|| format!("deleting ublk device {id}")),
    }
}

/// Ends the recovery of device `id` (END_USER_RECOVERY) for daemon `pid`,
/// whose queues are all up: the device is live again.
pub fn end_user_recovery(id: u32, pid: i32) -> Result<()> {
    match send(sys::UBLK_U_CMD_END_USER_RECOVERY, id, pid as u64).context("END_USER_RECOVERY")? {
        0 => Ok(()),
        r => Err(std::io::Error::from_raw_os_error(-r))
            .with_context(|| format!("ending the recovery of ublk device {id}")),
    }
}

/// One control command on a fresh ring: the kernel's result (0 or -errno).
fn send(cmd_op: u32, dev_id: u32, data: u64) -> Result<i32> {
    send_buf(cmd_op, dev_id, 0, 0, data)
}

/// One control command with a buffer (`addr`, `len` bytes; the caller
/// keeps it alive) on a fresh ring: the kernel's result (0 or -errno).
/// The driver may hand the command to an io_uring worker (it returns
/// -EAGAIN when called without blocking), so this waits for the one
/// completion, as libublk's own control path does: the buffer is not
/// touched once this returns.
fn send_buf(cmd_op: u32, dev_id: u32, addr: u64, len: u16, data: u64) -> Result<i32> {
    let control = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(CONTROL_NODE)
        .with_context(|| format!("opening {CONTROL_NODE}"))?;
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> =
        IoUring::builder().build(2).context("a control ring (io_uring with 128-byte entries)")?;
    let cmd =
        sys::ublksrv_ctrl_cmd { dev_id, queue_id: u16::MAX, len, addr, data: [data], ..Default::default() };
    let mut payload = [0u8; 80];
    // SAFETY: ublksrv_ctrl_cmd is a plain #[repr(C)] struct of integers
    // (32 bytes), copied byte for byte into the command area.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            (&cmd as *const sys::ublksrv_ctrl_cmd).cast::<u8>(),
            std::mem::size_of::<sys::ublksrv_ctrl_cmd>(),
        )
    };
    payload[..bytes.len()].copy_from_slice(bytes);
    let sqe =
        opcode::UringCmd80::new(types::Fd(control.as_raw_fd()), cmd_op).cmd(payload).build().user_data(1);
    // SAFETY: the entry refers to no memory beyond itself (the command is
    // copied into the entry) but the caller's buffer, which outlives this
    // call; the wait below ends only with the command's completion, and
    // `control` outlives the submission.
    unsafe { ring.submission().push(&sqe) }.map_err(|_| anyhow::anyhow!("the control ring is full"))?;
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            // A signal interrupted the wait, not the command.
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
            Err(e) => return Err(e).context("submitting a ublk control command"),
        }
        if let Some(cqe) = ring.completion().next() {
            return Ok(cqe.result());
        }
    }
}
