//! Raw passthrough mode: `/dev/ublkbN` maps 1:1 onto a backing file.
//!
//! Each queue has one thread, one io_uring (libublk's) and one async task
//! per tag. A task fetches a request, issues the storage IO for it on the
//! same ring (fixed file 1 is the backing), and commits the result with
//! COMMIT_AND_FETCH. This mode is the passthrough baseline for benchmarks
//! and stays in the product.

use crate::cli::AddArgs;
use crate::control;
use crate::launch::{self, Ready};
use crate::params::{device_params, Backing, ZeroMethod, SECTOR_SHIFT};
use crate::ring;
use anyhow::{bail, Context, Result};
use io_uring::{opcode, squeue, types};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::helpers::IoBuf;
use libublk::io::{UblkDev, UblkQueue};
use libublk::uring_async::ublk_submit_sqe_async;
use libublk::{BufDesc, UblkError, UblkFlags, UblkUringData};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Index of the backing file in the queue ring's fixed-file table
/// (index 0 is the ublk char device, registered by libublk).
const BACKING_FIXED_FD: types::Fixed = types::Fixed(1);
/// Largest write served inline for a memory-backed backing.
const INLINE_WRITE_BYTES_MAX: usize = 64 << 10;
/// EAGAIN retries before a request fails.
const EAGAIN_RETRIES: u32 = 4;
/// Largest queue depth and queue count the ublk driver accepts.
const MAX_DEPTH: u16 = 4096;
const MAX_QUEUES: u16 = 64;
pub const DAEMON_LOG: &str = "/run/casblk/casblk.log";

/// What every queue thread needs to serve requests.
struct RawTarget {
    /// For a memory-backed backing, reads and writes are served inline on
    /// the queue thread: a memory copy is cheaper than a trip through the
    /// ring, and it cannot block on a device.
    inline: Option<std::fs::File>,
    punch: bool,
    zeroes: ZeroMethod,
    /// Busy-poll budget before the queue thread sleeps in the ring.
    spin: Duration,
}

pub fn validate_queue_args(queues: u16, depth: u16, io_buf_bytes: u32) -> Result<()> {
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

pub fn add(args: AddArgs, backing: &Path) -> Result<()> {
    validate_queue_args(args.queues, args.depth, args.io_buf_bytes)?;
    let backing = Backing::open(backing)?;
    control::require_driver()?;
    control::require_free_id(args.id)?;
    launch::launch(args.foreground, Path::new(DAEMON_LOG), move |ready| {
        serve(&args, backing, ready, Start::Add)
    })
}

/// Serves raw device `state.id` again after its daemon died.
pub fn recover(state: &crate::state::DeviceState, backing: &Path, foreground: bool) -> Result<()> {
    let args = AddArgs {
        id: state.id as i32,
        image: None,
        backing: Some(backing.to_path_buf()),
        queues: state.queues,
        depth: state.depth,
        io_buf_bytes: state.io_buf_bytes,
        poll_us: state.poll_us,
        foreground,
        store_settings: Default::default(),
    };
    let backing = Backing::open(backing)?;
    launch::launch(foreground, Path::new(DAEMON_LOG), move |ready| {
        serve(&args, backing, ready, Start::Recover)
    })
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

/// Stops device `id` on SIGTERM, SIGINT or SIGHUP, so the daemon unwinds
/// through the normal path and deletes its device.
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

/// Waits (bounded) for the block device node the driver creates on START_DEV.
pub fn wait_for_node(path: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !Path::new(path).exists() {
        if Instant::now() > deadline {
            bail!("{path} did not appear after the device started");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// The device_fn of `run_target`: report readiness once the node exists.
pub fn report_ready(ctrl: &UblkCtrl, ready: &Ready) {
    let path = ctrl.get_bdev_path();
    match wait_for_node(&path) {
        Ok(()) => {
            tracing::info!(dev = %path, "device live");
            ready.ok(&path);
        }
        Err(e) => {
            ready.fail(&e);
            let _ = ctrl.kill_dev();
        }
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

/// A ublk device (not yet started) for `target`: added new, or taken over
/// for recovery (START_USER_RECOVERY; the start that follows is then
/// END_USER_RECOVERY, and the kernel reissues what was in flight).
pub fn new_device(
    target: &str,
    id: i32,
    queues: u16,
    depth: u16,
    io_buf_bytes: u32,
    start: Start,
) -> Result<UblkCtrl> {
    let builder = UblkCtrlBuilder::default()
        .name(target)
        .id(id)
        .nr_queues(queues)
        .depth(depth)
        .io_buf_bytes(io_buf_bytes);
    match start {
        Start::Add => builder
            .ctrl_flags(control::recovery_flags())
            .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
            .build()
            .map_err(|e| ctrl_error(id, e)),
        Start::Recover => {
            control::begin_recovery(id)?;
            builder.dev_flags(UblkFlags::UBLK_DEV_F_RECOVER_DEV).build().map_err(|e| ctrl_error(id, e))
        }
    }
}

/// After a device's queues stopped: a device this daemon took over for
/// recovery is not deleted by its control handle (only one it added is), so
/// delete it here, as a device stopped by SIGTERM or `del` must go.
pub fn delete_if_recovered(id: u32, start: Start) {
    if start == Start::Recover {
        if let Ok(ctrl) = UblkCtrl::new_simple(id as i32) {
            let _ = ctrl.del_dev();
        }
    }
}

/// Records `ctrl`'s device in its state file, so `casblk recover` can
/// serve it again if this daemon dies (see `state`).
pub fn save_state(ctrl: &UblkCtrl, args: (u16, u16, u32, u64), target: crate::state::Target) -> Result<()> {
    let info = ctrl.dev_info();
    let (queues, depth, io_buf_bytes, poll_us) = args;
    crate::state::DeviceState {
        id: info.dev_id,
        queues,
        depth,
        io_buf_bytes,
        poll_us,
        recovery: info.flags & u64::from(libublk::sys::UBLK_F_USER_RECOVERY) != 0,
        target,
    }
    .save()
}

fn serve(args: &AddArgs, backing: Backing, ready: Ready, start: Start) -> Result<()> {
    let ctrl = new_device("casblk-raw", args.id, args.queues, args.depth, args.io_buf_bytes, start)?;
    let dev_id = ctrl.dev_info().dev_id;
    let backing_path = backing.path.canonicalize().unwrap_or_else(|_| backing.path.clone());
    save_state(
        &ctrl,
        (args.queues, args.depth, args.io_buf_bytes, args.poll_us),
        crate::state::Target::Raw { backing: backing_path },
    )?;
    stop_on_signals(dev_id)?;

    let inline = match backing.in_memory {
        true => Some(backing.file.try_clone().context("duplicating the backing file handle")?),
        false => None,
    };
    let target = Arc::new(RawTarget {
        inline,
        punch: backing.punch,
        zeroes: backing.zeroes,
        spin: Duration::from_micros(args.poll_us),
    });
    let backing_fd = backing.file.as_raw_fd();
    let (size, io_buf_bytes, punch) = (backing.size, args.io_buf_bytes, backing.punch);
    let target_json = serde_json::json!({
        "raw": {
            "backing": backing.path.display().to_string(),
            "direct_io": backing.direct,
            "discard": backing.punch,
            "write_zeroes": format!("{:?}", backing.zeroes),
            "inline_io": backing.in_memory,
        }
    });
    let tgt_init = move |dev: &mut UblkDev| {
        let tgt = &mut dev.tgt;
        tgt.fds[tgt.nr_fds as usize] = backing_fd;
        tgt.nr_fds += 1;
        tgt.dev_size = size;
        tgt.params = device_params(size, io_buf_bytes, punch, false);
        dev.set_target_json(target_json);
        Ok(())
    };
    let q_target = target.clone();
    let queue_fn = move |qid: u16, dev: &UblkDev| queue_thread(qid, dev, &q_target);

    let served = ctrl.run_target(tgt_init, queue_fn, move |c: &UblkCtrl| report_ready(c, &ready));
    // The device stopped (deleted, or failed to start): nothing to recover.
    drop(ctrl);
    delete_if_recovered(dev_id, start);
    crate::state::DeviceState::remove(dev_id)?;
    served.map_err(|e| ctrl_error(dev_id as i32, e))?;
    // Keep the backing file open until every queue thread has exited.
    drop(backing);
    Ok(())
}

fn queue_thread(qid: u16, dev: &UblkDev, target: &Arc<RawTarget>) {
    ring::init_queue_ring(dev);
    let queue = match UblkQueue::new(qid, dev) {
        Ok(q) => Rc::new(q),
        Err(e) => {
            tracing::error!(qid, "creating queue failed: {e}");
            return;
        }
    };
    let exe = Rc::new(smol::LocalExecutor::new());
    let mut tasks = Vec::new();
    for tag in queue.tags() {
        let q = queue.clone();
        let t = target.clone();
        tasks.push(exe.spawn(async move {
            match serve_tag(&q, tag, &t).await {
                Err(UblkError::QueueIsDown) | Ok(()) => {}
                Err(e) => tracing::error!(qid = q.get_qid(), tag, "io task failed: {e}"),
            }
        }));
    }
    ring::run_event_loop(&queue, &exe, target.spin, || tasks.iter().all(|t| t.is_finished()));
}

async fn serve_tag(q: &UblkQueue<'_>, tag: u16, target: &RawTarget) -> Result<(), UblkError> {
    let mut buf = IoBuf::<u8>::new(q.dev.dev_info.max_io_buf_bytes as usize);
    q.submit_io_prep_cmd(tag, BufDesc::Slice(buf.as_slice()), 0, Some(&buf)).await?;
    loop {
        let res = handle(q, tag, target, buf.as_mut_slice()).await;
        q.submit_io_commit_cmd(tag, BufDesc::Slice(buf.as_slice()), res).await?;
    }
}

async fn submit(sqe: squeue::Entry) -> i32 {
    let sqe = sqe.flags(squeue::Flags::FIXED_FILE);
    ublk_submit_sqe_async(sqe, UblkUringData::Target as u64).await.unwrap_or(-libc::EIO)
}

async fn handle(q: &UblkQueue<'_>, tag: u16, target: &RawTarget, buf: &mut [u8]) -> i32 {
    let iod = q.get_iod(tag);
    let op = iod.op_flags & 0xff;
    let fua = iod.op_flags & libublk::sys::UBLK_IO_F_FUA != 0;
    let off = iod.start_sector << SECTOR_SHIFT;
    let len = (iod.nr_sectors as u64) << SECTOR_SHIFT;
    let res = match op {
        libublk::sys::UBLK_IO_OP_READ | libublk::sys::UBLK_IO_OP_WRITE => {
            let Some(data) = buf.get_mut(..len as usize) else {
                return -libc::EINVAL;
            };
            let write = op == libublk::sys::UBLK_IO_OP_WRITE;
            match &target.inline {
                // Large writes still go through the ring: io_uring hands
                // them to its workers, so their copy into the backing runs
                // beside the queue thread's copy of the next request.
                Some(file) if !write || data.len() <= INLINE_WRITE_BYTES_MAX => {
                    transfer_inline(file, write, fua, off, data)
                }
                _ => transfer(write, fua, off, data).await,
            }
        }
        libublk::sys::UBLK_IO_OP_FLUSH => return datasync().await,
        libublk::sys::UBLK_IO_OP_DISCARD if target.punch => punch(off, len).await,
        libublk::sys::UBLK_IO_OP_DISCARD => return -libc::EOPNOTSUPP,
        libublk::sys::UBLK_IO_OP_WRITE_ZEROES => write_zeroes(target.zeroes, off, len, buf).await,
        _ => return -libc::EINVAL,
    };
    if res >= 0 && fua && op != libublk::sys::UBLK_IO_OP_WRITE {
        let synced = datasync().await;
        if synced < 0 {
            return synced;
        }
    }
    res
}

async fn datasync() -> i32 {
    submit(opcode::Fsync::new(BACKING_FIXED_FD).flags(types::FsyncFlags::DATASYNC).build()).await
}

async fn punch(off: u64, len: u64) -> i32 {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    submit(opcode::Fallocate::new(BACKING_FIXED_FD, len).offset(off).mode(mode).build()).await
}

async fn write_zeroes(method: ZeroMethod, off: u64, len: u64, buf: &mut [u8]) -> i32 {
    match method {
        ZeroMethod::ZeroRange => {
            let mode = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
            submit(opcode::Fallocate::new(BACKING_FIXED_FD, len).offset(off).mode(mode).build()).await
        }
        ZeroMethod::PunchHole => punch(off, len).await,
        ZeroMethod::Write => {
            buf.fill(0);
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(buf.len() as u64) as usize;
                let res = transfer(true, false, off + done, &mut buf[..n]).await;
                if res < 0 {
                    return res;
                }
                done += n as u64;
            }
            0
        }
    }
}

/// Reads or writes all of `data` at `off`, resubmitting short transfers.
/// Returns the byte count or a negative errno.
async fn transfer(write: bool, fua: bool, off: u64, data: &mut [u8]) -> i32 {
    let mut done = 0usize;
    let mut retries = 0;
    while done < data.len() {
        let rest = &mut data[done..];
        let (ptr, n, pos) = (rest.as_mut_ptr(), rest.len() as u32, off + done as u64);
        let sqe = if write {
            let flags = if fua { libc::RWF_DSYNC } else { 0 };
            opcode::Write::new(BACKING_FIXED_FD, ptr, n).offset(pos).rw_flags(flags).build()
        } else {
            opcode::Read::new(BACKING_FIXED_FD, ptr, n).offset(pos).build()
        };
        let res = submit(sqe).await;
        if res == -libc::EAGAIN && retries < EAGAIN_RETRIES {
            retries += 1;
            continue;
        }
        if res < 0 {
            return res;
        }
        if res == 0 {
            if write {
                return -libc::EIO;
            }
            // The backing shrank under us: past its end reads as zeros.
            rest.fill(0);
            break;
        }
        done += res as usize;
    }
    data.len() as i32
}

/// Serves a read or write of a memory-backed file synchronously.
fn transfer_inline(file: &std::fs::File, write: bool, fua: bool, off: u64, data: &mut [u8]) -> i32 {
    use std::os::unix::fs::FileExt;
    let res = if write {
        file.write_all_at(data, off).and_then(|()| if fua { file.sync_data() } else { Ok(()) })
    } else {
        // Past the end of a shrunk file reads as zeros, as on the ring path.
        let mut done = 0;
        loop {
            match file.read_at(&mut data[done..], off + done as u64) {
                Ok(0) => {
                    data[done..].fill(0);
                    break Ok(());
                }
                Ok(n) => {
                    done += n;
                    if done == data.len() {
                        break Ok(());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        }
    };
    match res {
        Ok(()) => data.len() as i32,
        Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
    }
}
