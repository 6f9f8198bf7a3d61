//! The control socket client used by `casblk` (stats and commands).

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use trace::stats::Request;
use trace::{Error, Result, Snapshot};

/// Longest reply the client accepts.
pub const MAX_REPLY_BYTES: usize = 64 << 20;

/// Sends `request` and returns the reply, all within `timeout`. An
/// `{"error": ...}` reply is [`Error::Remote`].
pub fn query(path: impl AsRef<Path>, request: &Request, timeout: Duration) -> Result<Value> {
    let path = path.as_ref();
    let mut line = serde_json::to_vec(request)?;
    line.push(b'\n');
    let reply = exchange(path, &line, timeout)?;
    let value: Value = serde_json::from_slice(&reply)?;
    if let Some(message) = value.as_object().and_then(|o| o.get("error")) {
        let message = message.as_str().map_or_else(|| message.to_string(), str::to_owned);
        return Err(Error::Remote(message));
    }
    Ok(value)
}

/// `{"cmd":"stats"}` for one image (or all), parsed and version-checked.
pub fn query_snapshot(path: impl AsRef<Path>, image: Option<&str>, timeout: Duration) -> Result<Snapshot> {
    Snapshot::from_value(query(path, &Request::stats(image), timeout)?)
}

/// Writes one line and reads one reply line, with one overall deadline.
fn exchange(path: &Path, line: &[u8], timeout: Duration) -> Result<Vec<u8>> {
    let timed_out = || Error::Timeout { timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX) };
    let deadline = Instant::now() + timeout;
    let remaining = || deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero());

    let mut stream = UnixStream::connect(path)
        .map_err(|e| Error::io(format!("connect to stats socket {}", path.display()), e))?;
    stream
        .set_write_timeout(Some(remaining().ok_or_else(timed_out)?))
        .map_err(|e| Error::io("set stats socket timeout", e))?;
    // A server that refuses the connection (too many clients) replies and
    // closes without reading: the write then fails, but its reply is there.
    let send_error = match stream.write_all(line) {
        Ok(()) => None,
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Err(timed_out()),
        Err(e) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => Some(e),
        Err(e) => return Err(Error::io("send stats request", e)),
    };

    let mut reply = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let left = remaining().ok_or_else(timed_out)?;
        stream.set_read_timeout(Some(left)).map_err(|e| Error::io("set stats socket timeout", e))?;
        let n = match stream.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(timed_out())
            }
            Err(e) => return Err(Error::io("read stats reply", send_error.unwrap_or(e))),
        };
        if n == 0 {
            return Err(match send_error {
                Some(e) => Error::io("send stats request", e),
                None => Error::Protocol("stats server closed the connection without a reply".into()),
            });
        }
        reply.extend_from_slice(&chunk[..n]);
        if let Some(end) = reply.iter().position(|&b| b == b'\n') {
            reply.truncate(end);
            return Ok(reply);
        }
        if reply.len() > MAX_REPLY_BYTES {
            return Err(Error::Protocol(format!("stats reply longer than {MAX_REPLY_BYTES} bytes")));
        }
    }
}
