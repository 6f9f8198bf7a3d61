//! The control socket server: an accept thread and one thread per client,
//! both bounded (see the parent module).

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;

use super::{IDLE_TIMEOUT, MAX_CLIENTS, WRITE_TIMEOUT};
use trace::stats::{error_reply, parse_request, Request, MAX_REQUEST_BYTES};
use trace::{Error, Result};

/// What the daemon answers a request with. An `Err` becomes
/// `{"error": "<its message>"}`; a panic becomes an internal-error reply.
pub type Provider = dyn Fn(&Request) -> Result<Value> + Send + Sync + 'static;

/// How often a blocked client read wakes to check for shutdown.
const TICK: Duration = Duration::from_millis(200);

/// A running stats server; stops (and removes its socket) on drop.
pub struct Server {
    path: PathBuf,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

struct Shared {
    provider: Box<Provider>,
    stop: AtomicBool,
    clients: AtomicUsize,
}

impl Server {
    /// Binds `path` (mode 0600) and serves requests with `provider`.
    ///
    /// A stale socket at `path` (nobody listening) is replaced; a live one,
    /// or any other file, is an error.
    pub fn spawn<F>(path: impl AsRef<Path>, provider: F) -> Result<Server>
    where
        F: Fn(&Request) -> Result<Value> + Send + Sync + 'static,
    {
        let path = path.as_ref().to_path_buf();
        let listener = bind_private(&path)?;
        let shared = Arc::new(Shared {
            provider: Box::new(provider),
            stop: AtomicBool::new(false),
            clients: 0.into(),
        });
        let accept = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("trace-stats".into())
                .spawn(move || accept_loop(listener, shared))
                .map_err(|e| Error::io("spawn stats accept thread", e))?
        };
        tracing::info!(path = %path.display(), "stats socket listening");
        Ok(Server { path, shared, accept: Some(accept) })
    }

    /// Stops accepting, removes the socket file and waits for the accept
    /// thread. Client threads notice within 200 ms and exit on their own.
    /// (The daemon drops its server, which does the same.)
    #[cfg(test)]
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(accept) = self.accept.take() else { return };
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept(); failure means it is already gone.
        let _ = UnixStream::connect(&self.path);
        if accept.join().is_err() {
            tracing::error!("stats accept thread panicked");
        }
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), "removing stats socket: {e}");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Binds under a temporary name, restricts it to the owner, then renames it
/// into place, so the socket is never reachable with looser permissions.
fn bind_private(path: &Path) -> Result<UnixListener> {
    remove_stale(path)?;
    let file_name = path
        .file_name()
        .ok_or_else(|| Error::Protocol(format!("stats socket path {} has no file name", path.display())))?;
    let tmp = path.with_file_name(format!(".{}.{}.tmp", file_name.to_string_lossy(), std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener =
        UnixListener::bind(&tmp).map_err(|e| Error::io(format!("bind stats socket {}", tmp.display()), e))?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(format!("place stats socket at {}", path.display()), e));
    }
    Ok(listener)
}

fn remove_stale(path: &Path) -> Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(format!("stat {}", path.display()), e)),
    };
    if !meta.file_type().is_socket() {
        return Err(Error::Protocol(format!("{} exists and is not a socket", path.display())));
    }
    if UnixStream::connect(path).is_ok() {
        return Err(Error::io(
            format!("stats socket {}", path.display()),
            std::io::Error::new(ErrorKind::AddrInUse, "another server is listening"),
        ));
    }
    std::fs::remove_file(path).map_err(|e| Error::io(format!("remove stale {}", path.display()), e))
}

fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let stream = match conn {
            Ok(stream) => stream,
            Err(e) => {
                // E.g. EMFILE: back off instead of spinning.
                tracing::warn!("stats socket accept: {e}");
                std::thread::sleep(TICK);
                continue;
            }
        };
        let Some(slot) = ClientSlot::claim(&shared) else {
            tracing::warn!("stats socket: {MAX_CLIENTS} clients already connected; refusing one");
            let _ = stream.set_write_timeout(Some(TICK));
            let _ = write_reply(&stream, &error_reply(format!("too many clients (limit {MAX_CLIENTS})")));
            continue;
        };
        let spawned = std::thread::Builder::new()
            .name("trace-stats-client".into())
            .spawn(move || serve_client(stream, slot));
        if let Err(e) = spawned {
            tracing::warn!("stats socket: cannot spawn client thread: {e}");
        }
    }
}

/// A claimed client slot; released on drop, even if the thread panics.
struct ClientSlot(Arc<Shared>);

impl ClientSlot {
    fn claim(shared: &Arc<Shared>) -> Option<ClientSlot> {
        shared
            .clients
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < MAX_CLIENTS).then_some(n + 1))
            .ok()
            .map(|_| ClientSlot(Arc::clone(shared)))
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.0.clients.fetch_sub(1, Ordering::SeqCst);
    }
}

enum Line {
    Request(Vec<u8>),
    TooLong,
    Closed,
}

fn serve_client(stream: UnixStream, slot: ClientSlot) {
    let shared = &slot.0;
    if let Err(e) =
        stream.set_read_timeout(Some(TICK)).and_then(|()| stream.set_write_timeout(Some(WRITE_TIMEOUT)))
    {
        tracing::warn!("stats client socket options: {e}");
        return;
    }
    let mut reader = match stream.try_clone() {
        Ok(s) => BufReader::new(s),
        Err(e) => {
            tracing::warn!("stats client clone: {e}");
            return;
        }
    };
    loop {
        let reply = match read_line(&mut reader, shared) {
            Line::Request(line) => answer(&line, shared),
            Line::TooLong => {
                let _ = write_reply(
                    &stream,
                    &error_reply(format!("request longer than {MAX_REQUEST_BYTES} bytes")),
                );
                return;
            }
            Line::Closed => return,
        };
        if let Err(e) = write_reply(&stream, &reply) {
            tracing::debug!("stats client write: {e}");
            return;
        }
    }
}

/// Reads one request line of at most [`MAX_REQUEST_BYTES`].
fn read_line(reader: &mut BufReader<UnixStream>, shared: &Shared) -> Line {
    let mut buf = Vec::new();
    let mut idle = Duration::ZERO;
    loop {
        let room = (MAX_REQUEST_BYTES - buf.len()) as u64;
        let before = buf.len();
        match reader.by_ref().take(room).read_until(b'\n', &mut buf) {
            // EOF: a last request without its newline is still served.
            Ok(0) if room > 0 => return if buf.is_empty() { Line::Closed } else { Line::Request(buf) },
            Ok(_) if buf.last() == Some(&b'\n') => return Line::Request(buf),
            Ok(_) if buf.len() >= MAX_REQUEST_BYTES => return Line::TooLong,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::debug!("stats client read: {e}");
                return Line::Closed;
            }
        }
        if shared.stop.load(Ordering::SeqCst) {
            return Line::Closed;
        }
        if buf.len() == before {
            idle += TICK;
            if idle >= IDLE_TIMEOUT {
                tracing::debug!("stats client idle for {IDLE_TIMEOUT:?}; closing");
                return Line::Closed;
            }
        } else {
            idle = Duration::ZERO;
        }
    }
}

fn answer(line: &[u8], shared: &Shared) -> Value {
    let request = match parse_request(line) {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!("stats socket: {e}");
            return error_reply(e);
        }
    };
    match catch_unwind(AssertUnwindSafe(|| (shared.provider)(&request))) {
        Ok(Ok(value)) => value,
        Ok(Err(e)) => error_reply(e),
        Err(_) => {
            tracing::error!(?request, "stats provider panicked");
            error_reply("internal error while building stats")
        }
    }
}

fn write_reply(mut stream: &UnixStream, reply: &Value) -> std::io::Result<()> {
    let mut bytes = serde_json::to_vec(reply).map_err(std::io::Error::other)?;
    bytes.push(b'\n');
    stream.write_all(&bytes)
}
