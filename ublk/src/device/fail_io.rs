//! Serving a device taken over in the FAIL_IO state (added with
//! `--on-daemon-loss fail`, its daemon gone), which libublk 0.4.8's
//! `run_target` cannot start: its start path knows only QUIESCED as a
//! recovery, so for FAIL_IO it sends SET_PARAMS and START_DEV, which the
//! driver refuses for a disk that exists, and returns with its queue
//! threads left running. Here the same steps run from libublk's public
//! pieces, ending with END_USER_RECOVERY:
//!
//! ```text
//!  UblkDev::new (opens /dev/ublkcN)  one thread per queue: queue_fn (FETCH every tag)
//!  affinity + queue tids             wait for every queue's buffers
//!  END_USER_RECOVERY(pid)            the device is live: IO is served again
//!  on_started ... queues end         STOP_DEV
//! ```

use super::ctrl_cmd;
use anyhow::{anyhow, Context, Result};
use libublk::ctrl::UblkCtrl;
use libublk::io::UblkDev;
use std::sync::{mpsc, Arc};

/// Serves `ctrl`'s device, taken over from FAIL_IO, until it is stopped:
/// as `UblkCtrl::run_target` does for a quiesced one.
pub(super) fn serve_recovered<T, Q, W>(
    ctrl: &UblkCtrl,
    json: std::path::PathBuf,
    tgt_init: T,
    queue_fn: Q,
    on_started: W,
) -> Result<()>
where
    T: FnOnce(&mut UblkDev) -> Result<(), libublk::UblkError>,
    Q: FnOnce(u16, &UblkDev) + Send + Sync + Clone + 'static,
    W: FnOnce(&UblkCtrl),
{
    let id = ctrl.dev_info().dev_id;
    let dev = Arc::new(
        UblkDev::new(ctrl.get_name(), tgt_init, ctrl)
            .map_err(|e| anyhow!("opening ublk device {id}: {e}"))?,
    );
    let queues = dev.dev_info.nr_hw_queues;
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::with_capacity(usize::from(queues));
    for qid in 0..queues {
        let (dev, tx, queue_fn) = (dev.clone(), tx.clone(), queue_fn.clone());
        let spawned = std::thread::Builder::new().name(format!("ublk-q{qid}")).spawn(move || {
            let tid = UblkCtrl::init_queue_thread();
            // One thread serves all of the queue's tags.
            libublk::io::set_io_thread_idx(0);
            if tx.send((qid, tid)).is_ok() {
                queue_fn(qid, &dev);
            }
        });
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => return Err(stop_and_join(ctrl, threads, anyhow!("spawning queue thread {qid}: {e}"))),
        }
    }
    drop(tx);
    let started = (|| -> Result<()> {
        let mut tids = Vec::with_capacity(usize::from(queues));
        for _ in 0..queues {
            let (qid, tid) = rx.recv().context("a queue thread ended before it started")?;
            ctrl.set_thread_affinity(qid, tid);
            ctrl.configure_queue(&dev, qid, tid).map_err(|e| anyhow!("configuring queue {qid}: {e}"))?;
            tids.push((qid, tid));
        }
        refresh_json(&json, &tids);
        dev.wait_for_buffer_registration(usize::from(queues))
            .map_err(|e| anyhow!("the queues' buffers of ublk device {id}: {e}"))?;
        ctrl_cmd::end_user_recovery(id, std::process::id() as i32)
    })();
    if let Err(e) = started {
        return Err(stop_and_join(ctrl, threads, e));
    }
    tracing::info!(dev = id, "recovered from fail_io: IO is served again");
    on_started(ctrl);
    join(threads);
    let _ = ctrl.stop_dev();
    Ok(())
}

/// Points libublk's JSON file of the device (the dead daemon's, which
/// libublk's own recovery would rewrite) at this daemon: its pid and the
/// queues' thread ids. Best effort: `list` reads only its target data.
fn refresh_json(path: &std::path::Path, tids: &[(u16, i32)]) {
    let Ok(text) = std::fs::read_to_string(path) else { return };
    let Ok(mut json) = serde_json::from_str::<serde_json::Value>(&text) else { return };
    json["dev_info"]["ublksrv_pid"] = std::process::id().into();
    for &(qid, tid) in tids {
        if let Some(q) = json["queues"].get_mut(qid.to_string()) {
            q["tid"] = tid.into();
        }
    }
    if let Err(e) = std::fs::write(path, json.to_string()) {
        tracing::debug!(path = %path.display(), "refreshing the device JSON: {e}");
    }
}

/// Stops the device, so queue threads waiting in FETCH end, and joins them.
fn stop_and_join(
    ctrl: &UblkCtrl,
    threads: Vec<std::thread::JoinHandle<()>>,
    e: anyhow::Error,
) -> anyhow::Error {
    let _ = ctrl.kill_dev();
    join(threads);
    e
}

fn join(threads: Vec<std::thread::JoinHandle<()>>) {
    for t in threads {
        if t.join().is_err() {
            tracing::error!("a queue thread panicked");
        }
    }
}
