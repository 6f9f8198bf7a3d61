//! Pack header decoder on hostile bytes: an error or a value, never a
//! panic. A decoded header must decode again from its own encoding.
//!
//! The mutator re-seals the header crc32c (at byte 40) of most inputs so
//! the fuzzer explores the decoder past the checksum.
#![no_main]

use libfuzzer_sys::{fuzz_mutator, fuzz_target, fuzzer_mutate};

const CRC_AT: usize = 40;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = cas::chunk::fuzz_decode_pack_header(data) {
        let again = h.encode();
        assert_eq!(cas::chunk::fuzz_decode_pack_header(&again).ok(), Some(h));
    }
});

fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
    let size = fuzzer_mutate(data, size, max_size);
    if seed % 4 != 0 && size >= CRC_AT + 4 {
        let crc = cas::format::crc32c(&data[..CRC_AT]);
        data[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    }
    size
});
