//! Fuzzes the control socket's request decoder (`trace::stats::parse_request`,
//! what the daemon runs on every line a client sends): a request or an
//! error, never a panic; a decoded request round-trips through JSON.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(req) = trace::stats::parse_request(data) {
        let line = serde_json::to_vec(&req).expect("a request serializes");
        assert_eq!(trace::stats::parse_request(&line).ok(), Some(req));
    }
});
