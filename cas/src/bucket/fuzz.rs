//! The fuzz entry for the files this tier writes to the bucket and to
//! `chunks/`, dispatched by magic to each format's owner (the catalog,
//! the pack slot index, the published root object), which decodes and
//! re-encodes its own.

use super::manifests::root_object;
use super::packs::{catalog, packidx};
use crate::error::Result;

/// Fuzzing: decodes a remote pack catalog, a published manifest root or a
/// pack slot index (chosen by the magic) and returns its encoding, which
/// must equal the input.
pub fn fuzz_decode_remote(bytes: &[u8]) -> Result<Vec<u8>> {
    if bytes.starts_with(b"CASRPACK") {
        catalog::fuzz_decode_catalog(bytes)
    } else if bytes.starts_with(b"CASPROOT") {
        root_object::fuzz_decode_root_object(bytes)
    } else {
        packidx::fuzz_decode_packidx(bytes)
    }
}

/// Fuzzing seeds: a catalog (with a foreign pack), a slot index and a
/// published manifest root.
pub fn fuzz_sample_remote() -> Vec<Vec<u8>> {
    vec![
        catalog::fuzz_sample_catalog(),
        packidx::fuzz_sample_packidx(),
        root_object::fuzz_sample_root_object(),
    ]
}
