//! The manifest root record and its two slots.
//!
//! A manifest file starts with two root slots (pages 0 and 1); tree pages
//! follow from page 2. Commit `g` writes its root into slot `g % 2`, so
//! the slot holding the current root (generation `g - 1`) is never
//! overwritten by the commit that replaces it. On open the valid slot with
//! the higher generation wins; a torn or damaged newest slot falls back to
//! the previous root, which is safe because the log is reclaimed only after
//! the newest root's sync returned.
//!
//! ```text
//! manifest file:
//!  page 0       page 1       page 2 ...
//!  | slot 0     | slot 1     | tree pages (page.rs), appended by commits
//!
//! root record (at the start of its slot; the rest of the slot is zero):
//!  0          8         12       13        16           24        32          40         44
//!  | magic    | version | height | reserved| generation | covered | root_page | root_crc | reserved |
//!  "CASMROOT"   u32       u8       [u8; 3]   u64          u64       u64         u32        u32
//!  48           56           64              72       76
//!  | file_pages | live_pages | mapped_blocks | crc32c |
//!    u64          u64          u64             of 0..72
//! ```
//!
//! `height` 0 is the empty tree (root_page 0); else the root page is at
//! level `height - 1`. `file_pages` is where the next commit appends;
//! pages below it that the tree does not reach are garbage
//! (`file_pages - 2 - live_pages` of them). `covered` is the caller's
//! opaque log position.

pub use super::page::FIRST_TREE_PAGE;
use super::page::{ChildRef, MAX_LEVEL, PAGE_BYTES};
use crate::error::{Error, Result};
use crate::format::{self, Decoder, Encoder};
use std::path::Path;

pub const ROOT_VERSION: u32 = 1;
const ROOT_MAGIC: [u8; 8] = *b"CASMROOT";
pub(crate) const ROOT_USED_BYTES: usize = 72 + 4;

/// A decoded root record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RootRecord {
    pub generation: u64,
    pub covered: u64,
    pub height: u8,
    pub root: ChildRef,
    pub file_pages: u64,
    pub live_pages: u64,
    pub mapped_blocks: u64,
}

impl RootRecord {
    /// The root of a manifest that has never been committed.
    pub fn empty() -> RootRecord {
        RootRecord {
            generation: 0,
            covered: 0,
            height: 0,
            root: ChildRef::NONE,
            file_pages: FIRST_TREE_PAGE,
            live_pages: 0,
            mapped_blocks: 0,
        }
    }

    /// Pages below `file_pages` the tree no longer reaches.
    pub fn garbage_pages(&self) -> u64 {
        self.file_pages.saturating_sub(FIRST_TREE_PAGE + self.live_pages)
    }

    /// The slot this record belongs in.
    pub fn slot(&self) -> u64 {
        self.generation % 2
    }

    /// The whole slot page.
    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::with_capacity(PAGE_BYTES);
        e.bytes(&ROOT_MAGIC)
            .u32(ROOT_VERSION)
            .u8(self.height)
            .bytes(&[0; 3])
            .u64(self.generation)
            .u64(self.covered)
            .u64(self.root.page)
            .u32(self.root.crc)
            .u32(0)
            .u64(self.file_pages)
            .u64(self.live_pages)
            .u64(self.mapped_blocks)
            .seal();
        debug_assert_eq!(e.len(), ROOT_USED_BYTES);
        e.buf.resize(PAGE_BYTES, 0);
        e.buf
    }

    /// Decodes and checks the record in slot `slot`; never panics.
    pub fn decode(buf: &[u8], slot: u64, path: &Path) -> Result<RootRecord> {
        let offset = slot * PAGE_BYTES as u64;
        let corrupt = |detail: String| Error::Corruption { path: path.to_path_buf(), offset, detail };
        if buf.len() < ROOT_USED_BYTES {
            return Err(corrupt(format!("root slot of {} bytes", buf.len())));
        }
        if buf[..8] != ROOT_MAGIC {
            return Err(corrupt("no root record (bad magic)".into()));
        }
        let body = format::unseal(&buf[..ROOT_USED_BYTES], path, offset)?;
        let mut d = Decoder::new(&body[8..]);
        format::check_version("manifest root", d.u32().unwrap_or(0), ROOT_VERSION)?;
        let height = d.u8().unwrap_or(u8::MAX);
        let reserved_a = d.bytes(3).unwrap_or(&[1]) != [0; 3];
        let generation = d.u64().unwrap_or(0);
        let covered = d.u64().unwrap_or(0);
        let root = ChildRef { page: d.u64().unwrap_or(0), crc: d.u32().unwrap_or(0) };
        let reserved_b = d.u32() != Some(0);
        let file_pages = d.u64().unwrap_or(0);
        let live_pages = d.u64().unwrap_or(0);
        let mapped_blocks = d.u64().unwrap_or(0);
        if reserved_a || reserved_b {
            return Err(corrupt("reserved bytes of the root record are not zero".into()));
        }
        let r = RootRecord { generation, covered, height, root, file_pages, live_pages, mapped_blocks };
        if r.generation == 0 || r.slot() != slot {
            return Err(corrupt(format!("root generation {} does not belong in slot {slot}", r.generation)));
        }
        if height > MAX_LEVEL + 1 || (height == 0) != r.root.is_none() {
            return Err(corrupt(format!("root of height {height} with root page {}", r.root.page)));
        }
        if r.file_pages < FIRST_TREE_PAGE
            || r.live_pages > r.file_pages - FIRST_TREE_PAGE
            || (!r.root.is_none() && (r.root.page < FIRST_TREE_PAGE || r.root.page >= r.file_pages))
        {
            return Err(corrupt(format!(
                "root page {} / live {} outside a file of {} pages",
                r.root.page, r.live_pages, r.file_pages
            )));
        }
        Ok(r)
    }
}

impl RootRecord {
    /// Decodes a record kept outside a manifest file (a base root, base.rs),
    /// at `offset` of `path`: its slot is its generation's.
    pub fn decode_detached(buf: &[u8], path: &Path, offset: u64) -> Result<RootRecord> {
        let generation = buf.get(16..24).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
        RootRecord::decode(buf, generation % 2, path).map_err(|e| match e {
            Error::Corruption { path, detail, .. } => Error::Corruption { path, offset, detail },
            other => other,
        })
    }
}

/// Picks the current root from the two slots' bytes. Errors only when
/// neither slot holds a valid record.
pub fn choose(slot0: &[u8], slot1: &[u8], path: &Path) -> Result<RootRecord> {
    let a = RootRecord::decode(slot0, 0, path);
    let b = RootRecord::decode(slot1, 1, path);
    match (a, b) {
        (Ok(a), Ok(b)) => Ok(if a.generation > b.generation { a } else { b }),
        (Ok(r), Err(e)) | (Err(e), Ok(r)) => {
            if r.generation > 1 {
                tracing::debug!(path = %path.display(), error = %e, "one manifest root slot is invalid");
            }
            Ok(r)
        }
        (Err(e), Err(_)) => Err(e),
    }
}

/// Decodes hostile bytes as a root slot (slot from the generation's
/// parity is not known, so both are tried): the fuzz entry point.
pub fn fuzz_decode_root(bytes: &[u8]) -> Result<RootRecord> {
    RootRecord::decode(bytes, 0, Path::new("<fuzz>"))
        .or_else(|_| RootRecord::decode(bytes, 1, Path::new("<fuzz>")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(generation: u64) -> RootRecord {
        RootRecord {
            generation,
            covered: 77,
            height: 2,
            root: ChildRef { page: 5, crc: 9 },
            file_pages: 10,
            live_pages: 4,
            mapped_blocks: 300,
        }
    }

    #[test]
    fn round_trip_and_choice() {
        let p = Path::new("m");
        let r4 = rec(4);
        let r5 = rec(5);
        assert_eq!(RootRecord::decode(&r4.encode(), 0, p).unwrap(), r4);
        assert!(RootRecord::decode(&r4.encode(), 1, p).is_err(), "misdirected slot write");
        assert_eq!(choose(&r4.encode(), &r5.encode(), p).unwrap(), r5);
        let mut torn = r5.encode();
        torn[20] ^= 1;
        assert_eq!(choose(&r4.encode(), &torn, p).unwrap(), r4);
        assert!(choose(&[0; 4096], &torn, p).is_err());
        assert_eq!(r4.garbage_pages(), 4);
    }

    #[test]
    fn inconsistent_records_are_refused() {
        let p = Path::new("m");
        let mut r = rec(4);
        r.root.page = 10;
        assert!(RootRecord::decode(&r.encode(), 0, p).is_err());
        let mut r = rec(4);
        r.height = 0;
        assert!(RootRecord::decode(&r.encode(), 0, p).is_err());
        let mut r = rec(4);
        r.live_pages = 9;
        assert!(RootRecord::decode(&r.encode(), 0, p).is_err());
    }
}
