//! Remote pack catalog and pack slot index decoders on hostile bytes: an
//! error or a value, never a panic. A decoded value must encode back to
//! the same bytes.
//!
//! The mutator sets the entry count (byte 24 of both) to what the length
//! holds and re-seals the trailing crc32c of most inputs, so the fuzzer
//! explores the decoders past them.
#![no_main]

use libfuzzer_sys::{fuzz_mutator, fuzz_target, fuzzer_mutate};

const COUNT_AT: usize = 24;
const ENTRIES_AT: usize = 28;

fuzz_target!(|data: &[u8]| {
    if let Ok(encoded) = cas::chunk::remote::fuzz_decode_remote(data) {
        assert_eq!(encoded, data, "decode/encode round trip");
    }
});

fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
    let size = fuzzer_mutate(data, size, max_size);
    if seed % 4 != 0 && size >= ENTRIES_AT + 4 {
        let entry = if data.starts_with(b"CASRPACK") { 12 } else { 36 };
        let count = ((size - ENTRIES_AT - 4) / entry) as u32;
        data[COUNT_AT..COUNT_AT + 4].copy_from_slice(&count.to_le_bytes());
        let crc = cas::format::crc32c(&data[..size - 4]);
        data[size - 4..size].copy_from_slice(&crc.to_le_bytes());
    }
    size
});
