//! The control socket: replies, malformed and oversized requests, limits,
//! permissions, and that serving does not disturb recording.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{self as stats, Server, MAX_CLIENTS};
use serde_json::Value;
use trace::stats::{Request, MAX_REQUEST_BYTES};
use trace::{Error, Op, RequestTrace, Snapshot, Tracer};

const TIMEOUT: Duration = Duration::from_secs(5);

/// A server over one tracer, answering like the daemon will.
fn serve(dir: &Path, tracer: Arc<Tracer>) -> (Server, PathBuf) {
    let path = dir.join("stats.sock");
    let server = Server::spawn(&path, move |req: &Request| match req {
        Request::Stats { image } => {
            Ok(Snapshot::new(vec![tracer.snapshot()]).select(image.as_deref())?.to_value())
        }
        _ => Err(Error::Protocol("unsupported command".into())),
    })
    .expect("server starts");
    (server, path)
}

fn connect(path: &Path) -> (BufReader<UnixStream>, UnixStream) {
    let stream = UnixStream::connect(path).unwrap();
    stream.set_read_timeout(Some(TIMEOUT)).unwrap();
    (BufReader::new(stream.try_clone().unwrap()), stream)
}

fn send(reader: &mut BufReader<UnixStream>, mut writer: &UnixStream, line: &[u8]) -> Value {
    writer.write_all(line).unwrap();
    let mut reply = String::new();
    reader.read_line(&mut reply).unwrap();
    serde_json::from_str(&reply).unwrap_or_else(|e| panic!("reply {reply:?} is not JSON: {e}"))
}

fn record_reads(tracer: &Tracer, n: u64) {
    for i in 0..n {
        let mut t = RequestTrace::new(Op::Read, i);
        t.set_location(0, 0, 0, 4096);
        tracer.finish(&t, i + 1_000, 0);
    }
}

#[test]
fn stats_query_returns_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let tracer = Arc::new(Tracer::new("vm1"));
    record_reads(&tracer, 10);
    let (_server, path) = serve(dir.path(), Arc::clone(&tracer));
    let snap = stats::query_snapshot(&path, None, TIMEOUT).unwrap();
    assert_eq!(snap.images.len(), 1);
    assert_eq!(snap.images[0].name, "vm1");
    assert_eq!(snap.images[0].ops.read.count, 10);
    let one = stats::query_snapshot(&path, Some("vm1"), TIMEOUT).unwrap();
    assert_eq!(one.images[0].ops.read.count, 10);
    match stats::query_snapshot(&path, Some("nope"), TIMEOUT) {
        Err(Error::Remote(message)) => assert!(message.contains("nope"), "{message}"),
        other => panic!("expected a remote error, got {other:?}"),
    }
}

#[test]
fn malformed_requests_get_an_error_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let tracer = Arc::new(Tracer::new("vm1"));
    let (_server, path) = serve(dir.path(), Arc::clone(&tracer));

    // Recording keeps going, untouched, while the socket is abused.
    let stop = Arc::new(AtomicBool::new(false));
    let recorder = {
        let (tracer, stop) = (Arc::clone(&tracer), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                record_reads(&tracer, 100);
                n += 100;
            }
            n
        })
    };

    let (mut reader, writer) = connect(&path);
    for bad in [
        &b"this is not json\n"[..],
        b"{\"cmd\":\"explode\"}\n",
        b"{\"image\":\"vm1\"}\n",
        b"[1,2,3]\n",
        b"\n",
        b"{\"cmd\":\"stats\",\"image\":7}\n",
        b"\xff\xfe\n",
    ] {
        let reply = send(&mut reader, &writer, bad);
        let message = reply["error"].as_str().unwrap_or_else(|| panic!("no error for {bad:?}: {reply}"));
        assert!(message.contains("malformed"), "{message}");
    }
    // The same connection still serves a valid request...
    let reply = send(&mut reader, &writer, b"{\"cmd\":\"stats\",\"image\":null}\n");
    assert_eq!(reply["schema_version"], trace::SCHEMA_VERSION);
    // ... and so does a new one.
    let snap = stats::query_snapshot(&path, None, TIMEOUT).unwrap();
    assert_eq!(snap.images[0].name, "vm1");

    stop.store(true, Ordering::Relaxed);
    let recorded = recorder.join().expect("recording never panicked");
    assert_eq!(tracer.snapshot().ops.read.count, recorded, "every recorded request is counted");
}

#[test]
fn oversized_request_is_refused_and_the_connection_closed() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, path) = serve(dir.path(), Arc::new(Tracer::new("vm1")));
    let (mut reader, mut writer) = connect(&path);
    let big = vec![b'x'; MAX_REQUEST_BYTES * 4];
    // The server may close before reading all of it.
    let _ = writer.write_all(&big);
    let mut reply = String::new();
    reader.read_line(&mut reply).unwrap();
    let reply: Value = serde_json::from_str(&reply).unwrap();
    assert!(reply["error"].as_str().unwrap().contains("longer than"), "{reply}");
    // Closed: EOF, or a reset because our unread bytes were discarded;
    // not a read timeout.
    let mut rest = Vec::new();
    match reader.read_to_end(&mut rest) {
        Ok(_) => assert!(rest.is_empty(), "nothing after the error reply"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    // The server is still fine.
    assert!(stats::query_snapshot(&path, None, TIMEOUT).is_ok());
    // A request exactly at the limit is served.
    let (mut reader, writer) = connect(&path);
    let mut line = br#"{"cmd":"stats","image":null}"#.to_vec();
    line.resize(MAX_REQUEST_BYTES - 1, b' ');
    line.push(b'\n');
    assert_eq!(send(&mut reader, &writer, &line)["schema_version"], trace::SCHEMA_VERSION);
}

#[test]
fn socket_is_owner_only() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, path) = serve(dir.path(), Arc::new(Tracer::new("vm1")));
    let meta = std::fs::metadata(&path).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // No temporary name is left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["stats.sock"]);
}

#[test]
fn client_count_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, path) = serve(dir.path(), Arc::new(Tracer::new("vm1")));
    // Fill every slot with a served (so surely counted) connection.
    let held: Vec<_> = (0..MAX_CLIENTS)
        .map(|_| {
            let (mut reader, writer) = connect(&path);
            assert!(send(&mut reader, &writer, b"{\"cmd\":\"stats\"}\n")["images"].is_array());
            (reader, writer)
        })
        .collect();
    match stats::query_snapshot(&path, None, TIMEOUT) {
        Err(Error::Remote(message)) => assert!(message.contains("too many clients"), "{message}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    drop(held);
    // Slots free up once those clients go.
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        match stats::query_snapshot(&path, None, TIMEOUT) {
            Ok(_) => break,
            Err(e) => assert!(std::time::Instant::now() < deadline, "slots never freed: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn provider_error_and_panic_become_error_replies() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let _server = Server::spawn(&path, move |_req: &Request| match counter.fetch_add(1, Ordering::SeqCst) {
        0 => Err(Error::NoSuchImage("x".into())),
        1 => panic!("provider bug"),
        _ => Ok(serde_json::json!({"ok": true})),
    })
    .unwrap();
    let req = Request::stats(None);
    assert!(matches!(stats::query(&path, &req, TIMEOUT), Err(Error::Remote(m)) if m.contains("no image")));
    assert!(matches!(stats::query(&path, &req, TIMEOUT), Err(Error::Remote(m)) if m.contains("internal")));
    assert_eq!(stats::query(&path, &req, TIMEOUT).unwrap()["ok"], true);
}

#[test]
fn stale_socket_is_replaced_and_a_live_one_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stats.sock");
    drop(UnixListener::bind(&path).unwrap()); // stale: file left, nobody listening
    let server = Server::spawn(&path, |_: &Request| Ok(Value::Null)).expect("stale socket replaced");
    assert!(Server::spawn(&path, |_: &Request| Ok(Value::Null)).is_err(), "a live socket is not stolen");
    server.shutdown();
    assert!(!path.exists(), "shutdown removes the socket");
    // A regular file is never deleted.
    std::fs::write(&path, b"data").unwrap();
    assert!(Server::spawn(&path, |_: &Request| Ok(Value::Null)).is_err());
    assert_eq!(std::fs::read(&path).unwrap(), b"data");
}

#[test]
fn query_times_out_on_a_silent_server() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("silent.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let holder = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_millis(500));
        drop(stream);
    });
    let started = std::time::Instant::now();
    let result = stats::query(&path, &Request::stats(None), Duration::from_millis(100));
    assert!(matches!(result, Err(Error::Timeout { timeout_ms: 100 })), "{result:?}");
    assert!(started.elapsed() < Duration::from_millis(450));
    holder.join().unwrap();
}
