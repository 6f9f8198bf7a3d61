//! The store's small metadata files: the store version file `STORE` and
//! each image's header `IMAGE`. Both are written whole to `<name>.tmp`,
//! synced, renamed over `<name>` and the directory synced, so a crash
//! leaves the old file or the new one, never a mix.
//!
//! ```text
//!  STORE                                IMAGE
//!  off size field                       off size field
//!    0    8 magic "CASSTORE"              0    8 magic "CASIMAGE"
//!    8    4 version u32 LE (1)            8    4 version u32 LE (1)
//!   12    4 reserved 0                   12    4 reserved 0
//!   16    4 crc32c of [0,16)             16    8 size_bytes u64 LE
//!                                        24    8 log_id u64 LE
//!                                        32    4 crc32c of [0,32)
//! ```
//!
//! The checksum is verified first (a trailer over whatever length the file
//! has), then the magic, then the version: newer versions are refused.

use crate::error::{Error, Result};
use crate::format::{check_version, unseal, Decoder, Encoder};
use crate::storage::{OpenMode, Storage};
use std::path::Path;

pub const STORE_MAGIC: [u8; 8] = *b"CASSTORE";
pub const STORE_VERSION: u32 = 1;
pub const IMAGE_MAGIC: [u8; 8] = *b"CASIMAGE";
pub const IMAGE_VERSION: u32 = 1;
/// Largest metadata file read (they are tens of bytes).
const SMALL_FILE_BYTES_MAX: u64 = 4096;

/// Where `write_atomic` writes `dir/name` before its rename (a crash can
/// leave it behind).
pub fn tmp_path(dir: &Path, name: &str) -> std::path::PathBuf {
    dir.join(format!("{name}.tmp"))
}

/// Writes `bytes` as `dir/name` atomically and durably.
pub fn write_atomic(storage: &dyn Storage, dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = tmp_path(dir, name);
    let f = storage.open(&tmp, OpenMode::Create)?;
    f.set_len(0)?;
    f.write_all_at(bytes, 0)?;
    f.sync_data()?;
    storage.rename(&tmp, &dir.join(name))?;
    storage.sync_dir(dir)
}

/// Reads a small checksummed file and returns its body (trailer checked).
fn read_sealed(storage: &dyn Storage, path: &Path) -> Result<Vec<u8>> {
    let f = storage.open(path, OpenMode::Existing)?;
    let len = f.len()?;
    if len > SMALL_FILE_BYTES_MAX {
        return Err(Error::Corruption {
            path: path.into(),
            offset: 0,
            detail: format!("{len} bytes is too long"),
        });
    }
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, 0)?;
    Ok(unseal(&buf, path, 0)?.to_vec())
}

fn check_magic_version(
    d: &mut Decoder,
    magic: [u8; 8],
    supported: u32,
    what: &str,
    path: &Path,
) -> Result<()> {
    if d.array::<8>() != Some(magic) {
        let detail = format!("not a casblk {what} file (bad magic)");
        return Err(Error::Corruption { path: path.into(), offset: 0, detail });
    }
    let version = d.u32().ok_or_else(|| Error::Corruption {
        path: path.into(),
        offset: 8,
        detail: "truncated before the version".into(),
    })?;
    check_version(&format!("{what} {}", path.display()), version, supported)
}

pub fn encode_store() -> Vec<u8> {
    let mut e = Encoder::default();
    e.bytes(&STORE_MAGIC).u32(STORE_VERSION).u32(0).seal();
    e.buf
}

/// Checks the store version file at `path`.
pub fn read_store(storage: &dyn Storage, path: &Path) -> Result<()> {
    let body = read_sealed(storage, path)?;
    check_magic_version(&mut Decoder::new(&body), STORE_MAGIC, STORE_VERSION, "store", path)
}

/// The fields of an image header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageHeader {
    pub size_bytes: u64,
    pub log_id: u64,
}

impl ImageHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::default();
        e.bytes(&IMAGE_MAGIC).u32(IMAGE_VERSION).u32(0).u64(self.size_bytes).u64(self.log_id).seal();
        e.buf
    }

    pub fn read(storage: &dyn Storage, path: &Path) -> Result<ImageHeader> {
        let body = read_sealed(storage, path)?;
        let mut d = Decoder::new(&body);
        check_magic_version(&mut d, IMAGE_MAGIC, IMAGE_VERSION, "image header", path)?;
        let short = || Error::Corruption {
            path: path.into(),
            offset: 12,
            detail: "image header is truncated".into(),
        };
        let _reserved = d.u32().ok_or_else(short)?;
        let size_bytes = d.u64().ok_or_else(short)?;
        let log_id = d.u64().ok_or_else(short)?;
        Ok(ImageHeader { size_bytes, log_id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::crc32c;
    use crate::storage::MemStorage;

    #[test]
    fn image_header_round_trips_and_newer_versions_are_refused() {
        let s = MemStorage::new();
        let dir = Path::new("/d");
        s.create_dir_all(dir).unwrap();
        let h = ImageHeader { size_bytes: 1 << 30, log_id: 42 };
        write_atomic(&s, dir, "IMAGE", &h.encode()).unwrap();
        assert_eq!(ImageHeader::read(&s, &dir.join("IMAGE")).unwrap(), h);

        let mut bytes = h.encode();
        bytes[8] = 2;
        let n = bytes.len() - 4;
        let crc = crc32c(&bytes[..n]);
        bytes[n..].copy_from_slice(&crc.to_le_bytes());
        write_atomic(&s, dir, "IMAGE", &bytes).unwrap();
        let e = ImageHeader::read(&s, &dir.join("IMAGE")).unwrap_err();
        assert!(matches!(e, Error::UnsupportedVersion { found: 2, .. }), "{e}");

        bytes[20] ^= 1;
        write_atomic(&s, dir, "IMAGE", &bytes).unwrap();
        let e = ImageHeader::read(&s, &dir.join("IMAGE")).unwrap_err();
        assert!(matches!(e, Error::ChecksumMismatch { .. }), "{e}");
    }
}
