//! Fuzzes the chunk index journal's replay (`cas::chunk::fuzz_replay_index`,
//! the code a store open runs): an error or the replayed ops, never a panic.
//!
//! The mutator reseals the file header's and every batch's crc32c on most
//! inputs, so the fuzzer explores the record decoder behind the checksums.
#![no_main]

use libfuzzer_sys::{fuzz_mutator, fuzz_target, fuzzer_mutate};

fuzz_target!(|data: &[u8]| {
    let _ = cas::chunk::fuzz_replay_index(data);
});

fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
    let size = fuzzer_mutate(data, size, max_size);
    if seed % 4 != 0 {
        cas::chunk::fuzz_reseal_index(&mut data[..size]);
    }
    size
});
