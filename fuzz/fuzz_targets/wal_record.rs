//! Fuzzes the WAL decoders: record header, segment header, segment scan.
//! The body lives in `cas::wal::fuzz_decode` so that a stable-toolchain
//! smoke test (cas/tests/wal_fuzz_smoke.rs) runs the same checks.
//!
//!     cargo +nightly fuzz run wal_record -- -max_total_time=60
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    cas::wal::fuzz_decode(data);
});
