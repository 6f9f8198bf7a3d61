//! Pack forward table decoder on hostile bytes: an error or a value, never
//! a panic. A decoded table must encode back to the same bytes.
//!
//! The mutator sets the move count to what the length holds and re-seals
//! both crc32cs (header at byte 28, entries at the end) of most inputs, so
//! the fuzzer explores the decoder past them.
#![no_main]

use libfuzzer_sys::{fuzz_mutator, fuzz_target, fuzzer_mutate};

const COUNT_AT: usize = 24;
const HEADER_CRC_AT: usize = 28;

fuzz_target!(|data: &[u8]| {
    if let Ok(t) = cas::chunk::fuzz_decode_forward(data) {
        assert_eq!(t.encode(), data, "decode/encode round trip");
    }
});

fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
    let size = fuzzer_mutate(data, size, max_size);
    if seed % 4 != 0 && size >= HEADER_CRC_AT + 8 {
        let count = ((size - HEADER_CRC_AT - 8) / 12) as u32;
        data[COUNT_AT..COUNT_AT + 4].copy_from_slice(&count.to_le_bytes());
        let crc = cas::format::crc32c(&data[..HEADER_CRC_AT]);
        data[HEADER_CRC_AT..HEADER_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        let body = HEADER_CRC_AT + 4..size - 4;
        let crc = cas::format::crc32c(&data[body]);
        data[size - 4..size].copy_from_slice(&crc.to_le_bytes());
    }
    size
});
