//! Control commands that libublk 0.4.8 does not send, sent here one at a
//! time on a ring of their own to /dev/ublk-control (libublk's ring is a
//! private thread-local): today TRY_STOP_DEV (Linux 7.0+, advertised by
//! `UBLK_F_SAFE_STOP_DEV`), which stops a device only if nobody has it
//! open, deciding under the disk's open mutex, so no opener can slip in
//! between a check and the stop.

use super::driver::CONTROL_NODE;
use anyhow::{Context, Result};
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

/// One control command on a fresh ring: the kernel's result (0 or -errno).
/// The driver may hand the command to an io_uring worker (it returns
/// -EAGAIN when called without blocking), so this waits for the one
/// completion, as libublk's own control path does.
fn send(cmd_op: u32, dev_id: u32, data: u64) -> Result<i32> {
    let control = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(CONTROL_NODE)
        .with_context(|| format!("opening {CONTROL_NODE}"))?;
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> =
        IoUring::builder().build(2).context("a control ring (io_uring with 128-byte entries)")?;
    let cmd = sys::ublksrv_ctrl_cmd { dev_id, queue_id: u16::MAX, data: [data], ..Default::default() };
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
    // copied into the entry), and `control` outlives the submission.
    unsafe { ring.submission().push(&sqe) }.map_err(|_| anyhow::anyhow!("the control ring is full"))?;
    ring.submit_and_wait(1).context("submitting a ublk control command")?;
    let cqe = ring.completion().next().context("a ublk control command completed without a result")?;
    Ok(cqe.result())
}
