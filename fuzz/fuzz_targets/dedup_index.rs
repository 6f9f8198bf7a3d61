//! Fuzzes the dedup index's files (`cas::dedup::fuzz_decode_dedup`): a run
//! read whole as an open and fsck read it, the root, the slots file (the
//! first byte picks which). An error or a value, never a panic.
//!
//! The mutator reseals every checksum of most inputs (the run's header,
//! pages, fences and keys; the root's and slots file's trailers), so the
//! fuzzer explores the decoders behind them.
#![no_main]

use libfuzzer_sys::{fuzz_mutator, fuzz_target, fuzzer_mutate};

fuzz_target!(|data: &[u8]| {
    let _ = cas::dedup::fuzz_decode_dedup(data);
});

fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
    let size = fuzzer_mutate(data, size, max_size);
    if seed % 4 != 0 {
        cas::dedup::fuzz_reseal_dedup(&mut data[..size]);
    }
    size
});
