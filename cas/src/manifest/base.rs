//! A manifest that starts as a frozen tree of another image: what makes a
//! snapshot, a clone and a rollback instant.
//!
//! Commits never overwrite a tree page, so the pages a root reaches stay
//! valid for as long as their file exists. Freezing links the current
//! manifest file under a second name in the new image's directory and
//! records the root it had at that moment; nothing is copied. The image
//! the file came from goes on appending pages past that root (and writing
//! its own root slots, which the frozen copy never reads); a rewrite of
//! its garbage renames a new file over its own name and leaves the link
//! holding the old one.
//!
//! ```text
//! images/<name>/
//!   manifest            an own file (root slots + pages): always wins
//!   base.root           "CASMBASE", u32 version, u32 0, u64 link id,
//!                       the 76-byte root record (root.rs), crc32c of all
//!   base-<link id:016x> a hard link to the frozen file base.root names
//! ```
//!
//! Open: `manifest` if it exists (any `base*` entry is then a leftover
//! and is removed); else `base.root` and the link it names (other links
//! are leftovers); else the empty manifest. A base is never written: the
//! first commit on one rewrites the live tree into an own `manifest` first
//! (rewrite.rs), then removes the base entries. Switching an image to a
//! new base (rollback) writes the new link and `base.root` (atomically)
//! and then removes `manifest`; a crash leaves the old state or the new.

use super::root::{RootRecord, ROOT_USED_BYTES};
use crate::error::{Error, Result};
use crate::format::{self, Decoder, Encoder};
use crate::storage::{OpenMode, Storage};
use std::path::{Path, PathBuf};

const BASE_MAGIC: [u8; 8] = *b"CASMBASE";
pub const BASE_VERSION: u32 = 1;
/// The name of the file that names an image's base and its root.
pub const BASE_ROOT_FILE: &str = "base.root";
const LINK_PREFIX: &str = "base-";
/// `base.root` is 100 bytes; anything longer is not one.
const BASE_ROOT_BYTES_MAX: u64 = 4096;

/// An image's frozen base: the linked file and the root to read it by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Base {
    pub link: PathBuf,
    pub root: RootRecord,
}

fn dir_of(manifest_path: &Path) -> &Path {
    manifest_path.parent().unwrap_or(Path::new("/"))
}

/// `base-<id>` in the directory of `manifest_path`.
pub fn link_path(manifest_path: &Path, id: u64) -> PathBuf {
    dir_of(manifest_path).join(format!("{LINK_PREFIX}{id:016x}"))
}

fn encode(id: u64, root: &RootRecord) -> Vec<u8> {
    let mut e = Encoder::default();
    e.bytes(&BASE_MAGIC).u32(BASE_VERSION).u32(0).u64(id).bytes(&root.encode()[..ROOT_USED_BYTES]).seal();
    e.buf
}

/// The base of the manifest at `manifest_path`, if `base.root` exists.
pub fn read(storage: &dyn Storage, manifest_path: &Path) -> Result<Option<Base>> {
    let path = dir_of(manifest_path).join(BASE_ROOT_FILE);
    if !storage.exists(&path) {
        return Ok(None);
    }
    let f = storage.open(&path, OpenMode::Existing)?;
    let len = f.len()?;
    let corrupt = |offset: u64, detail: String| Error::Corruption { path: path.clone(), offset, detail };
    if len > BASE_ROOT_BYTES_MAX {
        return Err(corrupt(0, format!("{len} bytes is too long for a base root")));
    }
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, 0)?;
    let body = format::unseal(&buf, &path, 0)?;
    let mut d = Decoder::new(body);
    if d.array::<8>() != Some(BASE_MAGIC) {
        return Err(corrupt(0, "not a casblk base root (bad magic)".into()));
    }
    format::check_version(&format!("base root {}", path.display()), d.u32().unwrap_or(0), BASE_VERSION)?;
    if d.u32() != Some(0) {
        return Err(corrupt(12, "reserved bytes of the base root are not zero".into()));
    }
    let id = d.u64().ok_or_else(|| corrupt(16, "truncated before the link id".into()))?;
    let rec = d.bytes(ROOT_USED_BYTES).ok_or_else(|| corrupt(24, "truncated root record".into()))?;
    let root = RootRecord::decode_detached(rec, &path, 24)?;
    Ok(Some(Base { link: link_path(manifest_path, id), root }))
}

/// Makes `link` (made by the caller, a `base-<id>` beside `manifest_path`)
/// with `root` the base of the manifest at `manifest_path`, durably. The
/// caller removes an own `manifest` afterwards if there is one.
pub fn write(storage: &dyn Storage, manifest_path: &Path, id: u64, root: &RootRecord) -> Result<()> {
    let dir = dir_of(manifest_path);
    storage.sync_dir(dir)?;
    crate::storage::write_atomic(storage, dir, BASE_ROOT_FILE, &encode(id, root))
}

/// Removes base entries beside `manifest_path` other than `keep` (a link
/// to keep; None: `base.root` goes too). Returns whether it removed any.
pub fn remove_leftovers(storage: &dyn Storage, manifest_path: &Path, keep: Option<&Path>) -> Result<bool> {
    let dir = dir_of(manifest_path);
    let mut removed = false;
    if !storage.exists(dir) {
        return Ok(false);
    }
    for name in storage.list_dir(dir)? {
        let path = dir.join(&name);
        let is_tmp = name.starts_with(BASE_ROOT_FILE) && name != BASE_ROOT_FILE;
        let is_base = name.starts_with(LINK_PREFIX) || is_tmp || (keep.is_none() && name == BASE_ROOT_FILE);
        if is_base && Some(path.as_path()) != keep {
            storage.remove_file(&path)?;
            removed = true;
        }
    }
    if removed {
        storage.sync_dir(dir)?;
    }
    Ok(removed)
}

/// A fresh link id (random: ids never repeat within one directory).
pub fn new_link_id() -> u64 {
    use std::hash::BuildHasher;
    std::hash::RandomState::new().hash_one(std::time::SystemTime::now())
}
