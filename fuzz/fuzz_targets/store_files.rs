//! Fuzzes the decoders of the store's small files, `STORE` and `IMAGE`
//! (`cas::store::fuzz_decode_store_files`): errors or values, never a
//! panic; a decoded IMAGE round-trips through its encoding.
//!
//! The mutator reseals the crc32c trailer on most inputs.
#![no_main]

use libfuzzer_sys::{fuzz_mutator, fuzz_target, fuzzer_mutate};

fuzz_target!(|data: &[u8]| {
    let _ = cas::store::fuzz_decode_store_files(data);
});

fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
    let size = fuzzer_mutate(data, size, max_size);
    if seed % 4 != 0 {
        cas::store::fuzz_reseal(&mut data[..size]);
    }
    size
});
