//! The metrics endpoint: a minimal HTTP/1.x server on one thread
//! (`casblk-metrics`) that answers `GET /metrics` with the exposition.
//!
//! Bounded in every way a scraper or a stray client could push it: one
//! connection at a time (others wait in the kernel's backlog), at most
//! [`MAX_REQUEST_BYTES`] of request head read within [`HEAD_DEADLINE`],
//! the response written within [`RESPONSE_DEADLINE`] however slowly the
//! client reads, and the body rendered at most once per
//! [`MIN_RENDER_INTERVAL`] and refused past [`MAX_BODY_BYTES`]. No
//! keep-alive: every response closes its connection. A stuck client holds
//! the endpoint for at most the two deadlines.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest request head (request line and headers) read.
pub const MAX_REQUEST_BYTES: usize = 8 << 10;
/// A client must send its whole request head within this.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(2);
/// A response must be written within this, however the client reads it.
pub const RESPONSE_DEADLINE: Duration = Duration::from_secs(10);
/// After a response, unread request bytes are read and dropped for at
/// most this long (and [`MAX_DRAIN_BYTES`]), so closing does not reset the
/// connection before the client has read the answer.
const DRAIN_TIME: Duration = Duration::from_millis(500);
const MAX_DRAIN_BYTES: usize = 64 << 10;
/// The serving thread looks at its stop flag at least this often, so
/// stopping never depends on the wake-up connect getting through.
const STOP_TICK: Duration = Duration::from_millis(500);
/// Scrapes closer together than this get the same body.
pub const MIN_RENDER_INTERVAL: Duration = Duration::from_secs(1);
/// A body larger than this is not sent (500, and an error in the log).
pub const MAX_BODY_BYTES: usize = 32 << 20;
/// Pause after a failed accept (for example EMFILE) instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(200);

/// The exposition's content type (Prometheus text format 0.0.4).
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Renders the exposition; an `Err` is answered with 500.
pub type Render = dyn Fn() -> Result<String, String> + Send + Sync + 'static;

/// A running metrics endpoint; stops and joins its thread on drop.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds `addr` and serves `render`'s text at `/metrics`.
    pub fn spawn<F>(addr: SocketAddr, render: F) -> std::io::Result<Server>
    where
        F: Fn() -> Result<String, String> + Send + Sync + 'static,
    {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            let render: Box<Render> = Box::new(render);
            std::thread::Builder::new()
                .name("casblk-metrics".into())
                .spawn(move || serve(listener, &stop, &*render))?
        };
        tracing::info!(%addr, "metrics endpoint listening");
        Ok(Server { addr, stop, thread: Some(thread) })
    }

    /// The bound address (the port is chosen when asked for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let Some(thread) = self.thread.take() else { return };
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept(); a failure means it is already gone.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if thread.join().is_err() {
            tracing::error!("metrics thread panicked");
        }
    }
}

/// The body rendered last, and when.
struct Cached {
    at: Instant,
    body: Result<Arc<String>, String>,
}

/// Whether a connection waits to be accepted, looking at most
/// [`STOP_TICK`].
fn readable(listener: &TcpListener) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let tick = Timespec { tv_sec: 0, tv_nsec: STOP_TICK.as_nanos() as _ };
    let mut fds = [PollFd::new(listener, PollFlags::IN)];
    matches!(poll(&mut fds, Some(&tick)), Ok(n) if n > 0)
}

fn serve(listener: TcpListener, stop: &AtomicBool, render: &Render) {
    let mut cached: Option<Cached> = None;
    loop {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        if !readable(&listener) {
            continue;
        }
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let mut stream = match listener.accept().map(|(s, _)| s) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("metrics endpoint accept: {e}");
                std::thread::sleep(ACCEPT_BACKOFF);
                continue;
            }
        };
        if let Err(e) = answer(&mut stream, &mut cached, render) {
            tracing::debug!("metrics client: {e}");
        }
    }
}

/// What a request head asked for.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// `GET` (body wanted) or `HEAD` of `/metrics`.
    Metrics { head_only: bool },
    /// Any other path.
    NotFound,
    /// Another method.
    MethodNotAllowed,
}

/// Why a request head is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum HeadError {
    /// Not an HTTP/1.x request line.
    BadRequest,
    /// Longer than [`MAX_REQUEST_BYTES`].
    TooLarge,
}

/// Parses a request head (everything before the blank line).
pub fn parse_head(head: &[u8]) -> Result<Request, HeadError> {
    if head.len() > MAX_REQUEST_BYTES {
        return Err(HeadError::TooLarge);
    }
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let line = std::str::from_utf8(&head[..line_end]).map_err(|_| HeadError::BadRequest)?;
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(HeadError::BadRequest);
    };
    if !version.starts_with("HTTP/1.") || target.is_empty() {
        return Err(HeadError::BadRequest);
    }
    let path = target.split('?').next().unwrap_or(target);
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ if method.bytes().all(|b| b.is_ascii_uppercase()) && !method.is_empty() => {
            return Ok(Request::MethodNotAllowed)
        }
        _ => return Err(HeadError::BadRequest),
    };
    Ok(if path == "/metrics" { Request::Metrics { head_only } } else { Request::NotFound })
}

/// Reads the request head within [`HEAD_DEADLINE`] and answers it.
fn answer(stream: &mut TcpStream, cached: &mut Option<Cached>, render: &Render) -> std::io::Result<()> {
    let head = match read_head(stream) {
        Ok(head) => head,
        Err(ReadError::TooLarge) => return respond(stream, 431, "request header fields too large\n", false),
        Err(ReadError::Timeout) => return respond(stream, 408, "request timeout\n", false),
        Err(ReadError::Io(e)) => return Err(e),
    };
    match parse_head(&head) {
        Err(HeadError::BadRequest) => respond(stream, 400, "bad request\n", false),
        Err(HeadError::TooLarge) => respond(stream, 431, "request header fields too large\n", false),
        Ok(Request::NotFound) => respond(stream, 404, "not found: the metrics are at /metrics\n", false),
        Ok(Request::MethodNotAllowed) => respond(stream, 405, "use GET or HEAD\n", false),
        Ok(Request::Metrics { head_only }) => match body(cached, render) {
            Ok(body) => respond(stream, 200, &body, head_only),
            Err(e) => {
                tracing::error!("metrics: {e}");
                respond(stream, 500, &format!("{e}\n"), head_only)
            }
        },
    }
}

/// The cached body, rendered again when older than the interval.
fn body(cached: &mut Option<Cached>, render: &Render) -> Result<Arc<String>, String> {
    if let Some(c) = cached.as_ref().filter(|c| c.at.elapsed() < MIN_RENDER_INTERVAL) {
        return c.body.clone();
    }
    let rendered = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(render)) {
        Ok(Ok(text)) if text.len() > MAX_BODY_BYTES => {
            Err(format!("the exposition is {} bytes, over the {MAX_BODY_BYTES}-byte limit", text.len()))
        }
        Ok(Ok(text)) => Ok(Arc::new(text)),
        Ok(Err(e)) => Err(format!("rendering the metrics failed: {e}")),
        Err(_) => Err("rendering the metrics panicked".to_owned()),
    };
    *cached = Some(Cached { at: Instant::now(), body: rendered.clone() });
    rendered
}

enum ReadError {
    TooLarge,
    Timeout,
    Io(std::io::Error),
}

/// Reads up to the blank line that ends a request head.
fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, ReadError> {
    let deadline = Instant::now() + HEAD_DEADLINE;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        if let Some(end) = find_head_end(&head) {
            head.truncate(end);
            return Ok(head);
        }
        if head.len() > MAX_REQUEST_BYTES {
            return Err(ReadError::TooLarge);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ReadError::Timeout);
        }
        stream.set_read_timeout(Some(left)).map_err(ReadError::Io)?;
        match stream.read(&mut buf) {
            Ok(0) => return Err(ReadError::Io(ErrorKind::UnexpectedEof.into())),
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(ReadError::Timeout)
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadError::Io(e)),
        }
    }
}

fn find_head_end(head: &[u8]) -> Option<usize> {
    head.windows(4).position(|w| w == b"\r\n\r\n").or_else(|| head.windows(2).position(|w| w == b"\n\n"))
}

fn respond(stream: &mut TcpStream, status: u16, body: &str, head_only: bool) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        _ => "Internal Server Error",
    };
    let content_type = if status == 200 { CONTENT_TYPE } else { "text/plain; charset=utf-8" };
    let allow = if status == 405 { "Allow: GET, HEAD\r\n" } else { "" };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        body.len()
    );
    let deadline = Instant::now() + RESPONSE_DEADLINE;
    write_before(stream, head.as_bytes(), deadline)?;
    if !head_only {
        write_before(stream, body.as_bytes(), deadline)?;
    }
    let _ = stream.shutdown(std::net::Shutdown::Write);
    drain(stream);
    Ok(())
}

/// Writes all of `buf` unless `deadline` passes first (a client reading a
/// few bytes at a time gets no longer than anyone else).
fn write_before(stream: &mut TcpStream, mut buf: &[u8], deadline: Instant) -> std::io::Result<()> {
    while !buf.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(ErrorKind::TimedOut, "the response deadline passed"));
        }
        stream.set_write_timeout(Some(left))?;
        match stream.write(buf) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads and drops what the client still sends, briefly: closing a socket
/// with unread bytes resets the connection, which can discard the answer
/// before the client reads it.
fn drain(stream: &mut TcpStream) {
    let deadline = Instant::now() + DRAIN_TIME;
    let mut buf = [0u8; 4096];
    let mut total = 0;
    while total < MAX_DRAIN_BYTES {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => total += n,
        }
    }
}
