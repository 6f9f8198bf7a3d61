//! Starting a device daemon so that `casblk add` returns only once the
//! device is usable, or with the daemon's own error.
//!
//! The parent forks a daemon (double fork, new session) and keeps the read
//! end of a pipe. The daemon writes `pid N`, then exactly one of
//! `ready PATH` or `error MESSAGE`, and closes the pipe. The parent waits a
//! bounded time; on timeout it stops the daemon so no device is leaked.

use anyhow::{anyhow, bail, Context, Result};
use std::io::{BufRead, BufReader, PipeWriter, Write};
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// Where a launched daemon's stderr (its log) goes.
pub const DAEMON_LOG: &str = "/run/casblk/casblk.log";

/// How long `add` waits for the daemon to bring the device up. Software
/// emulated VMs are slow, so this is generous, but it is a bound.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Where the daemon reports readiness: a pipe to the waiting parent, or
/// stdout when running in the foreground. Clones share one report: the
/// first `ok` or `fail` wins, later ones are ignored.
#[derive(Clone)]
pub struct Ready(Arc<Mutex<ReadyState>>);

struct ReadyState {
    pipe: Option<PipeWriter>,
    reported: bool,
}

impl Ready {
    fn new(pipe: Option<PipeWriter>) -> Self {
        Ready(Arc::new(Mutex::new(ReadyState { pipe, reported: false })))
    }

    /// The device is usable at `path`.
    pub fn ok(&self, path: &str) {
        self.send(&format!("ready {path}"));
    }

    /// Start-up failed; the parent prints `err` and exits non-zero.
    pub fn fail(&self, err: &anyhow::Error) {
        self.send(&format!("error {err:#}"));
    }

    fn send(&self, line: &str) {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if state.reported {
            return;
        }
        state.reported = true;
        match state.pipe.take() {
            Some(mut pipe) => {
                let _ = writeln!(pipe, "{}", line.replace('\n', " "));
            }
            None => {
                if let Some(path) = line.strip_prefix("ready ") {
                    println!("{path}");
                }
            }
        }
    }
}

/// Runs `work` in the foreground or in a daemon. `work` must call
/// `Ready::ok` once the device is live; its error is reported either way.
pub fn launch<F>(foreground: bool, log_path: &Path, work: F) -> Result<()>
where
    F: FnOnce(Ready) -> Result<()>,
{
    if foreground {
        crate::set_sigpipe(false);
        crate::logging::daemon_mode();
        serve::process_memory::daemon_mode();
        return work(Ready::new(None));
    }

    if let Some(dir) = log_path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log_path)
        .with_context(|| format!("opening daemon log {}", log_path.display()))?;
    let (reader, mut writer) = std::io::pipe().context("creating the readiness pipe")?;

    let outcome = daemonize::Daemonize::new()
        .working_directory("/")
        .stdout(daemonize::Stdio::devnull())
        .stderr(log)
        .execute();
    match outcome {
        daemonize::Outcome::Parent(Ok(_)) => {
            drop(writer);
            wait_ready(reader)
        }
        daemonize::Outcome::Parent(Err(e)) => bail!("cannot start the device daemon: {e}"),
        daemonize::Outcome::Child(Err(e)) => {
            let _ = writeln!(writer, "error cannot start the device daemon: {e}");
            std::process::exit(1);
        }
        daemonize::Outcome::Child(Ok(_)) => {
            crate::set_sigpipe(false);
            crate::logging::daemon_mode();
            serve::process_memory::daemon_mode();
            drop(reader);
            let _ = writeln!(writer, "pid {}", std::process::id());
            let ready = Ready::new(Some(writer));
            let result = work(ready.clone());
            if let Err(e) = &result {
                tracing::error!("device daemon failed: {e:#}");
                ready.fail(e);
            }
            std::process::exit(if result.is_ok() { 0 } else { 1 });
        }
    }
}

fn wait_ready(reader: std::io::PipeReader) -> Result<()> {
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
            match line {
                Ok(l) => {
                    if tx.send(l).is_err() {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    });
    let deadline = std::time::Instant::now() + READY_TIMEOUT;
    let mut daemon_pid: Option<i32> = None;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(pid) = line.strip_prefix("pid ") {
                    daemon_pid = pid.trim().parse().ok();
                } else if let Some(path) = line.strip_prefix("ready ") {
                    println!("{path}");
                    return Ok(());
                } else if let Some(msg) = line.strip_prefix("error ") {
                    return Err(anyhow!("{msg}"));
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                bail!("the device daemon exited before the device was ready (see /run/casblk/casblk.log)")
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(pid) = daemon_pid {
                    // SIGTERM makes the daemon stop and delete its device.
                    // SAFETY: kill(2) takes plain integers and touches no memory.
                    unsafe { libc::kill(pid, libc::SIGTERM) };
                }
                bail!("the device was not ready within {} s; the daemon was stopped", READY_TIMEOUT.as_secs())
            }
        }
    }
}
