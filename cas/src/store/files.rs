//! The store's small metadata files: the store version file `STORE` and
//! each image's header `IMAGE`. Both are written whole to `<name>.tmp`,
//! synced, renamed over `<name>` and the directory synced, so a crash
//! leaves the old file or the new one, never a mix.
//!
//! ```text
//!  STORE                                IMAGE
//!  off size field                       off size field
//!    0    8 magic "CASSTORE"              0    8 magic "CASIMAGE"
//!    8    4 version u32 LE (1 to 3)       8    4 version u32 LE (1 or 2)
//!   12    4 reserved 0                   12    4 reserved 0
//!   16    4 crc32c of [0,16)             16    8 size_bytes u64 LE
//!                                        24    8 log_id u64 LE
//!                                        version 2 only:
//!                                        32    4 kind u32 LE (0 image, 1 snapshot)
//!                                        36    2 origin length u16 LE (0: none)
//!                                        38    n origin, UTF-8: the image a
//!                                               snapshot was taken of, the
//!                                               snapshot a clone was made from
//!                                        38+n 4 crc32c of [0,38+n)
//! ```
//!
//! The checksum is verified first (a trailer over whatever length the file
//! has), then the magic, then the version: newer versions are refused.
//! A plain image is still written as version 1. `STORE` versions: 2 may
//! hold snapshots and clones; 3 may hold manifest leaves with chunk
//! locations (page version 2) and a chunk index journal of version 2.
//! Opening a store for writing moves `STORE` to the newest version first,
//! so a casblk from before any of these refuses the whole store ("upgrade
//! casblk") instead of misreading it.

use crate::error::{Error, Result};
use crate::format::{check_version, unseal, Decoder, Encoder};
use crate::storage::{OpenMode, Storage};
use std::path::Path;

pub const STORE_MAGIC: [u8; 8] = *b"CASSTORE";
/// 2: snapshots and clones; 3: located manifest leaves and the index
/// journal's pack id floor; 4: the dedup index on disk (runs, root, slots
/// file, index journal 3). Older stores are read as they are, then moved
/// to this version when opened for writing.
pub const STORE_VERSION: u32 = 5;
/// What a store without a remote is moved to: 5 (pack uploads: a remote
/// pack catalog whose sealed packs an older casblk would append to and
/// repack) is written only when a store is opened with a remote.
pub const STORE_VERSION_LOCAL: u32 = 4;
pub const IMAGE_MAGIC: [u8; 8] = *b"CASIMAGE";
pub const IMAGE_VERSION: u32 = 3;
/// The version of headers of snapshots and clones (3 is written only for
/// replicas, which an older casblk must refuse).
const IMAGE_VERSION_SNAPSHOTS: u32 = 2;
/// Largest metadata file read (they are tens of bytes).
const SMALL_FILE_BYTES_MAX: u64 = 4096;

pub use crate::storage::{tmp_path, write_atomic};

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

/// The `STORE` file of `version` (1: no snapshots yet; 2: the current).
pub fn encode_store(version: u32) -> Vec<u8> {
    let mut e = Encoder::default();
    e.bytes(&STORE_MAGIC).u32(version).u32(0).seal();
    e.buf
}

/// Checks the store version file at `path`; returns its version.
pub fn read_store(storage: &dyn Storage, path: &Path) -> Result<u32> {
    let body = read_sealed(storage, path)?;
    let mut d = Decoder::new(&body);
    check_magic_version(&mut d, STORE_MAGIC, STORE_VERSION, "store", path)?;
    Ok(u32::from_le_bytes(body[8..12].try_into().expect("checked above")))
}

/// What an image is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageKind {
    /// A writable image (made by create, import or clone).
    #[default]
    Image,
    /// A read-only snapshot of an image, named `IMAGE@SNAP`.
    Snapshot,
    /// A read-only copy of an image another store published to the bucket
    /// (`Store::fetch_image`); its origin names the root it was built from.
    Replica,
}

/// The fields of an image header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageHeader {
    pub size_bytes: u64,
    pub log_id: u64,
    pub kind: ImageKind,
    /// A snapshot's image, a clone's snapshot.
    pub origin: Option<String>,
}

impl ImageHeader {
    /// A plain image's header.
    pub fn image(size_bytes: u64, log_id: u64) -> ImageHeader {
        ImageHeader { size_bytes, log_id, kind: ImageKind::Image, origin: None }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::default();
        let plain = self.kind == ImageKind::Image && self.origin.is_none();
        let version = match self.kind {
            _ if plain => 1,
            ImageKind::Replica => IMAGE_VERSION,
            _ => IMAGE_VERSION_SNAPSHOTS,
        };
        e.bytes(&IMAGE_MAGIC).u32(version).u32(0).u64(self.size_bytes).u64(self.log_id);
        if !plain {
            let origin = self.origin.as_deref().unwrap_or("");
            let kind = match self.kind {
                ImageKind::Image => 0,
                ImageKind::Snapshot => 1,
                ImageKind::Replica => 2,
            };
            e.u32(kind).u16(origin.len() as u16).bytes(origin.as_bytes());
        }
        e.seal();
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
        let version = u32::from_le_bytes(body[8..12].try_into().expect("checked above"));
        let _reserved = d.u32().ok_or_else(short)?;
        let size_bytes = d.u64().ok_or_else(short)?;
        let log_id = d.u64().ok_or_else(short)?;
        if version == 1 {
            return Ok(ImageHeader::image(size_bytes, log_id));
        }
        let bad = |detail: String| Error::Corruption { path: path.into(), offset: 32, detail };
        let kind = match d.u32().ok_or_else(short)? {
            0 => ImageKind::Image,
            1 => ImageKind::Snapshot,
            2 if version >= IMAGE_VERSION => ImageKind::Replica,
            k => return Err(bad(format!("image kind {k} is unknown"))),
        };
        let n = d.u16().ok_or_else(short)? as usize;
        let origin = d.bytes(n).ok_or_else(short)?;
        let origin = std::str::from_utf8(origin).map_err(|_| bad("origin is not UTF-8".into()))?;
        let origin = (!origin.is_empty()).then(|| origin.to_string());
        if kind != ImageKind::Image && origin.is_none() {
            return Err(bad(format!("a {kind:?} without its origin")));
        }
        Ok(ImageHeader { size_bytes, log_id, kind, origin })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::crc32c;
    use crate::storage::MemStorage;

    #[test]
    fn an_older_casblk_refuses_a_newer_store() {
        let s = MemStorage::new();
        let dir = Path::new("/d");
        s.create_dir_all(dir).unwrap();
        write_atomic(&s, dir, "STORE", &encode_store(STORE_VERSION)).unwrap();
        assert_eq!(read_store(&s, &dir.join("STORE")).unwrap(), 5);
        // What such a casblk runs: the same check with 1 as the newest it reads.
        let body = read_sealed(&s, &dir.join("STORE")).unwrap();
        let e = check_magic_version(&mut Decoder::new(&body), STORE_MAGIC, 1, "store", dir).unwrap_err();
        assert!(e.to_string().contains("upgrade casblk"), "{e}");
        write_atomic(&s, dir, "STORE", &encode_store(1)).unwrap();
        assert_eq!(
            read_store(&s, &dir.join("STORE")).unwrap(),
            1,
            "a store of the first release still opens"
        );
    }

    #[test]
    fn image_header_round_trips_and_newer_versions_are_refused() {
        let s = MemStorage::new();
        let dir = Path::new("/d");
        s.create_dir_all(dir).unwrap();
        let h = ImageHeader::image(1 << 30, 42);
        write_atomic(&s, dir, "IMAGE", &h.encode()).unwrap();
        assert_eq!(ImageHeader::read(&s, &dir.join("IMAGE")).unwrap(), h);
        assert_eq!(h.encode()[8], 1, "a plain image stays readable by an older casblk");
        let snap = ImageHeader { kind: ImageKind::Snapshot, origin: Some("vm".into()), ..h.clone() };
        write_atomic(&s, dir, "IMAGE", &snap.encode()).unwrap();
        assert_eq!(ImageHeader::read(&s, &dir.join("IMAGE")).unwrap(), snap);
        let clone = ImageHeader { origin: Some("vm@s".into()), ..h.clone() };
        write_atomic(&s, dir, "IMAGE", &clone.encode()).unwrap();
        assert_eq!(ImageHeader::read(&s, &dir.join("IMAGE")).unwrap(), clone);
        assert_eq!(clone.encode()[8], 2, "a clone stays readable by the casblk that made clones");
        let replica =
            ImageHeader { kind: ImageKind::Replica, origin: Some("s3://b/images/vm".into()), ..h.clone() };
        write_atomic(&s, dir, "IMAGE", &replica.encode()).unwrap();
        assert_eq!(ImageHeader::read(&s, &dir.join("IMAGE")).unwrap(), replica);
        assert_eq!(replica.encode()[8], 3);

        let mut bytes = h.encode();
        bytes[8] = 4;
        let n = bytes.len() - 4;
        let crc = crc32c(&bytes[..n]);
        bytes[n..].copy_from_slice(&crc.to_le_bytes());
        write_atomic(&s, dir, "IMAGE", &bytes).unwrap();
        let e = ImageHeader::read(&s, &dir.join("IMAGE")).unwrap_err();
        assert!(matches!(e, Error::UnsupportedVersion { found: 4, .. }), "{e}");

        bytes[20] ^= 1;
        write_atomic(&s, dir, "IMAGE", &bytes).unwrap();
        let e = ImageHeader::read(&s, &dir.join("IMAGE")).unwrap_err();
        assert!(matches!(e, Error::ChecksumMismatch { .. }), "{e}");
    }
}
