//! The exposition against the real stats structs, the text format's rules,
//! docs/metrics.md and the Grafana dashboard; the HTTP endpoint's answers
//! and bounds.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use trace::{counters_from, image_state, Op, RequestTrace, Snapshot, Tracer};

use super::families::{Kind, FAMILIES};
use super::http::{self, parse_head, HeadError, Request};
use super::render;

/// Two images (one live with traffic, one recovering) and every store
/// source, each built from the struct the daemon sends.
fn fixture() -> Snapshot {
    let tracer = Tracer::new("vm-a");
    for i in 0..300u64 {
        let op = [Op::Read, Op::Write, Op::Flush][(i % 3) as usize];
        let mut t = RequestTrace::new(op, 1_000);
        t.set_location(0, (i % 64) as u16, i * 4096, if op == Op::Flush { 0 } else { 4096 });
        t.admitted(2_000);
        t.dispatched(3_000);
        t.executed(3_000 + i * 40_000);
        tracer.finish(&t, 4_000 + i * 40_000, if i == 7 { -5 } else { 0 });
    }
    let mut a = tracer.snapshot();
    a.state = image_state::LIVE.into();
    let cas_stats = cas::ImageStats {
        size_bytes: 1 << 30,
        log_used_bytes: 3 << 20,
        log_quota_bytes: 256 << 20,
        capacity_waits: 2,
        next_seq: 101,
        covered_seq: 60,
        ..Default::default()
    };
    a.attach("cas", counters_from("cas", &cas_stats).unwrap());
    let sched_counters = sched::ImageCounters {
        rate_limited_admissions: 7,
        limits: sched::Limits {
            read_iops: Some(sched::RateLimit::new(500)),
            write_bytes_per_sec: Some(sched::RateLimit::new(20 << 20)),
            ..Default::default()
        }
        .into(),
        ..Default::default()
    };
    a.attach("sched", counters_from("sched", &sched_counters).unwrap());
    let mut b = Tracer::idle_stats("vm-b");
    b.state = image_state::RECOVERING.into();
    let mut snap = Snapshot::new(vec![a, b]);
    let space = cas::SpaceStats {
        images: 2,
        mapped_bytes: 8 << 20,
        unique_bytes: 5 << 20,
        dedup_ratio: 1.6,
        fs_size_bytes: 1 << 30,
        fs_avail_bytes: 100 << 20,
        provisioned_bytes: 3 << 30,
        overcommit_ratio: 3.0,
        ..Default::default()
    };
    snap.attach("store", counters_from("store", &space).unwrap());
    let chunks = cas::chunk::ChunkStats { cache_hits: 9, cache_misses: 4, ..Default::default() };
    snap.attach("chunks", counters_from("chunks", &chunks).unwrap());
    let remote = serde_json::json!({"sealed_packs": 3, "pending_upload_bytes": 12345, "uploaded_bytes": 7, "upload_errors": 1});
    snap.attach("remote", trace::counters_from_value("remote", &remote).unwrap());
    let scrub = serde_json::json!({"running": 1, "passes": 2, "chunks_checked": 30, "bytes_checked": 122880, "last_damaged_chunks": 1});
    snap.attach("scrub", trace::counters_from_value("scrub", &scrub).unwrap());
    snap.attach(
        "space",
        trace::counters_from_value(
            "space",
            &serde_json::json!({"warn_pct": 90, "used_pct": 90.2, "warning": 1}),
        )
        .unwrap(),
    );
    snap.attach(
        "process",
        trace::counters_from_value(
            "process",
            &serde_json::json!({"resident_bytes": 1u64 << 26, "threads": 30}),
        )
        .unwrap(),
    );
    snap
}

/// `name{labels} value` lines: the sample name and its labels' text.
fn samples(text: &str) -> Vec<(String, String, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            (name.to_owned(), labels.to_owned(), value.parse().unwrap())
        })
        .collect()
}

fn value(text: &str, name: &str, labels: &str) -> f64 {
    let found: Vec<f64> =
        samples(text).into_iter().filter(|(n, l, _)| n == name && l == labels).map(|(_, _, v)| v).collect();
    assert_eq!(found.len(), 1, "{name}{{{labels}}} in:\n{text}");
    found[0]
}

#[test]
fn every_family_is_exposed_with_help_and_type() {
    let text = render(&fixture()).unwrap();
    for f in FAMILIES {
        assert!(text.contains(&format!("# HELP {} ", f.name)), "{} has no HELP", f.name);
        assert!(text.contains(&format!("# TYPE {} {}\n", f.name, f.kind.name())), "{} has no TYPE", f.name);
        assert!(f.name.starts_with("casblk_"), "{}", f.name);
        let unit_ok = match f.kind {
            Kind::Counter => f.name.ends_with("_total"),
            Kind::Histogram => f.name.ends_with("_seconds"),
            Kind::Gauge => !f.name.ends_with("_total"),
        };
        assert!(unit_ok, "{} does not follow the naming conventions", f.name);
    }
}

#[test]
fn samples_equal_the_fields_they_come_from() {
    let snap = fixture();
    let text = render(&snap).unwrap();
    let w = &snap.images[0].ops.write;
    assert_eq!(value(&text, "casblk_image_requests_total", r#"image="vm-a",op="write""#), w.count as f64);
    assert_eq!(
        value(&text, "casblk_image_request_bytes_total", r#"image="vm-a",op="write""#),
        w.bytes as f64
    );
    assert_eq!(value(&text, "casblk_image_request_errors_total", r#"image="vm-a",op="read""#), 0.0);
    assert_eq!(
        value(&text, "casblk_image_request_errors_total", r#"image="vm-a",op="flush""#)
            + value(&text, "casblk_image_request_errors_total", r#"image="vm-a",op="write""#)
            + value(&text, "casblk_image_request_errors_total", r#"image="vm-a",op="read""#),
        1.0
    );
    assert_eq!(value(&text, "casblk_image_log_used_bytes", r#"image="vm-a""#), (3u64 << 20) as f64);
    assert_eq!(value(&text, "casblk_image_size_bytes", r#"image="vm-a""#), (1u64 << 30) as f64);
    assert_eq!(value(&text, "casblk_image_compaction_backlog_records", r#"image="vm-a""#), 40.0);
    assert_eq!(value(&text, "casblk_image_state", r#"image="vm-a",state="live""#), 1.0);
    assert_eq!(value(&text, "casblk_image_state", r#"image="vm-a",state="failed""#), 0.0);
    assert_eq!(value(&text, "casblk_image_state", r#"image="vm-b",state="recovering""#), 1.0);
    assert_eq!(value(&text, "casblk_store_dedup_ratio", ""), 1.6);
    assert_eq!(value(&text, "casblk_store_chunk_cache_misses_total", ""), 4.0);
    assert_eq!(value(&text, "casblk_store_remote_upload_pending_bytes", ""), 12345.0);
    assert_eq!(value(&text, "casblk_daemon_threads", ""), 30.0);
    assert_eq!(value(&text, "casblk_store_overcommit_ratio", ""), 3.0);
    assert_eq!(value(&text, "casblk_store_fs_avail_bytes", ""), (100u64 << 20) as f64);
    assert_eq!(value(&text, "casblk_store_space_warning", ""), 1.0);
    assert_eq!(value(&text, "casblk_image_limit_iops", r#"image="vm-a",class="read""#), 500.0);
    assert_eq!(
        value(&text, "casblk_image_limit_bytes_per_second", r#"image="vm-a",class="write""#),
        (20u64 << 20) as f64
    );
    assert!(!text.contains(r#"casblk_image_limit_iops{image="vm-a",class="write"}"#), "unlimited: no sample");
    assert_eq!(value(&text, "casblk_image_rate_limited_requests_total", r#"image="vm-a""#), 7.0);
    assert_eq!(value(&text, "casblk_store_scrub_checked_bytes_total", ""), 122880.0);
    assert_eq!(value(&text, "casblk_store_scrub_damaged_chunks", ""), 1.0);
    let wait_ms = snap.images[0].ops.read.gates["scheduler_turn"].wait_ms_total;
    assert_eq!(
        value(
            &text,
            "casblk_image_gate_wait_seconds_total",
            r#"image="vm-a",op="read",gate="scheduler_turn""#
        ),
        wait_ms / 1e3
    );
}

#[test]
fn histograms_are_cumulative_and_end_at_the_count() {
    let snap = fixture();
    let text = render(&snap).unwrap();
    let read = &snap.images[0].ops.read;
    let name = "casblk_image_request_duration_seconds";
    let buckets: Vec<(String, f64)> = samples(&text)
        .into_iter()
        .filter(|(n, l, _)| n == &format!("{name}_bucket") && l.starts_with(r#"image="vm-a",op="read""#))
        .map(|(_, l, v)| (l, v))
        .collect();
    assert_eq!(buckets.len(), trace::LATENCY_BUCKET_BOUNDS_US.len() + 1, "{buckets:?}");
    assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{buckets:?}");
    let (inf_labels, inf) = buckets.last().unwrap();
    assert!(inf_labels.contains(r#"le="+Inf""#), "{inf_labels}");
    assert_eq!(*inf, read.count as f64);
    assert!(buckets[0].0.contains(r#"le="0.00001""#), "{}", buckets[0].0);
    assert_eq!(value(&text, &format!("{name}_count"), r#"image="vm-a",op="read""#), read.count as f64);
    let sum = value(&text, &format!("{name}_sum"), r#"image="vm-a",op="read""#);
    assert!((sum - read.latency_us_total / 1e6).abs() < 1e-9, "{sum}");
    // Reads took 3 µs to 12 ms here: some but not all fall under 1 ms.
    let under_1ms = buckets.iter().find(|(l, _)| l.contains(r#"le="0.001""#)).unwrap().1;
    assert!(under_1ms > 0.0 && under_1ms < *inf, "{under_1ms}");
}

#[test]
fn a_snapshot_without_buckets_has_no_histogram() {
    let mut snap = fixture();
    snap.latency_bucket_bounds_us.clear();
    let text = render(&snap).unwrap();
    assert!(!text.contains("casblk_image_request_duration_seconds"));
    assert!(text.contains("casblk_image_requests_total"));
}

#[test]
fn a_store_without_a_bucket_reads_zero_upload_backlog() {
    let mut snap = fixture();
    snap.counters.remove("remote");
    let text = render(&snap).unwrap();
    assert_eq!(value(&text, "casblk_store_remote_upload_pending_bytes", ""), 0.0);
}

/// promtool, from Debian's `prometheus` package (ci/setup unpacks it).
fn promtool() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("CASBLK_PROMTOOL") {
        return Some(p.into());
    }
    let cache = std::env::var_os("CASBLK_VM_CACHE")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache/casblk-vm")))?;
    let p = cache.join("prometheus/usr/bin/promtool");
    p.exists().then_some(p)
}

#[test]
fn promtool_accepts_the_exposition() {
    let Some(promtool) = promtool() else {
        assert!(
            std::env::var("CASBLK_SKIP_PROMTOOL").as_deref() == Ok("1"),
            "promtool not found: run ci/setup (it unpacks Debian's prometheus package into the cache), or set \
             CASBLK_SKIP_PROMTOOL=1 to skip this check"
        );
        // ci/test fails on any line in this file: a skip is never a pass.
        let skips = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/test-skips.txt");
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(skips) {
            let _ = writeln!(f, "skipped (CASBLK_SKIP_PROMTOOL=1, no promtool): the metrics lint");
        }
        return;
    };
    let text = render(&fixture()).unwrap();
    let mut child = std::process::Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics:\n{said}\n---\n{text}");
}

/// The metric names a dashboard expression or query uses.
fn names_in(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("casblk_") {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, child) in map {
                match (k.as_str(), child) {
                    ("expr" | "query" | "definition", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => collect_exprs(child, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|i| collect_exprs(i, out)),
        _ => {}
    }
}

#[test]
fn the_dashboard_uses_only_exposed_metrics() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../dist/grafana/casblk.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let exposed: BTreeSet<String> =
        samples(&render(&fixture()).unwrap()).into_iter().map(|(n, _, _)| n).collect();
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8, "{} panels", panels.len());
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        let mut exprs = Vec::new();
        collect_exprs(panel, &mut exprs);
        let names: Vec<String> = exprs.iter().flat_map(|e| names_in(e)).collect();
        assert!(!names.is_empty(), "panel {} queries no casblk metric", panel["title"]);
        for n in names {
            assert!(exposed.contains(&n), "panel {} uses {n}, which casblk does not expose", panel["title"]);
        }
    }
    let mut exprs = Vec::new();
    collect_exprs(&dashboard["templating"], &mut exprs);
    for n in exprs.iter().flat_map(|e| names_in(e)) {
        assert!(exposed.contains(&n), "a dashboard variable uses {n}, which casblk does not expose");
    }
}

#[test]
fn the_docs_list_every_family() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md")).unwrap();
    let documented: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `casblk_"))
        .map(|rest| format!("casblk_{}", &rest[..rest.find('`').unwrap()]))
        .collect();
    let declared: BTreeSet<String> = FAMILIES.iter().map(|f| f.name.to_owned()).collect();
    assert_eq!(documented, declared, "docs/metrics.md's table and families.rs differ");
}

#[test]
fn request_heads_parse() {
    assert_eq!(parse_head(b"GET /metrics HTTP/1.1\r\nHost: x"), Ok(Request::Metrics { head_only: false }));
    assert_eq!(parse_head(b"HEAD /metrics?x=1 HTTP/1.0"), Ok(Request::Metrics { head_only: true }));
    assert_eq!(parse_head(b"GET / HTTP/1.1"), Ok(Request::NotFound));
    assert_eq!(parse_head(b"POST /metrics HTTP/1.1"), Ok(Request::MethodNotAllowed));
    assert_eq!(parse_head(b"GET /metrics"), Err(HeadError::BadRequest));
    assert_eq!(parse_head(b"\xff\xfe /metrics HTTP/1.1"), Err(HeadError::BadRequest));
    assert_eq!(parse_head(b"get /metrics HTTP/1.1"), Err(HeadError::BadRequest));
    assert_eq!(parse_head(b"GET /metrics SMTP"), Err(HeadError::BadRequest));
    assert_eq!(parse_head(&vec![b'a'; http::MAX_REQUEST_BYTES + 1]), Err(HeadError::TooLarge));
}

fn get(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn the_endpoint_answers_and_stays_within_its_bounds() {
    let renders = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = renders.clone();
    let server = http::Server::spawn("127.0.0.1:0".parse().unwrap(), move || {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        render(&fixture())
    })
    .unwrap();
    let addr = server.addr();
    let ok = get(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    assert!(ok.contains(&format!("Content-Type: {}\r\n", http::CONTENT_TYPE)), "{ok}");
    assert!(ok.contains("casblk_image_requests_total{"), "{ok}");
    let again = get(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");
    assert_eq!(
        renders.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "two scrapes within a second render once"
    );
    let head = get(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200") && head.ends_with("\r\n\r\n"), "{head}");
    assert!(get(addr, b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
    let post = get(addr, b"POST /metrics HTTP/1.1\r\n\r\n");
    assert!(post.starts_with("HTTP/1.1 405") && post.contains("Allow: GET, HEAD"), "{post}");
    assert!(get(addr, b"nonsense\r\n\r\n").starts_with("HTTP/1.1 400"));
    let mut huge = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    huge.extend(vec![b'a'; 9 << 10]);
    let big = get(addr, &huge);
    assert!(big.starts_with("HTTP/1.1 431"), "{big}");

    // A client that never finishes its request holds the endpoint for at
    // most the head deadline; the next scrape is then served.
    let idle = TcpStream::connect(addr).unwrap();
    let started = Instant::now();
    let served = get(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    let waited = started.elapsed();
    assert!(waited < http::HEAD_DEADLINE + Duration::from_secs(2), "{waited:?}");
    drop(idle);

    drop(server);
    assert!(TcpStream::connect(addr).is_err(), "the port is closed after drop");
    std::net::TcpListener::bind(addr).expect("and can be bound again");
}

#[test]
fn a_failing_or_panicking_render_is_a_500() {
    let server = http::Server::spawn("127.0.0.1:0".parse().unwrap(), || Err("no store".into())).unwrap();
    let r = get(server.addr(), b"GET /metrics HTTP/1.1\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 500") && r.contains("no store"), "{r}");
    let server = http::Server::spawn("127.0.0.1:0".parse().unwrap(), || panic!("render bug")).unwrap();
    let r = get(server.addr(), b"GET /metrics HTTP/1.1\r\n\r\n");
    assert!(r.starts_with("HTTP/1.1 500") && r.contains("panicked"), "{r}");
}

#[test]
fn a_client_that_never_reads_holds_the_endpoint_only_until_the_response_deadline() {
    // A body far larger than the socket buffers, so the write blocks.
    let body = "# a comment line to pad the body out\n".repeat(1 << 18);
    let server = http::Server::spawn("127.0.0.1:0".parse().unwrap(), move || Ok(body.clone())).unwrap();
    let addr = server.addr();
    let mut stuck = TcpStream::connect(addr).unwrap();
    stuck.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let mut next = TcpStream::connect(addr).unwrap();
    next.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    next.write_all(b"HEAD /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut head = String::new();
    let _ = next.read_to_string(&mut head);
    let waited = started.elapsed();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(waited <= http::RESPONSE_DEADLINE + Duration::from_secs(2), "waited {waited:?}");
    assert!(
        waited >= http::RESPONSE_DEADLINE - Duration::from_secs(1),
        "the stuck client was not waited for: {waited:?}"
    );
    drop(stuck);
    let stopping = Instant::now();
    drop(server);
    assert!(stopping.elapsed() < Duration::from_secs(2), "stopping took {:?}", stopping.elapsed());
}
