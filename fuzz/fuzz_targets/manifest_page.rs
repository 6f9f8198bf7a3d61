//! Manifest page and root slot decoders on hostile bytes: an error or a
//! value, never a panic. A decoded page must re-encode to the same bytes.
//!
//! The mutator re-seals the crc32c of most inputs (page crc at 4092, root
//! crc at 72) so the fuzzer explores the decoder past the checksum.
#![no_main]

use libfuzzer_sys::{fuzz_mutator, fuzz_target, fuzzer_mutate};

const PAGE_BYTES: usize = 4096;
const ROOT_CRC_AT: usize = 72;

fuzz_target!(|data: &[u8]| {
    if let Ok(page) = cas::manifest::fuzz_decode_page(data) {
        assert_eq!(cas::manifest::fuzz_encode_page(&page), data, "decode/encode round trip");
    }
    let _ = cas::manifest::fuzz_decode_root(data);
});

fn reseal(buf: &mut [u8], at: usize) {
    if buf.len() >= at + 4 {
        let crc = cas::format::crc32c(&buf[..at]);
        buf[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
    let size = fuzzer_mutate(data, size, max_size);
    match seed % 4 {
        0 => {}
        1 => reseal(&mut data[..size], ROOT_CRC_AT),
        _ => {
            if size == PAGE_BYTES {
                reseal(&mut data[..size], PAGE_BYTES - 4);
            }
        }
    }
    size
});
