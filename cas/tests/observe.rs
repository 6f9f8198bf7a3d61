//! The engine's I/O spans as the request path records them into a trace:
//! each source a request really used, and nothing for work that is not I/O.

mod common;

use cas::observe::observed;
use common::*;
use trace::IoSource;

fn sources(spans: &[trace::IoSpan]) -> Vec<IoSource> {
    spans.iter().map(|s| s.source).collect()
}

#[test]
fn each_request_reports_the_sources_it_used() {
    let (mem, store) = mem_store(small_opts());
    store.create_image("a", 1 << 20).unwrap();
    let image = store.open_image("a").unwrap();

    // A write appends one log record; with FUA it also syncs the log.
    let (r, spans) = observed(|| image.write(0, &payload(1, 0, 16), false));
    r.unwrap();
    assert_eq!(sources(&spans), [IoSource::Log]);
    let (r, spans) = observed(|| image.write(8192, &payload(2, 16, 8), true));
    r.unwrap();
    assert_eq!(sources(&spans), [IoSource::Log], "record write and sync merge into one log span");
    let (r, spans) = observed(|| image.flush());
    r.unwrap();
    assert_eq!(sources(&spans), [IoSource::Log]);

    // Uncompacted data comes from the log.
    let mut buf = vec![0u8; 4096];
    let (r, spans) = observed(|| image.read(0, &mut buf));
    r.unwrap();
    assert_eq!(sources(&spans), [IoSource::Log]);

    // Compacted, after a reopen (empty chunk cache): the manifest, then the
    // chunk store; the same read again hits the cache.
    store.compact_once(&image).unwrap();
    drop((image, store));
    let store = reopen(&mem, small_opts()).unwrap();
    let image = store.open_image("a").unwrap();
    let (r, spans) = observed(|| image.read(0, &mut buf));
    r.unwrap();
    assert_eq!(sources(&spans), [IoSource::Manifest, IoSource::Chunk]);
    assert!(spans.iter().all(|s| s.begin_ns <= s.end_ns));
    let (r, spans) = observed(|| image.read(0, &mut buf));
    r.unwrap();
    assert_eq!(sources(&spans), [IoSource::Manifest, IoSource::Cache]);
    assert_eq!(decode_sector(&buf[..SECTOR], 0), Ok(1));

    // A hole reads no chunk; an unobserved read records nothing.
    let (r, spans) = observed(|| image.read(65536, &mut buf));
    r.unwrap();
    assert_eq!(sources(&spans), [IoSource::Manifest]);
    image.read(0, &mut buf).unwrap();
    let ((), spans) = observed(|| ());
    assert!(spans.is_empty());
}

#[test]
fn spans_recorded_into_a_trace_become_its_io_phases() {
    let (_mem, store) = mem_store(small_opts());
    store.create_image("a", 1 << 20).unwrap();
    let image = store.open_image("a").unwrap();
    let mut t = trace::RequestTrace::new(trace::Op::Write, trace::now_ns());
    t.dispatched(trace::now_ns());
    cas::observe::into(&mut t, || image.write(0, &payload(1, 0, 8), true)).unwrap();
    t.executed(trace::now_ns());
    assert_eq!(sources(t.io_spans()), [IoSource::Log]);
}
