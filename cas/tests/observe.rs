//! The engine's I/O by source, as the request path records it into a trace:
//! each source a request really used, and nothing for work that is not I/O.

mod common;

use cas::io::{timed, IoCx};
use cas::observe::IoTimes;
use common::*;
use std::cell::Cell;
use trace::IoSource;

fn sources(times: &cas::observe::IoTimes) -> Vec<IoSource> {
    times.sources().collect()
}

#[test]
fn each_request_reports_the_sources_it_used() {
    let (mem, store) = mem_store(small_opts());
    store.create_image("a", 1 << 20).unwrap();
    let image = store.open_image("a").unwrap();

    // A write appends one log record; with FUA it also syncs the log.
    let (r, io) = timed(|cx| image.write_in(cx, 0, &payload(1, 0, 16), false));
    r.unwrap();
    assert_eq!(sources(&io), [IoSource::Log]);
    let (r, io) = timed(|cx| image.write_in(cx, 8192, &payload(2, 16, 8), true));
    r.unwrap();
    assert_eq!(sources(&io), [IoSource::Log]);
    assert_eq!(io.ios(IoSource::Log), 2, "the record write and the sync");
    let (r, io) = timed(|cx| image.flush_in(cx));
    r.unwrap();
    assert_eq!(sources(&io), [IoSource::Log]);

    // Uncompacted data comes from the log.
    let mut buf = vec![0u8; 4096];
    let (r, io) = timed(|cx| image.read_in(cx, 0, &mut buf));
    r.unwrap();
    assert_eq!(sources(&io), [IoSource::Log]);

    // Compacted, after a reopen (empty chunk cache): the manifest, then the
    // chunk store, twice (a chunk enters the cache on its second miss);
    // the same read again hits the cache.
    store.compact_once(&image).unwrap();
    drop((image, store));
    let store = reopen(&mem, small_opts()).unwrap();
    let image = store.open_image("a").unwrap();
    for _ in 0..2 {
        let (r, io) = timed(|cx| image.read_in(cx, 0, &mut buf));
        r.unwrap();
        assert_eq!(sources(&io), [IoSource::Manifest, IoSource::Chunk]);
    }
    let (r, io) = timed(|cx| image.read_in(cx, 0, &mut buf));
    r.unwrap();
    assert_eq!(sources(&io), [IoSource::Cache, IoSource::Manifest]);
    assert_eq!(decode_sector(&buf[..SECTOR], 0), Ok(1));

    // A hole reads no chunk.
    let (r, io) = timed(|cx| image.read_in(cx, 65536, &mut buf));
    r.unwrap();
    assert_eq!(sources(&io), [IoSource::Manifest]);
}

#[test]
fn spans_recorded_into_a_trace_become_its_io_phases() {
    let (_mem, store) = mem_store(small_opts());
    store.create_image("a", 1 << 20).unwrap();
    let image = store.open_image("a").unwrap();
    let mut t = trace::RequestTrace::new(trace::Op::Write, trace::now_ns());
    t.dispatched(trace::now_ns());
    let (r, io) = timed(|cx| image.write_in(cx, 0, &payload(1, 0, 8), true));
    r.unwrap();
    cas::observe::record(&mut t, &io);
    t.executed(trace::now_ns());
    assert_eq!(t.io_spans().iter().map(|s| s.source).collect::<Vec<_>>(), [IoSource::Log]);
}

#[test]
fn io_time_goes_to_the_context_it_is_passed_with() {
    let (mem, store) = mem_store(small_opts());
    store.create_image("a", 1 << 20).unwrap();
    let image = store.open_image("a").unwrap();
    let (a, b) = (Cell::new(IoTimes::default()), Cell::new(IoTimes::default()));
    image.write_in(IoCx::timed(&a), 0, &payload(1, 0, 8), true).unwrap();
    image.flush().unwrap();
    store.compact_once(&image).unwrap();
    drop((image, store));
    let store = reopen(&mem, small_opts()).unwrap();
    let image = store.open_image("a").unwrap();
    // Both contexts live on this one thread: each keeps only its own I/O.
    let mut buf = vec![0u8; 4096];
    image.read_in(IoCx::timed(&b), 0, &mut buf).unwrap();
    assert_eq!(decode_sector(&buf[..SECTOR], 0), Ok(1));
    let (a_then, b_then) = (a.get(), b.get());
    assert_eq!(sources(&a_then), [IoSource::Log]);
    assert_eq!(sources(&b_then), [IoSource::Manifest, IoSource::Chunk]);
    // An untimed read on the same thread adds to neither.
    image.read(0, &mut buf).unwrap();
    assert_eq!((a.get(), b.get()), (a_then, b_then));
}
