//! Fuzz entry points for the store's small files (`STORE`, `IMAGE`):
//! decode hostile bytes as each, and reseal mutated bytes (the crc32c
//! trailer) so a fuzzer reaches the fields. Used by
//! `fuzz/fuzz_targets/store_files.rs` and `cas/tests/fuzz_corpus.rs`.

use super::files::{self, ImageHeader};
use crate::error::Result;
use crate::format;
use crate::storage::{MemStorage, OpenMode, Storage};
use std::path::Path;

/// Decodes `bytes` as a `STORE` file and as an `IMAGE` file. A decoded
/// image header must decode again, to itself, from its own encoding.
/// Never panics otherwise.
pub fn fuzz_decode_store_files(bytes: &[u8]) -> (Result<()>, Result<ImageHeader>) {
    let storage = MemStorage::new();
    let path = Path::new("/f");
    let written = storage.open(path, OpenMode::CreateNew).and_then(|f| f.write_all_at(bytes, 0));
    if let Err(e) = written {
        return (Err(e), Err(crate::Error::InvalidArgument("unwritable".into())));
    }
    let store = files::read_store(&storage, path).map(|_| ());
    let image = ImageHeader::read(&storage, path);
    if let Ok(h) = &image {
        let again =
            storage.open(Path::new("/g"), OpenMode::CreateNew).and_then(|f| f.write_all_at(&h.encode(), 0));
        assert!(again.is_ok(), "an in-memory file takes the bytes");
        let back = ImageHeader::read(&storage, Path::new("/g")).ok();
        assert_eq!(back.as_ref(), Some(h), "a decoded IMAGE round-trips through its encoding");
    }
    (store, image)
}

/// Rewrites the crc32c trailer (the last 4 bytes) over the rest.
pub fn fuzz_reseal(bytes: &mut [u8]) {
    if bytes.len() >= 4 {
        let n = bytes.len() - 4;
        let crc = format::crc32c(&bytes[..n]);
        bytes[n..].copy_from_slice(&crc.to_le_bytes());
    }
}

/// Valid `STORE` and `IMAGE` files (seeds).
pub fn fuzz_samples() -> Vec<Vec<u8>> {
    vec![
        files::encode_store(files::STORE_VERSION),
        ImageHeader::image(1 << 30, 0x1234_5678).encode(),
        ImageHeader {
            kind: files::ImageKind::Snapshot,
            origin: Some("vm".into()),
            ..ImageHeader::image(1 << 30, 0x1234_5678)
        }
        .encode(),
        ImageHeader {
            kind: files::ImageKind::Replica,
            origin: Some("s3://b at http://h/images/vm/roots/0000000000000000-0000000000000007".into()),
            ..ImageHeader::image(1 << 30, 0x1234_5678)
        }
        .encode(),
    ]
}
