//! Remote pack catalog, pack slot index and published manifest root
//! decoders on hostile bytes: an error or a value, never a panic. A decoded
//! value must encode back to the same bytes.
//!
//! The mutator sets the entry count (byte 24 of the first two, 124 of a
//! root) to what the length holds and re-seals the trailing crc32c of most
//! inputs, so the fuzzer explores the decoders past them.
#![no_main]

use libfuzzer_sys::{fuzz_mutator, fuzz_target, fuzzer_mutate};

/// (count offset, first entry offset, entry bytes) of each format.
fn layout(data: &[u8]) -> (usize, usize, usize) {
    if data.starts_with(b"CASRPACK") {
        (24, 28, 12)
    } else if data.starts_with(b"CASPROOT") {
        (124, 128, 16)
    } else {
        (24, 28, 36)
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(encoded) = cas::bucket::fuzz_decode_remote(data) {
        assert_eq!(encoded, data, "decode/encode round trip");
    }
});

fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
    let size = fuzzer_mutate(data, size, max_size);
    let (count_at, entries_at, entry) = layout(&data[..size]);
    if seed % 4 != 0 && size >= entries_at + 4 {
        let count = ((size - entries_at - 4) / entry) as u32;
        data[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
        let crc = cas::format::crc32c(&data[..size - 4]);
        data[size - 4..size].copy_from_slice(&crc.to_le_bytes());
    }
    size
});
