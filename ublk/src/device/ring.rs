//! The per-queue io_uring: how it is created and how the queue thread
//! waits on it. Shared by every target.

use io_uring::{squeue, types};
use libublk::io::{UblkDev, UblkQueue};
use libublk::UblkError;
use std::time::{Duration, Instant};

/// Creates this thread's io_uring before libublk would: single issuer
/// with deferred task work, so completions (ublk commands and backing IO
/// alike) are processed only when the thread enters the ring, without
/// task-work interrupts. Falls back to libublk's default ring on kernels
/// without DEFER_TASKRUN (< 6.1).
pub fn init_queue_ring(dev: &UblkDev) {
    let depth = u32::from(dev.dev_info.queue_depth);
    let _ = libublk::io::ublk_init_task_ring(|cell| {
        if cell.get().is_none() {
            let ring = io_uring::IoUring::<squeue::Entry, io_uring::cqueue::Entry>::builder()
                .setup_cqsize(depth * 2)
                .setup_coop_taskrun()
                .setup_taskrun_flag()
                .setup_single_issuer()
                .setup_defer_taskrun()
                .build(depth * 2);
            if let Ok(ring) = ring {
                let _ = cell.set(std::cell::RefCell::new(ring));
            }
        }
        Ok(())
    });
}

/// Runs the queue thread's event loop until `done` says every task has
/// finished: waits on the ring (see [`poll_ring`]), wakes the tasks whose
/// operations completed, and ticks the executor.
pub fn run_event_loop(
    queue: &UblkQueue<'_>,
    exe: &smol::LocalExecutor<'_>,
    spin: Duration,
    done: impl Fn() -> bool,
) {
    let qid = queue.get_qid();
    smol::block_on(exe.run(async {
        let run_ops = || while exe.try_tick() {};
        let poll = || async { poll_ring(queue, spin) };
        let reap = |timed_out| {
            libublk::uring_async::ublk_reap_io_events_with_update_queue(queue, timed_out, None, |cqe| {
                libublk::uring_async::ublk_wake_task(cqe.user_data(), cqe)
            })
        };
        if let Err(e) = libublk::run_uring_tasks(poll, reap, run_ops, done).await {
            tracing::error!(qid, "queue event loop failed: {e}");
        }
    }));
}

/// Waits for completions on this thread's ring. With a spin budget, it
/// first submits without sleeping and busy-polls the completion ring (and
/// the kernel's pending-task-work flag) for up to `spin`, so a busy queue
/// never pays a sleep and wake-up per request; then it blocks (20 s cap,
/// which lets libublk notice an idle queue).
pub fn poll_ring(q: &UblkQueue<'_>, spin: Duration) -> Result<bool, UblkError> {
    if !spin.is_zero() && !q.is_stopping() {
        let ready = libublk::io::with_task_io_ring_mut(|r| -> std::io::Result<bool> {
            if !r.submission().is_empty() {
                r.submit()?;
            }
            let start = Instant::now();
            let mut n = 0u32;
            loop {
                if !r.completion().is_empty() {
                    return Ok(true);
                }
                if r.submission().taskrun() {
                    return Ok(false);
                }
                n += 1;
                if n.is_multiple_of(32) && start.elapsed() >= spin {
                    return Ok(false);
                }
                std::hint::spin_loop();
            }
        })
        .map_err(UblkError::IOError)?;
        if ready {
            return Ok(false);
        }
    }
    let timeout = types::Timespec::new().sec(20);
    libublk::uring_poll_io_fn::<squeue::Entry>(q, Some(timeout), 1)
}
