//! The other side of publication: finding the newest root of an image in
//! the bucket and building a manifest file from the pages it lists
//! (`Store::fetch_image` makes a read-only image of it).

pub use super::root_object::RootObject;
use super::root_object::{pages_key, parse_root_key, roots_prefix, MAX_ROOT_OBJECT_BYTES};
use crate::error::{Error, Result};
use crate::manifest::{build_from_pages, PAGE_BYTES};
use crate::objects::{list_all, Objects};
use crate::storage::Storage;
use std::path::{Path, PathBuf};

/// A root listed but gone when read (superseded and deleted meanwhile) is
/// looked for again, and so is a fetch whose ranges went: at most
/// `ATTEMPTS` times.
pub const ATTEMPTS: u32 = 3;

/// The newest root of image `name` in the bucket (its key and contents),
/// or None if none was published.
pub fn newest_root(objects: &dyn Objects, name: &str) -> Result<Option<(String, RootObject)>> {
    let mut attempt = 1;
    loop {
        let keys = list_all(objects, &roots_prefix(name))?;
        let Some(key) = keys.into_iter().rev().find(|k| parse_root_key(k).is_some()) else {
            return Ok(None);
        };
        match read_root(objects, key) {
            Err(Error::NotFound(_)) if attempt < ATTEMPTS => attempt += 1,
            r => return r.map(Some),
        }
    }
}

/// Root object `key`, checked against its key.
fn read_root(objects: &dyn Objects, key: String) -> Result<(String, RootObject)> {
    let what = PathBuf::from(format!("{}/{key}", objects.describe()));
    let too_big = |len: u64| Error::Corruption {
        path: what.clone(),
        offset: 0,
        detail: format!("{len} bytes is more than a root object holds"),
    };
    if let Some(len) = objects.head(&key)?.filter(|&l| l > MAX_ROOT_OBJECT_BYTES) {
        return Err(too_big(len));
    }
    let bytes = objects.get(&key)?;
    if bytes.len() as u64 > MAX_ROOT_OBJECT_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    let root = RootObject::decode(&bytes, &what)?;
    if parse_root_key(&key) != Some((root.epoch, root.root.generation)) {
        return Err(Error::Corruption {
            path: what,
            offset: 0,
            detail: format!("holds epoch {} generation {}", root.epoch, root.root.generation),
        });
    }
    Ok((key, root))
}

/// Builds the manifest file `path` from `root`'s page ranges, GETting them
/// one at a time; atomic (see `build_from_pages`).
pub fn build_manifest(
    objects: &dyn Objects,
    storage: &dyn Storage,
    path: &Path,
    name: &str,
    root: &RootObject,
) -> Result<()> {
    let mut ranges = root.ranges.iter().map(|&(first, end)| {
        let key = pages_key(name, root.series, first, end);
        let data = objects.get(&key)?;
        if data.len() as u64 != (end - first) * PAGE_BYTES as u64 {
            return Err(Error::Corruption {
                path: PathBuf::from(format!("{}/{key}", objects.describe())),
                offset: 0,
                detail: format!("{} bytes for {} pages", data.len(), end - first),
            });
        }
        Ok((first, data))
    });
    build_from_pages(storage, path, &root.root, &mut ranges)
}
