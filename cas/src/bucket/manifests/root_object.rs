//! A published manifest root: the object another host opens an image by.
//!
//! ```text
//! images/<name>/roots/<epoch:016x>-<generation:016x>   (written once)
//!  0 magic "CASPROOT" | 8 version u32 | 12 reserved u32 | 16 store_id u64
//!  24 epoch u64 | 32 size_bytes u64 | 40 series u64
//!  48 the manifest's root record (76 bytes, manifest/root.rs)
//!  124 ranges u32 | 128 ranges x (first_page u64, end_page u64)
//!  crc32c of everything before it
//! images/<name>/pages/<series:016x>/<first:016x>-<end:016x>
//!  the manifest file's raw pages first..end (each page checks itself)
//! ```
//!
//! The ranges are contiguous from the first tree page to the root's
//! `file_pages`: together they are the manifest file the root was
//! committed in, except its root slots. A series is one manifest file of
//! the publisher: a rewrite starts a new one. Keys sort by (epoch,
//! generation), so the newest root is the last one listed; the epoch is the
//! writer's lease epoch (0 until images take leases).

use crate::error::{Error, Result};
use crate::format::{self, Encoder};
use crate::manifest::{RootRecord, FIRST_TREE_PAGE};
use std::path::Path;

const MAGIC: [u8; 8] = *b"CASPROOT";
const VERSION: u32 = 1;
/// Bytes of the root record inside (manifest/root.rs `ROOT_USED_BYTES`).
const ROOT_RECORD_BYTES: usize = 76;
/// Largest root object read (about 64 K ranges).
pub const MAX_ROOT_OBJECT_BYTES: u64 = 1 << 20;
/// Most pages a published manifest spans (256 TiB of pages: far past the
/// largest image's tree; keeps page offsets from overflowing).
const MAX_FILE_PAGES: u64 = 1 << 36;

/// The decoded object (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootObject {
    pub store_id: u64,
    pub epoch: u64,
    pub size_bytes: u64,
    pub series: u64,
    pub root: RootRecord,
    /// Page ranges `[first, end)`, contiguous, in order.
    pub ranges: Vec<(u64, u64)>,
}

/// Where image `name`'s objects live in the bucket.
pub fn image_prefix(name: &str) -> String {
    format!("images/{name}/")
}

/// The key of the root of `generation` published in `epoch`.
pub fn root_key(name: &str, epoch: u64, generation: u64) -> String {
    format!("{}roots/{epoch:016x}-{generation:016x}", image_prefix(name))
}

/// The prefix every root key of `name` starts with.
pub fn roots_prefix(name: &str) -> String {
    format!("{}roots/", image_prefix(name))
}

/// The prefix every page range key of `name` starts with.
pub fn pages_prefix(name: &str) -> String {
    format!("{}pages/", image_prefix(name))
}

/// The prefix of the page range keys of `series`.
pub fn series_prefix(name: &str, series: u64) -> String {
    format!("{}{series:016x}/", pages_prefix(name))
}

/// The key of pages `first..end` of `series`.
pub fn pages_key(name: &str, series: u64, first: u64, end: u64) -> String {
    format!("{}{first:016x}-{end:016x}", series_prefix(name, series))
}

/// `(epoch, generation)` of a root key, if it is one.
pub fn parse_root_key(key: &str) -> Option<(u64, u64)> {
    let tail = key.rsplit('/').next()?;
    let (e, g) = tail.split_once('-')?;
    if e.len() != 16 || g.len() != 16 {
        return None;
    }
    Some((u64::from_str_radix(e, 16).ok()?, u64::from_str_radix(g, 16).ok()?))
}

impl RootObject {
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::with_capacity(132 + 16 * self.ranges.len());
        e.bytes(&MAGIC).u32(VERSION).u32(0).u64(self.store_id).u64(self.epoch);
        e.u64(self.size_bytes).u64(self.series);
        e.bytes(&self.root.encode()[..ROOT_RECORD_BYTES]);
        e.u32(u32::try_from(self.ranges.len()).expect("ranges fit in u32"));
        for &(first, end) in &self.ranges {
            e.u64(first).u64(end);
        }
        e.seal();
        e.buf
    }

    /// Decodes and checks a root object; never panics on hostile input.
    /// `what` names it in errors.
    pub fn decode(buf: &[u8], what: &Path) -> Result<RootObject> {
        let corrupt = |detail: String| Error::Corruption { path: what.to_path_buf(), offset: 0, detail };
        let (_, mut d) = format::open_sealed(buf, &MAGIC, "published manifest root", VERSION, what)?;
        let short = || corrupt("published manifest root is cut short".into());
        if d.u32().ok_or_else(short)? != 0 {
            return Err(corrupt("reserved bytes are not zero".into()));
        }
        let store_id = d.u64().ok_or_else(short)?;
        let epoch = d.u64().ok_or_else(short)?;
        let size_bytes = d.u64().ok_or_else(short)?;
        let series = d.u64().ok_or_else(short)?;
        let record = d.bytes(ROOT_RECORD_BYTES).ok_or_else(short)?;
        let root = RootRecord::decode_detached(record, what, 48)?;
        let n = d.u32().ok_or_else(short)? as usize;
        if d.remaining() != n * 16 {
            return Err(corrupt(format!("{n} page ranges do not fill {} bytes", d.remaining())));
        }
        let mut ranges = Vec::with_capacity(n);
        let mut at = FIRST_TREE_PAGE;
        for _ in 0..n {
            let (first, end) = (d.u64().ok_or_else(short)?, d.u64().ok_or_else(short)?);
            if first != at || end <= first {
                return Err(corrupt(format!("page range {first}..{end} does not follow page {at}")));
            }
            at = end;
            ranges.push((first, end));
        }
        if root.file_pages > MAX_FILE_PAGES {
            return Err(corrupt(format!("a tree of {} pages is more than any image has", root.file_pages)));
        }
        if let Some(&(first, end)) = ranges.iter().find(|(a, b)| b - a > super::ranges::MAX_RANGE_PAGES) {
            return Err(corrupt(format!("page range {first}..{end} is longer than a range object")));
        }
        if at != root.file_pages {
            return Err(corrupt(format!("page ranges end at {at}, the root's tree at {}", root.file_pages)));
        }
        if root.height > 0 && (root.root.page < FIRST_TREE_PAGE || root.root.page >= at) {
            return Err(corrupt(format!("root page {} is outside the published pages", root.root.page)));
        }
        Ok(RootObject { store_id, epoch, size_bytes, series, root, ranges })
    }
}

/// Fuzzing: decodes a root object and returns its encoding (which must
/// equal the input).
pub fn fuzz_decode_root_object(bytes: &[u8]) -> Result<Vec<u8>> {
    RootObject::decode(bytes, Path::new("<fuzz>")).map(|r| r.encode())
}

/// A fuzzing seed: a published root of a one-level tree in two ranges.
pub fn fuzz_sample_root_object() -> Vec<u8> {
    let mut root = RootRecord::empty();
    root.generation = 3;
    root.height = 1;
    root.root.page = 4;
    root.file_pages = 5;
    root.live_pages = 1;
    RootObject {
        store_id: 0x5eed,
        epoch: 0,
        size_bytes: 1 << 30,
        series: 9,
        root,
        ranges: vec![(2, 4), (4, 5)],
    }
    .encode()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::RootRecord;

    fn sample() -> RootObject {
        let mut root = RootRecord::empty();
        root.generation = 7;
        root.covered = 99;
        root.height = 1;
        root.root.page = 9;
        root.root.crc = 0xabcd;
        root.file_pages = 10;
        root.live_pages = 1;
        root.mapped_blocks = 3;
        RootObject {
            store_id: 0xfeed,
            epoch: 0,
            size_bytes: 1 << 30,
            series: 42,
            root,
            ranges: vec![(2, 8), (8, 10)],
        }
    }

    #[test]
    fn round_trips_and_refuses_damage_and_newer_versions() {
        let o = sample();
        let buf = o.encode();
        let p = Path::new("/r");
        assert_eq!(RootObject::decode(&buf, p).unwrap(), o);
        format::assert_refuses_damage(&buf, |b| RootObject::decode(b, p));
    }

    #[test]
    fn ranges_must_cover_the_tree_without_gaps() {
        let p = Path::new("/r");
        for ranges in [vec![(2, 8)], vec![(2, 8), (9, 10)], vec![(3, 10)], vec![(2, 10), (10, 11)]] {
            let o = RootObject { ranges: ranges.clone(), ..sample() };
            assert!(RootObject::decode(&o.encode(), p).is_err(), "{ranges:?} accepted");
        }
    }

    #[test]
    fn root_keys_sort_by_epoch_then_generation() {
        let a = root_key("vm", 1, 0xffff);
        let b = root_key("vm", 2, 1);
        assert!(a < b);
        assert_eq!(parse_root_key(&b), Some((2, 1)));
        assert_eq!(parse_root_key("images/vm/roots/x-y"), None);
    }
}
