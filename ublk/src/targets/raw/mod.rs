//! Raw passthrough mode: `/dev/ublkbN` maps 1:1 onto a backing file.
//!
//! Each queue has one thread, one io_uring (libublk's) and one async task
//! per tag. A task fetches a request, issues the storage IO for it on the
//! same ring (fixed file 1 is the backing), and commits the result with
//! COMMIT_AND_FETCH. This mode is the passthrough baseline for benchmarks
//! and stays in the product.

mod backing;

use crate::cli::AddArgs;
use crate::device::launch::{self, Ready, DAEMON_LOG};
use crate::device::params::SECTOR_SHIFT;
use crate::device::policy::Policy;
use crate::device::{driver, ring, state, Device, Setup, Shape, Start};
use anyhow::{Context, Result};
use backing::{Backing, ZeroMethod};
use io_uring::{opcode, squeue, types};
use libublk::helpers::IoBuf;
use libublk::io::{UblkDev, UblkQueue};
use libublk::uring_async::ublk_submit_sqe_async;
use libublk::{BufDesc, UblkError, UblkUringData};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// Index of the backing file in the queue ring's fixed-file table
/// (index 0 is the ublk char device, registered by libublk).
const BACKING_FIXED_FD: types::Fixed = types::Fixed(1);
/// Largest write served inline for a memory-backed backing.
const INLINE_WRITE_BYTES_MAX: usize = 64 << 10;
/// EAGAIN retries before a request fails.
const EAGAIN_RETRIES: u32 = 4;

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

pub fn add(args: AddArgs, backing: &Path) -> Result<()> {
    let shape = args.shape();
    shape.validate()?;
    let backing = Backing::open(backing)?;
    driver::require_driver()?;
    driver::require_free_id(args.id)?;
    // A driver that cannot honour the options refuses here, before a
    // daemon starts.
    let policy = args.policy();
    policy.add_flags(driver::driver_features().ok(), false)?;
    launch::launch(args.foreground, Path::new(DAEMON_LOG), move |ready| {
        serve(args.id, shape, backing, ready, (Start::Add, policy))
    })
}

/// Serves raw device `state.id` again after its daemon died.
pub fn recover(state: &state::DeviceState, backing: &Path, foreground: bool) -> Result<()> {
    let (id, shape) = (state.id as i32, state.shape);
    let backing = Backing::open(backing)?;
    launch::launch(foreground, Path::new(DAEMON_LOG), move |ready| {
        serve(id, shape, backing, ready, (Start::Recover, Default::default()))
    })
}

fn serve(id: i32, shape: Shape, backing: Backing, ready: Ready, how: (Start, Policy)) -> Result<()> {
    let backing_path = backing.path.canonicalize().unwrap_or_else(|_| backing.path.clone());
    let (start, policy) = how;
    let target = state::Target::Raw { backing: backing_path };
    let device = Device::create("casblk-raw", id, shape, start, target, (policy, false))?;
    crate::device::stop_on_signals(device.id())?;

    let inline = match backing.in_memory {
        true => Some(backing.file.try_clone().context("duplicating the backing file handle")?),
        false => None,
    };
    let target =
        Arc::new(RawTarget { inline, punch: backing.punch, zeroes: backing.zeroes, spin: shape.spin() });
    let setup = Setup {
        size_bytes: backing.size,
        discard: backing.punch,
        read_only: false,
        target_json: serde_json::json!({
            "raw": {
                "backing": backing.path.display().to_string(),
                "direct_io": backing.direct,
                "discard": backing.punch,
                "write_zeroes": format!("{:?}", backing.zeroes),
                "inline_io": backing.in_memory,
            }
        }),
        fixed_file: Some(backing.file.as_raw_fd()),
    };
    let queue_fn = move |qid: u16, dev: &UblkDev| queue_thread(qid, dev, &target);
    let ready = move |r: Result<String>| match r {
        Ok(path) => ready.ok(&path),
        Err(e) => ready.fail(&e),
    };
    let served = device.serve(setup, queue_fn, ready, || {});
    // Keep the backing file open until every queue thread has exited.
    drop(backing);
    served
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
